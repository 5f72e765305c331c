package aiinference

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	servingv1 "github.com/aiinference/operator/api/v1"
)

func canaryObject(steps ...servingv1.CanaryStep) *servingv1.AIInference {
	obj := sampleInference()
	obj.Spec.Replicas = ptr.To[int32](4)
	obj.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 2, MaxSurge: ptr.To[int32](1), Steps: steps,
	}}
	return obj
}

func analysisStepOf(runs, failureLimit, inconclusiveLimit int32) servingv1.CanaryStep {
	return servingv1.CanaryStep{Weight: 10, Analysis: &servingv1.AnalysisStep{
		Checks:   []servingv1.AnalysisCheck{{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.5"}},
		Interval: &metav1.Duration{Duration: time.Minute}, Runs: runs, FailureLimit: failureLimit, InconclusiveLimit: inconclusiveLimit,
	}}
}

// passes replays plans as a controller would: each pass's status becomes the
// next pass's input.
type rolloutRun struct {
	t   *testing.T
	obj *servingv1.AIInference
	in  rolloutInput
	// verdicts are handed out to analysis runs in turn.
	verdicts []servingv1.Verdict
	analyses int
}

func newRolloutRun(t *testing.T, obj *servingv1.AIInference) *rolloutRun {
	r := &rolloutRun{t: t, obj: obj}
	r.in = rolloutInput{obj: obj, now: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), desiredRev: "new", stableRev: "old", stableReady: 3,
		analyze: func(step int32, a *servingv1.AnalysisStep) servingv1.AnalysisRun {
			v := r.verdicts[r.analyses]
			r.analyses++
			return servingv1.AnalysisRun{Verdict: v, Checks: []servingv1.CheckResult{{Name: "ttft", Verdict: v, Value: "0.7", Threshold: "0.5", Samples: 40}}}
		}}
	return r
}

func (r *rolloutRun) pass(after time.Duration) rolloutPlan {
	r.in.now = r.in.now.Add(after)
	plan := planRollout(r.in)
	r.obj.Status.Rollout = plan.status
	return plan
}

func decisionsOf(plan rolloutPlan) []string {
	var words []string
	for _, d := range plan.decisions {
		words = append(words, d.Decision)
	}
	return words
}

func TestCanaryStartsNextToTheStableSet(t *testing.T) {
	r := newRolloutRun(t, canaryObject(servingv1.CanaryStep{Weight: 25, Pause: &servingv1.PauseStep{}}))
	plan := r.pass(0)
	if !plan.keepStableTemplate || plan.canaryReplicas != 2 || plan.stableReplicas != 3 {
		t.Fatalf("plan: keep %v, canary %d, stable %d; want the stable template kept, 2 canaries, 4-2+1 = 3 stable", plan.keepStableTemplate, plan.canaryReplicas, plan.stableReplicas)
	}
	if st := plan.status; st.Phase != servingv1.RolloutProgressing || st.Weight != 0 || st.StepStartedAt != nil {
		t.Fatalf("before the canary is ready: phase %s weight %d started %v; want Progressing, no traffic, no step", st.Phase, st.Weight, st.StepStartedAt)
	}
	r.in.canaryReady = 2
	plan = r.pass(time.Minute)
	if st := plan.status; st.Weight != 25 || st.StepStartedAt == nil {
		t.Fatalf("canary ready: weight %d; want the first step's 25", st.Weight)
	}
	if got := decisionsOf(plan); len(got) != 1 || got[0] != servingv1.DecisionStepStarted {
		t.Errorf("decisions %v", got)
	}
	// Nothing changes: no decision, nothing new in status.
	before := plan.status.DeepCopy()
	plan = r.pass(time.Hour)
	if len(plan.decisions) != 0 || plan.status.Message != before.Message {
		t.Errorf("a pass with nothing new decided %v, message %q -> %q", decisionsOf(plan), before.Message, plan.status.Message)
	}
}

func TestFailedAnalysisRollsBackWithinTheStep(t *testing.T) {
	r := newRolloutRun(t, canaryObject(analysisStepOf(3, 0, 2)))
	r.in.canaryReady = 2
	r.verdicts = []servingv1.Verdict{servingv1.VerdictPass, servingv1.VerdictFail}
	r.pass(0)
	if plan := r.pass(30 * time.Second); len(plan.decisions) != 0 {
		t.Fatalf("a run before the interval: %v", decisionsOf(plan))
	}
	plan := r.pass(30 * time.Second)
	if r.analyses != 1 || plan.status.Phase != servingv1.RolloutProgressing || plan.requeue != rolloutRecheck {
		t.Fatalf("after one passing run: %d runs, phase %s, requeue %s", r.analyses, plan.status.Phase, plan.requeue)
	}
	plan = r.pass(time.Minute)
	if plan.status.Phase != servingv1.RolloutRolledBack || plan.canaryReplicas != 0 || plan.stableReplicas != 4 || plan.status.Weight != 0 {
		t.Fatalf("after a failed run: phase %s, canary %d, stable %d, weight %d; want RolledBack, no canary, 4 stable, no traffic",
			plan.status.Phase, plan.canaryReplicas, plan.stableReplicas, plan.status.Weight)
	}
	if !plan.keepStableTemplate {
		t.Error("a rolled-back canary must leave the stable template alone")
	}
	if got := decisionsOf(plan); len(got) != 1 || got[0] != servingv1.DecisionRolledBack {
		t.Errorf("decisions %v", got)
	}
	// It stays rolled back until a retry request or a new spec.
	plan = r.pass(time.Hour)
	if plan.status.Phase != servingv1.RolloutRolledBack || plan.canaryReplicas != 0 {
		t.Fatalf("rolled back, later: %s with %d canaries", plan.status.Phase, plan.canaryReplicas)
	}
	r.obj.Annotations = map[string]string{servingv1.AnnotationRequestedAt: "retry"}
	if plan = r.pass(time.Second); plan.status.Phase != servingv1.RolloutProgressing || plan.canaryReplicas != 2 {
		t.Fatalf("after a retry request: %s with %d canaries", plan.status.Phase, plan.canaryReplicas)
	}
}

func TestInconclusiveAnalysisWaitsForAPerson(t *testing.T) {
	r := newRolloutRun(t, canaryObject(analysisStepOf(2, 0, 1), servingv1.CanaryStep{Weight: 50, Pause: &servingv1.PauseStep{}}))
	r.in.canaryReady = 2
	r.verdicts = []servingv1.Verdict{servingv1.VerdictInconclusive, servingv1.VerdictInconclusive}
	r.pass(0)
	r.pass(time.Minute)
	plan := r.pass(time.Minute)
	if plan.status.Phase != servingv1.RolloutInconclusive || plan.canaryReplicas != 2 || plan.status.Weight != 10 {
		t.Fatalf("two inconclusive runs past a limit of 1: phase %s, canary %d, weight %d; want Inconclusive, holding", plan.status.Phase, plan.canaryReplicas, plan.status.Weight)
	}
	if plan = r.pass(time.Hour); r.analyses != 2 || plan.status.Phase != servingv1.RolloutInconclusive {
		t.Fatalf("an inconclusive rollout must neither promote nor run more analyses: %d runs, %s", r.analyses, plan.status.Phase)
	}
	r.obj.Annotations = map[string]string{servingv1.AnnotationPromote: "1"}
	plan = r.pass(time.Second)
	if plan.status.Step != 1 || plan.status.Weight != 50 || plan.status.Phase != servingv1.RolloutProgressing {
		t.Fatalf("promoted by hand: step %d weight %d %s", plan.status.Step, plan.status.Weight, plan.status.Phase)
	}
}

func TestPromotionReplacesTheStableSetThenRemovesTheCanary(t *testing.T) {
	r := newRolloutRun(t, canaryObject(servingv1.CanaryStep{Weight: 20, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: time.Minute}}}))
	r.in.canaryReady = 2
	r.pass(0)
	r.in.stableReady = 2
	plan := r.pass(time.Minute)
	// First the traffic leaves the stable pods of the earlier revision, which
	// keep their template while the Gateway applies that.
	if plan.status.Phase != servingv1.RolloutPromoting || !plan.keepStableTemplate || plan.canaryReplicas != 2 ||
		plan.status.Weight != 100 || plan.requeue != promotionDrain {
		t.Fatalf("after the last step: %s, keep %v, canary %d, weight %d, requeue %s; want Promoting, the traffic on the canary, the stable template kept for %s",
			plan.status.Phase, plan.keepStableTemplate, plan.canaryReplicas, plan.status.Weight, plan.requeue, promotionDrain)
	}
	if plan = r.pass(time.Second); !plan.keepStableTemplate || plan.status.Weight != 100 {
		t.Fatalf("a second into the promotion: keep %v, weight %d", plan.keepStableTemplate, plan.status.Weight)
	}
	if plan = r.pass(promotionDrain); plan.keepStableTemplate || plan.status.Phase != servingv1.RolloutPromoting || plan.canaryReplicas != 2 {
		t.Fatalf("after the drain: %s, keep %v, canary %d; want the new stable template and the canary kept", plan.status.Phase, plan.keepStableTemplate, plan.canaryReplicas)
	}
	r.in.stableRev, r.in.stableReady, r.in.stableReadyCurrent = "new", 1, 1
	plan = r.pass(time.Second)
	if plan.status.Phase != servingv1.RolloutPromoting || plan.status.Weight != 66 {
		t.Fatalf("while the stable set rolls: %s, weight %d; want the share of ready replicas (2 of 3)", plan.status.Phase, plan.status.Weight)
	}
	r.in.stableRolledOut, r.in.stableReady, r.in.stableReadyCurrent = true, 3, 3
	plan = r.pass(time.Second)
	if plan.status.Phase != servingv1.RolloutPromoted || plan.canaryReplicas != 0 || plan.stableReplicas != 4 || plan.status.StableRevision != "new" {
		t.Fatalf("stable rolled out: %s, canary %d, stable %d, revision %s", plan.status.Phase, plan.canaryReplicas, plan.stableReplicas, plan.status.StableRevision)
	}
}

