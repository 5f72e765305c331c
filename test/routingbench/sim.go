// Package routingbench measures routing against the real engine simulator:
// a chat-shaped workload (tenants with long shared system prompts, multi-turn
// conversations that resend their history), a runner that sends it to
// llm-d-inference-sim replicas round robin or through one address (the
// router), and a report of TTFT, output tokens/s, failures and the prefix
// hit share the simulators themselves count. `go test ./test/routingbench
// -run TestCompareRouting -v` prints round robin and the router side by side.
package routingbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/aiinference/operator/test/testutil"
)

// Profile is the simulated engine: the latencies of one model on one GPU,
// from the simulator's reference tables (its docs/latency-profiles.md).
type Profile struct {
	Name string
	// PrefillOverhead and PrefillPerToken make the time to first token of the
	// per-token calculator: overhead + uncached prompt tokens x per token.
	PrefillOverhead, PrefillPerToken time.Duration
	// InterTokenLatency is the time per output token.
	InterTokenLatency time.Duration
	// MaxNumSeqs is how many requests run at once; more wait.
	MaxNumSeqs int
	// KVCacheBlocks bounds the prompt blocks (16 tokens each) a replica holds.
	KVCacheBlocks int
	// TimeFactorUnderLoad slows a replica running MaxNumSeqs requests by this factor.
	TimeFactorUnderLoad float64
	// MaxLoras is --max-loras (and --max-cpu-loras): the LoRA adapters a
	// replica runs in one batch and keeps loaded; 0 leaves the simulator's
	// default, 1.
	MaxLoras int
}

// H100Llama8B is a 7-8B model on one H100 (latency-profiles.md: prefill
// overhead 25-40 ms, 0.15-0.30 ms per prompt token, 10-15 ms per output
// token), with the KV cache and batch cut down to what a 2-core test machine
// can simulate, so that the tenants' prompts overflow one replica's cache as
// many tenants overflow a real replica's, and its running requests compete
// with the prefixes it keeps (an H100 holds about 26,000 blocks for
// Llama-3.1-8B and runs up to 256 sequences: under 2,000-token chats, its
// cache too is the running set's). Past its cache the simulator refuses a
// request where vLLM would queue it; the runner makes it wait (chatAsQueued).
var H100Llama8B = Profile{
	Name:                "7-8B on H100 (per-token prefill 30ms + 0.25ms/token, ITL 12ms)",
	PrefillOverhead:     30 * time.Millisecond,
	PrefillPerToken:     250 * time.Microsecond,
	InterTokenLatency:   12 * time.Millisecond,
	MaxNumSeqs:          8,
	KVCacheBlocks:       512,
	TimeFactorUnderLoad: 2,
}

// String is the profile with its simulator flags' values, to print beside figures.
func (p Profile) String() string {
	return fmt.Sprintf("%s; --max-num-seqs %d --kv-cache-size %d blocks of 16 tokens --time-factor-under-load %g",
		p.Name, p.MaxNumSeqs, p.KVCacheBlocks, p.TimeFactorUnderLoad)
}

// Args are the simulator's arguments for the profile, serving Model on port.
func (p Profile) Args(port string) []string {
	args := []string{
		"--model", Model, "--port", port,
		"--mode", "random",
		"--force-dummy-tokenizer",
		"--enable-kvcache", "--kv-cache-size", strconv.Itoa(p.KVCacheBlocks), "--block-size", "16",
		"--latency-calculator", "per-token",
		"--prefill-overhead", p.PrefillOverhead.String(),
		"--prefill-time-per-token", p.PrefillPerToken.String(),
		"--inter-token-latency", p.InterTokenLatency.String(),
		"--max-num-seqs", strconv.Itoa(p.MaxNumSeqs),
		// The simulator's default context is 1,024 tokens, shorter than a
		// chat with a long system prompt; 8B models are served with 8K to 128K.
		"--max-model-len", "32768",
		"--time-factor-under-load", strconv.FormatFloat(max(p.TimeFactorUnderLoad, 1), 'f', -1, 64),
	}
	if p.MaxLoras > 0 {
		args = append(args, "--max-loras", strconv.Itoa(p.MaxLoras), "--max-cpu-loras", strconv.Itoa(p.MaxLoras))
	}
	return args
}

// Model is the model name the simulators serve.
const Model = "routing-bench-model"

