package routerfaults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/aiinference/operator/test/routerfaults/world"
	"github.com/aiinference/operator/test/routingbench"
	"github.com/aiinference/operator/test/testutil"
)

// The healthy replicas: llm-d-inference-sim processes with test/routingbench's
// profile of an 8B model on an H100.

// Profile is the simulated engine of every healthy replica.
var Profile = routingbench.H100Llama8B

// simBuilt is where hack/tools/build.sh keeps llm-d-inference-sim (the path
// it would print), and whether it is there: a case that needs it is skipped
// rather than building it (minutes) in a test.
func simBuilt() (string, bool) {
	root, err := testutil.RepoRoot()
	if err != nil {
		return err.Error(), false
	}
	data, err := os.ReadFile(filepath.Join(root, "hack", "tools", "sim", "go.mod"))
	if err != nil {
		return err.Error(), false
	}
	version := ""
	s := bufio.NewScanner(strings.NewReader(string(data)))
	for s.Scan() {
		if f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(s.Text()), "require ")); len(f) >= 2 && f[0] == "github.com/llm-d/llm-d-inference-sim" {
			version = f[1]
		}
	}
	cache := os.Getenv("AIINFERENCE_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "aiinference-operator")
	}
	path := filepath.Join(cache, "bin", "sim-"+version, "llm-d-inference-sim")
	info, err := os.Stat(path)
	return path, err == nil && info.Mode()&0o111 != 0
}

// StartSims starts n simulators, named sim-0..., or skips the test when the
// simulator is not built.
func StartSims(t testing.TB, n int) []*routingbench.Sim {
	t.Helper()
	if path, ok := simBuilt(); !ok {
		say("%s: skipped: llm-d-inference-sim is not built yet (%s); make tools, or hack/tools/build.sh sim, builds it", t.Name(), path)
		t.Skipf("llm-d-inference-sim is not built yet (%s); make tools, or hack/tools/build.sh sim, builds it", path)
	}
	return routingbench.StartSims(t, n, Profile)
}

// SimEndpoint is a simulator as a replica in a world file.
func SimEndpoint(s *routingbench.Sim) world.Endpoint {
	return world.Endpoint{Name: s.Name, Addr: s.Addr}
}

// SimModel is the model the simulators serve.
const SimModel = routingbench.Model

// simLoad is a simulator's running and waiting requests.
func simLoad(ctx context.Context, addr string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
		for _, m := range families[name].GetMetric() {
			total += m.GetGauge().GetValue()
		}
	}
	return total, nil
}

// WaitIdle waits until no simulator runs or queues a request (what an
// earlier run left: a client that gave up does not always stop the
// simulator's work), at most timeout; an error says which was still busy.
func WaitIdle(ctx context.Context, sims []*routingbench.Sim, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		busy := ""
		for _, s := range sims {
			n, err := simLoad(ctx, s.Addr)
			if err != nil {
				busy = fmt.Sprintf("%s: %v", s.Name, err)
			} else if n > 0 {
				busy = fmt.Sprintf("%s: %g requests running or waiting", s.Name, n)
			}
		}
		if busy == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not idle after %s: %s", timeout, busy)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
