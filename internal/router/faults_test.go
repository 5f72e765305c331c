package router_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// Behaviours of a fakeEngine.
const (
	healthy int32 = iota
	failing       // answers 500 at once, as an engine whose GPU fell off
	silent        // takes the request and never answers
)

// fakeBatch is how many requests a fakeEngine runs at once.
const fakeBatch = 4

// fakeEngine is a fake replica (an httptest server, not an engine): it
// answers completions by its behaviour, streamed or not, and exports a
// vLLM-shaped /metrics as an engine running fakeBatch at once would: its
// own requests in flight, plus the requests others have there (others, set by
// the test), running up to the batch and waiting beyond it.
type fakeEngine struct {
	name     string
	srv      *httptest.Server
	behave   atomic.Int32
	others   atomic.Int64
	live     atomic.Int64
	requests atomic.Int64
}

func newFakeEngine(t *testing.T, name string, behave int32) *fakeEngine {
	e := &fakeEngine{name: name}
	e.behave.Store(behave)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			carried := e.others.Load() + e.live.Load()
			_, _ = fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:num_requests_running{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n",
				max(carried-fakeBatch, 0), min(carried, fakeBatch))
			return
		}
		e.requests.Add(1)
		e.live.Add(1)
		defer e.live.Add(-1)
		body, _ := io.ReadAll(r.Body)
		switch e.behave.Load() {
		case failing:
			http.Error(w, `{"error":"CUDA error"}`, http.StatusInternalServerError)
			return
		case silent:
			<-r.Context().Done()
			return
		}
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) endpoint() router.Endpoint {
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	return router.Endpoint{Name: e.name, Addr: addr, MetricsURL: e.srv.URL + "/metrics", Track: servingv1.TrackStable}
}

func fakeRouter(t *testing.T, opts router.Options, engines ...*fakeEngine) (*routingbench.FixedDirectory, string, *router.Metrics, *prometheus.Registry) {
	t.Helper()
	dir := routingbench.NewFixedDirectory("tenant", "chat", nil)
	var eps []router.Endpoint
	for _, e := range engines {
		eps = append(eps, e.endpoint())
	}
	dir.SetEndpoints(eps)
	reg := prometheus.NewRegistry()
	metrics := router.NewMetrics(reg)
	rt := router.New(opts, dir, router.NetworkPolicyCheck{}, metrics, logr.Discard())
	return dir, routingbench.ServeRouter(t, rt), metrics, reg
}

// complete posts a completion, streamed or not, with its own prompt (a prefix
// of its own, so hashing spreads them) and headers; the status, or 0 when
// no whole answer came within the client's timeout.
func complete(client *http.Client, url string, n int, stream bool, header map[string]string) int {
	body := fmt.Sprintf(`{"model":"m","stream":%v,"prompt":"%s"}`, stream, strings.Repeat(fmt.Sprintf("conversation %d ", n), 40))
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil || (resp.StatusCode == http.StatusOK && !strings.Contains(string(data), "hi")) || strings.Contains(string(data), `"error"`) && resp.StatusCode == http.StatusOK {
		return 0
	}
	return resp.StatusCode
}

