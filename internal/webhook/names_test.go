package webhook_test

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

func withGatewayCanary(o *servingv1.AIInference) {
	o.Spec.Replicas = ptr.To[int32](2)
	o.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1,
		Steps:    []servingv1.CanaryStep{{Weight: 10, Pause: &servingv1.PauseStep{}}},
		Traffic:  &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{Name: "inference-gateway"}}},
	}}
}

// Names that no child can take are refused by the real API server (the CRD's
// CEL rules, in both versions), with a message that says the limit and why; the
// rules and api/v1's NameProblem, which the operator applies to objects admitted
// before the rules, agree on every case.
func TestNamesThatCannotWorkAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cases := []struct {
		name          string
		gatewayCanary bool
		spansNodes    bool
		want          string // "" when admitted
	}{
		{name: "qwen2.5-7b", want: "no dots: write qwen2-5-7b for qwen2.5-7b"},
		{name: "7b-chat", want: "starting with a letter"},
		{name: "chat-", want: "ending with a letter or digit"},
		{name: strings.Repeat("a", 63)},
		{name: strings.Repeat("a", 64), want: "more than 63 characters"},
		{name: strings.Repeat("b", 56), gatewayCanary: true},
		{name: strings.Repeat("b", 57), gatewayCanary: true, want: "more than 56 characters, too many for rollout.canary.traffic"},
		{name: strings.Repeat("c", 57)},
		{name: strings.Repeat("d", 41), spansNodes: true},
		{name: strings.Repeat("d", 42), spansNodes: true, want: "more than 41 characters, too many for gpu.nodes above 1"},
		{name: "llama-3-1-8b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := validV1(func(o *servingv1.AIInference) {
				if tc.gatewayCanary {
					withGatewayCanary(o)
				}
				if tc.spansNodes {
					o.Spec.GPU = servingv1.GPUSpec{Count: 8, Products: []string{"NVIDIA-H100-80GB-HBM3"}, Nodes: 2}
				}
			})
			obj.Name, obj.Namespace = tc.name, ns
			g.Expect(obj.NameProblem() == "").To(Equal(tc.want == ""), "NameProblem: %q", obj.NameProblem())
			err := k8s.Create(ctx, obj)
			if tc.want == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred(), "admitted")
			t.Logf("%v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
		})
	}

	t.Run("v1alpha1", func(t *testing.T) {
		g := NewWithT(t)
		old := validV1Alpha1(nil)
		old.Name, old.Namespace = "qwen2.5-7b", ns
		err := k8s.Create(ctx, old)
		g.Expect(err).To(HaveOccurred(), "admitted")
		g.Expect(err.Error()).To(ContainSubstring("no dots"))
	})

	t.Run("canary traffic added to a long name", func(t *testing.T) {
		g := NewWithT(t)
		var err error
		g.Eventually(func() bool {
			obj := &servingv1.AIInference{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: strings.Repeat("c", 57)}, obj)).To(Succeed())
			withGatewayCanary(obj)
			err = k8s.Update(ctx, obj)
			return !apierrors.IsConflict(err) // the controller writes status meanwhile
		}).WithTimeout(10 * time.Second).Should(BeTrue())
		g.Expect(err).To(HaveOccurred(), "an update that the name cannot take was admitted")
		g.Expect(err.Error()).To(ContainSubstring("more than 56 characters"))
	})
}
