package webhook_test

import (
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/webhook"
)

// Each pod of a group names its group's PodGroup: a worker by the group index
// LeaderWorkerSet labels it with, a leader (before LeaderWorkerSet's own
// webhook labels it) by its StatefulSet's pod index. A pod that already names
// one is left alone, and so is every pod where the cluster serves no PodGroups.
func TestAGroupsPodsNameTheirPodGroup(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pod := func(name, role string, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns",
			Labels: map[string]string{servingv1.LabelInference: "big", servingv1.LabelRole: role, lwsv1.SetNameLabelKey: "big-group"}}}
		for k, v := range labels {
			p.Labels[k] = v
		}
		return p
	}
	admit := func(g *WithT, served bool, p *corev1.Pod) admission.Response {
		raw, err := json.Marshal(p)
		g.Expect(err).NotTo(HaveOccurred())
		h := webhook.GroupPods{Decoder: admission.NewDecoder(scheme), ServesPodGroups: func() bool { return served }}
		return h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
	}
	podGroupOf := func(g *WithT, res admission.Response) string {
		g.Expect(res.Allowed).To(BeTrue(), "%+v", res.Result)
		for _, op := range res.Patches {
			if op.Path == "/spec/schedulingGroup" {
				return op.Value.(map[string]any)["podGroupName"].(string)
			}
		}
		return ""
	}

	t.Run("a leader before LeaderWorkerSet's webhook", func(t *testing.T) {
		g := NewWithT(t)
		res := admit(g, true, pod("big-group-3", servingv1.RoleLeader, map[string]string{appsv1.PodIndexLabel: "3"}))
		g.Expect(podGroupOf(g, res)).To(Equal("big-group-3"))
	})
	t.Run("a worker", func(t *testing.T) {
		g := NewWithT(t)
		res := admit(g, true, pod("big-group-3-1", servingv1.RoleWorker, map[string]string{lwsv1.GroupIndexLabelKey: "3", appsv1.PodIndexLabel: "1"}))
		g.Expect(podGroupOf(g, res)).To(Equal("big-group-3"), "the group's index, not the worker's")
	})
	t.Run("a pod that names one already", func(t *testing.T) {
		g := NewWithT(t)
		p := pod("big-group-0", servingv1.RoleLeader, map[string]string{lwsv1.GroupIndexLabelKey: "0"})
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("elsewhere")}
		g.Expect(podGroupOf(g, admit(g, true, p))).To(BeEmpty())
	})
	t.Run("a cluster without PodGroups", func(t *testing.T) {
		g := NewWithT(t)
		res := admit(g, false, pod("big-group-0", servingv1.RoleLeader, map[string]string{lwsv1.GroupIndexLabelKey: "0"}))
		g.Expect(podGroupOf(g, res)).To(BeEmpty())
	})
	t.Run("a pod with the role label added by hand", func(t *testing.T) {
		g := NewWithT(t)
		p := pod("mine", servingv1.RoleWorker, nil)
		delete(p.Labels, lwsv1.SetNameLabelKey)
		res := admit(g, true, p)
		g.Expect(res.Allowed).To(BeFalse())
		g.Expect(res.Result.Message).To(ContainSubstring("only the operator's LeaderWorkerSets make pods with that label"))
	})
}