// TestAFastFailingReplicaIsTakenOutOfThePicking: one replica of three
// answers 500 at once. It is taken out after its failures in a row, the
// requests it failed before answering go to another, and when it heals its
// trial request brings it back. (Before: 86-97% of the requests failed, the
// failing replica looking the least loaded.)
func TestAFastFailingReplicaIsTakenOutOfThePicking(t *testing.T) {
	bad := newFakeEngine(t, "bad", failing)
	engines := []*fakeEngine{newFakeEngine(t, "good-1", healthy), newFakeEngine(t, "good-2", healthy), bad}
	opts := router.Options{}
	opts.Picker.Outliers.BaseEjection = 300 * time.Millisecond
	_, url, _, reg := fakeRouter(t, opts, engines...)
	client := &http.Client{Timeout: 5 * time.Second}
	failed := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for n := range 200 {
		wg.Go(func() {
			if complete(client, url, n, n%2 == 0, nil) != http.StatusOK {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		})
		if n%10 == 9 {
			wg.Wait() // waves of 10: a burst past the retry budget fails some, by design
		}
	}
	wg.Wait()
	if failed > 2 {
		t.Errorf("%d of 200 requests failed with one fast-failing replica of three; want at most 1%%", failed)
	}
	if got := testutil.ToFloat64(gaugeOf(t, reg, "aiinference_router_ejected_endpoints", "bad")); got != 1 {
		t.Errorf("the failing replica's ejected gauge is %v, want 1", got)
	}
	seen := bad.requests.Load()
	t.Logf("the failing replica saw %d requests of 200", seen)
	if seen > 40 {
		t.Errorf("the failing replica saw %d of 200 requests: it kept drawing traffic", seen)
	}
	// Healed: after its ejection a trial request brings it back.
	bad.behave.Store(healthy)
	time.Sleep(400 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for n := 1000; testutil.ToFloat64(gaugeOf(t, reg, "aiinference_router_ejected_endpoints", "bad")) != 0; n++ {
		if time.Now().After(deadline) {
			t.Fatal("the healed replica was not brought back within 5 s of requests")
		}
		complete(client, url, n, false, nil)
	}
}

// gaugeOf is one series of a vector metric, by its endpoint label.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, endpoint string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == endpoint {
					g.Set(m.GetGauge().GetValue())
				}
			}
		}
	}
	return g
}

// TestASilentReplicaLosesNoRequest: one replica of three takes requests and
// never answers. Streamed requests hashed to it go to another once its
// headers are late, well within the client's 3 s. (Before: 16-17 of 80 lost,
// waiting out the 10-minute header timeout.)
func TestASilentReplicaLosesNoRequest(t *testing.T) {
	engines := []*fakeEngine{newFakeEngine(t, "good-1", healthy), newFakeEngine(t, "good-2", healthy), newFakeEngine(t, "mute", silent)}
	_, url, _, _ := fakeRouter(t, router.Options{StreamHeaderTimeout: 500 * time.Millisecond}, engines...)
	client := &http.Client{Timeout: 3 * time.Second}
	var lost atomic.Int64
	var wg sync.WaitGroup
	for n := range 80 {
		wg.Go(func() {
			if complete(client, url, n, true, nil) != http.StatusOK {
				lost.Add(1)
			}
		})
		time.Sleep(25 * time.Millisecond) // 40 requests a second
	}
	wg.Wait()
	if lost.Load() > 0 {
		t.Errorf("%d of 80 streamed requests lost to a silent replica", lost.Load())
	}
	if engines[2].requests.Load() == 0 {
		t.Error("no request went to the silent replica: the test shows nothing")
	}
}

// TestSheddableIsShedBeforeCritical: while every replica's engine queues
// past the saturation bound, Sheddable requests are answered 429 with
// Retry-After at once, and Critical and Standard ones wait in the router and
// are answered once the queue goes down.
func TestSheddableIsShedBeforeCritical(t *testing.T) {
	e := newFakeEngine(t, "only", healthy)
	e.others.Store(20)
	dir, url, _, _ := fakeRouter(t, router.Options{ScrapeInterval: 50 * time.Millisecond}, e)
	dir.Update(func(obj *servingv1.AIInference) {
		obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true, Objectives: []servingv1.RoutingObjective{
			{Name: "batch", Priority: servingv1.PrioritySheddable}, {Name: "chat", Priority: servingv1.PriorityCritical}}}
	})
	client := &http.Client{Timeout: 10 * time.Second}
	// A first request lets the router learn the replica and read its queue.
	if got := complete(client, url, 0, false, nil); got != http.StatusOK {
		t.Fatalf("first request: %d", got)
	}
	time.Sleep(200 * time.Millisecond)
	begin := time.Now()
	if got := complete(client, url, 1, false, map[string]string{servingv1.ObjectiveHeader: "batch"}); got != http.StatusTooManyRequests {
		t.Errorf("a Sheddable request to a saturated model: %d, want 429", got)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("shedding took %s", d)
	}
	if got := complete(client, url, 2, false, map[string]string{servingv1.ObjectiveHeader: "unknown"}); got != http.StatusBadRequest {
		t.Errorf("an objective the spec does not list: %d, want 400", got)
	}
	results := make(chan int, 2)
	for n, objective := range []string{"chat", ""} {
		go func() {
			results <- complete(client, url, 3+n, false, map[string]string{servingv1.ObjectiveHeader: objective})
		}()
	}
	select {
	case got := <-results:
		t.Fatalf("a queued request was answered %d while the replica stayed saturated", got)
	case <-time.After(500 * time.Millisecond):
	}
	e.others.Store(0)
	for range 2 {
		if got := <-results; got != http.StatusOK {
			t.Errorf("a queued request once the queue went down: %d", got)
		}
	}
}

