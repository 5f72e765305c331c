package warmup

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine is a stand-in for the engine in the pod (an httptest server, not a
// model server): /health always answers 200, and each completion request is
// answered by complete, which gets the request's number (from 1).
type fakeEngine struct {
	*httptest.Server
	requests atomic.Int32
	mu       sync.Mutex
	bodies   []map[string]any
}

func newFakeEngine(t *testing.T, path string, complete func(n int32, w http.ResponseWriter)) *fakeEngine {
	e := &fakeEngine{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "not a JSON request", http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.bodies = append(e.bodies, body)
		e.mu.Unlock()
		complete(e.requests.Add(1), w)
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

// openAIAnswer is the shape of a vLLM completion.
const openAIAnswer = `{"id":"cmpl-1","object":"text_completion","model":"llama","choices":[{"index":0,"text":" world","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`

func testOptions(url string) Options {
	return Options{API: APIOpenAI, EngineURL: url, Model: "llama", Prompt: DefaultPrompt,
		Timeout: 5 * time.Second, RequestTimeout: time.Second, Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func readiness(t *testing.T, g *Gate) int {
	t.Helper()
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, ReadyPath, nil))
	return rec.Code
}

func TestWarmSucceedsAfterFailuresAndThenSendsNothing(t *testing.T) {
	const failures = 3
	engine := newFakeEngine(t, "/v1/completions", func(n int32, w http.ResponseWriter) {
		if n <= failures {
			http.Error(w, `{"error":"engine still loading"}`, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, openAIAnswer)
	})
	g := New(testOptions(engine.URL))
	if code := readiness(t, g); code != http.StatusServiceUnavailable {
		t.Fatalf("readiness before any completion: %d, want 503", code)
	}
	if err := g.Warm(context.Background(), quietLog()); err != nil {
		t.Fatal(err)
	}
	if got := engine.requests.Load(); got != failures+1 {
		t.Errorf("%d completion requests, want %d", got, failures+1)
	}
	if code := readiness(t, g); code != http.StatusOK {
		t.Errorf("readiness after a completion: %d, want 200", code)
	}
	want := map[string]any{"model": "llama", "prompt": "Hello", "max_tokens": float64(1)}
	for i, body := range engine.bodies {
		if !equalJSON(body, want) {
			t.Errorf("request %d: body %v, want %v", i+1, body, want)
		}
	}
	// Warm: readiness is served from memory, and the engine hears nothing more.
	for range 5 {
		readiness(t, g)
	}
	time.Sleep(100 * time.Millisecond)
	if got := engine.requests.Load(); got != failures+1 {
		t.Errorf("the gate sent %d more requests once warm", got-(failures+1))
	}
}

func TestWarmSendsTGIsGenerateRequest(t *testing.T) {
	engine := newFakeEngine(t, "/generate", func(_ int32, w http.ResponseWriter) {
		io.WriteString(w, `{"generated_text":" world"}`)
	})
	opts := testOptions(engine.URL)
	opts.API, opts.Model, opts.Prompt = APITGI, "", "Bonjour"
	g := New(opts)
	if err := g.Warm(context.Background(), quietLog()); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"inputs": "Bonjour", "parameters": map[string]any{"max_new_tokens": float64(1)}}
	if len(engine.bodies) != 1 || !equalJSON(engine.bodies[0], want) {
		t.Errorf("bodies %v, want one %v", engine.bodies, want)
	}
}

// An engine whose health endpoint answers 200 but whose completions fail, or
// answer with something that is not a completion, never makes the gate ready.
func TestHealthyEngineWithoutCompletionsNeverGetsReady(t *testing.T) {
	answers := map[string]func(int32, http.ResponseWriter){
		"500": func(_ int32, w http.ResponseWriter) {
			http.Error(w, `{"error":"CUDA out of memory"}`, http.StatusInternalServerError)
		},
		"unknown model": func(_ int32, w http.ResponseWriter) {
			http.Error(w, `{"error":"The model llama does not exist."}`, http.StatusNotFound)
		},
		"200 without choices": func(_ int32, w http.ResponseWriter) { io.WriteString(w, `{"choices":[]}`) },
		"200 not JSON":        func(_ int32, w http.ResponseWriter) { io.WriteString(w, "<html>proxy</html>") },
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			engine := newFakeEngine(t, "/v1/completions", answer)
			resp, err := http.Get(engine.URL + "/health")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("the fake engine's health: %v %v", resp, err)
			}
			resp.Body.Close()
			opts := testOptions(engine.URL)
			opts.Timeout = 300 * time.Millisecond
			g := New(opts)
			done := make(chan error, 1)
			go func() { done <- g.Warm(context.Background(), quietLog()) }()
			for {
				select {
				case err := <-done:
					if err == nil || g.Ready() {
						t.Fatal("the gate got ready without a completion")
					}
					if !strings.Contains(err.Error(), "no completion from the engine") {
						t.Errorf("error %q", err)
					}
					if engine.requests.Load() < 2 {
						t.Errorf("only %d attempts in %s", engine.requests.Load(), opts.Timeout)
					}
					return
				default:
					if code := readiness(t, g); code != http.StatusServiceUnavailable {
						t.Fatalf("readiness %d while completions fail", code)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
}

// An engine that never answers: the command exits non-zero within its bound and
// says why in its termination message.
func TestMainExitsNonZeroWithinTheBound(t *testing.T) {
	// A port nothing listens on: take one and close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	ln.Close()
	// And an engine that accepts the connection but never answers in time.
	hanging := newFakeEngine(t, "/v1/completions", func(int32, http.ResponseWriter) { time.Sleep(2 * time.Second) })

	for name, url := range map[string]string{"connection refused": deadURL, "hanging": hanging.URL} {
		t.Run(name, func(t *testing.T) {
			msgPath := filepath.Join(t.TempDir(), "termination-log")
			const bound = 700 * time.Millisecond
			var stderr bytes.Buffer
			start := time.Now()
			code := run(context.Background(), []string{
				"--engine-url", url, "--model", "llama", "--timeout", bound.String(), "--request-timeout", "300ms",
				"--backoff", "20ms", "--max-backoff", "100ms", "--listen", "127.0.0.1:0", "--termination-message-path", msgPath,
			}, &stderr, nil)
			took := time.Since(start)
			if code != ExitTimedOut {
				t.Fatalf("exit code %d, want %d; log:\n%s", code, ExitTimedOut, stderr.String())
			}
			if took < bound || took > bound+time.Second {
				t.Errorf("exited after %s; the bound is %s", took, bound)
			}
			msg, err := os.ReadFile(msgPath)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"warm-up failed", "no completion from the engine at " + url, "within 700ms", "POST /v1/completions"} {
				if !strings.Contains(string(msg), want) {
					t.Errorf("termination message %q lacks %q", msg, want)
				}
			}
		})
	}
}

// The command serves 503 on /ready while warming up and 200 once warm, and exits
// 0 when stopped.
func TestMainServesReadinessUntilStopped(t *testing.T) {
	release := make(chan struct{})
	engine := newFakeEngine(t, "/v1/completions", func(_ int32, w http.ResponseWriter) {
		select {
		case <-release:
			io.WriteString(w, openAIAnswer)
		default:
			http.Error(w, "loading", http.StatusServiceUnavailable)
		}
	})
	ctx, stop := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--engine-url", engine.URL, "--model", "llama", "--backoff", "10ms", "--max-backoff", "20ms",
			"--listen", "127.0.0.1:0", "--termination-message-path", ""}, io.Discard, func(a net.Addr) { addr <- a })
	}()
	readyURL := "http://" + (<-addr).String() + ReadyPath
	status := func() int {
		resp, err := http.Get(readyURL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(); got != http.StatusServiceUnavailable {
		t.Fatalf("GET %s while warming up: %d, want 503", ReadyPath, got)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for status() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("never ready after the engine answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if code := <-exit; code != 0 {
		t.Errorf("exit code %d after being stopped, want 0", code)
	}
}

func TestParseArgs(t *testing.T) {
	o, err := ParseArgs([]string{"--api", "tgi", "--engine-url", "http://127.0.0.1:8080", "--timeout", "20m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.API != APITGI || o.Timeout != 20*time.Minute || o.Prompt != DefaultPrompt || o.Listen != ":8099" {
		t.Errorf("options %+v", o)
	}
	for _, args := range [][]string{
		{"--api", "triton", "--model", "m"},
		{"--model", ""},
		{"--model", "m", "--prompt", ""},
		{"--model", "m", "--timeout", "0s"},
		{"--model", "m", "extra"},
	} {
		if _, err := ParseArgs(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	msgPath := filepath.Join(t.TempDir(), "termination-log")
	if code := run(context.Background(), []string{"--api", "grpc", "--termination-message-path", msgPath}, io.Discard, nil); code != ExitInvalidArgs {
		t.Errorf("exit code %d for a bad --api, want %d", code, ExitInvalidArgs)
	}
	if msg, _ := os.ReadFile(msgPath); !strings.Contains(string(msg), `--api "grpc"`) {
		t.Errorf("termination message %q", msg)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
