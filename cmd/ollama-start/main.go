// Command ollama-start is the entrypoint of the engine container of
// engine.type Ollama. Ollama serves only the models of its own store, so it
// registers the GGUF file of the model folder in a store (internal/ollamastore,
// without copying it) and then execs `ollama serve`, which keeps the pid, the
// signals and the logs of the container.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/aiinference/operator/internal/ollamastore"
)

// terminationLog is where Kubernetes reads the container's termination message.
const terminationLog = "/dev/termination-log"

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		msg := "ollama-start: " + err.Error()
		fmt.Fprintln(os.Stderr, msg)
		// Only into an existing file: outside a pod, /dev is no place to create one.
		if f, err := os.OpenFile(terminationLog, os.O_WRONLY|os.O_TRUNC, 0); err == nil {
			_, _ = f.WriteString(msg)
			_ = f.Close()
		}
		os.Exit(1)
	}
}

type options struct {
	modelDir, name, store, ollama          string
	port, parallel, contextLength, threads int
}

func parseArgs(args []string) (options, error) {
	fset := flag.NewFlagSet("ollama-start", flag.ContinueOnError)
	var o options
	home := os.Getenv("HOME")
	defaultStore := ""
	if home != "" {
		defaultStore = filepath.Join(home, "ollama")
	}
	fset.StringVar(&o.modelDir, "model-dir", "", "the model folder, holding one .gguf file (required)")
	fset.StringVar(&o.name, "name", "", "the served model name, which clients send as \"model\" (required)")
	fset.IntVar(&o.port, "port", 11434, "the port Ollama listens on, on all addresses")
	fset.IntVar(&o.parallel, "parallel", 4, "requests served at once (OLLAMA_NUM_PARALLEL); each has its own context")
	fset.IntVar(&o.contextLength, "context-length", 4096, "context length of each request, in tokens (OLLAMA_CONTEXT_LENGTH)")
	fset.IntVar(&o.threads, "threads", 0, "llama.cpp's threads; 0 lets Ollama take the host's core count, so set it to the CPU limit")
	fset.StringVar(&o.store, "store", defaultStore, "a writable folder for Ollama's model store (OLLAMA_MODELS); it gets links, not copies")
	fset.StringVar(&o.ollama, "ollama", "/ollama", "the Ollama binary")
	if err := fset.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fset.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fset.Args())
	case o.modelDir == "" || o.name == "":
		return o, errors.New("--model-dir and --name are required")
	case o.store == "":
		return o, errors.New("--store is required when HOME is not set")
	case o.port < 1 || o.port > 65535:
		return o, fmt.Errorf("--port %d: want 1 to 65535", o.port)
	case o.parallel < 1 || o.contextLength < 1 || o.threads < 0:
		return o, errors.New("--parallel and --context-length must be positive, and --threads 0 or more")
	}
	return o, nil
}

func run(args []string) error {
	o, err := parseArgs(args)
	if err != nil {
		return err
	}
	// Ollama keeps its identity key in $HOME/.ollama and exits without it:
	// say so here, where the message reaches the termination log.
	home, err := os.UserHomeDir()
	if err == nil {
		err = os.MkdirAll(filepath.Join(home, ".ollama"), 0o755)
	}
	if err != nil {
		return fmt.Errorf("the container needs a writable HOME, where Ollama keeps its key: %w", err)
	}
	m, err := ollamastore.Register(o.modelDir, o.store, o.name, ollamastore.Options{Threads: o.threads})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "ollama-start: serving %s (%s) as %q from the store %s\n", m.GGUF, m.Digest, o.name, o.store)

	// These come from the AIInference spec (the port its probes and Service
	// use, the store just written), so they override the same names set in
	// the container's environment; every other variable passes through, e.g.
	// OLLAMA_FLASH_ATTENTION or OLLAMA_DEBUG.
	ours := map[string]string{
		"OLLAMA_HOST":              "0.0.0.0:" + strconv.Itoa(o.port),
		"OLLAMA_MODELS":            o.store,
		"OLLAMA_NUM_PARALLEL":      strconv.Itoa(o.parallel),
		"OLLAMA_CONTEXT_LENGTH":    strconv.Itoa(o.contextLength),
		"OLLAMA_KEEP_ALIVE":        "-1", // never unload the one model
		"OLLAMA_MAX_LOADED_MODELS": "1",
		"OLLAMA_NOPRUNE":           "1", // the store holds only what Register wrote: nothing to tidy
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, set := ours[k]
		return set
	})
	for _, k := range slices.Sorted(maps.Keys(ours)) {
		env = append(env, k+"="+ours[k])
	}
	err = syscall.Exec(o.ollama, []string{o.ollama, "serve"}, env)
	return fmt.Errorf("running %s serve (--ollama names the Ollama binary): %w", o.ollama, err)
}
