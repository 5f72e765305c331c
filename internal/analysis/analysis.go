// Package analysis judges a canary on its model servers' metrics: one run of an
// analysis step sends each check's PromQL to Prometheus for the canary's pods
// (and, for a bound relative to stable, for the stable pods over the same window),
// and returns the run's results as status.rollout records them.
//
// A run never passes on too little data. A check is Inconclusive, never Pass, when
// the canary (or, for maxRatioToStable, the stable set) finished fewer requests
// than minSamples in the window, when a query returns nothing, NaN or ±Inf, when
// Prometheus refuses a query, and when Prometheus cannot be reached. The run is
// Fail if any check fails, else Inconclusive if any check is, else Pass.
//
// Run is pure but for the Querier: the controller passes a Prometheus client
// (NewPrometheus) and the time, tests a fake. What the results say of a failed
// query is the Querier's error text: Prometheus keeps it to an HTTP status code
// and reasons from a fixed set for a URL set in an object (see URLSource).
package analysis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Defaults of an analysis step, the same as the CRD's (kubebuilder:default), for
// a step that did not go through the API server.
const (
	DefaultInterval   = time.Minute
	DefaultMinSamples = 20
)

// Target is a set of pods to judge.
type Target struct {
	// Selector is PromQL label matchers without braces, e.g.
	// namespace="ns",pod=~"llama-chat-canary-[a-z0-9]+-[a-z0-9]+". Prometheus
	// Operator PodMonitors and kubernetes_sd relabeling both give series the
	// namespace and pod labels. PromQL regular expressions are anchored, so
	// pod=~"llama-chat-[a-z0-9]+-[a-z0-9]+" does not match llama-chat-canary-x-y.
	Selector string
}

// Request is one run of an analysis step.
type Request struct {
	// Engine of the pods judged; it picks the built-in checks' metrics.
	Engine servingv1.EngineType
	// Step is the index of the canary step the run belongs to.
	Step int32
	// Checks to judge.
	Checks []servingv1.AnalysisCheck
	// MinSamples is the fewest requests a target must have finished in the window.
	MinSamples int32
	// Window each query looks back over: the step's interval.
	Window time.Duration
	// Canary and Stable are the pods judged and the pods they are compared with.
	Canary, Stable Target
	// Time the queries are evaluated at, and the run's time.
	Time time.Time
}

// RequestFor is the Request of a run of an analysis step, with the step's
// interval as the window and the CRD's defaults where the step leaves a field unset.
func RequestFor(engine servingv1.EngineType, stepIndex int32, step servingv1.AnalysisStep, canary, stable Target, now time.Time) Request {
	window := DefaultInterval
	if step.Interval != nil && step.Interval.Duration > 0 {
		window = step.Interval.Duration
	}
	minSamples := step.MinSamples
	if minSamples < 1 {
		minSamples = DefaultMinSamples
	}
	return Request{
		Engine:     engine,
		Step:       stepIndex,
		Checks:     step.Checks,
		MinSamples: minSamples,
		Window:     window,
		Canary:     canary,
		Stable:     stable,
		Time:       now,
	}
}

// Run makes one analysis run: every check of the request, judged with q. A nil q
// (no Prometheus configured) makes every check Inconclusive, saying so.
func Run(ctx context.Context, q Querier, req Request) servingv1.AnalysisRun {
	if req.Time.IsZero() {
		req.Time = time.Now()
	}
	if req.Window <= 0 {
		req.Window = DefaultInterval
	}
	if req.MinSamples < 1 {
		req.MinSamples = DefaultMinSamples
	}
	r := &runner{q: q, req: req, memo: map[string]queryResult{}}
	if q == nil {
		r.unreachable = &noValue{msg: "no Prometheus to query: set the operator's --prometheus-url or rollout.canary.prometheusURL"}
	}
	run := servingv1.AnalysisRun{
		Step:   req.Step,
		Time:   metav1.NewTime(req.Time),
		Checks: make([]servingv1.CheckResult, 0, len(req.Checks)),
	}
	for _, check := range req.Checks {
		run.Checks = append(run.Checks, r.check(ctx, check))
	}
	run.Verdict = Combine(run.Checks)
	return run
}

// Combine is a run's verdict from its checks': Fail if any failed, else
// Inconclusive if any is (or there are none), else Pass.
func Combine(checks []servingv1.CheckResult) servingv1.Verdict {
	if len(checks) == 0 {
		return servingv1.VerdictInconclusive
	}
	verdict := servingv1.VerdictPass
	for _, c := range checks {
		switch c.Verdict {
		case servingv1.VerdictFail:
			return servingv1.VerdictFail
		case servingv1.VerdictPass:
		default:
			verdict = servingv1.VerdictInconclusive
		}
	}
	return verdict
}

