package v1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A multi-node replica serves through its leader: a worker, whose engine
// container has no probe and so is ready while it runs, never counts as a
// serving pod, so the autoscaler reads no worker's /metrics (it has none),
// and neither the activator nor status takes it for a replica that serves.
func TestOnlyALeaderOfAGroupServes(t *testing.T) {
	pod := func(role string, engineReady bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}}}
		if role != "" {
			p.Labels[LabelRole] = role
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: EngineContainerName, Ready: engineReady}}
		return p
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		serves bool
	}{
		{"a single-node replica's ready pod", pod("", true), true},
		{"a leader whose engine is ready", pod(RoleLeader, true), true},
		{"a leader whose engine is not ready", pod(RoleLeader, false), false},
		{"a running worker", pod(RoleWorker, true), false},
	} {
		if got := PodServes(tc.pod); got != tc.serves {
			t.Errorf("%s: PodServes = %v, want %v", tc.name, got, tc.serves)
		}
	}
}
