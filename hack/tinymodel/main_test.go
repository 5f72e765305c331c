package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// tinySHA256 is the sha256 of TestWriteDecodes's model. It catches a change
// of the bytes (a new generator, a new ollama WriteGGUF), which changes every
// cached model's key.
const tinySHA256 = "68e4009b2be600cd3f292bdaf3183d8127f9bf759bc4f8500f7c6ee96a74c721"

// TestWriteDecodes writes a very small model twice and reads it back with
// ollama's own GGUF decoder: the shape a llama.cpp runner needs, the full
// Llama 3 vocabulary, and the same bytes for the same flags.
func TestWriteDecodes(t *testing.T) {
	dir, err := ollamaTestdata()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := LoadTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Layers: 2, Dim: 32, FFN: 64, Heads: 2, KVHeads: 1, Context: 256, Seed: 1}
	a, b := filepath.Join(t.TempDir(), "a.gguf"), filepath.Join(t.TempDir(), "b.gguf")
	for _, p := range []string{a, b} {
		if err := Write(p, c, tok); err != nil {
			t.Fatal(err)
		}
	}

	f, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	kv := m.KV()
	if got := kv.Architecture(); got != "llama" {
		t.Errorf("architecture %q, want llama", got)
	}
	if got := kv.BlockCount(); got != 2 {
		t.Errorf("block_count %d, want 2", got)
	}
	if got, want := len(m.Tensors().Items()), 2+9*c.Layers; got != want {
		t.Errorf("%d tensors, want %d", got, want)
	}
	tokens := kv.Strings("tokenizer.ggml.tokens")
	if len(tokens) != vocabSize || len(kv.Ints("tokenizer.ggml.token_type")) != vocabSize {
		t.Errorf("vocabulary has %d tokens, want %d", len(tokens), vocabSize)
	}
	if tokens[eotID] != "<|eot_id|>" || tokens[vocabSize-1] != "<|reserved_special_token_247|>" {
		t.Errorf("special tokens %q, %q", tokens[eotID], tokens[vocabSize-1])
	}
	if kv.String("tokenizer.ggml.pre") != "llama-bpe" || len(kv.Strings("tokenizer.ggml.merges")) < 280000 {
		t.Error("not the Llama 3 BPE tokenizer")
	}
	emb := m.Tensors().Items("token_embd")
	if len(emb) != 1 || !slices.Equal(emb[0].Shape, []uint64{32, vocabSize}) || emb[0].Kind != 1 {
		t.Errorf("token_embd %+v, want F16 [32 %d]", emb, vocabSize)
	}

	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) {
		t.Error("the same config wrote different bytes")
	}
	if sum := sha256.Sum256(ab); hex.EncodeToString(sum[:]) != tinySHA256 {
		t.Errorf("sha256 %x, want %s", sum, tinySHA256)
	}
}
