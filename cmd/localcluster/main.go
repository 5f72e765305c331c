// Command localcluster runs a local Kubernetes cluster with simulated GPU nodes
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on
// 127.0.0.1) that keeps running in the background.
//
//	localcluster up [--nodes FILE] [--kubelet-delay-scale X] [--gateway] [--network-policy] [--model-cache BUDGET] [--state-dir DIR]
//	                                                    start it (or say it is running)
//	localcluster down [--state-dir DIR]                 stop it and remove its files
//	localcluster status [--state-dir DIR]               show it; exit 1 if not running
//	localcluster kubeconfig [--state-dir DIR]           print the kubeconfig path
//	localcluster env [--state-dir DIR]                  print shell variables for scripts
//	localcluster check-real-node                        exit 1 (and say why) if no real node can run here, 3 if packages are missing
//
// Run it from the repository: the binaries are built by hack/tools/build.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/localcluster"
)

const usage = `Usage: localcluster COMMAND [flags]

Runs a local Kubernetes cluster with simulated GPU nodes in the background.

Commands:
  up          start the cluster and wait until it is usable (succeeds if it already runs)
  down        stop the cluster and remove its files (succeeds if nothing runs)
  status      show the cluster's processes and readiness; exit status 1 if not running
  kubeconfig  print the path of the admin kubeconfig; exit status 1 if not running
  check-real-node
              exit status 0 if this host can run real nodes, else say why and exit 1,
              or 3 when only Debian packages are missing (hack/tools/build.sh
              node-packages installs them, as root)
  env         print shell variables: KUBECONFIG, the real nodes' image references
              (IMAGE_MODEL_LOADER, IMAGE_LLM_D_INFERENCE_SIM, ...) and the object
              store (OBJECT_STORE_ENDPOINT, _BUCKET, _MODEL_PREFIX, _MODEL_BYTES,
              _GGUF_PREFIX, _GGUF_BYTES)
              and the gateway (GATEWAY_URL, _NAMESPACE, _NAME, _API_URL)

Flags:
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		var exit exitCode
		if errors.As(err, &exit) {
			os.Exit(int(exit))
		}
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

// exitCode is an error that only sets the exit status (the message is printed already).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func run(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fs, _ := newFlags("")
		fs.Usage()
		return nil
	}
	command := args[0]
	fs, f := newFlags(command)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch command {
	case "up":
		s, err := localcluster.Up(ctx, localcluster.UpOptions{StateDir: f.stateDir, NodesFile: f.nodes,
			KubeletDelayScale: f.kubeletDelayScale, ObjectStoreModelBytes: f.objectStoreModelBytes, Gateway: f.gateway,
			NetworkPolicy: f.networkPolicy, ModelCacheBudget: f.modelCache, Out: os.Stderr})
		if err != nil {
			return err
		}
		stopWith := "make cluster-down"
		if f.stateDir != localcluster.DefaultStateDir() {
			stopWith = "go run ./cmd/localcluster down --state-dir " + f.stateDir
		}
		fmt.Fprintf(os.Stderr, "The local cluster is up. Use it with:\n  export KUBECONFIG=%s\n  kubectl get nodes -L nvidia.com/gpu.product\nLogs: %s\nStop it with: %s\n",
			s.Kubeconfig, s.LogsDir, stopWith)
		return nil
	case "down":
		return localcluster.Down(f.stateDir, os.Stderr)
	case "check-real-node":
		if err := localcluster.CheckRealNodeHost(); err != nil {
			fmt.Fprintln(os.Stderr, "This host cannot run a real node:", err)
			if missing := (*localcluster.MissingPackagesError)(nil); errors.As(err, &missing) {
				return exitCode(3)
			}
			return exitCode(1)
		}
		return nil
	case "status":
		ok, err := localcluster.Status(ctx, f.stateDir, os.Stdout)
		if err != nil {
			return err
		}
		if !ok {
			return exitCode(1)
		}
		return nil
	case "kubeconfig", "env":
		s, err := localcluster.ReadState(f.stateDir)
		if err != nil {
			return err
		}
		if !s.Running() || !s.Ready {
			fmt.Fprintln(os.Stderr, "The local cluster is not running: start it with make cluster-up")
			return exitCode(1)
		}
		if command == "kubeconfig" {
			fmt.Println(s.Kubeconfig)
			return nil
		}
		printEnv(s)
		return nil
	case "supervise":
		return localcluster.RunSupervisor(localcluster.SupervisorOptions{
			StateDir: f.stateDir, BinDir: f.binDir, KwokStageDir: f.stageDir, NodesFile: f.nodes,
			RealNodes:         localcluster.RealNodeOptions{BinDir: f.realNodeBinDir, ImageDir: f.imageDir},
			KubeletDelayScale: f.kubeletDelayScale,
			ObjectStore:       objectStoreOptions(f),
			Gateway:           gatewayOptions(f),
			NetworkPolicy:     networkPolicyOptions(f),
			ModelCache:        modelCacheOptions(f),
		})
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", command)
	}
}

type flags struct {
	stateDir, nodes       string
	kubeletDelayScale     float64
	objectStoreModelBytes int64
	gateway               bool
	networkPolicy         bool
	networkPolicyBinDir   string
	modelCache            string
	modelCacheBinary      string
	// Set by up for the detached supervisor only.
	binDir, stageDir, realNodeBinDir, imageDir, objectStoreBinDir, objectStoreGGUFDir, gatewayBinDir, repoRoot string
}

func networkPolicyOptions(f *flags) *localcluster.NetworkPolicyOptions {
	if !f.networkPolicy {
		return nil
	}
	return &localcluster.NetworkPolicyOptions{BinDir: f.networkPolicyBinDir, RepoRoot: f.repoRoot}
}

func modelCacheOptions(f *flags) *localcluster.ModelCacheOptions {
	if f.modelCache == "" {
		return nil
	}
	return &localcluster.ModelCacheOptions{Binary: f.modelCacheBinary, Budget: f.modelCache, Namespace: localcluster.ModelCacheNamespace}
}

func gatewayOptions(f *flags) *localcluster.GatewayOptions {
	if !f.gateway {
		return nil
	}
	return &localcluster.GatewayOptions{BinDir: f.gatewayBinDir, RepoRoot: f.repoRoot}
}

func objectStoreOptions(f *flags) *localcluster.ObjectStoreOptions {
	if f.objectStoreModelBytes <= 0 {
		return nil
	}
	return &localcluster.ObjectStoreOptions{ModelBytes: f.objectStoreModelBytes, BinDir: f.objectStoreBinDir, GGUFDir: f.objectStoreGGUFDir}
}

// printEnv prints the cluster's facts as shell variable assignments.
func printEnv(s *localcluster.State) {
	fmt.Printf("KUBECONFIG=%s\n", shellQuote(s.Kubeconfig))
	for _, image := range s.Images {
		name := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(image.Name))
		fmt.Printf("IMAGE_%s=%s\n", name, shellQuote(image.Ref))
	}
	if o := s.ObjectStore; o != nil {
		fmt.Printf("OBJECT_STORE_ENDPOINT=%s\nOBJECT_STORE_BUCKET=%s\nOBJECT_STORE_MODEL_PREFIX=%s\nOBJECT_STORE_MODEL_BYTES=%d\n",
			shellQuote(o.Endpoint), shellQuote(o.Bucket), shellQuote(o.ModelPrefix), o.ModelBytes)
		fmt.Printf("OBJECT_STORE_GGUF_PREFIX=%s\nOBJECT_STORE_GGUF_BYTES=%d\n", shellQuote(o.GGUFPrefix), o.GGUFBytes)
		secret := o.CredentialsSecret("")
		for _, key := range []string{loadspec.EnvAccessKeyID, loadspec.EnvSecretAccessKey} {
			fmt.Printf("OBJECT_STORE_%s=%s\n", key, shellQuote(secret.StringData[key]))
		}
	}
	if gw := s.Gateway; gw != nil {
		fmt.Printf("GATEWAY_URL=%s\nGATEWAY_NAMESPACE=%s\nGATEWAY_NAME=%s\nGATEWAY_API_URL=%s\n",
			shellQuote(gw.URL), shellQuote(gw.Namespace), shellQuote(gw.Name), shellQuote(gw.APIURL))
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// internalFlags are left out of the usage text.
var internalFlags = map[string]bool{"bin-dir": true, "kwok-stage-dir": true, "real-node-bin-dir": true, "image-dir": true, "object-store-bin-dir": true, "object-store-gguf-dir": true, "gateway-bin-dir": true, "network-policy-bin-dir": true, "model-cache-binary": true, "repo-root": true}

func newFlags(command string) (*flag.FlagSet, *flags) {
	f := &flags{}
	fs := flag.NewFlagSet("localcluster "+command, flag.ContinueOnError)
	fs.StringVar(&f.stateDir, "state-dir", localcluster.DefaultStateDir(), "folder that holds the running cluster's state, logs and kubeconfig")
	fs.StringVar(&f.nodes, "nodes", "", "node pool description (YAML) for up; default: the built-in pool, as in config/localcluster/nodepool.yaml")
	fs.Float64Var(&f.kubeletDelayScale, "kubelet-delay-scale", 1, "for up: multiplies the simulated kubelets' delays (1-5 s per step of a pod's start, a crash-loop back-off from 10 s to 5 min); 0.1 is ten times faster")
	fs.Int64Var(&f.objectStoreModelBytes, "object-store-model-bytes", 0, "for up: start an S3-compatible store (versitygw) on the host's address, seeded with a model of this many bytes; 0: none")
	fs.BoolVar(&f.gateway, "gateway", false, "for up: run the cluster's Gateway API data plane (Traefik on the host, docs/gateway.md)")
	fs.StringVar(&f.binDir, "bin-dir", "", "")
	fs.StringVar(&f.objectStoreBinDir, "object-store-bin-dir", "", "")
	fs.StringVar(&f.objectStoreGGUFDir, "object-store-gguf-dir", "", "")
	fs.StringVar(&f.stageDir, "kwok-stage-dir", "", "")
	fs.StringVar(&f.realNodeBinDir, "real-node-bin-dir", "", "")
	fs.StringVar(&f.imageDir, "image-dir", "", "")
	fs.StringVar(&f.gatewayBinDir, "gateway-bin-dir", "", "")
	fs.BoolVar(&f.networkPolicy, "network-policy", false, "for up: enforce NetworkPolicies on the real nodes (kube-router's firewall on the host, docs/security.md)")
	fs.StringVar(&f.networkPolicyBinDir, "network-policy-bin-dir", "", "")
	fs.StringVar(&f.modelCache, "model-cache", "", "for up: run the node-local model cache (docs/model-cache.md) on the real nodes with this budget per node, e.g. 2Gi; empty: none")
	fs.StringVar(&f.modelCacheBinary, "model-cache-binary", "", "")
	fs.StringVar(&f.repoRoot, "repo-root", "", "")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.VisitAll(func(fl *flag.Flag) {
			if !internalFlags[fl.Name] {
				fmt.Fprintf(fs.Output(), "  --%s\n    \t%s (default %q)\n", fl.Name, fl.Usage, fl.DefValue)
			}
		})
	}
	return fs, f
}
