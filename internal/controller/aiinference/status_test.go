package aiinference

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/test/testutil"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// failedPod is a current pod whose loader failed `failures` times, the last with code.
func failedPod(name string, failures, code int32, finished time.Time) podView {
	return podView{Name: name, Current: true, Scheduled: true, LoaderFailures: failures,
		LoaderLastFailure: &loaderExit{ExitCode: code, Reason: "TransientError", Message: "reset", Finished: finished}}
}

func TestAssessLoads(t *testing.T) {
	const tmpl = "t1"
	readyFor := func(d time.Duration) []metav1.Condition {
		return []metav1.Condition{{Type: servingv1.ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now.Add(-d))}}
	}
	tests := []struct {
		name        string
		annotation  string
		status      servingv1.AIInferenceStatus
		pods        []podView
		wantFailed  int32
		wantHalted  string
		wantDelete  []string
		wantCounted map[string]int32
		wantRequeue time.Duration
	}{
		{name: "nothing failed", pods: []podView{{Name: "a", Current: true, LoaderDone: true}}},
		{name: "a restart in place counts", pods: []podView{failedPod("a", 1, loadspec.ExitRetryable, now)}, wantFailed: 1, wantCounted: map[string]int32{"a": 1}},
		{
			name:   "a failure counted before is not counted again",
			status: servingv1.AIInferenceStatus{LoadRetries: 1, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, CountedByPod: map[string]int32{"a": 1}}},
			pods:   []podView{failedPod("a", 1, loadspec.ExitRetryable, now)}, wantFailed: 1, wantCounted: map[string]int32{"a": 1},
		},
		{
			name:   "failures of a replaced pod stay counted",
			status: servingv1.AIInferenceStatus{LoadRetries: 2, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, CountedByPod: map[string]int32{"gone": 2}}},
			pods:   []podView{failedPod("b", 1, loadspec.ExitRetryable, now)}, wantFailed: 3, wantCounted: map[string]int32{"b": 1},
		},
		{name: "past maxRetries (3) halts", pods: []podView{failedPod("a", 4, loadspec.ExitRetryable, now)}, wantFailed: 4, wantHalted: servingv1.ReasonRetriesExhausted, wantCounted: map[string]int32{"a": 4}},
		{name: "a crash (137) is retryable", pods: []podView{failedPod("a", 1, 137, now)}, wantFailed: 1, wantCounted: map[string]int32{"a": 1}},
		{name: "a permanent failure halts at once", pods: []podView{failedPod("a", 1, loadspec.ExitChecksum, now)}, wantFailed: 1, wantHalted: servingv1.ReasonLoadFailed, wantCounted: map[string]int32{"a": 1}},
		{
			name:   "once halted nothing more counts",
			status: servingv1.AIInferenceStatus{LoadRetries: 4, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, Halted: servingv1.ReasonRetriesExhausted, CountedByPod: map[string]int32{"a": 4}}},
			pods:   []podView{failedPod("a", 7, loadspec.ExitHalted, now)}, wantFailed: 4, wantHalted: servingv1.ReasonRetriesExhausted, wantCounted: map[string]int32{"a": 4},
		},
		{
			name:   "a new template starts afresh",
			status: servingv1.AIInferenceStatus{LoadRetries: 4, LoadBudget: &servingv1.LoadBudget{Epoch: "t0", Halted: servingv1.ReasonRetriesExhausted}},
			pods:   []podView{failedPod("b", 1, loadspec.ExitRetryable, now)}, wantFailed: 1, wantCounted: map[string]int32{"b": 1},
		},
		{
			name: "a retry request forgives and replaces failed pods", annotation: "2026-12-01T11:00:00Z",
			status:     servingv1.AIInferenceStatus{LoadRetries: 4, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, Halted: servingv1.ReasonRetriesExhausted, CountedByPod: map[string]int32{"a": 4}}},
			pods:       []podView{failedPod("a", 7, loadspec.ExitHalted, now), {Name: "b", Current: true, LoaderDone: true}},
			wantDelete: []string{"a"}, wantCounted: map[string]int32{"a": 7},
		},
		{name: "pods of an older template do not count", pods: []podView{func() podView { p := failedPod("a", 1, loadspec.ExitChecksum, now); p.Current = false; return p }()}},
		{
			name:   "ten minutes of Ready refill the budget",
			status: servingv1.AIInferenceStatus{LoadRetries: 2, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, CountedByPod: map[string]int32{"a": 2}}, Conditions: readyFor(11 * time.Minute)},
			pods:   []podView{{Name: "a", Current: true, LoaderDone: true, LoaderFailures: 2}}, wantCounted: map[string]int32{"a": 2},
		},
		{
			name:   "less Ready than that waits for it",
			status: servingv1.AIInferenceStatus{LoadRetries: 2, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, CountedByPod: map[string]int32{"a": 2}}, Conditions: readyFor(4 * time.Minute)},
			pods:   []podView{{Name: "a", Current: true, LoaderDone: true, LoaderFailures: 2}}, wantFailed: 2, wantCounted: map[string]int32{"a": 2}, wantRequeue: 6 * time.Minute,
		},
		{
			name: "a running load is looked at again at its deadline",
			pods: []podView{{Name: "a", Current: true, LoaderStarted: now.Add(-10 * time.Minute)}}, wantRequeue: 21 * time.Minute,
		},
		{
			name: "a loader hung past its deadline is replaced and counted",
			pods: []podView{{Name: "a", Current: true, LoaderStarted: now.Add(-32 * time.Minute)}}, wantFailed: 1, wantDelete: []string{"a"}, wantCounted: map[string]int32{"a": deletedForTimeout},
		},
		{
			name:   "a replaced loader is not counted twice",
			status: servingv1.AIInferenceStatus{LoadRetries: 1, LoadBudget: &servingv1.LoadBudget{Epoch: tmpl, CountedByPod: map[string]int32{"a": deletedForTimeout}}},
			pods:   []podView{{Name: "a", Current: true, LoaderStarted: now.Add(-40 * time.Minute)}}, wantFailed: 1, wantCounted: map[string]int32{"a": deletedForTimeout},
		},
		{
			name: "a retry's deadline includes its back-off",
			pods: []podView{{Name: "a", Current: true, LoaderFailures: 2, LoaderStarted: now.Add(-30 * time.Minute)}},
			// Counted now: 2 failures; the run started 30m ago may take 30m + 1m grace + a 1m back-off.
			wantFailed: 2, wantCounted: map[string]int32{"a": 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := sampleInference()
			obj.Generation = 1
			obj.Status = tt.status
			if tt.annotation != "" {
				obj.Annotations = map[string]string{servingv1.AnnotationRequestedAt: tt.annotation}
			}
			a := assessLoads(obj, tt.pods, tmpl, now)
			if a.failed != tt.wantFailed {
				t.Errorf("failed = %d, want %d", a.failed, tt.wantFailed)
			}
			if a.halted() != tt.wantHalted {
				t.Errorf("halted = %q, want %q", a.halted(), tt.wantHalted)
			}
			var deleted []string
			for _, p := range a.deletePods {
				deleted = append(deleted, p.Name)
			}
			if !equality.Semantic.DeepEqual(deleted, tt.wantDelete) {
				t.Errorf("deleted = %v, want %v", deleted, tt.wantDelete)
			}
			if !equality.Semantic.DeepEqual(a.budget.CountedByPod, tt.wantCounted) {
				t.Errorf("counted = %v, want %v", a.budget.CountedByPod, tt.wantCounted)
			}
			if tt.wantRequeue != 0 && a.requeue != tt.wantRequeue {
				t.Errorf("requeue = %s, want %s", a.requeue, tt.wantRequeue)
			}
			if want := budgetEpoch(obj, tmpl); a.budget.Epoch != want {
				t.Errorf("epoch = %q, want %q", a.budget.Epoch, want)
			}
		})
	}
}