// runner holds one run's state: the queries already answered (the sample counts
// are shared by most checks) and whether Prometheus was found unreachable, after
// which no further query is sent.
type runner struct {
	q           Querier
	req         Request
	memo        map[string]queryResult
	unreachable error
}

type queryResult struct {
	value float64
	err   error // an *Error saying why there is no value
}

// noValue says why a query gave no usable value; its message is for a person.
// noData marks an empty result or NaN: nothing measured, rather than a fault.
type noValue struct {
	msg    string
	noData bool
}

func (e *noValue) Error() string { return e.msg }

// query sends one query (once per run) and reduces its answer to one number.
func (r *runner) query(ctx context.Context, promql string) (float64, error) {
	if res, ok := r.memo[promql]; ok {
		return res.value, res.err
	}
	var res queryResult
	if r.unreachable != nil {
		res.err = r.unreachable
	} else {
		v, err := r.q.Query(ctx, promql, r.req.Time)
		res.value, res.err = single(v, err)
		var qe *QueryError
		if err != nil && ctx.Err() != nil {
			// The caller's bound on the whole run, not Prometheus's answer.
			res.err = &noValue{msg: fmt.Sprintf("the analysis run ran out of time (%v) with queries left; "+
				"Prometheus answers slowly", ctx.Err())}
			r.unreachable = res.err
		} else if err != nil && !(errors.As(err, &qe) && qe.Reached) {
			// No Prometheus answered: the request did not get through (refused,
			// timed out, DNS), or what answered is not a Prometheus API. Every
			// other query of this run would fare the same.
			res.err = &noValue{msg: fmt.Sprintf("Prometheus is unreachable: %v; no check can be judged until "+
				"a Prometheus answers there (check the operator's --prometheus-url or rollout.canary.prometheusURL)", err)}
			r.unreachable = res.err
		}
	}
	r.memo[promql] = res
	return res.value, res.err
}

// single reduces a query's answer to one finite number, or says why it cannot.
func single(v model.Value, err error) (float64, error) {
	if err != nil {
		var qe *QueryError
		if errors.As(err, &qe) && qe.Reached {
			return 0, &noValue{msg: qe.Reason}
		}
		return 0, err
	}
	var f float64
	switch v := v.(type) {
	case *model.Scalar:
		f = float64(v.Value)
	case model.Vector:
		switch len(v) {
		case 0:
			return 0, &noValue{msg: "the query returned no data", noData: true}
		case 1:
			f = float64(v[0].Value)
		default:
			return 0, &noValue{msg: fmt.Sprintf("the query returned %d series where one number is needed; "+
				"aggregate it, e.g. with sum() or max()", len(v))}
		}
	default:
		return 0, &noValue{msg: fmt.Sprintf("the query returned a %s where one number is needed", v.Type())}
	}
	if math.IsNaN(f) {
		return 0, &noValue{msg: "the query returned NaN (nothing measured in the window, or 0/0)", noData: true}
	}
	if math.IsInf(f, 0) {
		return 0, &noValue{msg: "the query returned " + formatValue(f) + " (a division by zero)"}
	}
	return f, nil
}

