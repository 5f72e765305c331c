package router

import (
	"encoding/json"

	"github.com/cespare/xxhash/v2"
)

// request is what the router reads of an OpenAI request body.
type request struct {
	Model    string          `json:"model"`
	Stream   bool            `json:"stream"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// parseRequest reads the fields the router routes by; a body that is not a
// JSON object routes as one with no prompt (the engine answers what is wrong).
func parseRequest(body []byte) request {
	var r request
	_ = json.Unmarshal(body, &r)
	return r
}

// withModel is body with its "model" set to model and its other fields as
// they were (their order aside); body itself when it is not a JSON object.
func withModel(body []byte, model string) []byte {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return body
	}
	fields["model"], _ = json.Marshal(model)
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}

// promptText is the text whose prefix the engine caches: the prompt of a
// completion, or the chat messages in order (role and content), as the
// engine's chat template lays them one after the other. A turn of a
// conversation resends the turns before it, so its text starts with theirs.
func (r request) promptText() []byte {
	if len(r.Messages) == 0 {
		var s string
		if json.Unmarshal(r.Prompt, &s) == nil {
			return []byte(s)
		}
		return r.Prompt // token ids or a list of prompts: their JSON is as stable
	}
	var text []byte
	for _, m := range r.Messages {
		text = append(text, m.Role...)
		text = append(text, 0)
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			text = append(text, s...)
		} else {
			text = append(text, m.Content...)
		}
		text = append(text, 0)
	}
	return text
}

// blockHashes are the chained hashes of the text's whole blocks: the i-th
// hashes block i and the hash before it, so that two texts share the i-th hash
// only when they share their first i+1 blocks, as an engine's prefix cache
// matches blocks. A partial last block is left out: engines cache whole blocks.
// xxhash has no per-process seed, so router replicas agree on every hash.
func blockHashes(text []byte, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	n := len(text) / blockSize
	hashes := make([]uint64, 0, n)
	var prev [8]byte
	d := xxhash.New()
	for i := range n {
		d.Reset()
		_, _ = d.Write(prev[:])
		_, _ = d.Write(text[i*blockSize : (i+1)*blockSize])
		h := d.Sum64()
		hashes = append(hashes, h)
		for j := range prev {
			prev[j] = byte(h >> (8 * j))
		}
	}
	return hashes
}
