package router_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// A request naming one of the model's LoRA adapters goes only to the replicas
// that status.adapters says serve it; while none does, it is answered 503 with
// Retry-After rather than sent to a replica that would not know the name. The
// namespace's address finds the model by the adapter's name and lists the
// adapters beside their base model, as vLLM's /v1/models does.
func TestAnAdapterGoesToTheReplicasThatServeIt(t *testing.T) {
	sims := routingbench.StartSims(t, 3, fast)
	url, dir, _ := routerFor(t, router.Options{}, sims...)
	dir.Update(func(o *servingv1.AIInference) {
		o.Spec.Adapters = []servingv1.AdapterSpec{{Name: "sql-lora"}, {Name: "chat-lora"}}
		o.Status.Adapters = []servingv1.AdapterStatus{{Name: "sql-lora", ServingReplicas: 1, Pods: []string{sims[2].Name}}, {Name: "chat-lora"}}
	})
	send := func(model, prompt string) (int, string) {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
		return resp.StatusCode, resp.Header.Get(router.EndpointHeader)
	}
	for i := range 12 {
		// Different prompts: prefix affinity alone would spread them.
		if _, endpoint := send("sql-lora", fmt.Sprintf("question %d: %s", i, strings.Repeat("x", i*50))); endpoint != sims[2].Name {
			t.Errorf("request %d for sql-lora went to %q, want %s, the one replica serving it", i, endpoint, sims[2].Name)
		}
	}
	if code, endpoint := send("chat-lora", "hello"); code != http.StatusServiceUnavailable || endpoint != "" {
		t.Errorf("an adapter no replica serves yet: HTTP %d from %q, want 503 from none", code, endpoint)
	}
	seen := map[string]bool{}
	for i := range 12 {
		_, endpoint := send(routingbench.Model, fmt.Sprintf("question %d: %s", i, strings.Repeat("y", i*50)))
		seen[endpoint] = true
	}
	if len(seen) < 2 {
		t.Errorf("base-model requests all went to %v: the adapter's bound must not hold for them", seen)
	}

	dir.NamespaceAddress()
	if _, endpoint := send("sql-lora", "through the namespace's address"); endpoint != sims[2].Name {
		t.Errorf("sql-lora through the namespace's address went to %q, want %s", endpoint, sims[2].Name)
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var list struct {
		Data []struct{ ID, Parent string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range list.Data {
		got[m.ID] = m.Parent
	}
	want := map[string]string{routingbench.Model: "", "sql-lora": routingbench.Model, "chat-lora": routingbench.Model}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("/v1/models lists %v, want %v (id: parent)", got, want)
	}
}
