package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/analysistest"
)

// These tests judge canaries in the real manager against a real Prometheus server
// scraping real llm-d-inference-sim processes (vLLM's OpenAI API and metrics, with
// the harness's stand-in for vLLM's HTTP metrics in front). Each test runs the
// simulators of its object's pods under the names of the pods it makes in envtest
// (<name>-<hash>-<suffix> for stable, <name>-canary-<hash>-<suffix> for the
// canary), so the controller's selectors find their series, and points
// spec.rollout.canary.prometheusURL at its own Prometheus, which scrapes every second.
// The five cases take about 40 s with -parallel 5, 70 s two at a time (the
// default on 2 cores):
//
//	KUBEBUILDER_ASSETS=$(hack/tools/build.sh envtest) go test ./internal/controller/aiinference/integration/ -run TestAnalysis -parallel 5 -count=1 -v

// runInterval is the analysis steps' interval, and so the window each run looks at.
const runInterval = 6 * time.Second

// analysisChecks are the checks of every analysis step here: absolute and
// relative bounds on the canary's time to first token, its error ratio, and its
// end-to-end latency relative to the stable pod's.
func analysisChecks() []servingv1.AnalysisCheck {
	return []servingv1.AnalysisCheck{
		{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.1", MaxRatioToStable: "2"},
		{Name: "errors", Metric: servingv1.MetricErrorRatio, Max: "0.05"},
		{Name: "e2e", Metric: servingv1.MetricEndToEndLatency, MaxRatioToStable: "1.5"},
	}
}

// analysisStep is a canary step judged by analysis every runInterval.
func analysisStep(weight, runs, inconclusiveLimit int32) servingv1.CanaryStep {
	return servingv1.CanaryStep{Weight: weight, Analysis: &servingv1.AnalysisStep{
		Checks: analysisChecks(), Interval: &metav1.Duration{Duration: runInterval}, Runs: runs,
		MinSamples: 20, FailureLimit: 0, InconclusiveLimit: inconclusiveLimit,
	}}
}

// analysedCanary is one test's object, its simulated pods and its Prometheus.
type analysedCanary struct {
	ns, name string
	key      client.ObjectKey
	// stableSim and canarySim serve as the stable and the canary pod.
	stableSim, canarySim *analysistest.Pod
	prom                 *analysistest.Prometheus
	// stablePod is the stable pod in envtest; stableRev the revision it runs.
	stablePod *corev1.Pod
	stableRev string
	// changed is when the spec changed, starting the canary.
	changed time.Time
	// runs are the analysis runs seen in status, oldest first: a step's runs
	// leave status when the step ends.
	runs []servingv1.AnalysisRun
}

// startAnalysedCanary starts a stable and a canary simulator under the pod names
// of an object called name, a Prometheus scraping them, and load (8 requests a
// second to the stable pod, canaryRate to the canary); then it brings the object
// (one replica, a canary of one pod next to it) to Ready, changes its spec and
// makes the canary's pod ready, which starts the first step.
func startAnalysedCanary(t *testing.T, g *WithT, name string, canaryRate float64, steps ...servingv1.CanaryStep) *analysedCanary {
	t.Helper()
	analysistest.RequireBinaries(t)
	ctx := context.Background()
	ns := credentialedNamespace(t)
	c := &analysedCanary{ns: ns, name: name, key: client.ObjectKey{Namespace: ns, Name: name}}
	stableName, canaryName := name+"-7c9d8f6b5-x2k4p", name+"-canary-5d8f7c9b6-q7w2e"
	sims := analysistest.StartPods(t,
		analysistest.PodSpec{Namespace: ns, Name: stableName},
		analysistest.PodSpec{Namespace: ns, Name: canaryName})
	c.stableSim, c.canarySim = sims[0], sims[1]
	c.prom = analysistest.StartPrometheus(t, analysistest.TargetsOf(sims...))
	analysistest.StartLoad(t, 8, c.stableSim)
	analysistest.StartLoad(t, canaryRate, c.canarySim)

	obj := newInference(ns, name)
	obj.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1, MaxSurge: ptr.To[int32](1), Steps: steps, PrometheusURL: c.prom.URL,
		Traffic: &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{Name: "inference-gateway"}}},
	}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	c.stablePod = podOf(t, g, ns, name, stableName)
	setDeploymentStatus(g, c.key, 1, 1)
	eventually(t, g, c.key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady))
	})
	c.stableRev = getDeployment(g, c.key).Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
	// Prometheus hands new targets to its scrapers about 5 s after it starts.
	c.prom.WaitForTargetsUp(t, 2, 20*time.Second)

	c.changed = time.Now()
	updateInference(g, c.key, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len=8192"} })
	canaryKey := client.ObjectKey{Namespace: ns, Name: name + "-canary"}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, canaryKey, &appsv1.Deployment{})).To(Succeed())
	}).WithTimeout(waitTimeout).Should(Succeed())
	podOf(t, g, ns, canaryKey.Name, canaryName)
	setDeploymentStatus(g, canaryKey, 1, 1)
	c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout).NotTo(BeNil())
		g.Expect(obj.Status.Rollout.StepStartedAt).NotTo(BeNil())
	})
	return c
}

