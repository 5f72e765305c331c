// Command model-loader is the init container of every AIInference pod: it fetches
// the model into the shared volume, verified and resumable, and reports how it went
// in its termination message (see internal/loadspec for the contract).
//
// `model-loader warmup ...` is the warm-up gate from the same image: a sidecar
// that holds the pod's readiness until the engine has answered one real
// completion (see internal/warmup).
//
// `model-loader adapters ...` is the adapter agent from the same image: a
// sidecar that fetches LoRA adapters and loads them into a running engine
// (see internal/adapteragent).
//
// `model-loader node-cache ...` is the node-local model cache's CSI plugin, one
// per node (see internal/nodecache).
package main

import (
	"fmt"
	"os"

	"github.com/aiinference/operator/internal/adapteragent"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/nodecache"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/internal/warmup"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(version.Version)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "warmup" {
		os.Exit(warmup.Main(os.Args[2:], os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "adapters" {
		os.Exit(adapteragent.Main(os.Args[2:], os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "node-cache" {
		os.Exit(nodecache.Main(os.Args[2:], os.Stderr))
	}
	os.Exit(loader.Main(os.Args[1:], os.Stderr))
}