// The kubelet's numbering: restartCount is the index of the latest run.
func TestObserveLoaderCountsRunsAsAKubeletNumbersThem(t *testing.T) {
	exited := func(code int32) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Message: `{"failure":{"reason":"TransientError","message":"reset","retryable":true}}`}
	}
	tests := []struct {
		name         string
		status       corev1.ContainerStatus
		wantFailures int32
		wantLast     bool
		wantDone     bool
	}{
		{name: "first run running", status: corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
		{name: "first run failed", status: corev1.ContainerStatus{State: corev1.ContainerState{Terminated: exited(10)}}, wantFailures: 1, wantLast: true},
		{
			name:         "waiting after the first failure",
			status:       corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}, LastTerminationState: corev1.ContainerState{Terminated: exited(10)}},
			wantFailures: 1, wantLast: true,
		},
		{
			name:         "second run running",
			status:       corev1.ContainerStatus{RestartCount: 1, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, LastTerminationState: corev1.ContainerState{Terminated: exited(10)}},
			wantFailures: 1, wantLast: true,
		},
		{
			name:         "waiting after the second failure",
			status:       corev1.ContainerStatus{RestartCount: 1, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}, LastTerminationState: corev1.ContainerState{Terminated: exited(10)}},
			wantFailures: 2, wantLast: true,
		},
		{
			name:         "third run succeeded",
			status:       corev1.ContainerStatus{RestartCount: 2, State: corev1.ContainerState{Terminated: exited(0)}, LastTerminationState: corev1.ContainerState{Terminated: exited(10)}},
			wantFailures: 2, wantDone: true,
		},
		{name: "not started", status: corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v podView
			tt.status.Name = servingv1.LoaderContainerName
			observeLoader(&v, tt.status)
			if v.LoaderFailures != tt.wantFailures || (v.LoaderLastFailure != nil) != tt.wantLast || v.LoaderDone != tt.wantDone {
				t.Errorf("failures %d, last failure %v, done %v; want %d, %v, %v", v.LoaderFailures, v.LoaderLastFailure != nil, v.LoaderDone, tt.wantFailures, tt.wantLast, tt.wantDone)
			}
		})
	}
}