// eventually waits for the object to satisfy check, keeping the analysis runs it sees.
func (c *analysedCanary) eventually(t *testing.T, g *WithT, check func(g Gomega, obj *servingv1.AIInference)) *servingv1.AIInference {
	t.Helper()
	return eventually(t, g, c.key, 4*runInterval, func(g Gomega, obj *servingv1.AIInference) {
		c.record(obj)
		check(g, obj)
	})
}

func (c *analysedCanary) record(obj *servingv1.AIInference) {
	if obj.Status.Rollout == nil {
		return
	}
	for _, run := range obj.Status.Rollout.Analysis {
		seen := false
		for _, r := range c.runs {
			seen = seen || (r.Step == run.Step && r.Time.Equal(&run.Time))
		}
		if !seen {
			c.runs = append(c.runs, run)
		}
	}
}

// canarySelector is the PromQL selector the controller must send for the canary's pods.
func (c *analysedCanary) canarySelector() string {
	return fmt.Sprintf(`namespace=%q,pod=~"%s-canary-[a-z0-9]+-[a-z0-9]+"`, c.ns, c.name)
}

// logRuns shows the runs seen, as status recorded them.
func (c *analysedCanary) logRuns(t *testing.T) {
	t.Helper()
	var b strings.Builder
	for _, r := range c.runs {
		fmt.Fprintf(&b, "\nstep %d at %s (+%s after the spec changed): %s", r.Step+1, r.Time.Format(time.TimeOnly),
			r.Time.Sub(c.changed.Truncate(time.Second)), r.Verdict)
		for _, ch := range r.Checks {
			fmt.Fprintf(&b, "\n  %-6s %-12s value=%-7s threshold=%-45s samples=%-3d %s", ch.Name, ch.Verdict, ch.Value, ch.Threshold, ch.Samples, ch.Message)
		}
	}
	t.Logf("analysis runs of %s:%s", c.name, b.String())
	obj := &servingv1.AIInference{}
	if t.Failed() && k8s.Get(context.Background(), c.key, obj) == nil && obj.Status.Rollout != nil {
		b.Reset()
		for _, d := range obj.Status.Rollout.History {
			fmt.Fprintf(&b, "\n  %s step %d weight %d revision %s: %s", d.Time.Format(time.TimeOnly), d.Step+1, d.Weight, d.Revision, d.Message)
		}
		t.Logf("rollout of %s: phase %q step %d, %s; decisions:%s", c.name, obj.Status.Rollout.Phase, obj.Status.Rollout.Step, obj.Status.Rollout.Message, b.String())
	}
}

// expectJudged checks that a run's check carries what status promises: the query
// sent for the canary's pods, the value, the threshold, the sample count and the verdict.
func (c *analysedCanary) expectJudged(g Gomega, check servingv1.CheckResult, verdict servingv1.Verdict) {
	g.Expect(check.Verdict).To(Equal(verdict), "check %s: %s", check.Name, check.Message)
	g.Expect(check.Query).To(ContainSubstring(c.canarySelector()), "check %s", check.Name)
	value, err := strconv.ParseFloat(check.Value, 64)
	g.Expect(err).NotTo(HaveOccurred(), "check %s: value %q", check.Name, check.Value)
	g.Expect(value).To(BeNumerically(">=", 0))
	g.Expect(check.Threshold).NotTo(BeEmpty(), "check %s", check.Name)
	g.Expect(check.Samples).To(BeNumerically(">=", 20), "check %s", check.Name)
	if verdict == servingv1.VerdictFail {
		g.Expect(check.Message).To(ContainSubstring("above the threshold " + check.Threshold))
	}
}

