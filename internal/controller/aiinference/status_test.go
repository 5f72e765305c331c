package aiinference

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/testutil"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func failedPod(name string, code int32, finished time.Time) podView {
	return podView{Name: name, Current: true, Scheduled: true, LoaderFailed: &loaderExit{ExitCode: code, Reason: "TransientError", Message: "reset", Finished: finished}}
}

func TestPlanRetries(t *testing.T) {
	tests := []struct {
		name        string
		retries     int32
		lastFailure *servingv1.LoadFailure
		newGen      bool
		pods        []podView
		wantDelete  bool
		wantWait    time.Duration
		wantTerm    string
		wantRetries int32
	}{
		{name: "nothing failed", pods: []podView{{Name: "a", Current: true, LoaderDone: true}}},
		{name: "retryable failure inside the back-off waits", pods: []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-10*time.Second))}, wantWait: 20 * time.Second},
		{name: "retryable failure after the back-off is retried", pods: []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-31*time.Second))}, wantDelete: true, wantRetries: 1},
		{name: "second retry waits twice as long", retries: 1, pods: []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-31*time.Second))}, wantWait: 29 * time.Second, wantRetries: 1},
		{name: "a crash (137) is retryable", pods: []podView{failedPod("a", 137, now.Add(-time.Minute))}, wantDelete: true, wantRetries: 1},
		{name: "permanent failure ends at once", pods: []podView{failedPod("a", loadspec.ExitChecksum, now)}, wantTerm: servingv1.ReasonLoadFailed},
		{name: "retries exhausted", retries: 3, pods: []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-time.Hour))}, wantTerm: servingv1.ReasonRetriesExhausted, wantRetries: 3},
		{name: "a new generation starts afresh", retries: 3, newGen: true, pods: []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-time.Hour))}, wantDelete: true, wantRetries: 1},
		{name: "pods of an older template do not count", pods: []podView{func() podView { p := failedPod("a", loadspec.ExitChecksum, now); p.Current = false; return p }()}},
		{
			name: "an already retried failure is not counted twice", retries: 1,
			lastFailure: &servingv1.LoadFailure{Pod: "a", Retried: true, Time: metav1.NewTime(now.Add(-time.Hour))},
			pods:        []podView{failedPod("a", loadspec.ExitRetryable, now.Add(-time.Hour))}, wantRetries: 1,
		},
		{name: "a load past the timeout is a failure", pods: []podView{{Name: "a", Current: true, LoaderStarted: now.Add(-31 * time.Minute)}}, wantDelete: true, wantRetries: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := sampleInference()
			obj.Status.ObservedGeneration = obj.Generation
			if tt.newGen {
				obj.Generation++
			}
			obj.Status.LoadRetries = tt.retries
			obj.Status.LastFailure = tt.lastFailure
			plan := planRetries(obj, tt.pods, now)
			if got := plan.deletePod != nil; got != tt.wantDelete {
				t.Errorf("delete = %v, want %v", got, tt.wantDelete)
			}
			if plan.wait != tt.wantWait {
				t.Errorf("wait = %s, want %s", plan.wait, tt.wantWait)
			}
			if plan.terminalReason != tt.wantTerm {
				t.Errorf("terminal = %q, want %q", plan.terminalReason, tt.wantTerm)
			}
			if plan.retries != tt.wantRetries {
				t.Errorf("retries = %d, want %d", plan.retries, tt.wantRetries)
			}
		})
	}
}

func TestPlanRetriesRequeuesAtTheTimeout(t *testing.T) {
	obj := sampleInference()
	plan := planRetries(obj, []podView{{Name: "a", Current: true, LoaderStarted: now.Add(-10 * time.Minute)}}, now)
	if plan.nextTimeout != 20*time.Minute {
		t.Errorf("nextTimeout = %s, want 20m", plan.nextTimeout)
	}
}

func deploymentWith(replicas, ready, updated int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Generation: 2},
		Status:     appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: replicas, ReadyReplicas: ready, UpdatedReplicas: updated},
	}
}

