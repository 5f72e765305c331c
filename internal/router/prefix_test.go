package router

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

func TestARequestIsReadForWhatRoutingNeeds(t *testing.T) {
	chat, err := parseRequest([]byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"hello"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(bytes.Join(chat.prompt, nil)); got != "system\x00hello\x00user\x00[{\"type\":\"text\",\"text\":\"hi\"}]\x00" {
		t.Errorf("chat text %q", got)
	}
	if chat.Model != "m" || !chat.Stream {
		t.Errorf("model %q, stream %v", chat.Model, chat.Stream)
	}
	completion, _ := parseRequest([]byte(`{"prompt":"a\"b\u00e9", "model" : "x", "n": [1,{"k":[]}]}`))
	if got := string(bytes.Join(completion.prompt, nil)); got != "a\"bé" || completion.Model != "x" || completion.Stream {
		t.Errorf("completion %q, model %q, stream %v", got, completion.Model, completion.Stream)
	}
	// A key written with escapes is the key a Python or Go parser reads.
	escaped, _ := parseRequest([]byte(`{"mod\u0065l":"y"}`))
	if escaped.Model != "y" {
		t.Errorf("escaped key: model %q", escaped.Model)
	}
	for _, body := range []string{`{"model":"a","model":"b"}`, `{"model":"a","mod\u0065l":"b"}`, `{"messages":[],"messages":[]}`} {
		if _, err := parseRequest([]byte(body)); !errors.Is(err, errDuplicateField) {
			t.Errorf("%s: %v, want a refusal of the field given twice", body, err)
		}
	}
	for _, body := range []string{``, `[]`, `{"model":`, `{"model":"a"`, `{"model":"a"}x`, `not json`, `{"prompt":"x",}`} {
		r, err := parseRequest([]byte(body))
		if err != nil || r.Model != "" || len(r.prompt) != 0 {
			t.Errorf("%q: %+v, %v; want an empty request for the engine to refuse", body, r, err)
		}
	}
}

func TestManyMessagesAreRefusedAndCostNoMemory(t *testing.T) {
	// 8 MiB of empty messages: millions of elements.
	body := []byte(`{"model":"chat","messages":[` + strings.Repeat(`{},`, 8<<20/3) + `{}]}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := parseRequest(body)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errTooManyMessages) {
		t.Errorf("%v, want the request refused for its count of messages", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 8<<20 {
		t.Errorf("reading an 8 MiB body allocated %d MiB; it must cost little more than the pieces of at most %d messages", allocated>>20, MaxMessages)
	}
	// Under the bound: the pieces only.
	body = []byte(`{"model":"chat","messages":[` + strings.Repeat(`{"role":"user","content":"`+strings.Repeat("x", 500)+`"},`, MaxMessages-1) + `{}]}`)
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := parseRequest(body)
	runtime.ReadMemStats(&after)
	if err != nil || len(r.prompt) != 4*MaxMessages {
		t.Fatalf("%d pieces, %v", len(r.prompt), err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > uint64(len(body))/2 {
		t.Errorf("reading a %d MiB body allocated %d MiB: the prompt must stay in the body", len(body)>>20, allocated>>20)
	}
}

func TestPiecesHashAsTheTextTheyMake(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, 5000)
	for i := range text {
		text[i] = byte('a' + rng.IntN(26))
	}
	want := blockHashes(text, 256)
	for range 50 {
		var pieces [][]byte
		for rest := text; len(rest) > 0; {
			n := min(len(rest), rng.IntN(600))
			pieces, rest = append(pieces, rest[:n]), rest[n:]
		}
		got := blockHashesOf(pieces, 256)
		if len(got) != len(want) {
			t.Fatalf("%d hashes, want %d", len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("block %d differs when the text comes in %d pieces", i, len(pieces))
			}
		}
	}
}

func TestTheModelIsRewrittenInPlace(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi"}], "model" : "reviews" ,"max_tokens":3}`)
	r, _ := parseRequest(body)
	if got := string(withModel(body, r, `llama "3"`)); got != `{"messages":[{"role":"user","content":"hi"}], "model" : "llama \"3\"" ,"max_tokens":3}` {
		t.Errorf("rewritten %s", got)
	}
	none := []byte(`{"prompt":"x"}`)
	r, _ = parseRequest(none)
	if got := withModel(none, r, "m"); string(got) != string(none) {
		t.Errorf("a body without a model became %s", got)
	}
}
