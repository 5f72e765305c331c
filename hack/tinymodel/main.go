// Command tinymodel writes a small Llama-architecture GGUF model with seeded
// random weights and the real Llama 3.2 tokenizer, so that a real Ollama
// (llama.cpp) can load and serve it where no model hub can be reached. Its
// answers are random tokens; what it is for is the cost shape of serving: a
// long prompt's prefill costs several times the decode of a short answer.
//
//	cd hack/tinymodel && go run . -out /tmp/tiny.gguf
//
// The same flags give the same bytes, so the file's sha256 can key a cache.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/x448/float16"
)

const ollamaModule = "github.com/ollama/ollama"

// Config is the model's shape. Every field goes into the file's bytes.
type Config struct {
	Layers, Dim, FFN, Heads, KVHeads, Context int
	Seed                                      uint64
}

func main() {
	var c Config
	out := flag.String("out", "", "GGUF file to write (required)")
	tokDir := flag.String("tokenizer-dir", "", "directory with the Llama 3.2 encoder.json and vocab.bpe (default: the ollama module's model/testdata/llama3.2)")
	flag.IntVar(&c.Layers, "layers", 6, "transformer blocks")
	flag.IntVar(&c.Dim, "dim", 128, "embedding length")
	flag.IntVar(&c.FFN, "ffn", 384, "feed-forward length")
	flag.IntVar(&c.Heads, "heads", 4, "attention heads")
	flag.IntVar(&c.KVHeads, "kv-heads", 2, "key/value heads")
	flag.IntVar(&c.Context, "context", 4096, "context length")
	flag.Uint64Var(&c.Seed, "seed", 1, "weights' random seed")
	flag.Parse()
	if *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if *tokDir == "" {
		var err error
		if *tokDir, err = ollamaTestdata(); err != nil {
			log.Fatal(err)
		}
	}
	tok, err := LoadTokenizer(*tokDir)
	if err != nil {
		log.Fatal(err)
	}
	if err := Write(*out, c, tok); err != nil {
		log.Fatal(err)
	}
}

// ollamaTestdata finds the tokenizer in the ollama module this binary was
// built with, in the module cache, so that it needs no copy in this repo.
func ollamaTestdata() (string, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", errors.New("no build info; pass -tokenizer-dir")
	}
	for _, m := range bi.Deps {
		if m.Path != ollamaModule {
			continue
		}
		if m.Replace != nil {
			m = m.Replace
			if filepath.IsAbs(m.Path) || strings.HasPrefix(m.Path, ".") {
				return filepath.Join(m.Path, "model", "testdata", "llama3.2"), nil
			}
		}
		cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("go env GOMODCACHE: %w; pass -tokenizer-dir", err)
		}
		dir := filepath.Join(strings.TrimSpace(string(cache)), m.Path+"@"+m.Version, "model", "testdata", "llama3.2")
		if _, err := os.Stat(dir); err != nil {
			return "", fmt.Errorf("%w; run go mod download in hack/tinymodel or pass -tokenizer-dir", err)
		}
		return dir, nil
	}
	return "", errors.New(ollamaModule + " not in build info; pass -tokenizer-dir")
}

// Tokenizer is a GPT-2 style BPE vocabulary as GGUF stores it.
type Tokenizer struct {
	Tokens []string
	Types  []int32
	Merges []string
}

// Llama 3's vocabulary: 128000 BPE tokens, then 256 special ones.
const (
	bosID     = 128000
	eotID     = 128009
	vocabSize = 128256

	tokenNormal  = 1
	tokenControl = 3
)

// specialTokens are Llama 3's named special tokens; the others of the 256 are
// <|reserved_special_token_N|>.
var specialTokens = map[int]string{
	128000: "<|begin_of_text|>",
	128001: "<|end_of_text|>",
	128004: "<|finetune_right_pad_id|>",
	128006: "<|start_header_id|>",
	128007: "<|end_header_id|>",
	128008: "<|eom_id|>",
	128009: "<|eot_id|>",
	128010: "<|python_tag|>",
}

// LoadTokenizer reads encoder.json and vocab.bpe and appends Llama 3's 256
// special tokens as control tokens.
func LoadTokenizer(dir string) (*Tokenizer, error) {
	b, err := os.ReadFile(filepath.Join(dir, "encoder.json"))
	if err != nil {
		return nil, err
	}
	var enc map[string]int
	if err := json.Unmarshal(b, &enc); err != nil {
		return nil, fmt.Errorf("encoder.json: %w", err)
	}
	if len(enc) != bosID {
		return nil, fmt.Errorf("encoder.json has %d tokens, want %d", len(enc), bosID)
	}
	t := &Tokenizer{Tokens: make([]string, vocabSize), Types: make([]int32, vocabSize)}
	for s, id := range enc {
		if id < 0 || id >= bosID || t.Tokens[id] != "" {
			return nil, fmt.Errorf("encoder.json: bad or repeated id %d", id)
		}
		t.Tokens[id], t.Types[id] = s, tokenNormal
	}
	reserved := 0
	for id := bosID; id < vocabSize; id++ {
		s, ok := specialTokens[id]
		if !ok {
			s = fmt.Sprintf("<|reserved_special_token_%d|>", reserved)
			reserved++
		}
		t.Tokens[id], t.Types[id] = s, tokenControl
	}

	f, err := os.Open(filepath.Join(dir, "vocab.bpe"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#version") {
			t.Merges = append(t.Merges, l)
		}
	}
	return t, sc.Err()
}

