// Package warmup is the warm-up gate: `model-loader warmup`, which the operator
// runs as a native sidecar (a restartable init container) beside the engine.
//
// A replica must count as ready only once the engine has answered a real
// request, which its health endpoint alone does not prove. The gate sends the
// engine one short completion (one token) on 127.0.0.1, retrying with a bounded
// back-off while the engine starts, for at most --timeout in all. Until a
// completion succeeds its own readiness endpoint (GET /ready) answers 503;
// afterwards 200, and it sends nothing more. The kubelet counts a sidecar's
// readiness in the pod's, so the pod becomes Ready, and receives Service traffic,
// only after a real completion.
//
// When no completion succeeds in time the gate writes why to its termination
// message and exits non-zero: the kubelet runs it again (with back-off) and the
// operator reports the message (reason WarmupFailed).
package warmup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiinference/operator/internal/outbound"
)

// API is how the gate asks the engine for a completion.
type API string

const (
	// APIOpenAI is an OpenAI-compatible server (vLLM, llm-d-inference-sim):
	// POST /v1/completions {"model", "prompt", "max_tokens": 1}.
	APIOpenAI API = "openai"
	// APITGI is Text Generation Inference's own API:
	// POST /generate {"inputs", "parameters": {"max_new_tokens": 1}}.
	APITGI API = "tgi"
)

// Defaults and the pod-level contract with the operator.
const (
	// Port is the port of the gate's readiness endpoint in the pod, which the
	// engine must not take (the CRD refuses engine.port 8099).
	Port = 8099
	// ReadyPath answers 200 once a completion succeeded, 503 before.
	ReadyPath = "/ready"
	// DefaultPrompt is the warm-up completion's text unless told otherwise.
	DefaultPrompt = "Hello"
	// ExitTimedOut: no completion succeeded within the bound.
	ExitTimedOut = 1
	// ExitInvalidArgs: the command line is wrong; running again will not help.
	ExitInvalidArgs = 2
	// maxMessage keeps the termination message under the kubelet's 4096 bytes.
	maxMessage = 4000
	// maxBody is the most of a response the gate reads.
	maxBody = 1 << 20
)

// Options is one run of the gate.
type Options struct {
	// API is the engine's completion API.
	API API
	// EngineURL is the engine's base URL, e.g. http://127.0.0.1:8000.
	EngineURL string
	// Model is the served model name (OpenAI API only).
	Model string
	// Prompt is the completion's text.
	Prompt string
	// Timeout bounds the whole warm-up: every attempt and the waits between them.
	Timeout time.Duration
	// RequestTimeout bounds one completion request (within Timeout).
	RequestTimeout time.Duration
	// Backoff is the wait after the first failed attempt; it doubles up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Listen is the address of the readiness endpoint, e.g. ":8099".
	Listen string
	// TerminationMessagePath receives the reason of a failed warm-up ("" writes none).
	TerminationMessagePath string
}

// Gate warms an engine up and tells whether it has.
type Gate struct {
	opts   Options
	client *http.Client
	ready  atomic.Bool
	// mu guards state, what /ready says before the engine is warm.
	mu    sync.Mutex
	state string
}

// New returns a gate that is not ready yet.
func New(opts Options) *Gate {
	return &Gate{
		opts: opts,
		// Within RequestTimeout (the context's), as the engine's first
		// completion may take long: the client's own bound is the whole warm-up's.
		client: outbound.New(opts.Timeout),
		state:  "waiting for the engine's first completion",
	}
}

// Ready tells whether a completion has succeeded.
func (g *Gate) Ready() bool { return g.ready.Load() }

// Handler serves the readiness endpoint: 200 once warm, 503 with the latest
// error before.
func (g *Gate) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ReadyPath, func(w http.ResponseWriter, _ *http.Request) {
		if g.Ready() {
			fmt.Fprintln(w, "warm: the engine answered a completion")
			return
		}
		g.mu.Lock()
		state := g.state
		g.mu.Unlock()
		http.Error(w, "not warm yet: "+state, http.StatusServiceUnavailable)
	})
	return mux
}

func (g *Gate) setState(s string) {
	g.mu.Lock()
	g.state = s
	g.mu.Unlock()
}

// Warm sends completions until one succeeds, within opts.Timeout. It returns nil
// once the engine has answered one (and the gate is ready), or an error that
// says how many attempts failed and the last reason.
func (g *Gate) Warm(parent context.Context, log *slog.Logger) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(parent, g.opts.Timeout)
	defer cancel()
	wait := g.opts.Backoff
	var last error
	for attempt := 1; ; attempt++ {
		err := g.complete(ctx)
		if err == nil {
			g.ready.Store(true)
			log.Info("The engine answered a completion; the replica is warm", "attempts", attempt, "after", time.Since(start).Round(time.Millisecond).String())
			return nil
		}
		// An attempt the bound cut short says less than the one before it.
		if ctx.Err() == nil || last == nil {
			last = err
		}
		g.setState(fmt.Sprintf("attempt %d: %v", attempt, err))
		if ctx.Err() == nil {
			log.Info("No completion from the engine yet", "attempt", attempt, "error", err.Error(), "retryIn", wait.String())
			select {
			case <-ctx.Done():
			case <-time.After(wait):
				wait = min(2*wait, g.opts.MaxBackoff)
				continue
			}
		}
		if err := parent.Err(); err != nil {
			return err // stopped from outside, e.g. the pod is being deleted
		}
		return fmt.Errorf("no completion from the engine at %s succeeded within %s (%d attempts); last: %w",
			g.opts.EngineURL, g.opts.Timeout, attempt, last)
	}
}

// complete sends one completion and checks that the answer is one.
func (g *Gate) complete(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, g.opts.RequestTimeout)
	defer cancel()
	path, body := g.request()
	url := strings.TrimSuffix(g.opts.EngineURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		var uerr *neturl.Error // it repeats the method and URL
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("POST %s: reading the answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, excerpt(data))
	}
	if err := g.checkAnswer(data); err != nil {
		return fmt.Errorf("POST %s: %s, but %w: %s", path, resp.Status, err, excerpt(data))
	}
	return nil
}

// request is the path and JSON body of one completion.
func (g *Gate) request() (string, []byte) {
	var path string
	var body any
	switch g.opts.API {
	case APITGI:
		path = "/generate"
		body = map[string]any{"inputs": g.opts.Prompt, "parameters": map[string]any{"max_new_tokens": 1}}
	default:
		path = "/v1/completions"
		body = map[string]any{"model": g.opts.Model, "prompt": g.opts.Prompt, "max_tokens": 1}
	}
	data, _ := json.Marshal(body) // maps of strings and numbers always encode
	return path, data
}

// checkAnswer accepts a completion: for OpenAI, at least one choice; for TGI, a
// generated text.
func (g *Gate) checkAnswer(data []byte) error {
	switch g.opts.API {
	case APITGI:
		var answer struct {
			GeneratedText *string `json:"generated_text"`
		}
		if json.Unmarshal(data, &answer) != nil || answer.GeneratedText == nil {
			return errors.New("the answer has no generated_text")
		}
	default:
		var answer struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if json.Unmarshal(data, &answer) != nil || len(answer.Choices) == 0 {
			return errors.New("the answer has no choices")
		}
	}
	return nil
}

// excerpt is the start of a response body, on one line.
func excerpt(data []byte) string {
	s := strings.Join(strings.Fields(string(data)), " ")
	const n = 300
	if len(s) > n {
		s = s[:n] + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
