// Command router sends each request for a model to the replica that serves it
// fastest and holds requests while the model has no serving replica (see
// internal/router).
package main

import (
	"fmt"
	"os"

	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/internal/version"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(version.Version)
		return
	}
	os.Exit(router.Main(os.Args[1:], os.Stderr))
}
