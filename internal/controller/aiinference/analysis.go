package aiinference

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/analysis"
)

// analysisStep runs the current step's analysis when a run is due and judges the
// step: Pass once enough runs passed, Fail or Inconclusive past their limits, ""
// while it goes on.
func analysisStep(st *servingv1.RolloutStatus, a *servingv1.AnalysisStep, in rolloutInput) servingv1.Verdict {
	interval := analysisInterval(a)
	last := st.StepStartedAt.Time
	if run := lastRunOfStep(st); run != nil {
		last = run.Time.Time
	}
	if in.now.Before(last.Add(interval)) {
		return ""
	}
	run := in.analyze(st.Step, a)
	run.Step, run.Time = st.Step, metav1.NewTime(in.now.Truncate(time.Second))
	st.Analysis = append(st.Analysis, run)
	if n := len(st.Analysis); n > maxAnalysisRuns {
		st.Analysis = st.Analysis[n-maxAnalysisRuns:]
	}
	if st.StepVerdicts == nil {
		st.StepVerdicts = &servingv1.VerdictCounts{}
	}
	switch run.Verdict {
	case servingv1.VerdictPass:
		st.StepVerdicts.Pass++
	case servingv1.VerdictFail:
		st.StepVerdicts.Fail++
	default:
		st.StepVerdicts.Inconclusive++
	}
	passed, failed, inconclusive := st.StepVerdicts.Pass, st.StepVerdicts.Fail, st.StepVerdicts.Inconclusive
	switch {
	case failed > a.FailureLimit:
		return servingv1.VerdictFail
	case inconclusive > a.InconclusiveLimit:
		return servingv1.VerdictInconclusive
	case passed >= max(a.Runs, 1):
		return servingv1.VerdictPass
	}
	return ""
}

func analysisInterval(a *servingv1.AnalysisStep) time.Duration {
	if a.Interval == nil || a.Interval.Duration <= 0 {
		return time.Minute
	}
	return a.Interval.Duration
}

// tally says how the step's runs stand against its limits.
func tally(counts *servingv1.VerdictCounts, a *servingv1.AnalysisStep) string {
	var c servingv1.VerdictCounts
	if counts != nil {
		c = *counts
	}
	return fmt.Sprintf("%d of %d passing runs, %d failed (limit %d), %d inconclusive (limit %d)",
		c.Pass, max(a.Runs, 1), c.Fail, a.FailureLimit, c.Inconclusive, a.InconclusiveLimit)
}

// failedChecks names what the latest run found wrong.
func failedChecks(runs []servingv1.AnalysisRun) string {
	if len(runs) == 0 {
		return "no run"
	}
	run := runs[len(runs)-1]
	msg := ""
	for _, c := range run.Checks {
		if c.Verdict == servingv1.VerdictPass {
			continue
		}
		if msg != "" {
			msg += "; "
		}
		msg += fmt.Sprintf("%s %s", c.Name, c.Verdict)
		if c.Value != "" {
			msg += fmt.Sprintf(" (value %s, threshold %s, %d samples)", c.Value, c.Threshold, c.Samples)
		}
		if c.Message != "" {
			msg += ": " + c.Message
		}
	}
	if msg == "" {
		msg = "run " + string(run.Verdict)
	}
	return msg
}

// lastRunOfStep is the current step's latest analysis run; nil before its first.
func lastRunOfStep(st *servingv1.RolloutStatus) *servingv1.AnalysisRun {
	for i := len(st.Analysis) - 1; i >= 0; i-- {
		if st.Analysis[i].Step == st.Step {
			return &st.Analysis[i]
		}
	}
	return nil
}

// canaryTargets are the PromQL label matchers of the canary's and the stable
// pods: Prometheus labels scraped pods with their namespace and name, and the
// names of a Deployment's pods are <deployment>-<hash>-<suffix>.
func canaryTargets(obj *servingv1.AIInference) (canary, stable string) {
	pods := func(deployment string) string {
		return fmt.Sprintf(`namespace=%q,pod=~%q`, obj.Namespace, deployment+"-[a-z0-9]+-[a-z0-9]+")
	}
	return pods(obj.CanaryName()), pods(obj.Name)
}

// runAnalysis runs one analysis of the current step against Prometheus.
func (r *Reconciler) runAnalysis(ctx context.Context, obj *servingv1.AIInference, step int32, a *servingv1.AnalysisStep) servingv1.AnalysisRun {
	url, source := obj.Spec.Rollout.Canary.PrometheusURL, analysis.ObjectURL
	if url == "" {
		url, source = r.Options.PrometheusURL, analysis.OperatorURL
	}
	canary, stable := canaryTargets(obj)
	in := AnalysisInput{PrometheusURL: url, URLSource: source, Engine: obj.Spec.Engine.Type, Step: step, Analysis: a,
		Window: analysisInterval(a), CanarySelector: canary, StableSelector: stable}
	if url == "" || r.Analyzer == nil {
		return inconclusiveRun(a, "no Prometheus to query: set the operator's --prometheus-url or rollout.canary.prometheusURL")
	}
	ctx, cancel := context.WithTimeout(ctx, analysisTimeout)
	defer cancel()
	return r.Analyzer(ctx, in)
}

// analysisTimeout bounds one analysis run, so a slow Prometheus cannot hold a
// reconcile worker.
const analysisTimeout = 15 * time.Second

// inconclusiveRun is a run whose every check could not be judged, for the reason given.
func inconclusiveRun(a *servingv1.AnalysisStep, message string) servingv1.AnalysisRun {
	run := servingv1.AnalysisRun{Verdict: servingv1.VerdictInconclusive}
	for _, c := range a.Checks {
		run.Checks = append(run.Checks, servingv1.CheckResult{Name: c.Name, Verdict: servingv1.VerdictInconclusive, Message: message})
	}
	return run
}

// AnalysisInput is one analysis run's question.
type AnalysisInput struct {
	// PrometheusURL is the Prometheus to query.
	PrometheusURL string
	// URLSource says who set PrometheusURL: the object's
	// rollout.canary.prometheusURL, set by anyone who may edit it, shows nothing
	// of what it answers but a status code and fixed reasons; the operator's
	// --prometheus-url shows Prometheus's own error messages too.
	URLSource analysis.URLSource
	// Engine is the model server, whose metrics the built-in checks read.
	Engine servingv1.EngineType
	// Step is the index of the step; Analysis its checks and limits.
	Step     int32
	Analysis *servingv1.AnalysisStep
	// Window is the span of requests a run looks at.
	Window time.Duration
	// CanarySelector and StableSelector are the PromQL label matchers of the
	// canary's and the stable pods.
	CanarySelector, StableSelector string
}

// Analyzer runs one analysis; the result's checks carry the values and verdicts.
type Analyzer func(ctx context.Context, in AnalysisInput) servingv1.AnalysisRun

// PrometheusAnalyzer runs an analysis with the engines' built-in queries (or the
// user's) against the Prometheus the input names.
func PrometheusAnalyzer(ctx context.Context, in AnalysisInput) servingv1.AnalysisRun {
	q, err := analysis.NewPrometheus(in.PrometheusURL, in.URLSource)
	if err != nil {
		return inconclusiveRun(in.Analysis, fmt.Sprintf("cannot query Prometheus at %s: %v", in.PrometheusURL, err))
	}
	req := analysis.RequestFor(in.Engine, in.Step, *in.Analysis, analysis.Target{Selector: in.CanarySelector}, analysis.Target{Selector: in.StableSelector}, time.Now())
	return analysis.Run(ctx, q, req)
}
