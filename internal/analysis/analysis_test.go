package analysis

import (
	"context"
	"errors"
	"math"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// fakeQuerier is a fake Prometheus: it answers the queries it was given answers
// for, and the rest with an empty vector (what Prometheus says for a query whose
// series do not exist). It records the queries sent.
type fakeQuerier struct {
	answers map[string]model.Value
	errs    map[string]error
	// err, when set, is the answer to every query (Prometheus unreachable).
	err  error
	sent []string
}

func (f *fakeQuerier) Query(_ context.Context, query string, _ time.Time) (model.Value, error) {
	f.sent = append(f.sent, query)
	if f.err != nil {
		return nil, f.err
	}
	if err, ok := f.errs[query]; ok {
		return nil, err
	}
	if v, ok := f.answers[query]; ok {
		return v, nil
	}
	return model.Vector{}, nil
}

func vec(values ...float64) model.Vector {
	v := model.Vector{}
	for i, f := range values {
		v = append(v, &model.Sample{Metric: model.Metric{"i": model.LabelValue(rune('a' + i))}, Value: model.SampleValue(f)})
	}
	return v
}

var (
	canary = Target{Selector: `namespace="ns",pod=~"chat-canary-[a-z0-9]+-[a-z0-9]+"`}
	stable = Target{Selector: `namespace="ns",pod=~"chat-[a-z0-9]+-[a-z0-9]+"`}
	now    = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
)

// world is what the fake Prometheus knows: for each target, its finished
// requests and the value of each query template.
type world struct {
	engine                      servingv1.EngineType
	canarySamples, stableSample float64
	canaryValue, stableValue    map[string]model.Value // by query template
}

func (w world) querier(window time.Duration) *fakeQuerier {
	f := &fakeQuerier{answers: map[string]model.Value{}, errs: map[string]error{}}
	for _, m := range []servingv1.AnalysisMetric{"", servingv1.MetricErrorRatio} {
		f.answers[Expand(SamplesQuery(w.engine, m), canary, window)] = vec(w.canarySamples)
		f.answers[Expand(SamplesQuery(w.engine, m), stable, window)] = vec(w.stableSample)
	}
	for tmpl, v := range w.canaryValue {
		f.answers[Expand(tmpl, canary, window)] = v
	}
	for tmpl, v := range w.stableValue {
		f.answers[Expand(tmpl, stable, window)] = v
	}
	return f
}

func request(engine servingv1.EngineType, checks ...servingv1.AnalysisCheck) Request {
	return RequestFor(engine, 2, servingv1.AnalysisStep{
		Checks:     checks,
		Interval:   &metav1.Duration{Duration: 30 * time.Second},
		MinSamples: 20,
	}, canary, stable, now)
}

var ttftQuery = BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricTimeToFirstToken)

func TestBuiltinQueriesExpand(t *testing.T) {
	got := Expand(BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricTimeToFirstToken), canary, 30*time.Second)
	want := `histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{namespace="ns",pod=~"chat-canary-[a-z0-9]+-[a-z0-9]+"}[30s])))`
	if got != want {
		t.Errorf("vLLM TTFT:\n got %s\nwant %s", got, want)
	}
	got = Expand(BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricErrorRatio), canary, 90*time.Second)
	want = `(sum(rate(http_requests_total{namespace="ns",pod=~"chat-canary-[a-z0-9]+-[a-z0-9]+",handler=~"/v1/.+",handler!="/v1/models",status="5xx"}[1m30s])) or vector(0))` +
		` / sum(rate(http_requests_total{namespace="ns",pod=~"chat-canary-[a-z0-9]+-[a-z0-9]+",handler=~"/v1/.+",handler!="/v1/models"}[1m30s]))`
	if got != want {
		t.Errorf("vLLM error ratio:\n got %s\nwant %s", got, want)
	}
	got = Expand(SamplesQuery(servingv1.EngineVLLM, ""), stable, time.Minute)
	want = `sum(increase(vllm:e2e_request_latency_seconds_count{namespace="ns",pod=~"chat-[a-z0-9]+-[a-z0-9]+"}[1m]))`
	if got != want {
		t.Errorf("vLLM samples:\n got %s\nwant %s", got, want)
	}
	// A user's query, written as the API's example.
	got = Expand(`sum(rate(my_errors_total{{{selector}}}[{{window}}]))`, canary, 5*time.Minute)
	want = `sum(rate(my_errors_total{namespace="ns",pod=~"chat-canary-[a-z0-9]+-[a-z0-9]+"}[5m]))`
	if got != want {
		t.Errorf("custom query:\n got %s\nwant %s", got, want)
	}
}

