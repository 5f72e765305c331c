// Package version is the operator's release version: what `manager --version` and
// `model-loader --version` print, the tag `make images` gives both images, and
// the tag config/manager and the default --loader-image name (a test keeps them
// equal).
package version

// Version is the release version. `make images` may override it with
// -ldflags "-X github.com/aiinference/operator/internal/version.Version=...".
var Version = "v0.1.0"

// OperatorRepository and LoaderRepository are the images' repositories, without a
// registry host: a user pushes `make images`' output to a registry of their choice
// and sets the chart's or kustomization's image to it.
const (
	OperatorRepository = "aiinference/operator"
	LoaderRepository   = "aiinference/model-loader"
	RouterRepository   = "aiinference/router"
	// OllamaRepository is the engine image of engine.type Ollama: Ollama
	// (built from its module) behind the operator's cmd/ollama-start.
	OllamaRepository = "aiinference/ollama"
)

// OperatorImage and LoaderImage are the images of this version.
func OperatorImage() string { return OperatorRepository + ":" + Version }
func LoaderImage() string   { return LoaderRepository + ":" + Version }
func RouterImage() string   { return RouterRepository + ":" + Version }
func OllamaImage() string   { return OllamaRepository + ":" + Version }