func TestStoppedLoadsAbortAndNewSpecsSupersede(t *testing.T) {
	r := newRolloutRun(t, canaryObject(servingv1.CanaryStep{Weight: 20, Pause: &servingv1.PauseStep{}}))
	r.pass(0)
	r.in.desiredRev = "newer"
	plan := r.pass(time.Second)
	if got := decisionsOf(plan); len(got) != 2 || got[0] != servingv1.DecisionSuperseded || got[1] != servingv1.DecisionCanaryStarted || plan.status.CanaryRevision != "newer" {
		t.Fatalf("a newer spec mid-canary: %v, canary revision %s", got, plan.status.CanaryRevision)
	}
	r.in.loadsHalted = servingv1.ReasonRetriesExhausted
	if plan = r.pass(time.Second); plan.status.Phase != servingv1.RolloutRolledBack || plan.canaryReplicas != 0 {
		t.Fatalf("the canary's loads stopped: %s with %d canaries", plan.status.Phase, plan.canaryReplicas)
	}
	// The spec goes back to what the stable pods run: nothing to roll out.
	r.in.desiredRev = "old"
	if plan = r.pass(time.Second); plan.keepStableTemplate || plan.canaryReplicas != 0 || plan.stableReplicas != 4 {
		t.Fatalf("spec back to stable: keep %v, canary %d, stable %d", plan.keepStableTemplate, plan.canaryReplicas, plan.stableReplicas)
	}
}

