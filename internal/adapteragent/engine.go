package adapteragent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// vllmAPI is vLLM's adapter API, on the engine's own port in the pod
// (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, --enable-lora).
//
// Checked against vLLM v0.11.0, vllm/entrypoints/openai/api_server.py and
// serving_models.py: POST /v1/load_lora_adapter {"lora_name", "lora_path"}
// answers 200, or 400 with the reason ("has already been loaded", a path it
// cannot read); POST /v1/unload_lora_adapter {"lora_name"} answers 200, or 404
// when it is not loaded; GET /v1/models lists each loaded adapter with its
// path as "root" and the base model as "parent" (the base model's parent is
// null). llm-d-inference-sim serves the same three.
type vllmAPI struct {
	url    string
	client *http.Client
}

// maxAnswerBytes bounds what is read of an engine's answer.
const maxAnswerBytes = 1 << 20

// engineCallTimeout bounds one call to the engine.
const engineCallTimeout = 30 * time.Second

func newVLLMAPI(url string) *vllmAPI {
	return &vllmAPI{url: strings.TrimSuffix(url, "/"), client: &http.Client{
		// No proxy: the engine is in the same pod. No redirect either.
		Transport:     &http.Transport{Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       engineCallTimeout,
	}}
}

// loaded lists the adapters the engine serves, by name, with their paths.
func (e *vllmAPI) loaded(ctx context.Context) (map[string]string, error) {
	var models struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := e.call(ctx, http.MethodGet, "/v1/models", nil, &models); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range models.Data {
		if m.Parent != nil {
			out[m.ID] = m.Root
		}
	}
	return out, nil
}

func (e *vllmAPI) load(ctx context.Context, name, path string) error {
	return e.call(ctx, http.MethodPost, "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": path}, nil)
}

func (e *vllmAPI) unload(ctx context.Context, name string) error {
	err := e.call(ctx, http.MethodPost, "/v1/unload_lora_adapter", map[string]string{"lora_name": name}, nil)
	var refused *engineError
	if errors.As(err, &refused) && refused.status == http.StatusNotFound {
		return nil // already gone
	}
	return err
}

// engineError is an answer of the engine other than 2xx.
type engineError struct {
	status int
	body   string
}

func (e *engineError) Error() string {
	return fmt.Sprintf("the engine answered %d: %s", e.status, e.body)
}

func (e *vllmAPI) call(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &engineError{status: resp.StatusCode, body: strings.TrimSpace(string(data))}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("reading the engine's answer to %s: %w", path, err)
	}
	return nil
}