// A kubelet restarts a loader that failed for good at once; the run that refuses
// must not hide the failure or count as another attempt.
func TestObserveLoaderSeesThroughARefusal(t *testing.T) {
	failed := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	refusal := fmt.Sprintf(`{"failure":{"reason":"LoadsHalted","message":"an earlier attempt failed with ChecksumMismatch: shard: crc64nvme check failed; not downloading again"},`+
		`"attempts":{"epoch":"e1","failed":1,"lastFailure":{"reason":"ChecksumMismatch","message":"shard: crc64nvme check failed"},"lastTime":%q}}`, failed.Format(time.RFC3339))
	var v podView
	observeLoader(&v, corev1.ContainerStatus{Name: servingv1.LoaderContainerName, RestartCount: 2,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: loadspec.ExitHalted, Message: refusal}}})
	if v.LoaderFailures != 1 {
		t.Errorf("failures %d; want 1, the refusals are no attempts", v.LoaderFailures)
	}
	want := &loaderExit{ExitCode: loadspec.ExitChecksum, Reason: loadspec.ReasonChecksumMismatch, Message: "shard: crc64nvme check failed", Finished: failed}
	if !reflect.DeepEqual(v.LoaderLastFailure, want) {
		t.Errorf("last failure %+v; want %+v", v.LoaderLastFailure, want)
	}
	if f := failureOf(v, time.Now()); f.Retryable || f.Reason != loadspec.ReasonChecksumMismatch {
		t.Errorf("status failure %+v; want the checksum mismatch, not retryable", f)
	}
}

func deploymentWith(replicas, ready, updated int32, conditions ...appsv1.DeploymentCondition) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Generation: 2},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: replicas, ReadyReplicas: ready, AvailableReplicas: ready,
			UpdatedReplicas: updated, Conditions: conditions},
	}
}

func halted(reason string, failure *servingv1.LoadFailure) loadAssessment {
	return loadAssessment{budget: servingv1.LoadBudget{Epoch: "", Halted: reason}, failed: 1, failure: failure}
}