// Write writes the model to path.
func Write(path string, c Config, t *Tokenizer) error {
	if c.Layers < 1 || c.Dim < 1 || c.FFN < 1 || c.Heads < 1 || c.KVHeads < 1 || c.Context < 1 ||
		c.Dim%c.Heads != 0 || c.Heads%c.KVHeads != 0 || (c.Dim/c.Heads)%2 != 0 {
		return fmt.Errorf("bad shape %+v: dim must split into an even head size, heads into kv-heads", c)
	}
	headDim := c.Dim / c.Heads
	kvDim := headDim * c.KVHeads
	name := fmt.Sprintf("tinyllama-random-L%d-D%d-F%d-H%d-KV%d", c.Layers, c.Dim, c.FFN, c.Heads, c.KVHeads)
	kv := ggml.KV{
		"general.architecture":         "llama",
		"general.name":                 name,
		"general.description":          fmt.Sprintf("Llama-architecture model with seeded random weights (seed %d): its answers are random tokens of the Llama 3.2 vocabulary. For testing serving, not for use.", c.Seed),
		"general.file_type":            uint32(1), // mostly F16
		"general.quantization_version": uint32(2),

		"llama.vocab_size":                       uint32(vocabSize),
		"llama.block_count":                      uint32(c.Layers),
		"llama.context_length":                   uint32(c.Context),
		"llama.embedding_length":                 uint32(c.Dim),
		"llama.feed_forward_length":              uint32(c.FFN),
		"llama.attention.head_count":             uint32(c.Heads),
		"llama.attention.head_count_kv":          uint32(c.KVHeads),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.dimension_count":             uint32(headDim),
		"llama.rope.freq_base":                   float32(500000),

		"tokenizer.ggml.model":         "gpt2",
		"tokenizer.ggml.pre":           "llama-bpe",
		"tokenizer.ggml.tokens":        t.Tokens,
		"tokenizer.ggml.token_type":    t.Types,
		"tokenizer.ggml.merges":        t.Merges,
		"tokenizer.ggml.bos_token_id":  uint32(bosID),
		"tokenizer.ggml.eos_token_id":  uint32(eotID),
		"tokenizer.ggml.add_bos_token": true,
		"tokenizer.ggml.add_eos_token": false,
	}

	// GGUF shapes are innermost first: a matrix is [in, out]. There is no
	// output.weight: llama.cpp then ties the output projection to
	// token_embd, which halves the file (the vocabulary is most of it).
	ts := []*ggml.Tensor{
		c.matrix("token_embd.weight", c.Dim, vocabSize),
		norm("output_norm.weight", c.Dim),
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			norm(p+"attn_norm.weight", c.Dim),
			c.matrix(p+"attn_q.weight", c.Dim, c.Dim),
			c.matrix(p+"attn_k.weight", c.Dim, kvDim),
			c.matrix(p+"attn_v.weight", c.Dim, kvDim),
			c.matrix(p+"attn_output.weight", c.Dim, c.Dim),
			norm(p+"ffn_norm.weight", c.Dim),
			c.matrix(p+"ffn_gate.weight", c.Dim, c.FFN),
			c.matrix(p+"ffn_up.weight", c.Dim, c.FFN),
			c.matrix(p+"ffn_down.weight", c.FFN, c.Dim),
		)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(f, kv, ts); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// norm is an RMS norm's weight: ones, in F32 as llama.cpp wants norms.
func norm(name string, n int) *ggml.Tensor {
	return &ggml.Tensor{Name: name, Kind: 0, Shape: []uint64{uint64(n)}, WriterTo: onesF32(n)}
}

// matrix is an F16 matrix of random values drawn from its own stream, keyed
// by (seed, name), so that WriteGGUF's parallel writes stay deterministic.
func (c Config) matrix(name string, in, out int) *ggml.Tensor {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &ggml.Tensor{Name: name, Kind: 1, Shape: []uint64{uint64(in), uint64(out)},
		WriterTo: randF16{in * out, c.Seed, h.Sum64()}}
}

type onesF32 int

func (n onesF32) WriteTo(w io.Writer) (int64, error) {
	b := make([]byte, 4*n)
	for i := range int(n) {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(1))
	}
	k, err := w.Write(b)
	return int64(k), err
}

type randF16 struct {
	n           int
	seed, named uint64
}

// WriteTo writes values that are near-normal with std 0.018 (so activations
// and logits stay small and finite): the sum of four uniform 12-bit integers
// times 2^-17. That is integer arithmetic and an exact scaling, unlike
// NormFloat64 (math.Exp, FMA), so the bytes are the same on every platform.
func (t randF16) WriteTo(w io.Writer) (int64, error) {
	r := rand.New(rand.NewPCG(t.seed, t.named))
	bw := bufio.NewWriterSize(w, 1<<20)
	var b [2]byte
	for range t.n {
		u, sum := r.Uint64(), 0
		for range 4 {
			sum += int(u&0xfff) - 2048
			u >>= 16
		}
		binary.LittleEndian.PutUint16(b[:], float16.Fromfloat32(float32(sum)/(1<<17)).Bits())
		if _, err := bw.Write(b[:]); err != nil {
			return 0, err
		}
	}
	return int64(2 * t.n), bw.Flush()
}