// check judges one check.
func (r *runner) check(ctx context.Context, check servingv1.AnalysisCheck) servingv1.CheckResult {
	res := servingv1.CheckResult{Name: check.Name, Verdict: servingv1.VerdictInconclusive}
	inconclusive := func(format string, args ...any) servingv1.CheckResult {
		res.Verdict = servingv1.VerdictInconclusive
		res.Message = fmt.Sprintf(format, args...)
		return res
	}
	req := r.req
	window := promDuration(req.Window)

	var (
		valueQuery string
		b          builtin
	)
	switch {
	case check.Metric != "" && check.Query != "":
		return inconclusive("check sets both metric and query; set one")
	case check.Metric != "":
		eq, ok := queries[req.Engine]
		if !ok {
			return inconclusive("unknown engine type %q", req.Engine)
		}
		if b, ok = eq.Checks[check.Metric]; !ok {
			return inconclusive("unknown analysis metric %q", check.Metric)
		}
		if b.Unavailable != "" {
			return inconclusive("%s", b.Unavailable)
		}
		valueQuery = b.Value
	case check.Query != "":
		if _, ok := queries[req.Engine]; !ok {
			return inconclusive("unknown engine type %q", req.Engine)
		}
		valueQuery = check.Query
		b = builtin{Measures: "value"}
	default:
		return inconclusive("check sets neither metric nor query")
	}
	res.Query = Expand(valueQuery, req.Canary, req.Window)

	limit, ratio, err := bounds(check)
	if err != nil {
		return inconclusive("%v", err)
	}

	if ratio == nil {
		res.Threshold = formatValue(*limit)
	}

	// Enough requests, from the canary and, for a relative bound, from stable.
	samplesQuery := SamplesQuery(req.Engine, check.Metric)
	samples, hint, err := r.samples(ctx, samplesQuery, req.Canary)
	if err != nil {
		return inconclusive("counting the canary's requests: %v", err)
	}
	res.Samples = samples
	if samples < int64(req.MinSamples) {
		return inconclusive("the canary finished %d requests in the last %s, fewer than minSamples %d; "+
			"send it more traffic (a higher step weight) or lengthen the interval%s",
			samples, window, req.MinSamples, hint)
	}
	var stableValue float64
	if ratio != nil {
		n, hint, err := r.samples(ctx, samplesQuery, req.Stable)
		if err != nil {
			return inconclusive("counting the stable pods' requests: %v", err)
		}
		if n < int64(req.MinSamples) {
			return inconclusive("the stable pods finished %d requests in the last %s, fewer than minSamples %d, "+
				"so maxRatioToStable has nothing to compare with%s", n, window, req.MinSamples, hint)
		}
	}

	// The values.
	value, err := r.query(ctx, res.Query)
	if err != nil {
		return inconclusive("canary: %v%s", err, noDataHint(err, b))
	}
	res.Value = formatValue(value)
	if ratio != nil {
		stableValue, err = r.query(ctx, Expand(valueQuery, req.Stable, req.Window))
		if err != nil {
			return inconclusive("stable: %v%s (query %s)", err, noDataHint(err, b), Expand(valueQuery, req.Stable, req.Window))
		}
	}

	// The threshold: max, stable x ratio, or the lower of the two.
	threshold, text := thresholdOf(limit, ratio, stableValue)
	res.Threshold = text
	if value <= threshold {
		res.Verdict = servingv1.VerdictPass
		return res
	}
	res.Verdict = servingv1.VerdictFail
	res.Message = fmt.Sprintf("%s %s is above the threshold %s", b.Measures, withUnit(res.Value, b.Unit), text)
	return res
}

// bounds parses a check's max and maxRatioToStable; nil when unset.
func bounds(check servingv1.AnalysisCheck) (limit, ratio *float64, err error) {
	parse := func(field, s string) (*float64, error) {
		if s == "" {
			return nil, nil
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%s %q is not a decimal number such as 0.5", field, s)
		}
		return &f, nil
	}
	if limit, err = parse("max", check.Max); err != nil {
		return nil, nil, err
	}
	if ratio, err = parse("maxRatioToStable", check.MaxRatioToStable); err != nil {
		return nil, nil, err
	}
	if limit == nil && ratio == nil {
		return nil, nil, errors.New("check has no bound: set max, maxRatioToStable or both")
	}
	return limit, ratio, nil
}

// thresholdOf is the bound a value is held to and its text for status.
func thresholdOf(limit, ratio *float64, stable float64) (float64, string) {
	switch {
	case ratio == nil:
		return *limit, formatValue(*limit)
	case limit == nil:
		t := *ratio * stable
		return t, fmt.Sprintf("%s (%s x stable %s)", formatValue(t), formatValue(*ratio), formatValue(stable))
	default:
		relative := *ratio * stable
		t := math.Min(*limit, relative)
		return t, fmt.Sprintf("%s (lower of max %s and %s x stable %s)",
			formatValue(t), formatValue(*limit), formatValue(*ratio), formatValue(stable))
	}
}

// samples counts a target's requests in the window. No series at all counts as
// none, with a hint that the pods may not be scraped; other errors are returned.
func (r *runner) samples(ctx context.Context, samplesQuery string, target Target) (int64, string, error) {
	n, err := r.query(ctx, Expand(samplesQuery, target, r.req.Window))
	var nv *noValue
	if errors.As(err, &nv) && nv.noData {
		return 0, " (no series matched: if requests were sent, check that Prometheus scrapes these pods " +
			"and labels their series with namespace and pod, as a PodMonitor does)", nil
	}
	if err != nil {
		return 0, "", err
	}
	return int64(math.Round(n)), "", nil
}

// noDataHint adds what a check's engine may be missing when its query returned nothing.
func noDataHint(err error, b builtin) string {
	var nv *noValue
	if !errors.As(err, &nv) || !nv.noData || b.NoData == "" {
		return ""
	}
	return "; " + b.NoData
}

func withUnit(v, unit string) string {
	if unit == "" {
		return v
	}
	return v + " " + unit
}

// formatValue writes a value with four significant digits, as status shows it.
func formatValue(f float64) string {
	return strconv.FormatFloat(f, 'g', 4, 64)
}