// decisions are the decisions in the object's rollout history.
func decisions(obj *servingv1.AIInference) []string {
	var out []string
	for _, d := range obj.Status.Rollout.History {
		out = append(out, d.Decision)
	}
	return out
}

// expectEvent waits for an event of the object with this reason and type whose
// note holds text.
func expectEvent(g *WithT, key client.ObjectKey, eventType, reason, text string) {
	g.Eventually(func(g Gomega) {
		events := &eventsv1.EventList{}
		g.Expect(k8s.List(context.Background(), events, client.InNamespace(key.Namespace))).To(Succeed())
		var notes []string
		for _, e := range events.Items {
			if e.Regarding.Name == key.Name && e.Reason == reason && e.Type == eventType {
				notes = append(notes, e.Note)
			}
		}
		g.Expect(notes).To(ContainElement(ContainSubstring(text)), "%s event %s", eventType, reason)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

func expectCanaryRemoved(g *WithT, c *analysedCanary) {
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: c.name + "-canary"}, &appsv1.Deployment{}))
	}).WithTimeout(waitTimeout).Should(BeTrue(), "the canary's Deployment is removed")
}

// A good canary passes two analysis steps, 20% then 50% of the traffic, and is
// promoted: the stable Deployment takes the new template, then the canary goes.
func TestAnalysisPromotesAGoodCanary(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	c := startAnalysedCanary(t, g, "good", 8, analysisStep(20, 1, 2), analysisStep(50, 2, 2))
	defer c.logRuns(t)
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, c.key)).To(Equal([]int32{80, 20})) }).WithTimeout(waitTimeout).Should(Succeed())

	c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Step).To(Equal(int32(1)))
	})
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, c.key)).To(Equal([]int32{50, 50})) }).WithTimeout(waitTimeout).Should(Succeed())
	promoting := c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Phase).To(BeElementOf(servingv1.RolloutPromoting, servingv1.RolloutPromoted))
	})
	toPromoting := time.Since(c.changed)
	g.Expect(promoting.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoting), "the stable pod cannot run the new revision before the test makes it")
	g.Expect(readyCondition(promoting).Reason).To(Equal(servingv1.ReasonPromoting))
	g.Expect(decisions(promoting)).To(Equal([]string{"CanaryStarted", "StepStarted", "AnalysisPassed", "StepStarted", "AnalysisPassed", "Promoting"}))

	// Every run seen passed on every check, with its numbers in status. The run
	// that finishes a step leaves status with the step (history says it passed),
	// so of step 2's two runs the first is seen.
	g.Expect(c.runs).NotTo(BeEmpty())
	for _, run := range c.runs {
		g.Expect(run.Verdict).To(Equal(servingv1.VerdictPass))
		g.Expect(run.Checks).To(HaveLen(3))
		for _, check := range run.Checks {
			c.expectJudged(g, check, servingv1.VerdictPass)
		}
	}

	// The stable Deployment takes the new template; its pod is replaced.
	var newRev string
	g.Eventually(func(g Gomega) {
		newRev = getDeployment(g, c.key).Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
		g.Expect(newRev).NotTo(Equal(c.stableRev))
	}).WithTimeout(waitTimeout).Should(Succeed())
	deletePod(g, c.stablePod)
	podOf(t, g, c.ns, c.name, c.name+"-6b8d9c7f4-n5m6k")
	setDeploymentStatus(g, c.key, 1, 1)
	done := c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoted))
		g.Expect(obj.Status.Rollout.StableRevision).To(Equal(newRev))
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady))
	})
	toPromoted := time.Since(c.changed)
	g.Expect(decisions(done)[len(decisions(done))-1]).To(Equal("Promoted"))
	expectCanaryRemoved(g, c)
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, c.key)).To(Equal([]int32{100, 0})) }).WithTimeout(waitTimeout).Should(Succeed())
	expectEvent(g, c.key, corev1.EventTypeNormal, "AnalysisPassed", "analysis passed at step 2")
	expectEvent(g, c.key, corev1.EventTypeNormal, "Promoting", "every step passed")
	expectEvent(g, c.key, corev1.EventTypeNormal, "Promoted", "the stable pods run revision "+newRev)
	t.Logf("spec change to Promoting: %s (two steps: 1 then 2 runs of %s); to Promoted: %s",
		toPromoting.Round(100*time.Millisecond), runInterval, toPromoted.Round(100*time.Millisecond))
}