// TestHugeReadingsDoNotBreakThePicking: a replica whose /metrics says 1e308
// requests wait is read as very busy, not as an overflow that fails every
// request.
func TestHugeReadingsDoNotBreakThePicking(t *testing.T) {
	p := router.NewPicker(router.PickerOptions{})
	eps := []router.Endpoint{{Name: "a"}, {Name: "b"}}
	p.SetEngineLoad("a", router.EngineLoad{Waiting: 1e308, Running: 1e308, KVCacheUsage: 1e308, At: time.Now()})
	p.SetEngineLoad("b", router.EngineLoad{Waiting: 1e308, Running: 1e308, KVCacheUsage: 1e308, At: time.Now()})
	for range 10 {
		pick, ok := p.Pick(eps, nil, "")
		if !ok || pick.Endpoint.Name == "" {
			t.Fatalf("no replica picked: %+v", pick)
		}
	}
}

// TestAHeldRequestIsCheckedAgainstThePolicyWhenReleased: a request held
// while the model has no serving replica is refused, not delivered, when the
// model's policy changed meanwhile to refuse its client.
func TestAHeldRequestIsCheckedAgainstThePolicyWhenReleased(t *testing.T) {
	e := newFakeEngine(t, "late", healthy)
	dir := routingbench.NewFixedDirectory("tenant", "chat", nil)
	policy := &switchablePolicy{}
	policy.admit.Store(true)
	url := routingbench.ServeRouter(t, router.New(router.Options{Poll: 20 * time.Millisecond}, dir, policy, nil, logr.Discard()))
	done := make(chan int, 1)
	go func() { done <- complete(&http.Client{Timeout: 10 * time.Second}, url, 0, false, nil) }()
	time.Sleep(300 * time.Millisecond)
	policy.admit.Store(false)
	dir.SetEndpoints([]router.Endpoint{e.endpoint()})
	if got := <-done; got != http.StatusForbidden {
		t.Errorf("a held request after its model's policy changed to refuse its client: %d, want 403", got)
	}
	if n := e.requests.Load(); n != 0 {
		t.Errorf("the replica got %d requests the policy refuses", n)
	}
}

// switchablePolicy is a fake router.IngressPolicy that admits every client
// or none (router.NetworkPolicyCheck, the real one, is tested in sim_test.go).
type switchablePolicy struct{ admit atomic.Bool }

func (p *switchablePolicy) Admits(context.Context, *servingv1.AIInference, netip.Addr) (bool, error) {
	return p.admit.Load(), nil
}

// TestHugeResponseHeadersAreRefused: a replica's answer with 8 MiB of
// headers is refused (502) rather than held for the client.
func TestHugeResponseHeadersAreRefused(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 128 {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("x", 64<<10))
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(big.Close)
	_, url, _, _ := fakeRouter(t, router.Options{MaxRetries: -1}, &fakeEngine{name: "big", srv: big})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("an answer with 8 MiB of headers: %d %s, want 502", resp.StatusCode, line)
	}
}
