package analysis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/analysis"
	"github.com/aiinference/operator/test/analysistest"
)

// The step the real-component test judges with: every built-in check and one
// user-written query, over a window of a few seconds (the test's Prometheus
// scrapes every second).
const window = 8 * time.Second

var step = servingv1.AnalysisStep{
	Interval:   &metav1.Duration{Duration: window},
	MinSamples: 20,
	Checks: []servingv1.AnalysisCheck{
		{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.1", MaxRatioToStable: "2"},
		{Name: "itl", Metric: servingv1.MetricInterTokenLatency, Max: "0.05"},
		{Name: "e2e", Metric: servingv1.MetricEndToEndLatency, Max: "0.4"},
		{Name: "errors", Metric: servingv1.MetricErrorRatio, Max: "0.05"},
		{Name: "queue", Metric: servingv1.MetricQueueLength, Max: "2"},
		{Name: "mean-ttft", Query: "sum(rate(vllm:time_to_first_token_seconds_sum{{{selector}}}[{{window}}]))" +
			" / sum(rate(vllm:time_to_first_token_seconds_count{{{selector}}}[{{window}}]))", Max: "0.1"},
	},
}

// selectorOf selects the pods of a Deployment-like name, as the controller does.
func selectorOf(ns, name string) analysis.Target {
	return analysis.Target{Selector: fmt.Sprintf(`namespace=%q,pod=~"%s-[a-z0-9]+-[a-z0-9]+"`, ns, name)}
}

// TestRunAgainstPrometheusAndSimulators judges canaries with a real Prometheus
// scraping real llm-d-inference-sim processes (vLLM's metrics) behind a stand-in
// for vLLM's HTTP metrics: a good canary passes; a canary made slow mid-step fails
// the time-to-first-token checks, and one made to fail requests fails the error
// ratio, within one interval of the change; a canary with too few requests is
// Inconclusive; every built-in query of every engine is valid PromQL; and with
// Prometheus stopped every check is Inconclusive.
func TestRunAgainstPrometheusAndSimulators(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus and model-server simulators; run without -short")
	}
	analysistest.RequireBinaries(t)
	start := time.Now()
	const ns = "serving"
	pods := analysistest.StartPods(t,
		analysistest.PodSpec{Namespace: ns, Name: "chat-7d9f8c6b5-x2k4p"},
		analysistest.PodSpec{Namespace: ns, Name: "chat-7d9f8c6b5-m8n3q"},
		analysistest.PodSpec{Namespace: ns, Name: "chat-canary-5c8d7f9b6-q7w2e"},   // made slow mid-step
		analysistest.PodSpec{Namespace: ns, Name: "faulty-canary-6f7d8c9b5-r4t6y"}, // made to fail requests mid-step
		analysistest.PodSpec{Namespace: ns, Name: "quiet-canary-7a8b9c0d1-z9x8w"},  // too little traffic
	)
	stablePods, slowed, faulty, quiet := pods[:2], pods[2], pods[3], pods[4]
	t.Logf("5 simulators and their proxies up: %s", time.Since(start).Round(time.Millisecond))
	prom := analysistest.StartPrometheus(t, analysistest.TargetsOf(pods...))
	t.Logf("Prometheus ready: %s", time.Since(start).Round(time.Millisecond))
	prom.WaitForTargetsUp(t, len(pods), 15*time.Second)
	load := analysistest.StartLoad(t, 8, slowed, faulty, stablePods[0], stablePods[1])
	// One request a second: about 8 in a window, under minSamples 20.
	analysistest.StartLoad(t, 1, quiet)
	t.Logf("every pod scraped, load started: %s", time.Since(start).Round(time.Millisecond))

	q, err := analysis.NewPrometheus(prom.URL, analysis.ObjectURL)
	if err != nil {
		t.Fatal(err)
	}
	stable := selectorOf(ns, "chat")
	targets := map[string]analysis.Target{
		"slowed": selectorOf(ns, "chat-canary"),
		"faulty": selectorOf(ns, "faulty-canary"),
		"quiet":  selectorOf(ns, "quiet-canary"),
	}
	run := func(name string) servingv1.AnalysisRun {
		req := analysis.RequestFor(servingv1.EngineVLLM, 1, step, targets[name], stable, time.Now())
		r := analysis.Run(context.Background(), q, req)
		logRun(t, name, r)
		return r
	}

	// A good canary passes once the window holds enough requests; it never fails.
	t.Run("good canary passes", func(t *testing.T) {
		begin := time.Now()
		passed := map[string]bool{}
		for time.Since(begin) < 3*window && !(passed["slowed"] && passed["faulty"]) {
			for _, name := range []string{"slowed", "faulty"} {
				if passed[name] {
					continue
				}
				r := run(name)
				if r.Verdict == servingv1.VerdictFail {
					t.Fatalf("%s canary, still good, failed", name)
				}
				passed[name] = r.Verdict == servingv1.VerdictPass
			}
			time.Sleep(time.Second)
		}
		if !passed["slowed"] || !passed["faulty"] {
			t.Fatalf("good canaries passed: %v, within %s", passed, 3*window)
		}
		t.Logf("good canaries passed %s after the load started", time.Since(start).Round(time.Second))
	})
	if t.Failed() {
		return
	}

	t.Run("too few requests is inconclusive", func(t *testing.T) {
		r := run("quiet")
		if r.Verdict != servingv1.VerdictInconclusive {
			t.Fatalf("verdict %s, want Inconclusive", r.Verdict)
		}
		for _, c := range r.Checks {
			if c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "fewer than minSamples 20") ||
				c.Samples == 0 || c.Samples >= 20 {
				t.Errorf("%s: %s %d samples %q, want Inconclusive for too few (but some) requests", c.Name, c.Verdict, c.Samples, c.Message)
			}
		}
	})

	// Mid-step, one canary turns slow and another starts failing requests.
	changed := time.Now()
	slowed.Sim.SetTimeToFirstToken(t, 300*time.Millisecond)
	faulty.Sim.SetFailureRate(t, 30)
	t.Run("a canary made slow or failing mid-step fails within one interval", func(t *testing.T) {
		failedAt := map[string]time.Duration{}
		last := map[string]servingv1.AnalysisRun{}
		// Runs every second until both fail, and one more a whole interval after
		// the change: that run, the next the controller would make, must fail.
		for {
			elapsed := time.Since(changed)
			for _, name := range []string{"slowed", "faulty"} {
				r := run(name)
				last[name] = r
				if _, done := failedAt[name]; !done && r.Verdict == servingv1.VerdictFail {
					failedAt[name] = elapsed
				}
			}
			if elapsed >= window+analysistest.ScrapeInterval {
				break
			}
			time.Sleep(time.Second)
		}
		t.Logf("first failing run after the change: slowed %s, faulty %s (interval %s)",
			failedAt["slowed"].Round(100*time.Millisecond), failedAt["faulty"].Round(100*time.Millisecond), window)
		wantFail := map[string][]string{"slowed": {"ttft", "mean-ttft", "e2e"}, "faulty": {"errors"}}
		for name, checks := range wantFail {
			r := last[name]
			if r.Verdict != servingv1.VerdictFail {
				t.Errorf("%s canary: verdict %s one interval after the change, want Fail", name, r.Verdict)
			}
			for _, c := range r.Checks {
				shouldFail := contains(checks, c.Name)
				if shouldFail && (c.Verdict != servingv1.VerdictFail || c.Message == "") {
					t.Errorf("%s canary: check %s %s %q, want Fail with a message", name, c.Name, c.Verdict, c.Message)
				}
				if !shouldFail && c.Verdict != servingv1.VerdictPass {
					t.Errorf("%s canary: check %s %s %q, want Pass", name, c.Name, c.Verdict, c.Message)
				}
			}
		}
		if ok, failed := load.Counts(); ok == 0 || failed == 0 {
			t.Errorf("load: %d answered, %d failed; the faulty canary should have failed some", ok, failed)
		}
	})

	// Every built-in query of every engine, and its sample count, is PromQL that
	// Prometheus accepts (TGI's and Triton's return nothing here).
	t.Run("every built-in query is valid PromQL", func(t *testing.T) {
		for _, engine := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton} {
			for _, m := range []servingv1.AnalysisMetric{servingv1.MetricErrorRatio, servingv1.MetricTimeToFirstToken,
				servingv1.MetricInterTokenLatency, servingv1.MetricEndToEndLatency, servingv1.MetricQueueLength} {
				for _, tmpl := range []string{analysis.BuiltinQuery(engine, m), analysis.SamplesQuery(engine, m)} {
					if tmpl == "" {
						continue
					}
					query := analysis.Expand(tmpl, targets["slowed"], window)
					if _, err := q.Query(context.Background(), query, time.Now()); err != nil {
						t.Errorf("%s %s: %s: %v", engine, m, query, err)
					}
				}
			}
		}
	})

	// A query Prometheus refuses: its own message (where the PromQL is wrong) is
	// shown for the operator's --prometheus-url, never for an object's URL.
	t.Run("a refused query says why, in Prometheus's words only for the operator's URL", func(t *testing.T) {
		const broken = "sum(rate(vllm:e2e_request_latency_seconds_count[1m])"
		operator, err := analysis.NewPrometheus(prom.URL, analysis.OperatorURL)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			q    analysis.Querier
			want string
		}{
			{q, "Prometheus refused the query (bad_data: the query is not valid PromQL"},
			{operator, "parse error: unclosed left parenthesis"},
		} {
			_, err := tc.q.Query(context.Background(), broken, time.Now())
			var qe *analysis.QueryError
			if !errors.As(err, &qe) || !qe.Reached || !strings.Contains(qe.Reason, tc.want) {
				t.Errorf("query %s: %#v, want a refusal saying %q", broken, err, tc.want)
			}
			t.Logf("%v", err)
		}
		var qe *analysis.QueryError
		if _, err := q.Query(context.Background(), broken, time.Now()); errors.As(err, &qe) && strings.Contains(qe.Reason, "parse error") {
			t.Errorf("an object's URL shows Prometheus's own message: %v", err)
		}
	})

	t.Run("Prometheus stopped is inconclusive", func(t *testing.T) {
		prom.Stop()
		begin := time.Now()
		r := run("slowed")
		if r.Verdict != servingv1.VerdictInconclusive {
			t.Fatalf("verdict %s, want Inconclusive", r.Verdict)
		}
		for _, c := range r.Checks {
			if c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "Prometheus is unreachable") {
				t.Errorf("%s: %s %q, want Inconclusive because Prometheus is unreachable", c.Name, c.Verdict, c.Message)
			}
		}
		t.Logf("run with Prometheus stopped took %s", time.Since(begin).Round(time.Millisecond))
	})
	t.Logf("total %s", time.Since(start).Round(100*time.Millisecond))
}

func logRun(t *testing.T, name string, r servingv1.AnalysisRun) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s canary: %s", name, r.Verdict)
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "\n  %-9s %-12s value=%-8s threshold=%-40s samples=%-4d %s", c.Name, c.Verdict, c.Value, c.Threshold, c.Samples, c.Message)
	}
	t.Log(b.String())
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