// A canary that turns slow, or starts failing requests, after its first passing
// run is rolled back by the next run, within the step (which needs three passing
// runs): all traffic back on the stable pod, the canary's Deployment removed.
func TestAnalysisRollsBackACanaryMadeBadMidStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// spoil makes the canary's simulator bad.
		spoil func(t *testing.T, sim *analysistest.Sim)
		// failing are the checks that must fail.
		failing []string
	}{
		{name: "slow", spoil: func(t *testing.T, sim *analysistest.Sim) { sim.SetTimeToFirstToken(t, 300*time.Millisecond) }, failing: []string{"ttft", "e2e"}},
		{name: "failing", spoil: func(t *testing.T, sim *analysistest.Sim) { sim.SetFailureRate(t, 30) }, failing: []string{"errors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			c := startAnalysedCanary(t, g, tc.name, 8, analysisStep(50, 3, 2))
			defer c.logRuns(t)
			g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, c.key)).To(Equal([]int32{50, 50})) }).WithTimeout(waitTimeout).Should(Succeed())
			c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
				g.Expect(obj.Status.Rollout.Analysis).To(HaveLen(1))
				g.Expect(obj.Status.Rollout.Analysis[0].Verdict).To(Equal(servingv1.VerdictPass), "the canary is good until it is spoiled")
			})

			spoiled := time.Now()
			tc.spoil(t, c.canarySim.Sim)
			rolledBack := c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
				stopIfPromoted(obj)
				g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutRolledBack))
			})
			took := time.Since(spoiled)
			// The run after the change judges it: at most one interval later, plus
			// the time to query and write status.
			g.Expect(took).To(BeNumerically("<", runInterval+3*time.Second), "rolled back %s after the canary went bad", took)
			st := rolledBack.Status.Rollout
			g.Expect(st.Step).To(Equal(int32(0)), "rolled back within the step")
			g.Expect(st.Weight).To(Equal(int32(0)))
			g.Expect(decisions(rolledBack)).To(Equal([]string{"CanaryStarted", "StepStarted", "RolledBack"}))
			g.Expect(st.Analysis).To(HaveLen(2))
			g.Expect(st.Analysis[0].Verdict).To(Equal(servingv1.VerdictPass))
			failed := st.Analysis[1]
			g.Expect(failed.Verdict).To(Equal(servingv1.VerdictFail))
			for _, check := range failed.Checks {
				if slices.Contains(tc.failing, check.Name) {
					c.expectJudged(g, check, servingv1.VerdictFail)
				} else {
					c.expectJudged(g, check, servingv1.VerdictPass)
				}
			}
			ready := readyCondition(rolledBack)
			g.Expect(ready.Reason).To(Equal(servingv1.ReasonRolledBack))
			g.Expect(ready.Message).To(ContainSubstring("analysis failed at step 1"))
			g.Expect(condition(rolledBack, servingv1.ConditionStalled).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(rolledBack, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))

			g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, c.key)).To(Equal([]int32{100, 0})) }).WithTimeout(waitTimeout).Should(Succeed())
			expectCanaryRemoved(g, c)
			removed := time.Since(spoiled)
			d := getDeployment(g, c.key)
			g.Expect(d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(c.stableRev), "the stable pod keeps the earlier spec")
			expectEvent(g, c.key, corev1.EventTypeWarning, "RolledBack", "analysis failed at step 1: "+tc.failing[0]+" Fail (value "+checkNamed(failed, tc.failing[0]).Value)
			t.Logf("%s canary: rolled back %s after it went bad (the failing run at +%s), its Deployment removed after %s",
				tc.name, took.Round(100*time.Millisecond), failed.Time.Sub(spoiled.Truncate(time.Second)), removed.Round(100*time.Millisecond))
		})
	}
}

// With Prometheus stopped mid-step, the runs cannot judge the canary: past the
// inconclusive limit the rollout waits for a person, and nothing is promoted.
func TestAnalysisWithPrometheusStoppedIsInconclusive(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	c := startAnalysedCanary(t, g, "noprom", 8, analysisStep(50, 3, 1))
	defer c.logRuns(t)
	c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Analysis).To(HaveLen(1))
		g.Expect(obj.Status.Rollout.Analysis[0].Verdict).To(Equal(servingv1.VerdictPass), "the canary is judged while Prometheus runs")
	})
	c.prom.Stop()
	stopped := time.Now()

	obj := c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		stopIfPromoted(obj)
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutInconclusive))
	})
	t.Logf("Inconclusive %s after Prometheus stopped (inconclusiveLimit 1, interval %s)", time.Since(stopped).Round(100*time.Millisecond), runInterval)
	expectInconclusive(t, g, c, obj, "Prometheus is unreachable")
	g.Expect(obj.Status.Rollout.Analysis).To(HaveLen(3))
	g.Expect(obj.Status.Rollout.Analysis[0].Verdict).To(Equal(servingv1.VerdictPass))
}

