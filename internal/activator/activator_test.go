package activator

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

var model = types.NamespacedName{Namespace: "ml", Name: "llm"}

// stubResolver stands in for the cluster: one model, whose backend appears
// when the test sets it.
type stubResolver struct {
	mu      sync.Mutex
	backend string
}

func (s *stubResolver) Route(_ context.Context, host string) (types.NamespacedName, bool) {
	return model, strings.HasPrefix(host, "llm")
}

func (s *stubResolver) Backend(context.Context, types.NamespacedName) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend, nil
}

func (s *stubResolver) set(backend string) {
	s.mu.Lock()
	s.backend = backend
	s.mu.Unlock()
}

func start(t *testing.T, opts Options) (*Activator, *stubResolver, string, *atomic.Int32) {
	t.Helper()
	res := &stubResolver{}
	woken := &atomic.Int32{}
	a := New(opts, res, func(types.NamespacedName) { woken.Add(1) }, logr.Discard())
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, res, srv.URL, woken
}

func send(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Host = "llm.ml.svc:8000"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(data)
}

// An engine that echoes the request's path and body.
func engine(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "served "+r.URL.Path+" "+string(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestAHeldRequestIsServedOnceAReplicaServes(t *testing.T) {
	a, res, url, woken := start(t, Options{})
	backend := engine(t)
	go func() {
		for a.Held(model) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		res.set(backend)
	}()
	begin := time.Now()
	resp, body := send(t, url, `{"model":"llm","prompt":"hi"}`)
	if resp.StatusCode != http.StatusOK || body != `served /v1/completions {"model":"llm","prompt":"hi"}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if waited := time.Since(begin); waited < 300*time.Millisecond {
		t.Errorf("answered after %s, before the replica served", waited)
	}
	if woken.Load() != 1 || a.Held(model) != 0 {
		t.Errorf("woken %d times, %d still held", woken.Load(), a.Held(model))
	}
}

func TestPastTheBoundARequestIsRefusedAtOnce(t *testing.T) {
	a, _, url, _ := start(t, Options{MaxHeld: 2, Timeout: 2 * time.Second})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { send(t, url, "{}") })
	}
	for a.Held(model) < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	begin := time.Now()
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || time.Since(begin) > 500*time.Millisecond {
		t.Errorf("the third request: %d (Retry-After %q) after %s: %s", resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(begin), body)
	}
	wg.Wait()
}

func TestNoReplicaInTimeIsA503WithRetryAfter(t *testing.T) {
	_, _, url, _ := start(t, Options{Timeout: 300 * time.Millisecond})
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "no replica of ml/llm served within 300ms") {
		t.Errorf("got %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// The operator stops while requests wait: they are answered at once.
func TestStoppingAnswersWhatIsHeld(t *testing.T) {
	a, _, url, _ := start(t, Options{})
	go func() {
		for a.Held(model) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		a.Stop()
	}()
	begin := time.Now()
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "the operator is stopping") || time.Since(begin) > 2*time.Second {
		t.Errorf("got %d after %s: %s", resp.StatusCode, time.Since(begin), body)
	}
}

func TestUnknownHostIsNotHeld(t *testing.T) {
	_, _, url, _ := start(t, Options{})
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
	req.Host = "other:8000"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("got %d, want 404", resp.StatusCode)
	}
}

// A streaming client gets its headers at once and comments while it waits,
// then the replica's events.
func TestAStreamingClientIsKeptAliveWhileItWaits(t *testing.T) {
	a, res, url, _ := start(t, Options{Keepalive: 100 * time.Millisecond})
	backend := engine(t)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"llm","stream":true}`))
	req.Host = "llm"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(resp.Body)
	comments := 0
	for lines.Scan() && comments < 3 {
		if strings.HasPrefix(lines.Text(), ":") {
			comments++
		}
	}
	if a.Held(model) != 1 {
		t.Fatalf("held %d", a.Held(model))
	}
	res.set(backend)
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), `served /v1/completions {"model":"llm","stream":true}`) {
		t.Errorf("after the comments: %q", rest)
	}
}