func TestComputeStatus(t *testing.T) {
	tests := []struct {
		name        string
		replicas    int32
		obs         observation
		loads       loadAssessment
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
			name: "an engine crash-looping within the loading bound is waited for", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true,
				EngineCrashLoop: "restarted 5 times", EngineCrashLoopSince: now.Add(-servingv1.DefaultLoadTimeout + time.Minute)}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonEngineCrashLooping, reconciling: true,
		},
		{
			name: "an engine crash-looping past the loading bound is stalled", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true,
				EngineCrashLoop: "restarted 40 times", EngineCrashLoopSince: now.Add(-servingv1.DefaultLoadTimeout - time.Minute)}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonEngineCrashLooping, stalled: true,
		},
		{
			name: "a healthy engine waits for its warm-up completion", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true, EngineReady: true, WarmupPending: true}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonWarmingUp, reconciling: true,
		},
		{
			name: "a failing warm-up is said", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true, EngineReady: true,
				WarmupPending: true, WarmupFailure: "warm-up gate exited 2 times"}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonWarmupFailed, reconciling: true,
		},
		{
			name: "a crash-looping engine outranks the warm-up it fails", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true,
				EngineCrashLoop: "restarted 5 times", WarmupPending: true, WarmupFailure: "warm-up gate exited 2 times"}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonEngineCrashLooping, reconciling: true,
		},
		{
			name: "an image that cannot be pulled is said", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{{Name: "a", Current: true, Scheduled: true, StartFailure: "container model-loader: ImagePullBackOff"}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonPodStartFailed, reconciling: true,
		},
		{name: "ready", replicas: 2, obs: observation{deployment: deploymentWith(2, 2, 2)}, phase: servingv1.PhaseReady, reason: servingv1.ReasonReady},
		{
			name: "not ready while old replicas serve a rollout", replicas: 2,
			obs:   observation{deployment: deploymentWith(3, 2, 1), pods: []podView{{Name: "new", Current: true, Scheduled: true, LoaderStarted: now}}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonLoading, reconciling: true,
		},
		{name: "not ready before the Deployment controller saw the spec", replicas: 1, obs: observation{deployment: deploymentWith(1, 1, 1), childChanged: true}, phase: servingv1.PhasePending, reason: servingv1.ReasonProgressing, reconciling: true},
		{
			name: "pods that cannot be created are said", replicas: 1,
			obs:   observation{deployment: deploymentWith(0, 0, 0, appsv1.DeploymentCondition{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Message: "exceeded quota"})},
			phase: servingv1.PhasePending, reason: servingv1.ReasonPodCreateFailed, reconciling: true,
		},
		{
			name: "a passed progress deadline stalls", replicas: 1,
			obs: observation{deployment: deploymentWith(1, 0, 1, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded"}),
				pods: []podView{{Name: "a", Current: true, Unschedulable: "0/3 nodes are available"}}},
			phase: servingv1.PhasePending, reason: servingv1.ReasonProgressDeadlineExceeded, stalled: true,
		},
		{
			name: "a name taken by another object stalls", replicas: 1,
			obs:   observation{nameConflict: &problem{servingv1.ReasonNameConflict, `Service "x" already exists`}},
			phase: servingv1.PhasePending, reason: servingv1.ReasonNameConflict, stalled: true,
		},
		{
			name: "a failed step is said", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 1, 1), stepError: errors.New("applying ConfigMap x: forbidden")},
			phase: servingv1.PhaseDegraded, reason: servingv1.ReasonReconcileError, reconciling: true,
		},
		{
			name: "one replica failed among serving ones degrades", replicas: 2,
			obs:   observation{deployment: deploymentWith(2, 1, 2)},
			loads: halted(servingv1.ReasonLoadFailed, &servingv1.LoadFailure{Pod: "b", Reason: loadspec.ReasonChecksumMismatch, Message: "bad"}),
			phase: servingv1.PhaseDegraded, reason: servingv1.ReasonLoadFailed, stalled: true,
		},
		{name: "scaled to zero", replicas: 0, obs: observation{deployment: deploymentWith(0, 0, 0)}, phase: servingv1.PhaseReady, reason: servingv1.ReasonScaledToZero},
		{
			name: "missing claim stalls", replicas: 1,
			obs:   observation{referenceProblem: &problem{servingv1.ReasonPVCNotFound, "PersistentVolumeClaim \"x\" does not exist"}},
			phase: servingv1.PhasePending, reason: servingv1.ReasonPVCNotFound, stalled: true,
		},
		{
			name: "permanent failure stalls", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1)},
			loads: halted(servingv1.ReasonLoadFailed, &servingv1.LoadFailure{Pod: "a", Reason: loadspec.ReasonChecksumMismatch, Message: "bad"}),
			phase: servingv1.PhaseFailed, reason: servingv1.ReasonLoadFailed, stalled: true,
		},
		{
			name: "waiting to retry", replicas: 1,
			obs:   observation{deployment: deploymentWith(1, 0, 1), pods: []podView{failedPod("a", 1, loadspec.ExitRetryable, now)}},
			loads: loadAssessment{failed: 1, failure: &servingv1.LoadFailure{Pod: "a", Reason: "TransientError", Retryable: true, Retried: true}},
			phase: servingv1.PhaseLoading, reason: servingv1.ReasonRetryingLoad, reconciling: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Replicas = ptr.To(tt.replicas)
			tt.obs.podsSeen = true
			st := computeStatus(obj, tt.obs, tt.loads, now)
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

// Once the current spec serves on every desired replica, RollingOut says what
// the workload still does: removes replicas of an earlier spec, removes
// replicas past the desired count, or only has not counted the pods yet (its
// status lags them), which is no removal.
func TestRollingOutSaysWhatIsLeft(t *testing.T) {
	serving := func(n int) []podView {
		var pods []podView
		for i := range n {
			pods = append(pods, podView{Name: fmt.Sprint(i), Current: true, Scheduled: true, Serves: true})
		}
		return pods
	}
	for _, tt := range []struct {
		name    string
		d       *appsv1.Deployment
		pods    []podView
		message string
	}{
		{"replicas of an earlier spec", deploymentWith(3, 3, 2), serving(2), "2 of 2 replicas run the current spec and are ready (1 of an earlier spec still serve); replicas of an earlier spec are being removed"},
		{"a scale down", deploymentWith(3, 3, 3), serving(3), "3 of 2 replicas run the current spec and are ready; replicas past the desired 2 are being removed"},
		{"a status behind the pods", deploymentWith(1, 1, 1), serving(2), "2 of 2 replicas run the current spec and are ready; waiting for the Deployment's status to count them"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Replicas = ptr.To[int32](2)
			st := computeStatus(obj, observation{deployment: tt.d, pods: tt.pods, podsSeen: true}, loadAssessment{}, now)
			ready := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
			g.Expect(ready.Reason).To(Equal(servingv1.ReasonRollingOut))
			g.Expect(ready.Message).To(Equal(tt.message))
		})
	}
}