// Every engine has every built-in check: a query, or a reason it has none.
func TestEveryEngineCoversEveryMetric(t *testing.T) {
	metrics := []servingv1.AnalysisMetric{servingv1.MetricErrorRatio, servingv1.MetricTimeToFirstToken,
		servingv1.MetricInterTokenLatency, servingv1.MetricEndToEndLatency, servingv1.MetricQueueLength}
	for _, engine := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton} {
		for _, m := range metrics {
			q, why := BuiltinQuery(engine, m), Unsupported(engine, m)
			if (q == "") == (why == "") {
				t.Errorf("%s %s: query %q, unsupported %q: want exactly one", engine, m, q, why)
			}
			for _, tmpl := range []string{q, SamplesQuery(engine, m)} {
				if tmpl != "" && (!strings.Contains(tmpl, SelectorPlaceholder) || !strings.Contains(tmpl, WindowPlaceholder)) {
					t.Errorf("%s %s: %q lacks a placeholder", engine, m, tmpl)
				}
			}
		}
	}
	if why := Unsupported(servingv1.EngineTGI, servingv1.MetricTimeToFirstToken); !strings.Contains(why, "query") {
		t.Errorf("TGI TTFT: %q should say to write a query instead", why)
	}
}

func TestRunVerdicts(t *testing.T) {
	good := world{
		engine:        servingv1.EngineVLLM,
		canarySamples: 120, stableSample: 300,
		canaryValue: map[string]model.Value{ttftQuery: vec(0.2)},
		stableValue: map[string]model.Value{ttftQuery: vec(0.18)},
	}
	ttft := func(max, ratio string) servingv1.AnalysisCheck {
		return servingv1.AnalysisCheck{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: max, MaxRatioToStable: ratio}
	}
	with := func(w world, edit func(*world)) world {
		w.canaryValue = map[string]model.Value{ttftQuery: w.canaryValue[ttftQuery]}
		w.stableValue = map[string]model.Value{ttftQuery: w.stableValue[ttftQuery]}
		edit(&w)
		return w
	}
	cases := []struct {
		name          string
		world         world
		check         servingv1.AnalysisCheck
		verdict       servingv1.Verdict
		value, thresh string
		samples       int64
		message       string // a part of it
	}{
		{name: "under max passes", world: good, check: ttft("0.5", ""),
			verdict: servingv1.VerdictPass, value: "0.2", thresh: "0.5", samples: 120},
		{name: "over max fails", world: good, check: ttft("0.1", ""),
			verdict: servingv1.VerdictFail, value: "0.2", thresh: "0.1", samples: 120,
			message: "p95 time to first token 0.2 s is above the threshold 0.1"},
		{name: "equal to max passes", world: good, check: ttft("0.2", ""),
			verdict: servingv1.VerdictPass, value: "0.2", thresh: "0.2", samples: 120},
		{name: "within ratio of stable passes", world: good, check: ttft("", "1.2"),
			verdict: servingv1.VerdictPass, value: "0.2", thresh: "0.216 (1.2 x stable 0.18)", samples: 120},
		{name: "beyond ratio of stable fails", world: good, check: ttft("", "1.05"),
			verdict: servingv1.VerdictFail, value: "0.2", thresh: "0.189 (1.05 x stable 0.18)", samples: 120,
			message: "above the threshold 0.189 (1.05 x stable 0.18)"},
		{name: "both bounds: the lower (max) applies", world: good, check: ttft("0.19", "2"),
			verdict: servingv1.VerdictFail, value: "0.2", thresh: "0.19 (lower of max 0.19 and 2 x stable 0.18)", samples: 120},
		{name: "both bounds: the lower (ratio) applies", world: good, check: ttft("1", "1.05"),
			verdict: servingv1.VerdictFail, value: "0.2", thresh: "0.189 (lower of max 1 and 1.05 x stable 0.18)", samples: 120},
		{name: "both bounds passed", world: good, check: ttft("1", "1.5"),
			verdict: servingv1.VerdictPass, value: "0.2", thresh: "0.27 (lower of max 1 and 1.5 x stable 0.18)", samples: 120},
		{name: "too few canary requests is inconclusive, never a pass",
			world: with(good, func(w *world) { w.canarySamples = 19.4 }), check: ttft("10", ""),
			verdict: servingv1.VerdictInconclusive, samples: 19, thresh: "10",
			message: "the canary finished 19 requests in the last 30s, fewer than minSamples 20"},
		{name: "too few stable requests for a relative bound",
			world: with(good, func(w *world) { w.stableSample = 3 }), check: ttft("", "1.5"),
			verdict: servingv1.VerdictInconclusive, samples: 120,
			message: "the stable pods finished 3 requests in the last 30s, fewer than minSamples 20"},
		{name: "too few stable requests do not matter to an absolute bound",
			world: with(good, func(w *world) { w.stableSample = 3 }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictPass, value: "0.2", thresh: "0.5", samples: 120},
		{name: "no series for the sample count",
			world: with(good, func(w *world) { w.canarySamples = math.NaN() }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, thresh: "0.5",
			message: "check that Prometheus scrapes these pods"},
		{name: "empty value is inconclusive",
			world: with(good, func(w *world) { w.canaryValue[ttftQuery] = model.Vector{} }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, samples: 120, thresh: "0.5",
			message: "canary: the query returned no data"},
		{name: "NaN is inconclusive",
			world: with(good, func(w *world) { w.canaryValue[ttftQuery] = vec(math.NaN()) }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, samples: 120, thresh: "0.5", message: "NaN"},
		{name: "+Inf is inconclusive, not a fail",
			world: with(good, func(w *world) { w.canaryValue[ttftQuery] = vec(math.Inf(1)) }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, samples: 120, thresh: "0.5", message: "+Inf"},
		{name: "stable NaN is inconclusive",
			world: with(good, func(w *world) { w.stableValue[ttftQuery] = vec(math.NaN()) }), check: ttft("", "1.5"),
			verdict: servingv1.VerdictInconclusive, value: "0.2", samples: 120, message: "stable: the query returned NaN"},
		{name: "several series are inconclusive",
			world: with(good, func(w *world) { w.canaryValue[ttftQuery] = vec(0.1, 0.2) }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, samples: 120, thresh: "0.5", message: "returned 2 series"},
		{name: "a scalar answer is fine",
			world: with(good, func(w *world) { w.canaryValue[ttftQuery] = &model.Scalar{Value: 0.3} }), check: ttft("0.5", ""),
			verdict: servingv1.VerdictPass, value: "0.3", thresh: "0.5", samples: 120},
		{name: "TGI has no time to first token",
			world: world{engine: servingv1.EngineTGI, canarySamples: 100, stableSample: 100}, check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, message: "TGI exports no time-to-first-token metric"},
		{name: "Triton has no inter-token latency",
			world:   world{engine: servingv1.EngineTriton, canarySamples: 100, stableSample: 100},
			check:   servingv1.AnalysisCheck{Name: "itl", Metric: servingv1.MetricInterTokenLatency, Max: "0.1"},
			verdict: servingv1.VerdictInconclusive, message: "Triton exports no inter-token latency metric"},
		{name: "Triton without histogram latencies says how to turn them on",
			world: world{engine: servingv1.EngineTriton, canarySamples: 100, stableSample: 100}, check: ttft("0.5", ""),
			verdict: servingv1.VerdictInconclusive, samples: 100, thresh: "0.5", message: "histogram_latencies=true"},
		{name: "a bad bound is inconclusive", world: good, check: ttft("fast", ""),
			verdict: servingv1.VerdictInconclusive, message: `max "fast" is not a decimal number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(tc.world.engine, tc.check)
			run := Run(context.Background(), tc.world.querier(req.Window), req)
			if len(run.Checks) != 1 {
				t.Fatalf("got %d check results, want 1", len(run.Checks))
			}
			got := run.Checks[0]
			t.Logf("%+v", got)
			if got.Verdict != tc.verdict || run.Verdict != tc.verdict {
				t.Errorf("verdict %s (run %s), want %s", got.Verdict, run.Verdict, tc.verdict)
			}
			if got.Value != tc.value || got.Threshold != tc.thresh || got.Samples != tc.samples {
				t.Errorf("value %q threshold %q samples %d, want %q %q %d", got.Value, got.Threshold, got.Samples, tc.value, tc.thresh, tc.samples)
			}
			if !strings.Contains(got.Message, tc.message) {
				t.Errorf("message %q does not contain %q", got.Message, tc.message)
			}
			if tc.verdict != servingv1.VerdictPass && got.Message == "" {
				t.Errorf("a %s verdict needs a message", tc.verdict)
			}
			if got.Name != tc.check.Name || run.Step != 2 || !run.Time.Time.Equal(now) {
				t.Errorf("name %q step %d time %s", got.Name, run.Step, run.Time)
			}
		})
	}
}

// ErrorRatio counts its samples from all requests, failed ones included: a canary
// that fails every request has no finished ones, and must fail, not be inconclusive.
func TestErrorRatioCountsFailedRequests(t *testing.T) {
	errQuery := BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricErrorRatio)
	req := request(servingv1.EngineVLLM, servingv1.AnalysisCheck{Name: "errors", Metric: servingv1.MetricErrorRatio, Max: "0.05"})
	f := &fakeQuerier{answers: map[string]model.Value{
		Expand(SamplesQuery(servingv1.EngineVLLM, ""), canary, req.Window):                         vec(0),
		Expand(SamplesQuery(servingv1.EngineVLLM, servingv1.MetricErrorRatio), canary, req.Window): vec(60),
		Expand(errQuery, canary, req.Window):                                                       vec(1),
	}}
	run := Run(context.Background(), f, req)
	if c := run.Checks[0]; c.Verdict != servingv1.VerdictFail || c.Samples != 60 || c.Value != "1" {
		t.Errorf("got %+v, want Fail with 60 samples and value 1", c)
	}
	if !strings.Contains(run.Checks[0].Message, "error ratio") {
		t.Errorf("message %q should name the error ratio", run.Checks[0].Message)
	}
}

func TestCustomQuery(t *testing.T) {
	custom := `max(my_queue_depth{{{selector}}}) + 0*count_over_time(up{{{selector}}}[{{window}}])`
	check := servingv1.AnalysisCheck{Name: "depth", Query: custom, MaxRatioToStable: "2"}
	w := world{engine: servingv1.EngineTGI, canarySamples: 50, stableSample: 50,
		canaryValue: map[string]model.Value{custom: vec(3)},
		stableValue: map[string]model.Value{custom: vec(1)}}
	req := request(servingv1.EngineTGI, check)
	f := w.querier(req.Window)
	run := Run(context.Background(), f, req)
	c := run.Checks[0]
	if c.Verdict != servingv1.VerdictFail || c.Threshold != "2 (2 x stable 1)" || c.Message != "value 3 is above the threshold 2 (2 x stable 1)" {
		t.Errorf("got %+v", c)
	}
	wantQuery := `max(my_queue_depth{` + canary.Selector + `}) + 0*count_over_time(up{` + canary.Selector + `}[30s])`
	if c.Query != wantQuery {
		t.Errorf("query %s, want %s", c.Query, wantQuery)
	}
	// Its samples are the engine's finished requests, for the canary and stable.
	for _, target := range []Target{canary, stable} {
		want := Expand(SamplesQuery(servingv1.EngineTGI, ""), target, req.Window)
		if !contains(f.sent, want) {
			t.Errorf("queries sent %q lack %q", f.sent, want)
		}
	}
}

func TestPrometheusErrors(t *testing.T) {
	checks := []servingv1.AnalysisCheck{
		{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.5"},
		{Name: "e2e", Metric: servingv1.MetricEndToEndLatency, Max: "5"},
		{Name: "queue", Metric: servingv1.MetricQueueLength, Max: "3"},
	}
	t.Run("unreachable: every check inconclusive, one query sent", func(t *testing.T) {
		refused := &url.Error{Op: "Post", URL: "http://prometheus:9090/api/v1/query",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
		f := &fakeQuerier{err: refused}
		run := Run(context.Background(), f, request(servingv1.EngineVLLM, checks...))
		if run.Verdict != servingv1.VerdictInconclusive {
			t.Errorf("run verdict %s, want Inconclusive", run.Verdict)
		}
		for _, c := range run.Checks {
			if c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "Prometheus is unreachable") ||
				!strings.Contains(c.Message, "connection refused") {
				t.Errorf("%s: %+v", c.Name, c)
			}
		}
		if len(f.sent) != 1 {
			t.Errorf("sent %d queries to an unreachable Prometheus, want 1", len(f.sent))
		}
	})
	t.Run("the run's time running out", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		run := Run(ctx, &fakeQuerier{err: context.Canceled}, request(servingv1.EngineVLLM, checks...))
		for _, c := range run.Checks {
			if c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "ran out of time") {
				t.Errorf("%s: %+v", c.Name, c)
			}
		}
	})
	t.Run("no Prometheus configured", func(t *testing.T) {
		run := Run(context.Background(), nil, request(servingv1.EngineVLLM, checks...))
		for _, c := range run.Checks {
			if c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "--prometheus-url") {
				t.Errorf("%s: %+v", c.Name, c)
			}
		}
	})
	t.Run("a refused query is inconclusive and the others are judged", func(t *testing.T) {
		bad := `sum(rate(broken{{{selector}}}[{{window}}])`
		req := request(servingv1.EngineVLLM, append([]servingv1.AnalysisCheck{{Name: "bad", Query: bad, Max: "1"}}, checks...)...)
		w := world{engine: servingv1.EngineVLLM, canarySamples: 100, stableSample: 100, canaryValue: map[string]model.Value{
			ttftQuery: vec(0.1),
			BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricEndToEndLatency): vec(1),
			BuiltinQuery(servingv1.EngineVLLM, servingv1.MetricQueueLength):     vec(0),
		}}
		f := w.querier(req.Window)
		f.errs[Expand(bad, canary, req.Window)] = &QueryError{Reached: true,
			Reason: "Prometheus refused the query (bad_data: 1:36: parse error: unclosed left parenthesis)"}
		run := Run(context.Background(), f, req)
		if run.Verdict != servingv1.VerdictInconclusive {
			t.Errorf("run verdict %s, want Inconclusive", run.Verdict)
		}
		if c := run.Checks[0]; c.Verdict != servingv1.VerdictInconclusive || !strings.Contains(c.Message, "Prometheus refused the query (bad_data: 1:36: parse error") {
			t.Errorf("bad query: %+v", c)
		}
		for _, c := range run.Checks[1:] {
			if c.Verdict != servingv1.VerdictPass {
				t.Errorf("%s: %+v, want Pass", c.Name, c)
			}
		}
		// The sample count is asked once for all the checks that share it.
		samples := Expand(SamplesQuery(servingv1.EngineVLLM, ""), canary, req.Window)
		if n := count(f.sent, samples); n != 1 {
			t.Errorf("the canary's sample count was queried %d times, want 1", n)
		}
	})
}

func TestCombine(t *testing.T) {
	r := func(vs ...servingv1.Verdict) []servingv1.CheckResult {
		var out []servingv1.CheckResult
		for _, v := range vs {
			out = append(out, servingv1.CheckResult{Verdict: v})
		}
		return out
	}
	pass, fail, inc := servingv1.VerdictPass, servingv1.VerdictFail, servingv1.VerdictInconclusive
	for _, tc := range []struct {
		in   []servingv1.CheckResult
		want servingv1.Verdict
	}{
		{r(pass, pass), pass},
		{r(pass, inc), inc},
		{r(inc, fail, pass), fail},
		{r(fail), fail},
		{nil, inc},
	} {
		if got := Combine(tc.in); got != tc.want {
			t.Errorf("Combine(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestRequestForDefaults(t *testing.T) {
	req := RequestFor(servingv1.EngineVLLM, 0, servingv1.AnalysisStep{}, canary, stable, now)
	if req.Window != time.Minute || req.MinSamples != 20 {
		t.Errorf("window %s minSamples %d, want the CRD defaults 1m and 20", req.Window, req.MinSamples)
	}
}

func TestNewPrometheusRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "prometheus:9090", "ftp://prometheus", "http://"} {
		if _, err := NewPrometheus(u, ObjectURL); err == nil {
			t.Errorf("NewPrometheus(%q) accepted it", u)
		}
	}
	if _, err := NewPrometheus("http://prometheus.monitoring:9090", ObjectURL); err != nil {
		t.Error(err)
	}
}

func contains(list []string, s string) bool { return count(list, s) > 0 }

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