func TestPausedByHandHoldsTheStep(t *testing.T) {
	r := newRolloutRun(t, canaryObject(servingv1.CanaryStep{Weight: 20, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: time.Minute}}}))
	r.in.canaryReady = 2
	r.pass(0)
	r.obj.Annotations = map[string]string{servingv1.AnnotationPaused: "true"}
	if plan := r.pass(2 * time.Minute); plan.status.Phase != servingv1.RolloutPaused || plan.status.Step != 0 {
		t.Fatalf("paused past the pause's end: %s step %d", plan.status.Phase, plan.status.Step)
	}
	r.obj.Annotations = nil
	if plan := r.pass(time.Second); plan.status.Phase != servingv1.RolloutPromoting {
		t.Fatalf("resumed after the pause's end: %s; want Promoting", plan.status.Phase)
	}
}

func TestHistoryAndRunsAreBounded(t *testing.T) {
	steps := make([]servingv1.CanaryStep, 0, 20)
	for range 20 {
		steps = append(steps, analysisStepOf(100, 100, 100))
	}
	r := newRolloutRun(t, canaryObject(steps...))
	r.in.canaryReady = 2
	for range 30 {
		r.verdicts = append(r.verdicts, servingv1.VerdictPass)
	}
	r.pass(0)
	for range 30 {
		r.pass(time.Minute)
	}
	if n := len(r.obj.Status.Rollout.Analysis); n != maxAnalysisRuns {
		t.Errorf("%d analysis runs kept, want %d", n, maxAnalysisRuns)
	}
	r.obj.Annotations = map[string]string{}
	for i := range 25 {
		r.obj.Annotations[servingv1.AnnotationPromote] = string(rune('a' + i))
		r.pass(time.Second)
	}
	if n := len(r.obj.Status.Rollout.History); n != maxHistory {
		t.Errorf("%d decisions kept, want %d", n, maxHistory)
	}
}

// Each timed step asks to be looked at when it ends, also when it started in a
// pass that ended the previous one: no change of a child wakes the operator then.
func TestTimedStepsAskForTheirNextLook(t *testing.T) {
	pause := func(d time.Duration) servingv1.CanaryStep {
		return servingv1.CanaryStep{Weight: 20, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: d}}}
	}
	r := newRolloutRun(t, canaryObject(pause(10*time.Second), pause(20*time.Second), analysisStepOf(1, 0, 0)))
	r.in.canaryReady = 2
	r.verdicts = []servingv1.Verdict{servingv1.VerdictPass}
	// A rollout in progress is looked at again within rolloutRecheck anyway.
	for i, want := range []struct {
		after, requeue time.Duration
		step           int32
	}{{0, 10 * time.Second, 0}, {4 * time.Second, 6 * time.Second, 0}, {6 * time.Second, 20 * time.Second, 1}, {20 * time.Second, rolloutRecheck, 2}} {
		plan := r.pass(want.after)
		if plan.status.Step != want.step || plan.requeue != want.requeue {
			t.Errorf("pass %d: step %d, requeue %s; want step %d, requeue %s", i, plan.status.Step, plan.requeue, want.step, want.requeue)
		}
	}
}

