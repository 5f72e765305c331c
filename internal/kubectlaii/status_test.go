package kubectlaii

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

func TestDescribeProgress(t *testing.T) {
	p := &loadspec.Progress{Stage: "downloading", Bytes: 3_200_000_000, Total: 16_000_000_000, RateBytesPerSecond: 410e6, ETASeconds: 31, Files: 12, FilesDone: 3}
	if got, want := describeProgress(p), "loading 3.2 GB of 16.0 GB (20%), 410.0 MB/s, ETA 31s, 3/12 files"; got != want {
		t.Errorf("describeProgress = %q, want %q", got, want)
	}
}

func TestStatusShowsTheAutoscaler(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC))
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm"}}
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MaxReplicas: 4, Targets: servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](2)}}
	obj.Status.Autoscaling = &servingv1.AutoscalingStatus{DesiredReplicas: 3, LastScaleTime: &at,
		Signals:   []servingv1.SignalReading{{Signal: servingv1.SignalQueueDepth, PerReplica: "5.5", Target: 2, Replicas: 3}},
		Decisions: []servingv1.ScalingDecision{{Time: at, From: 1, To: 3, Reason: servingv1.ScalingDecisionUp, Message: "QueueDepth 5.5 per replica against a target of 2 asks for 3"}}}
	var out strings.Builder
	writeStatus(&out, statusReport(&view{obj: obj}, at.Time))
	for _, want := range []string{
		"Autoscaling: 3 replicas desired (min 1, max 4), last change at 2026-12-05T08:00:00Z",
		"QueueDepth  5.5          2       3",
		"2026-12-05T08:00:00Z ScaledUp      1 -> 3: QueueDepth 5.5 per replica",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// A canary superseded (the spec went back to the stable revision) leaves no
// rollout running: status says so, with the decision, and shows no phase,
// step, weight or analysis of a canary that is gone.
func TestStatusAfterASupersededCanary(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC))
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm"}}
	obj.Status.Rollout = &servingv1.RolloutStatus{StableRevision: "a1", CanaryRevision: "b2", TrafficSplit: "Gateway",
		Analysis: []servingv1.AnalysisRun{{Time: at, Verdict: servingv1.VerdictPass}},
		History: []servingv1.RolloutDecision{
			{Time: at, Decision: "CanaryStarted", Revision: "b2", Message: "revision b2 starts as a canary"},
			{Time: at, Decision: "Superseded", Revision: "b2", Message: "the spec is back to the stable revision a1; the canary of b2 is removed"},
		}}
	var out strings.Builder
	writeStatus(&out, statusReport(&view{obj: obj}, at.Time))
	if want := "Canary rollout: none in progress; stable a1. The canary of revision b2 was superseded"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
	for _, stale := range []string{"Canary rollout: ,", "canary weight", "Last analysis run"} {
		if strings.Contains(out.String(), stale) {
			t.Errorf("status shows %q of a superseded canary:\n%s", stale, out.String())
		}
	}
}

func TestStatusShowsTheResolvedSource(t *testing.T) {
	for _, tc := range []struct {
		source servingv1.ModelSource
		status *servingv1.SourceStatus
		want   string
	}{
		{servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen/Qwen2.5-0.5B"}},
			&servingv1.SourceStatus{Revision: "0123456789abcdef0123456789abcdef01234567"},
			"Source hf://Qwen/Qwen2.5-0.5B@main, commit 0123456789abcdef0123456789abcdef01234567\n"},
		{servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen/Qwen2.5-0.5B", Revision: "v2"}}, nil,
			"Source hf://Qwen/Qwen2.5-0.5B@v2, not resolved yet\n"},
		{servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "reg.example/models/qwen:v1"}},
			&servingv1.SourceStatus{Digest: "sha256:abc", Mode: servingv1.OCIModeImageVolume},
			"Source oci://reg.example/models/qwen:v1, digest sha256:abc, mode ImageVolume\n"},
	} {
		obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm"}}
		obj.Spec.Model.Source, obj.Status.Source = tc.source, tc.status
		var out strings.Builder
		writeStatus(&out, statusReport(&view{obj: obj}, time.Now()))
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("status lacks %q:\n%s", tc.want, out.String())
		}
	}
}

func TestStatusListsTheAdapters(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC))
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm"}}
	obj.Spec.Adapters = []servingv1.AdapterSpec{
		{Name: "sql-lora", Revision: "v2", Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "adapters", Prefix: "sql/"}}},
		{Name: "chat-lora", Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "adapters", Prefix: "chat/"}}},
	}
	obj.Status.Adapters = []servingv1.AdapterStatus{
		{Name: "sql-lora", ServingReplicas: 2, Pods: []string{"llm-a", "llm-b"}},
		{Name: "chat-lora", LastFailure: &servingv1.AdapterFailure{Reason: loadspec.ReasonNotFound, Message: "nothing under s3://adapters/chat/", Pod: "llm-a", Attempts: 1, Retrying: false, Time: at}},
	}
	var out strings.Builder
	writeStatus(&out, statusReport(&view{obj: obj}, at.Time))
	for _, want := range []string{
		"ADAPTER    REVISION  SOURCE               SERVING  PODS         LAST FAILURE",
		"sql-lora   v2        s3://adapters/sql/   2        llm-a,llm-b  -",
		"chat-lora  -         s3://adapters/chat/  0        -            SourceNotFound on llm-a, attempt 1, not retried: nothing under s3://adapters/chat/",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// A replica that spans nodes is a group: status lists each pod's group and
// role, and a worker is ready when its pod is (it has no server to serve).
func TestStatusListsGroups(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC))
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "big"}}
	obj.Status.GPU = "2 nodes x 8x NVIDIA-H100-80GB-HBM3"
	member := func(name, role string, ready bool) corev1.Pod {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{servingv1.LabelRole: role, lwsv1.GroupIndexLabelKey: "0"}},
			Spec:       corev1.PodSpec{NodeName: name + "-node"},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: ready}}},
		}
	}
	v := &view{obj: obj, pods: []corev1.Pod{member("big-group-0", servingv1.RoleLeader, true), member("big-group-0-1", servingv1.RoleWorker, true)}}
	var out strings.Builder
	writeStatus(&out, statusReport(v, at.Time))
	for _, want := range []string{
		"2 nodes x 8x NVIDIA-H100-80GB-HBM3 per replica",
		"POD            GROUP     SPEC",
		"big-group-0    0/leader",
		"big-group-0-1  0/worker",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "big-group-0-1") && !strings.Contains(line, "true") {
			t.Errorf("the ready worker is shown not ready: %q", line)
		}
	}
}