func TestComputeStatusIsStable(t *testing.T) {
	obj := sampleInference()
	obs := observation{deployment: deploymentWith(1, 0, 1), podsSeen: true,
		pods: []podView{{Name: "a", Current: true, Unschedulable: "0/3 nodes are available"}}}
	obj.Status = computeStatus(obj, obs, loadAssessment{}, now)
	again := computeStatus(obj, obs, loadAssessment{}, now.Add(time.Minute))
	if !equality.Semantic.DeepEqual(obj.Status, again) {
		t.Errorf("a second pass over the same observation changed the status:\n%+v\n%+v", obj.Status, again)
	}
}

func TestObservePodSeesContainersThatCannotStart(t *testing.T) {
	pod := corev1.Pod{Status: corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{
		Name:  servingv1.LoaderContainerName,
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

// The warm-up gate is a sidecar: the kubelet shows it running and not ready while
// it warms up, waiting in CrashLoopBackOff (or just exited) after a run without a
// completion, and ready once warm. kwok's simulated kubelet shows every init
// container, sidecars too, as completed and ready.
func TestObservePodSeesTheWarmupGate(t *testing.T) {
	engineReady := corev1.ContainerStatus{Name: servingv1.EngineContainerName, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	exited := func(code int32, msg string) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", Message: msg}
	}
	const msg = "warm-up failed: no completion from the engine at http://127.0.0.1:8000 succeeded within 30m0s (183 attempts); last: POST /v1/completions: 404 Not Found"
	tests := []struct {
		name        string
		warmup      *corev1.ContainerStatus // nil: the pod has no gate
		wantPending bool
		wantFailure string
		wantReady   bool // counted as a ready replica of the current spec
	}{
		{name: "no gate", wantReady: true},
		{name: "warming up", warmup: &corev1.ContainerStatus{State: running}, wantPending: true},
		{name: "warm", warmup: &corev1.ContainerStatus{Ready: true, State: running}, wantReady: true},
		{name: "kwok shows it completed", warmup: &corev1.ContainerStatus{Ready: true, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}, wantReady: true},
		{
			name:        "just exited without a completion",
			warmup:      &corev1.ContainerStatus{State: corev1.ContainerState{Terminated: exited(1, msg)}},
			wantPending: true, wantFailure: "warm-up gate exited 1 times without a completion from the engine; last exit code 1 (Error): " + msg,
		},
		{
			name: "waiting to run again",
			warmup: &corev1.ContainerStatus{RestartCount: 2, LastTerminationState: corev1.ContainerState{Terminated: exited(1, msg)},
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			wantPending: true, wantFailure: "warm-up gate exited 2 times without a completion from the engine; last exit code 1 (Error): " + msg,
		},
		{
			name:        "running again after a failed run",
			warmup:      &corev1.ContainerStatus{RestartCount: 1, LastTerminationState: corev1.ContainerState{Terminated: exited(1, msg)}, State: running},
			wantPending: true, wantFailure: "warm-up gate exited 1 times without a completion from the engine; last exit code 1 (Error): " + msg,
		},
		{
			name:      "warm after a failed run",
			warmup:    &corev1.ContainerStatus{Ready: true, RestartCount: 1, LastTerminationState: corev1.ContainerState{Terminated: exited(1, msg)}, State: running},
			wantReady: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			pod := corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{engineReady}}}
			loader := corev1.ContainerStatus{Name: servingv1.LoaderContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}
			pod.Status.InitContainerStatuses = []corev1.ContainerStatus{loader}
			if tt.warmup != nil {
				tt.warmup.Name = servingv1.WarmupContainerName
				pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, *tt.warmup)
			}
			v := observePod(&pod, "")
			g.Expect(v.WarmupPending).To(Equal(tt.wantPending))
			g.Expect(v.WarmupFailure).To(Equal(tt.wantFailure))
			g.Expect(v.LoaderDone).To(BeTrue())
			g.Expect(v.EngineCrashLoop).To(BeEmpty())
			g.Expect(v.StartFailure).To(BeEmpty())
			v.Current = true
			ro := observeRollout(sampleInference(), observation{pods: []podView{v}}, "")
			g.Expect(ro.currentReady == 1).To(Equal(tt.wantReady))
		})
	}
}

