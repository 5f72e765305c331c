package aiinference

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// An object admitted before admission refused names no child can take gets a
// Stalled status that says so, and no child is written: the Reconciler has no
// client here, so any read or write would panic.
func TestANameNoChildCanTakeStallsWithoutWrites(t *testing.T) {
	for _, name := range []string{"qwen2.5-7b", strings.Repeat("a", 64)} {
		obj := sampleInference()
		obj.Name = name
		s := &scope{obj: obj, now: now}
		if err := (&Reconciler{}).reconcileSteps(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st := computeStatus(obj, s.obs, s.loads, now)
		stalled := meta.FindStatusCondition(st.Conditions, servingv1.ConditionStalled)
		if stalled == nil || stalled.Reason != servingv1.ReasonInvalidName || !strings.Contains(stalled.Message, "create the AIInference again under a name that fits") {
			t.Errorf("%s: Stalled %+v", name, stalled)
		}
	}
}

// The same pods give the same status in whatever order the cache lists them,
// pods created in the same second included: status names the first pod that
// explains the wait, and a different one on each pass was a write per pass.
func TestStatusDoesNotDependOnThePodOrder(t *testing.T) {
	obj := sampleInference()
	created := metav1.NewTime(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	var pods []corev1.Pod
	for i := range 300 {
		pods = append(pods, corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "llama-7d9f-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), CreationTimestamp: created},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, Message: "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."}}},
		})
	}
	first := observePods(pods, "")
	want := computeStatus(obj, observation{podsSeen: true, pods: first}, loadAssessment{}, now)
	obj.Status = want
	for range 20 {
		rand.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		got := computeStatus(obj, observation{podsSeen: true, pods: observePods(pods, "")}, loadAssessment{}, now)
		if !equality.Semantic.DeepEqual(want, got) {
			t.Fatalf("another order of the same pods gave another status:\n%+v\n%+v", meta.FindStatusCondition(want.Conditions, servingv1.ConditionReady), meta.FindStatusCondition(got.Conditions, servingv1.ConditionReady))
		}
	}
}
