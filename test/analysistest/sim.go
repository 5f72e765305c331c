package analysistest

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// SimOptions configure one llm-d-inference-sim (v0.10.2) process.
type SimOptions struct {
	// Model is the served model name; a dummy name needs no tokenizer service.
	// Default DefaultModel.
	Model string
	// TimeToFirstToken and InterTokenLatency are the simulated latencies
	// (--time-to-first-token, --inter-token-latency). Defaults 20ms and 5ms.
	TimeToFirstToken, InterTokenLatency time.Duration
	// FailureRate is the share of requests, in percent, answered 503
	// (--failure-injection-rate with --failure-types server_error).
	FailureRate int
	// MaxNumSeqs is how many requests run at once (--max-num-seqs); more wait
	// and show in vllm:num_requests_waiting. Default 32.
	MaxNumSeqs int
}

// DefaultModel is the model the simulators serve unless told otherwise.
const DefaultModel = "analysis-test-model"

// Sim is a running llm-d-inference-sim: vLLM's OpenAI API (/v1/completions,
// /v1/chat/completions), /health and vLLM's /metrics on Addr.
type Sim struct {
	// Addr is host:port of its HTTP server.
	Addr string
	// Model it serves.
	Model string
	srv   *server
}

// StartSim starts a simulator and waits until it answers /health. It stops when
// the test ends.
func StartSim(t testing.TB, opts SimOptions) *Sim {
	t.Helper()
	s := launchSim(t, opts)
	s.waitHealthy(t)
	return s
}

// launchSim starts a simulator without waiting for it.
func launchSim(t testing.TB, opts SimOptions) *Sim {
	t.Helper()
	simBin, _, err := binaries()
	if err != nil {
		t.Skipf("analysis real-component test needs llm-d-inference-sim and prometheus: %v", err)
	}
	if opts.Model == "" {
		opts.Model = DefaultModel
	}
	if opts.TimeToFirstToken == 0 {
		opts.TimeToFirstToken = 20 * time.Millisecond
	}
	if opts.InterTokenLatency == 0 {
		opts.InterTokenLatency = 5 * time.Millisecond
	}
	if opts.MaxNumSeqs == 0 {
		opts.MaxNumSeqs = 32
	}
	srv := launchServer(t, func(port string) string { return "llm-d-inference-sim-" + port }, simBin,
		func(port string) []string {
			return []string{
				"--model", opts.Model,
				"--port", port,
				// echo answers with the prompt: a known number of tokens per request, so
				// every request has inter-token latencies.
				"--mode", "echo",
				// The constant calculator takes the latencies as given, whatever the prompt.
				"--latency-calculator", "constant",
				"--time-to-first-token", opts.TimeToFirstToken.String(),
				"--inter-token-latency", opts.InterTokenLatency.String(),
				"--max-num-seqs", strconv.Itoa(opts.MaxNumSeqs),
				"--failure-injection-rate", strconv.Itoa(opts.FailureRate),
				"--failure-types", "server_error",
			}
		})
	return &Sim{Model: opts.Model, srv: srv}
}

// waitHealthy waits for /health; then Addr is where the simulator serves.
func (s *Sim) waitHealthy(t testing.TB) {
	t.Helper()
	s.srv.waitReady(t, "/health", 30*time.Second)
	s.Addr = s.srv.addr
}

// Configure changes the simulator while it runs, through POST /admin/config
// (v0.10.2 applies latency fields, failure-injection-rate and failure-types),
// e.g. {"time-to-first-token": "300ms"}.
func (s *Sim) Configure(t testing.TB, settings map[string]any) {
	t.Helper()
	body, err := json.Marshal(settings)
	if err != nil {
		t.Fatal(err)
	}
	code, out, err := post(context.Background(), &http.Client{Timeout: 5 * time.Second}, "http://"+s.Addr+"/admin/config", string(body))
	if err != nil || code != http.StatusOK {
		t.Fatalf("POST /admin/config %s to the simulator at %s: %d %v %.300s", body, s.Addr, code, err, out)
	}
}

// SetTimeToFirstToken changes the simulated time to first token.
func (s *Sim) SetTimeToFirstToken(t testing.TB, d time.Duration) {
	t.Helper()
	s.Configure(t, map[string]any{"time-to-first-token": d.String()})
}

// SetFailureRate makes the simulator answer percent of the requests with 503.
func (s *Sim) SetFailureRate(t testing.TB, percent int) {
	t.Helper()
	s.Configure(t, map[string]any{"failure-injection-rate": percent, "failure-types": []string{"server_error"}})
}

// Stop stops the simulator, as an engine that goes away.
func (s *Sim) Stop() { s.srv.proc.Stop() }
