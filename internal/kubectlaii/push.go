package kubectlaii

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/aiinference/operator/internal/ocipush"
)

// pushCommand puts a model's folder into an OCI registry, for model.source.oci.
// It needs no cluster: it talks to the registry only.
func pushCommand() *cobra.Command {
	var format string
	var o ocipush.Options
	cmd := &cobra.Command{
		Use:   "push DIR REGISTRY/REPOSITORY:TAG",
		Short: "Push a model's folder to an OCI registry, for model.source.oci: as an artifact (one file a layer, ModelPack media types) the loader pulls, or as an image an image volume mounts",
		Example: `  kubectl aii push ./qwen2.5-0.5b registry.example.com/models/qwen:v1
  kubectl aii push ./qwen2.5-0.5b registry.example.com/models/qwen:v1-image --format image
  REGISTRY_PASSWORD=... kubectl aii push ./model registry.example.com/models/m:v1 --username me`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch ocipush.Format(format) {
			case ocipush.Artifact, ocipush.Image:
				o.Format = ocipush.Format(format)
			default:
				return fmt.Errorf("--format %q: want artifact (for oci.mode Loader) or image (for oci.mode ImageVolume)", format)
			}
			// The password never goes on the command line, where ps shows it.
			o.Password = os.Getenv("REGISTRY_PASSWORD")
			digest, err := ocipush.Push(cmd.Context(), args[0], args[1], o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Pushed %s as %s\nmodel.source.oci.reference: %s@%s\n", args[0], digest, referenceWithoutTag(args[1]), digest)
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", string(ocipush.Artifact), "artifact (the loader pulls it: oci.mode Loader, any cache) or image (tar layers: oci.mode ImageVolume)")
	cmd.Flags().BoolVar(&o.PlainHTTP, "plain-http", false, "talk to the registry over plain HTTP (a registry without TLS)")
	cmd.Flags().StringVar(&o.Username, "username", "", "registry user; the password is read from $REGISTRY_PASSWORD")
	return cmd
}

// referenceWithoutTag is REGISTRY/REPOSITORY of REGISTRY/REPOSITORY:TAG.
func referenceWithoutTag(ref string) string {
	for i := len(ref) - 1; i >= 0 && ref[i] != '/'; i-- {
		if ref[i] == ':' {
			return ref[:i]
		}
	}
	return ref
}
