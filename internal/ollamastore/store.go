// Package ollamastore registers the GGUF file of a model folder in an Ollama
// model store ($OLLAMA_MODELS), so that `ollama serve` serves it under the
// served name. Ollama serves only the models of its store: a manifest at
// manifests/<host>/<namespace>/<model>/<tag> that lists content-addressed
// blobs/sha256-<hex> (see Ollama v0.9.6's server/manifest.go and images.go).
//
// The model's blob is a symbolic link to the GGUF file, not a copy: the model
// folder may be read-only, and a copy would double the disk a large model takes.
// Registering again (a restarted container) rewrites the same store.
package ollamastore

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// DefaultTemplate is the chat template of a model registered without one: a
// plain transcript, which any model can continue.
const DefaultTemplate = "{{- range .Messages }}{{ .Role }}: {{ .Content }}\n{{ end }}assistant: "

// Media types of Ollama's manifests and layers.
const (
	mediaManifest = "application/vnd.docker.distribution.manifest.v2+json"
	mediaConfig   = "application/vnd.docker.container.image.v1+json"
	mediaModel    = "application/vnd.ollama.image.model"
	mediaTemplate = "application/vnd.ollama.image.template"
	mediaParams   = "application/vnd.ollama.image.params"
)

// Options shape how Ollama runs the model.
type Options struct {
	// Threads is llama.cpp's thread count (Ollama's num_thread); 0 leaves it to
	// Ollama, which takes the host's core count, not the container's CPU limit:
	// more threads than the limit allows make decoding many times slower.
	Threads int
	// Template is the chat template, in Ollama's TEMPLATE syntax; "" is DefaultTemplate.
	Template string
}

// Model is what Register wrote.
type Model struct {
	// GGUF is the file served, which the model blob links to.
	GGUF string
	// Digest is the GGUF file's sha256:<hex>.
	Digest string
	// Manifest is the manifest's path in the store.
	Manifest string
}

type layer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// Register writes into store a manifest named servedName that serves the one
// GGUF file of modelDir (see findGGUF) with opts. It reads the whole file once,
// for its digest: seconds for a model of several gigabytes, which also brings
// it into the page cache that Ollama then loads it from.
func Register(modelDir, store, servedName string, opts Options) (Model, error) {
	name, err := parseName(servedName)
	if err != nil {
		return Model{}, err
	}
	if opts.Threads < 0 {
		return Model{}, fmt.Errorf("threads is %d: want 0 (Ollama decides) or more", opts.Threads)
	}
	gguf, err := findGGUF(modelDir)
	if err != nil {
		return Model{}, err
	}
	// The link must hold wherever Ollama runs from.
	if gguf, err = filepath.Abs(gguf); err != nil {
		return Model{}, err
	}
	info, err := scanGGUF(gguf)
	if err != nil {
		return Model{}, err
	}
	blobs := filepath.Join(store, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return Model{}, fmt.Errorf("the Ollama store must be writable: %w", err)
	}

	model := layer{MediaType: mediaModel, Digest: info.digest, Size: info.size}
	if err := replace(blobPath(blobs, info.digest), func(tmp string) error { return os.Symlink(gguf, tmp) }); err != nil {
		return Model{}, fmt.Errorf("linking the model blob to %s: %w", gguf, err)
	}
	template, err := writeBlob(blobs, mediaTemplate, []byte(cmp.Or(opts.Template, DefaultTemplate)))
	if err != nil {
		return Model{}, err
	}
	params := map[string]any{}
	if opts.Threads > 0 {
		params["num_thread"] = opts.Threads
	}
	paramsLayer, err := writeJSONBlob(blobs, mediaParams, params)
	if err != nil {
		return Model{}, err
	}
	layers := []layer{model, template, paramsLayer}

	// Ollama's ConfigV2, as `ollama create` writes it for a GGUF file.
	family := cmp.Or(info.architecture, "llama")
	config := map[string]any{
		"model_format":   "gguf",
		"model_family":   family,
		"model_families": []string{family},
		"model_type":     "",
		"file_type":      "",
		"architecture":   runtime.GOARCH,
		"os":             "linux",
		"rootfs":         map[string]any{"type": "layers", "diff_ids": digests(layers)},
	}
	configLayer, err := writeJSONBlob(blobs, mediaConfig, config)
	if err != nil {
		return Model{}, err
	}

	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configLayer,
		"layers":        layers,
	})
	if err != nil {
		return Model{}, err
	}
	path := filepath.Join(append([]string{store, "manifests"}, name.path()...)...)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Model{}, fmt.Errorf("the Ollama store must be writable: %w", err)
	}
	if err := replace(path, func(tmp string) error { return os.WriteFile(tmp, manifest, 0o644) }); err != nil {
		return Model{}, fmt.Errorf("writing the manifest: %w", err)
	}
	return Model{GGUF: gguf, Digest: info.digest, Manifest: path}, nil
}

// blobPath is where Ollama looks for the blob of a sha256:<hex> digest.
func blobPath(blobs, digest string) string {
	return filepath.Join(blobs, strings.Replace(digest, ":", "-", 1))
}

func writeJSONBlob(blobs, mediaType string, v any) (layer, error) {
	data, err := json.Marshal(v) // maps marshal with sorted keys: the same options give the same digest
	if err != nil {
		return layer{}, err
	}
	return writeBlob(blobs, mediaType, data)
}

// writeBlob stores data under its digest; a blob already there is that data.
func writeBlob(blobs, mediaType string, data []byte) (layer, error) {
	sum := sha256.Sum256(data)
	l := layer{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
	path := blobPath(blobs, l.Digest)
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == l.Size {
		return l, nil
	}
	if err := replace(path, func(tmp string) error { return os.WriteFile(tmp, data, 0o644) }); err != nil {
		return layer{}, fmt.Errorf("writing the %s blob: %w", mediaType, err)
	}
	return l, nil
}

// replace makes path with create, under a temporary name first, so that a
// killed container never leaves half a file, and an old file or link is
// replaced in one step.
func replace(path string, create func(tmp string) error) error {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp) // left by an earlier run with the same pid
	if err := create(tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

func digests(layers []layer) []string {
	out := make([]string, len(layers))
	for i, l := range layers {
		out[i] = l.Digest
	}
	return out
}