// A canary sent a request a second finishes about 6 in a run's window, fewer
// than minSamples 20: every run is Inconclusive, never a pass, though one passing
// run would finish the step and promote it.
func TestAnalysisWithTooFewRequestsIsInconclusive(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	c := startAnalysedCanary(t, g, "quiet", 1, analysisStep(10, 1, 1))
	defer c.logRuns(t)
	obj := c.eventually(t, g, func(g Gomega, obj *servingv1.AIInference) {
		stopIfPromoted(obj)
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutInconclusive))
	})
	expectInconclusive(t, g, c, obj, "fewer than minSamples 20")
	g.Expect(obj.Status.Rollout.Analysis).To(HaveLen(2))
	for _, run := range c.runs {
		for _, check := range run.Checks {
			g.Expect(check.Samples).To(BeNumerically(">", 0), "check %s: the canary's few requests are counted", check.Name)
			g.Expect(check.Samples).To(BeNumerically("<", 20), "check %s", check.Name)
			g.Expect(check.Query).To(ContainSubstring(c.canarySelector()))
		}
	}
}

// expectInconclusive checks an object whose rollout went Inconclusive: the runs
// after the first passing one are Inconclusive on every check for the reason
// given, the object is Stalled with reason AnalysisInconclusive, an event says
// so, and nothing is promoted while it waits.
func expectInconclusive(t *testing.T, g *WithT, c *analysedCanary, obj *servingv1.AIInference, reason string) {
	t.Helper()
	st := obj.Status.Rollout
	g.Expect(st.Step).To(Equal(int32(0)))
	g.Expect(decisions(obj)).To(Equal([]string{"CanaryStarted", "StepStarted", "Inconclusive"}))
	for _, run := range c.runs {
		if run.Verdict == servingv1.VerdictPass && reason == "Prometheus is unreachable" {
			continue // judged before Prometheus stopped
		}
		g.Expect(run.Verdict).To(Equal(servingv1.VerdictInconclusive))
		for _, check := range run.Checks {
			g.Expect(check.Verdict).To(Equal(servingv1.VerdictInconclusive), "check %s", check.Name)
			g.Expect(check.Message).To(ContainSubstring(reason), "check %s", check.Name)
		}
	}
	ready := readyCondition(obj)
	g.Expect(ready.Reason).To(Equal(servingv1.ReasonAnalysisInconclusive))
	g.Expect(ready.Message).To(ContainSubstring(reason))
	stalled := condition(obj, servingv1.ConditionStalled)
	g.Expect(stalled.Status).To(Equal(metav1.ConditionTrue))
	g.Expect(stalled.Reason).To(Equal(servingv1.ReasonAnalysisInconclusive))
	g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))
	expectEvent(g, c.key, corev1.EventTypeWarning, "Inconclusive", "could not judge the canary")

	// It waits for a person: no further run, no promotion, the canary kept at its weight.
	g.Consistently(func(g Gomega) {
		obj := &servingv1.AIInference{}
		g.Expect(k8s.Get(context.Background(), c.key, obj)).To(Succeed())
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutInconclusive))
		g.Expect(obj.Status.Rollout.Analysis).To(HaveLen(len(st.Analysis)))
		d := getDeployment(g, c.key)
		g.Expect(d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(c.stableRev))
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: c.name + "-canary"}, &appsv1.Deployment{})).To(Succeed())
		g.Expect(routeWeights(g, c.key)).To(Equal([]int32{100 - st.Weight, st.Weight}))
	}).WithTimeout(runInterval + time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// stopIfPromoted ends an Eventually at once when the canary was promoted.
func stopIfPromoted(obj *servingv1.AIInference) {
	if st := obj.Status.Rollout; st != nil && (st.Phase == servingv1.RolloutPromoting || st.Phase == servingv1.RolloutPromoted) {
		StopTrying(fmt.Sprintf("the canary was promoted: %s", decisions(obj))).Now()
	}
}

func checkNamed(run servingv1.AnalysisRun, name string) servingv1.CheckResult {
	for _, c := range run.Checks {
		if c.Name == name {
			return c
		}
	}
	return servingv1.CheckResult{}
}
