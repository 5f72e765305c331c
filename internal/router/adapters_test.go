package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
		resp := sendCompletion(t, url, model, prompt)
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

// Among the replicas that serve an adapter, the router prefers the one whose
// engine runs it now (vllm:lora_requests_info, read from each simulator's
// /metrics): with sql-lora loaded on three simulators and running on one,
// requests for it with unrelated prompts all go there, counted as
// aiinference_router_picks_total{reason="adapter"}.
func TestAnAdapterGoesWhereItIsActive(t *testing.T) {
	profile := fast
	profile.MaxLoras = 2
	sims := routingbench.StartSims(t, 3, profile)
	url, dir, reg := routerFor(t, router.Options{ScrapeInterval: 100 * time.Millisecond}, sims...)
	var pods []string
	for _, s := range sims {
		body := `{"lora_name":"sql-lora","lora_path":"/models/.adapters/sql-lora"}`
		resp, err := http.Post("http://"+s.Addr+"/v1/load_lora_adapter", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("loading sql-lora into %s: HTTP %d", s.Name, resp.StatusCode)
		}
		pods = append(pods, s.Name)
	}
	dir.Update(func(o *servingv1.AIInference) {
		o.Spec.Adapters = []servingv1.AdapterSpec{{Name: "sql-lora"}}
		o.Status.Adapters = []servingv1.AdapterStatus{{Name: "sql-lora", ServingReplicas: 3, Pods: pods}}
	})
	send := func(model, prompt string) string {
		resp := sendCompletion(t, url, model, prompt)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d", model, resp.StatusCode)
		}
		return resp.Header.Get(router.EndpointHeader)
	}
	send(routingbench.Model, "the router reads the replicas of a model it has routed to")

	// A long sql-lora request runs on sims[1], sent to it directly.
	busy := sims[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan struct{})
	go func() {
		defer close(held)
		body := `{"model":"sql-lora","prompt":"a long answer","max_tokens":2000,"ignore_eos":true,"stream":true}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+busy.Addr+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(scrapeText(t, busy), `running_lora_adapters="sql-lora"`) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reported sql-lora running:\n%s", busy.Name, scrapeText(t, busy))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a few of the router's scrapes

	for i := range 8 {
		// Unrelated prompts: the ring alone would spread them.
		if endpoint := send("sql-lora", fmt.Sprintf("question %d: %s", i, strings.Repeat("z", i*60))); endpoint != busy.Name {
			t.Errorf("request %d for sql-lora went to %q, want %s, where it runs", i, endpoint, busy.Name)
		}
	}
	if got := metric(t, reg, "aiinference_router_picks_total", map[string]string{"endpoint": busy.Name, "reason": router.ReasonAdapter}); got != 8 {
		t.Errorf("picks{reason=adapter} at %s: %v, want 8", busy.Name, got)
	}
	cancel()
	<-held
}

// sendCompletion posts a two-token completion for model to the router at url
// and returns its answer, the body read and closed.
func sendCompletion(t *testing.T, url, model, prompt string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

// scrapeText is a simulator's /metrics.
func scrapeText(t *testing.T, s *routingbench.Sim) string {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