// A step that needs more passing runs than status keeps still finishes: the
// runs are counted apart from the list that shows them.
func TestStepsNeedingManyRunsFinish(t *testing.T) {
	r := newRolloutRun(t, canaryObject(analysisStepOf(15, 0, 0), servingv1.CanaryStep{Weight: 50, Pause: &servingv1.PauseStep{}}))
	r.in.canaryReady = 2
	for range 15 {
		r.verdicts = append(r.verdicts, servingv1.VerdictPass)
	}
	r.pass(0)
	var plan rolloutPlan
	for range 15 {
		plan = r.pass(time.Minute)
	}
	if plan.status.Step != 1 || len(plan.status.Analysis) != maxAnalysisRuns {
		t.Fatalf("after 15 passing runs of a 15-run step: step %d, %d runs shown; want step 2 and %d runs", plan.status.Step+1, len(plan.status.Analysis), maxAnalysisRuns)
	}
	if last := plan.status.Analysis[len(plan.status.Analysis)-1]; last.Step != 0 || last.Verdict != servingv1.VerdictPass {
		t.Errorf("the run that finished the step is not shown: %+v", last)
	}
}

// Gateway traffic on a cluster without the Gateway API is reported, not ignored:
// without it the canary's weights would never reach any route.
func TestGatewayTrafficWithoutTheGatewayAPIStalls(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))
	obj := canaryObject(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
	obj.Namespace, obj.Name, obj.Generation = "no-gateway-api", "canary", 1
	obj.Spec.Rollout.Canary.Traffic = &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{Name: "gw"}}}
	// The fake client's REST mapper knows the scheme's kinds only: no HTTPRoute.
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(&servingv1.AIInference{}).Build()
	r := &Reconciler{Client: c, APIReader: c, Scheme: scheme, Recorder: nopRecorder{}, Now: time.Now}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "no-gateway-api", Name: "canary"}}); err != nil {
		t.Fatal(err)
	}
	got := &servingv1.AIInference{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "no-gateway-api", Name: "canary"}, got); err != nil {
		t.Fatal(err)
	}
	stalled := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionStalled)
	if stalled == nil || stalled.Reason != servingv1.ReasonTrafficAPIMissing || !strings.Contains(stalled.Message, "install the Gateway API CRDs") {
		t.Fatalf("Stalled: %+v; want TrafficAPIMissing saying what to install", stalled)
	}
}

// The route sends no share to a track with no serving pod, while the other has one.
func TestTheRouteSkipsATrackWithNoServingPod(t *testing.T) {
	serving := func(canary bool) podView { return podView{Serves: true, Canary: canary} }
	cases := []struct {
		name string
		pods []podView
		want int32
	}{
		{"both serve", []podView{serving(false), serving(true)}, 30},
		{"the canary's pod is gone", []podView{serving(false)}, 0},
		{"the canary's pod does not serve", []podView{serving(false), {Canary: true}}, 0},
		{"no stable pod serves", []podView{serving(true), {}}, 100},
		{"nothing serves", nil, 30},
	}
	for _, c := range cases {
		if got := routedWeight(30, observation{podsSeen: true, pods: c.pods}, nil); got != c.want {
			t.Errorf("%s: routed %d%%, want %d%%", c.name, got, c.want)
		}
	}
	if got := routedWeight(30, observation{}, nil); got != 30 {
		t.Errorf("pods not seen: routed %d%%, want the step's 30%%", got)
	}
	// The Gateway reads the backends' EndpointSlices, which list a pod
	// ready a moment after the pod is: until then its track gets no share.
	both := observation{podsSeen: true, pods: []podView{serving(false), serving(true)}}
	for _, c := range []struct {
		name     string
		backends trackEndpoints
		want     int32
	}{
		{"both listed", trackEndpoints{stable: 1, canary: 1}, 30},
		{"the new stable pod not listed yet", trackEndpoints{canary: 1}, 100},
		{"the canary's pod not listed yet", trackEndpoints{stable: 1}, 0},
	} {
		if got := routedWeight(30, both, &c.backends); got != c.want {
			t.Errorf("%s: routed %d%%, want %d%%", c.name, got, c.want)
		}
	}
}