func TestComputeStatus(t *testing.T) {
	tests := []struct {
		name        string
		replicas    int32
		obs         observation
		phase       servingv1.Phase
		reason      string
		reconciling bool
		stalled     bool
	}{
		{name: "no deployment yet", replicas: 1, phase: servingv1.PhasePending, reason: servingv1.ReasonProgressing, reconciling: true},
		{
			name: "unschedulable", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Unschedulable: "0/3 nodes are available"}}},
			phase: servingv1.PhasePending, reason: servingv1.ReasonUnschedulable, reconciling: true,
		},
		{
			name: "loading", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderStarted: now}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonLoading, reconciling: true,
		},
		{
			name: "engine starting", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonEngineStarting, reconciling: true,
		},
		{
			name: "engine crash-looping is not ready", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true, EngineCrashLoop: "restarted 5 times"}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonEngineCrashLooping, reconciling: true,
		},
		{
			name: "an image that cannot be pulled is said", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, StartFailure: "container model-loader: ImagePullBackOff"}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonPodStartFailed, reconciling: true,
		},
		{name: "ready", replicas: 2, obs: observation{deployment: deploymentWith(2, 2, 2)}, phase: servingv1.PhaseReady, reason: servingv1.ReasonReady},
		{name: "ready while rolling out", replicas: 2, obs: observation{deployment: deploymentWith(3, 2, 1)}, phase: servingv1.PhaseReady, reason: servingv1.ReasonReady, reconciling: true},
		{name: "scaled to zero", replicas: 0, obs: observation{deployment: deploymentWith(0, 0, 0)}, phase: servingv1.PhaseReady, reason: servingv1.ReasonScaledToZero},
		{
			name: "missing secret stalls", replicas: 1,
			obs:   observation{referenceProblem: &problem{servingv1.ReasonSecretNotFound, "Secret \"x\" does not exist"}},
			phase: servingv1.PhasePending, reason: servingv1.ReasonSecretNotFound, stalled: true,
		},
		{
			name: "permanent failure stalls", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), retry: retryPlan{terminalReason: servingv1.ReasonLoadFailed,
				failure: &servingv1.LoadFailure{Pod: "a", Reason: loadspec.ReasonChecksumMismatch, Message: "bad"}}},
			phase: servingv1.PhaseFailed, reason: servingv1.ReasonLoadFailed, stalled: true,
		},
		{
			name: "waiting to retry", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), retry: retryPlan{wait: time.Second,
				failure: &servingv1.LoadFailure{Pod: "a", Reason: "TransientError", Retryable: true}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonRetryingLoad, reconciling: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Replicas = ptr.To(tt.replicas)
			st := computeStatus(obj, tt.obs)
			obj.Status = st
			g.Expect(testutil.KstatusViolations(obj)).To(BeEmpty())
			g.Expect(st.Phase).To(Equal(tt.phase))
			g.Expect(meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady).Reason).To(Equal(tt.reason))
			g.Expect(meta.IsStatusConditionTrue(st.Conditions, servingv1.ConditionReconciling)).To(Equal(tt.reconciling))
			g.Expect(meta.IsStatusConditionTrue(st.Conditions, servingv1.ConditionStalled)).To(Equal(tt.stalled))
			g.Expect(st.ObservedGeneration).To(Equal(obj.Generation))
		})
	}
}

func TestComputeStatusIsStable(t *testing.T) {
	obj := sampleInference()
	obs := observation{deployment: deploymentWith(1, 1, 1)}
	obj.Status = computeStatus(obj, obs)
	again := computeStatus(obj, obs)
	if !equality.Semantic.DeepEqual(obj.Status, again) {
		t.Errorf("a second pass over the same observation changed the status:\n%+v\n%+v", obj.Status, again)
	}
}

func TestObservePodSeesContainersThatCannotStart(t *testing.T) {
	pod := corev1.Pod{Status: corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{
		Name:  LoaderContainerName,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image \"loader:bad\""}},
	}}}}
	v := observePod(&pod, "")
	if v.StartFailure != `container model-loader: ImagePullBackOff: Back-off pulling image "loader:bad"` {
		t.Errorf("StartFailure = %q", v.StartFailure)
	}
	pod.Status.InitContainerStatuses[0].State.Waiting.Reason = "PodInitializing"
	if v := observePod(&pod, ""); v.StartFailure != "" {
		t.Errorf("a container that is merely starting is reported as failing: %q", v.StartFailure)
	}
}
