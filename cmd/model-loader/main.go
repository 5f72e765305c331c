// Command model-loader is the init container of every AIInference pod: it fetches
// the model into the shared volume, verified and resumable, and reports how it went
// in its termination message (see internal/loadspec for the contract).
package main

import (
	"os"

	"github.com/aiinference/operator/internal/loader"
)

func main() {
	os.Exit(loader.Main(os.Args[1:], os.Stderr))
}
