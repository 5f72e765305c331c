package autoscale

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

func spec(min, max int32, targets servingv1.AutoscalingTargets) *servingv1.AutoscalingSpec {
	return &servingv1.AutoscalingSpec{MinReplicas: ptr.To(min), MaxReplicas: max, Targets: targets}
}

func TestRecommend(t *testing.T) {
	queue2 := servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](2)}
	cases := []struct {
		name             string
		a                *servingv1.AutoscalingSpec
		current, serving int32
		sums             Signals
		want             int32
	}{
		{"a queue of 9 over a target of 2 asks for 5", spec(1, 10, queue2), 1, 1, Signals{servingv1.SignalQueueDepth: 9}, 5},
		{"no queue goes to the minimum", spec(1, 10, queue2), 3, 3, Signals{servingv1.SignalQueueDepth: 0}, 1},
		{"never above the maximum", spec(1, 4, queue2), 1, 1, Signals{servingv1.SignalQueueDepth: 100}, 4},
		{"within 10% of the target: no change", spec(1, 10, queue2), 3, 3, Signals{servingv1.SignalQueueDepth: 6.5}, 3},
		{"the largest of several targets", spec(1, 10, servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](10), KVCacheUtilization: ptr.To[int32](80)}),
			2, 2, Signals{servingv1.SignalQueueDepth: 1, servingv1.SignalKVCacheUtilization: 1.9}, 3},
	}
	for _, c := range cases {
		got, readings := Recommend(c.a, c.current, c.serving, c.sums)
		if got != c.want {
			t.Errorf("%s: got %d, want %d (%+v)", c.name, got, c.want, readings)
		}
	}
}

// A load that rises and falls each minute must not move the count up and down
// each minute: the scale-down window holds the highest recent recommendation.
func TestSawtoothLoadDoesNotFlap(t *testing.T) {
	start := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	var h History
	current := int32(1)
	changes := 0
	for i := range 60 * 6 { // six minutes, a reading every second
		now := start.Add(time.Duration(i) * time.Second)
		rec := int32(1)
		if (i/30)%2 == 0 {
			rec = 3 // high for 30 s, low for 30 s
		}
		h.Add(Recommendation{Time: now, Replicas: rec}, 5*time.Minute)
		next := h.Stabilize(now, current, 0, 5*time.Minute)
		if next != current {
			changes++
			current = next
		}
	}
	if changes != 1 || current != 3 {
		t.Errorf("%d changes, ending at %d; want one change, up to 3", changes, current)
	}
}

// After the operator restarts, its history is empty: it may scale up at
// once but scales down only after a whole window of low readings.
func TestNoScaleDownBeforeAWholeWindow(t *testing.T) {
	start := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	var h History
	for i := range 299 {
		now := start.Add(time.Duration(i) * time.Second)
		h.Add(Recommendation{Time: now, Replicas: 1}, 5*time.Minute)
		if got := h.Stabilize(now, 4, 0, 5*time.Minute); got != 4 {
			t.Fatalf("after %d s: scaled down to %d before a whole window", i, got)
		}
	}
	now := start.Add(5 * time.Minute)
	h.Add(Recommendation{Time: now, Replicas: 1}, 5*time.Minute)
	if got := h.Stabilize(now, 4, 0, 5*time.Minute); got != 1 {
		t.Fatalf("after a whole window of 1: got %d", got)
	}
	h.Add(Recommendation{Time: now.Add(time.Second), Replicas: 6}, 5*time.Minute)
	if got := h.Stabilize(now.Add(time.Second), 1, 0, 5*time.Minute); got != 6 {
		t.Fatalf("scale up: got %d, want 6 at once", got)
	}
}

func TestScrape(t *testing.T) {
	vllm, _ := engine.For(servingv1.EngineVLLM)
	body := map[string]string{
		"/ok": `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3
vllm:num_requests_waiting{model_name="b"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.5
`,
		"/nan":     "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0.1\n",
		"/missing": "vllm:num_requests_running 1\n",
		"/html":    "<html>hello</html>\n",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, ok := body[r.URL.Path]; ok {
			_, _ = w.Write([]byte(b))
			return
		}
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	wanted := []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalKVCacheUtilization}
	got, err := Scrape(context.Background(), srv.URL+"/ok", wanted, vllm.SignalMetrics)
	if err != nil || got[servingv1.SignalQueueDepth] != 5 || got[servingv1.SignalKVCacheUtilization] != 0.5 {
		t.Fatalf("got %v, %v; want the sum of the model series: 5 waiting, 0.5 KV cache", got, err)
	}
	for path, want := range map[string]string{"/nan": "reads NaN", "/missing": "exports no QueueDepth (looked for vllm:num_requests_waiting)",
		"/html": "not Prometheus text", "/down": "answered HTTP 503"} {
		if _, err := Scrape(context.Background(), srv.URL+path, wanted, vllm.SignalMetrics); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error saying %q", path, err, want)
		}
	}
}

// The engine's pod is the user's. A /metrics that redirects (to an address the
// operator can reach and the user cannot, or to a target that reads a long
// queue) is not followed; an answer that is not Prometheus text is not quoted
// in the error, which goes into status. Nothing of the operator's is sent.
func TestScrapeTrustsNothingOfTheAnswer(t *testing.T) {
	vllm, _ := engine.For(servingv1.EngineVLLM)
	var reached atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "vllm:num_requests_waiting 100\nvllm:kv_cache_usage_perc 0.1\nTOPSECRET internal data\n")
	}))
	defer target.Close()
	var sent http.Header
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent = r.Header.Clone()
		if r.URL.Path == "/metrics" {
			http.Redirect(w, r, target.URL+"/metrics", http.StatusFound)
			return
		}
		_, _ = io.WriteString(w, "TOPSECRET internal data\n")
	}))
	defer engine.Close()
	wanted := []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth}
	_, err := Scrape(context.Background(), engine.URL+"/metrics", wanted, vllm.SignalMetrics)
	if err == nil || !strings.Contains(err.Error(), "answered HTTP 302") || reached.Load() != 0 {
		t.Errorf("a redirect: got %v, the target reached %d times", err, reached.Load())
	}
	if sent.Get("Authorization") != "" || sent.Get("Cookie") != "" {
		t.Errorf("sent credentials: %v", sent)
	}
	_, err = Scrape(context.Background(), engine.URL+"/other", wanted, vllm.SignalMetrics)
	if err == nil || strings.Contains(err.Error(), "TOPSECRET") {
		t.Errorf("an answer that is not Prometheus text: %v", err)
	}
}
