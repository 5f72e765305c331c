// Command kubectl-aii is a kubectl plugin that explains AIInference objects:
// `kubectl aii status NAME`, `why NAME`, `trace NAME` and `logs NAME [--loader]`,
// with kubectl's flags (-n, --context, --kubeconfig, -o json|yaml).
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/aiinference/operator/internal/kubectlaii"
)

func main() {
	cmd := kubectlaii.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
