package ollamastore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ggufBytes is a GGUF v3 file with no tensors and a few metadata keys before
// general.architecture, which the scan must skip, then some weight-like bytes.
func ggufBytes(arch string) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3)) // version
	w(uint64(0)) // tensors
	w(uint64(4)) // metadata keys
	str("general.alignment")
	w(uint32(4)) // uint32
	w(uint32(32))
	str("tokenizer.ggml.tokens")
	w(uint32(ggufArray))
	w(uint32(ggufString))
	w(uint64(3))
	for _, t := range []string{"<s>", "hello", "world"} {
		str(t)
	}
	str("tokenizer.ggml.scores")
	w(uint32(ggufArray))
	w(uint32(6)) // float32
	w(uint64(3))
	w([]float32{0, 1, 2})
	str("general.architecture")
	w(uint32(ggufString))
	str(arch)
	b.Write(bytes.Repeat([]byte{0xab}, 3000))
	return b.Bytes()
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

type testManifest struct {
	Config layer   `json:"config"`
	Layers []layer `json:"layers"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestRegister(t *testing.T) {
	modelDir, store := t.TempDir(), t.TempDir()
	data := ggufBytes("qwen3")
	gguf := filepath.Join(modelDir, "model-q4.gguf")
	writeFile(t, gguf, data)
	writeFile(t, filepath.Join(modelDir, "README.md"), []byte("a model card"))
	if err := os.Chmod(modelDir, 0o555); err != nil { // the loader's folder may be read-only
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(modelDir, 0o755) })
	sum := sha256.Sum256(data)
	wantDigest := "sha256:" + hex.EncodeToString(sum[:])

	for i, threads := range []int{2, 2, 0} { // a restart on the same store, then other options
		m, err := Register(modelDir, store, "tiny-chat", Options{Threads: threads})
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		wantManifest := filepath.Join(store, "manifests", "registry.ollama.ai", "library", "tiny-chat", "latest")
		if m.GGUF != gguf || m.Digest != wantDigest || m.Manifest != wantManifest {
			t.Fatalf("run %d: Register = %+v, want GGUF %s, digest %s, manifest %s", i, m, gguf, wantDigest, wantManifest)
		}
		var manifest testManifest
		readJSON(t, m.Manifest, &manifest)
		if len(manifest.Layers) != 3 {
			t.Fatalf("run %d: %d layers, want model, template and params", i, len(manifest.Layers))
		}
		model, tmpl, params := manifest.Layers[0], manifest.Layers[1], manifest.Layers[2]
		if model.MediaType != mediaModel || model.Digest != wantDigest || model.Size != int64(len(data)) {
			t.Errorf("run %d: model layer %+v, want digest %s and size %d", i, model, wantDigest, len(data))
		}
		blob := blobPath(filepath.Join(store, "blobs"), wantDigest)
		if target, err := os.Readlink(blob); err != nil || target != gguf {
			t.Errorf("run %d: model blob links to %q (%v), want %s", i, target, err, gguf)
		}
		if got, err := os.ReadFile(blobPath(filepath.Join(store, "blobs"), tmpl.Digest)); err != nil || string(got) != DefaultTemplate || tmpl.MediaType != mediaTemplate {
			t.Errorf("run %d: template layer %+v holds %q (%v), want the default template", i, tmpl, got, err)
		}
		var gotParams map[string]any
		readJSON(t, blobPath(filepath.Join(store, "blobs"), params.Digest), &gotParams)
		if want := float64(threads); threads > 0 && gotParams["num_thread"] != want || threads == 0 && len(gotParams) != 0 || params.MediaType != mediaParams {
			t.Errorf("run %d: params %v (%s), want num_thread %d", i, gotParams, params.MediaType, threads)
		}
		var config struct {
			ModelFormat   string   `json:"model_format"`
			ModelFamily   string   `json:"model_family"`
			ModelFamilies []string `json:"model_families"`
			RootFS        struct {
				DiffIDs []string `json:"diff_ids"`
			} `json:"rootfs"`
		}
		readJSON(t, blobPath(filepath.Join(store, "blobs"), manifest.Config.Digest), &config)
		if config.ModelFormat != "gguf" || config.ModelFamily != "qwen3" || len(config.ModelFamilies) != 1 || config.ModelFamilies[0] != "qwen3" ||
			len(config.RootFS.DiffIDs) != 3 || manifest.Config.MediaType != mediaConfig {
			t.Errorf("run %d: config %+v (%s), want format gguf, family qwen3 and 3 diff ids", i, config, manifest.Config.MediaType)
		}
	}
	// No copy of the model, and no temporary files left.
	var total int64
	_ = filepath.Walk(store, func(path string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			total += fi.Size()
			if strings.HasSuffix(path, ".tmp") {
				t.Errorf("temporary file %s left", path)
			}
		}
		return nil
	})
	if total >= int64(len(data)) {
		t.Errorf("the store holds %d bytes of files, as much as the %d-byte model: a copy?", total, len(data))
	}
}

func TestRegisterFamilyFallback(t *testing.T) {
	modelDir, store := t.TempDir(), t.TempDir()
	// A GGUF magic and then nothing readable: still served, as family llama.
	writeFile(t, filepath.Join(modelDir, "sub", "m.gguf"), []byte("GGUF\x01"))
	m, err := Register(modelDir, store, "ns/m:v1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(store, "manifests", "registry.ollama.ai", "ns", "m", "v1"); m.Manifest != want {
		t.Errorf("manifest at %s, want %s", m.Manifest, want)
	}
	var manifest testManifest
	readJSON(t, m.Manifest, &manifest)
	var config struct {
		ModelFamily string `json:"model_family"`
	}
	readJSON(t, blobPath(filepath.Join(store, "blobs"), manifest.Config.Digest), &config)
	if config.ModelFamily != "llama" {
		t.Errorf("family %q, want llama", config.ModelFamily)
	}
}

func TestRegisterErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		model string
		want  string
	}{
		{"safetensors", map[string]string{"config.json": "{}", "model.safetensors": "x", ".model-complete.json": "{}", ".cache/x.gguf": "GGUF"}, "m",
			"holds no .gguf file (it holds config.json, model.safetensors): engine.type Ollama serves a GGUF file; point spec.model.source at one"},
		{"empty", nil, "m", "is empty: engine.type Ollama serves a GGUF file"},
		{"two", map[string]string{"a.gguf": "GGUF", "b.gguf": "GGUF"}, "m", "holds 2 .gguf files (a.gguf, b.gguf): engine.type Ollama serves exactly one"},
		{"two nested", map[string]string{"x/a.gguf": "GGUF", "y/b.gguf": "GGUF"}, "m", "holds 2 .gguf files (x/a.gguf, y/b.gguf)"},
		{"not gguf", map[string]string{"m.gguf": "<html>"}, "m", "m.gguf is not a GGUF file"},
		{"bad name", map[string]string{"m.gguf": "GGUF"}, "Tiny Chat",
			`its model "Tiny Chat" holds ' ' (a model is 1 to 80 letters, digits, '_', '-' and '.', starting with a letter, digit or '_')`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			modelDir := t.TempDir()
			for name, data := range tc.files {
				writeFile(t, filepath.Join(modelDir, name), []byte(data))
			}
			_, err := Register(modelDir, t.TempDir(), tc.model, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Register: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