// Sim is a running llm-d-inference-sim.
type Sim struct {
	// Name is its replica name (the router's endpoint name).
	Name string
	// Addr is host:port of its HTTP server (OpenAI API, /metrics).
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// StartSims starts n simulators of the profile and waits until each answers
// /health. They stop when the test ends.
func StartSims(t testing.TB, n int, p Profile) []*Sim {
	t.Helper()
	sims := make([]*Sim, n)
	for i := range sims {
		sims[i] = StartSim(t, fmt.Sprintf("sim-%d", i), p)
	}
	return sims
}

// SimBinary is the simulator built by hack/tools/build.sh; the test is
// skipped, saying why, when it cannot be had.
func SimBinary(t testing.TB) string {
	t.Helper()
	dir, err := testutil.BuildTools("sim")
	if err != nil {
		t.Skipf("needs llm-d-inference-sim: %v", err)
	}
	return filepath.Join(dir, "llm-d-inference-sim")
}

// StartSim starts one simulator. The simulator binds its port itself, so a
// port found free may be taken before it binds: then it is started again on
// another.
func StartSim(t testing.TB, name string, p Profile) *Sim {
	t.Helper()
	bin := SimBinary(t)
	var last string
	for range 5 {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		s := &Sim{Name: name, Addr: addr, done: make(chan struct{}), log: filepath.Join(t.TempDir(), name+".log")}
		logFile, err := os.Create(s.log)
		if err != nil {
			t.Fatal(err)
		}
		s.cmd = exec.Command(bin, p.Args(port)...)
		s.cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
		s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		go func() {
			_ = s.cmd.Wait()
			_ = logFile.Close()
			close(s.done)
		}()
		t.Cleanup(func() {
			s.Stop()
			if t.Failed() {
				out, _ := os.ReadFile(s.log)
				t.Logf("%s log (end):\n%s", name, tail(out, 3000))
			}
		})
		if last = s.waitHealthy(30 * time.Second); last == "" {
			return s
		}
		s.Stop()
		if !strings.Contains(last, "address already in use") {
			break
		}
	}
	t.Fatalf("%s did not start: %s", name, last)
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitHealthy is "" once the simulator answers /health, else why not.
func (s *Sim) waitHealthy(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			out, _ := os.ReadFile(s.log)
			return "exited while starting: " + string(tail(out, 2000))
		default:
		}
		resp, err := client.Get("http://" + s.Addr + "/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return ""
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("/health did not answer 200 within %s (last: %s)", timeout, last)
}

// Stop ends the simulator, as a replica that goes away.
func (s *Sim) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill ends the simulator at once (SIGKILL), as a replica whose node fails or
// that is killed for memory: its connections close with the requests on them.
// It returns once the process has exited.
func (s *Sim) Kill() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// Counters are a simulator's prefix-cache counters and requests.
type Counters struct {
	PrefixHits, PrefixQueries, Requests float64
}

// Sub is the counts between an earlier reading and this one.
func (c Counters) Sub(before Counters) Counters {
	return Counters{c.PrefixHits - before.PrefixHits, c.PrefixQueries - before.PrefixQueries, c.Requests - before.Requests}
}

// ReadCounters reads a simulator's vllm:prefix_cache_hits and
// vllm:prefix_cache_queries (tokens) and its finished requests.
func (s *Sim) ReadCounters(ctx context.Context) (Counters, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Counters{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return Counters{}, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return Counters{}, fmt.Errorf("%s/metrics: %w", s.Addr, err)
	}
	sum := func(names ...string) float64 {
		total := 0.0
		for _, name := range names {
			if f := families[name]; f != nil {
				for _, m := range f.GetMetric() {
					total += m.GetCounter().GetValue() + m.GetUntyped().GetValue() + m.GetGauge().GetValue()
				}
				return total
			}
		}
		return 0
	}
	return Counters{
		PrefixHits:    sum("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"),
		PrefixQueries: sum("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"),
		Requests:      sum("vllm:request_success", "vllm:request_success_total"),
	}, nil
}

// ReadAll sums the counters of every simulator.
func ReadAll(ctx context.Context, sims []*Sim) (Counters, error) {
	var mu sync.Mutex
	var total Counters
	var firstErr error
	var wg sync.WaitGroup
	for _, s := range sims {
		wg.Go(func() {
			c, err := s.ReadCounters(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			total.PrefixHits += c.PrefixHits
			total.PrefixQueries += c.PrefixQueries
			total.Requests += c.Requests
		})
	}
	wg.Wait()
	return total, firstErr
}
