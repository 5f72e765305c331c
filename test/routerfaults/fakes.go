package routerfaults

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiinference/operator/test/routerfaults/world"
)

// The fake engines: HTTP servers on 127.0.0.1 that stand for a replica in
// one way it can misbehave (or, the quick one, for a replica whose speed
// does not matter to the case). None of them is an engine; the healthy
// replicas of the cases that measure serving are real simulators.

// FakeEngine is a fake replica on loopback.
type FakeEngine struct {
	Name, Addr string
	// Requests counts the completions whose body it read whole.
	Requests atomic.Int64
	// stop is closed when the test ends: handlers that hold a request let go.
	stop chan struct{}
}

// Endpoint is the fake as a replica in a world file.
func (f *FakeEngine) Endpoint() world.Endpoint { return world.Endpoint{Name: f.Name, Addr: f.Addr} }

// startFake serves completions with answer, and /metrics with metrics (an
// idle vLLM's when nil), until the test ends.
func startFake(t testing.TB, name string, metrics []byte, answer func(f *FakeEngine, w http.ResponseWriter, r *http.Request, body []byte)) *FakeEngine {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &FakeEngine{Name: name, Addr: l.Addr().String(), stop: make(chan struct{})}
	if metrics == nil {
		metrics = idleMetrics
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(metrics)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		f.Requests.Add(1)
		answer(f, w, r, body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		close(f.stop)
		_ = srv.Close()
	})
	return f
}

// idleMetrics is an idle vLLM's load gauges.
var idleMetrics = []byte(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="fake"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="fake"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="fake"} 0
`)

// answerQuickly answers a completion at once with one word, streamed when
// the request asks for a stream.
func answerQuickly(_ *FakeEngine, w http.ResponseWriter, _ *http.Request, body []byte) {
	if streamRequested(body) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"fake","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"}}]}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"id":"fake","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"fake","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

func streamRequested(body []byte) bool {
	return bytes.Contains(body, []byte(`"stream":true`)) || bytes.Contains(body, []byte(`"stream": true`))
}

// StartQuickEngine is a fake replica that answers every completion at once.
func StartQuickEngine(t testing.TB, name string) *FakeEngine {
	return startFake(t, name, nil, answerQuickly)
}

// StartSlowEngine is a fake replica that reads each request whole and then
// never answers (until the client goes or the test ends): a replica that
// takes minutes to start an answer, as a long prefill on a busy engine does.
func StartSlowEngine(t testing.TB, name string) *FakeEngine {
	return startFake(t, name, nil, func(f *FakeEngine, _ http.ResponseWriter, r *http.Request, _ []byte) {
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
	})
}

// StartFastFailEngine is a fake replica that answers every completion with
// HTTP 500 at once (an engine whose GPU failed, say), while its /metrics
// reads idle: it looks the least loaded replica of all.
func StartFastFailEngine(t testing.TB, name string) *FakeEngine {
	return startFake(t, name, nil, func(_ *FakeEngine, w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"fake engine: CUDA error: an illegal memory access was encountered","type":"InternalServerError","code":500}}`)
	})
}

// StartHugeMetricsEngine is a fake replica whose /metrics is metrics (see
// HugeMetrics), answering completions at once.
func StartHugeMetricsEngine(t testing.TB, name string, metrics []byte) *FakeEngine {
	return startFake(t, name, metrics, answerQuickly)
}

// StartHugeHeadersEngine is a fake replica that answers every completion
// with response headers of about size bytes (headers), then one word.
func StartHugeHeadersEngine(t testing.TB, name string, headers http.Header) *FakeEngine {
	return startFake(t, name, nil, func(f *FakeEngine, w http.ResponseWriter, r *http.Request, body []byte) {
		for k, v := range headers {
			w.Header()[k] = v
		}
		answerQuickly(f, w, r, body)
	})
}

// HugeHeaders are response headers of about size bytes: lines of 1 KiB.
func HugeHeaders(size int) http.Header {
	h := http.Header{}
	value := strings.Repeat("x", 1000)
	for i := 0; i*(len(value)+24) < size; i++ {
		h[fmt.Sprintf("X-Fake-Filler-%06d", i)] = []string{value}
	}
	return h
}

// HugeMetrics is valid vLLM-style Prometheus text of at most size bytes
// (and within a line of it): the load gauges the router reads, then a
// counter of many series, one per label set, as an engine that labels its
// requests by adapter exports.
func HugeMetrics(size int) []byte {
	var b bytes.Buffer
	b.Write(idleMetrics)
	b.WriteString("# HELP vllm:request_success_total Count of successfully processed requests.\n")
	b.WriteString("# TYPE vllm:request_success_total counter\n")
	for i := 0; ; i++ {
		line := fmt.Sprintf("vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"fake\",lora_name=\"adapter-%07d\"} %d\n", i, i%1000)
		if b.Len()+len(line) > size {
			return b.Bytes()
		}
		b.WriteString(line)
	}
}

// SilentEngine is a fake replica that accepts TCP connections and never
// reads from them nor answers (a hung process, a node whose network died
// with the connection half open): its /metrics hangs too.
type SilentEngine struct {
	Name, Addr string
	// Accepted counts the connections it took.
	Accepted atomic.Int64
}

// Endpoint is the fake as a replica in a world file.
func (s *SilentEngine) Endpoint() world.Endpoint { return world.Endpoint{Name: s.Name, Addr: s.Addr} }

// StartSilentEngine holds every connection until the test ends.
func StartSilentEngine(t testing.TB, name string) *SilentEngine {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &SilentEngine{Name: name, Addr: l.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			s.Accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return s
}