// A failed warm-up reads as Ready=False WarmupFailed with the gate's message, and
// is recorded as the last failure, as a crash-looping engine is.
func TestWarmupFailureIsReported(t *testing.T) {
	g := NewWithT(t)
	obj := sampleInference()
	failure := "warm-up gate exited 1 times without a completion from the engine; last exit code 1 (Error): warm-up failed: no completion"
	obs := observation{deployment: deploymentWith(1, 0, 1), podsSeen: true,
		pods: []podView{{Name: "a", Current: true, Scheduled: true, LoaderDone: true, EngineReady: true, WarmupPending: true, WarmupFailure: failure}}}
	st := computeStatus(obj, obs, loadAssessment{}, now)
	ready := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
	g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(ready.Reason).To(Equal(servingv1.ReasonWarmupFailed))
	g.Expect(ready.Message).To(ContainSubstring("0 of 1 replicas run the current spec and are ready; pod a: " + failure))
	g.Expect(ready.Message).To(ContainSubstring("engine.warmup.enabled: false"))
	g.Expect(st.LastFailure).NotTo(BeNil())
	g.Expect(st.LastFailure.Reason).To(Equal(servingv1.ReasonWarmupFailed))
	g.Expect(st.LastFailure.Message).To(Equal(failure))
	g.Expect(st.LastFailure.Pod).To(Equal("a"))
	g.Expect(reasons.Explain(servingv1.ReasonWarmupFailed).Warning).To(BeTrue(), "a failing warm-up is a Warning event")
}

// fakeLogs is a fake LogReader: envtest runs no kubelet to serve logs.
type fakeLogs map[string]string

func (f fakeLogs) LastLine(_ context.Context, _, pod, _ string) (string, error) { return f[pod], nil }

func TestCrashLoopWithoutAMessageReadsTheLog(t *testing.T) {
	crashed := func(message string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: servingv1.EngineContainerName, RestartCount: 3,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: message}},
		}}}}
	}
	withMessage := crashed("Traceback: CUDA out of memory")
	if v := observePod(&withMessage, ""); v.EngineLogWanted {
		t.Error("the log is read although the exit left a message")
	}
	silent := crashed("")
	r := &Reconciler{Logs: fakeLogs{"p": `E1203 main.go:44] "failed to read configuration" err="unknown flag: --bad"`}}
	s := &scope{obj: sampleInference(), obs: observation{pods: []podView{observePod(&silent, "")}}}
	s.obs.pods[0].Current = true
	r.readCrashLogs(context.Background(), s)
	if got := s.obs.pods[0].EngineCrashLoop; !strings.Contains(got, "last exit code 0 (Completed); last log line: E1203") || !strings.Contains(got, "unknown flag: --bad") {
		t.Errorf("EngineCrashLoop = %q", got)
	}
}

// minReplicas 0 without an activator is said, not silently ignored.
func TestScalingConditionSaysWhenZeroCannotBeHonoured(t *testing.T) {
	obj := sampleInference()
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2}
	st := computeStatus(obj, observation{autoscale: &autoscaleView{noActivator: true}}, loadAssessment{}, now)
	c := meta.FindStatusCondition(st.Conditions, servingv1.ConditionScalingActive)
	if c == nil || !strings.Contains(c.Message, "minReplicas 0 is not applied") {
		t.Fatalf("ScalingActive: %+v", c)
	}
}
