package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Network policy is off by default: no NetworkPolicy. Enabled, the model's
// pods take calls on the engine's port from the listed peers only, and reach
// out to DNS and the store's address and port only; disabled again, the
// policies go.
func TestNetworkPoliciesFollowTheSpec(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, obj, key := startInference(t, "fenced", func(o *servingv1.AIInference) {
		o.Spec.Model.Source.S3.Endpoint = "http://10.96.0.50:9000"
	})
	getDeployment(g, key)
	policy := func(name string) (*networkingv1.NetworkPolicy, error) {
		p := &networkingv1.NetworkPolicy{}
		return p, k8s.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: name}, p)
	}
	g.Consistently(func() bool {
		_, err := policy("fenced-ingress")
		return apierrors.IsNotFound(err)
	}).WithTimeout(2e9).Should(BeTrue(), "off by default")

	gateway := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "gateway"}}}
	updateObject(g, key, func(o *servingv1.AIInference) {
		o.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{gateway}}
	})
	g.Eventually(func(g Gomega) {
		in, err := policy("fenced-ingress")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(in.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue(servingv1.LabelInference, obj.Name))
		g.Expect(in.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}))
		g.Expect(in.Spec.Ingress).To(HaveLen(1))
		g.Expect(in.Spec.Ingress[0].From).To(ContainElement(gateway))
		g.Expect(in.Spec.Ingress[0].Ports).To(HaveLen(1))
		g.Expect(*in.Spec.Ingress[0].Ports[0].Port).To(Equal(intstr.FromInt32(8000)))
		out, err := policy("fenced-egress")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeEgress}))
		g.Expect(out.Spec.Egress).To(HaveLen(2), "DNS, and the store")
		g.Expect(out.Spec.Egress[1].To).To(Equal([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.96.0.50/32"}}}))
		g.Expect(*out.Spec.Egress[1].Ports[0].Port).To(Equal(intstr.FromInt32(9000)))
	}).WithTimeout(waitTimeout).Should(Succeed())

	updateObject(g, key, func(o *servingv1.AIInference) { o.Spec.NetworkPolicy.Enabled = false })
	g.Eventually(func() bool {
		_, errIn := policy("fenced-ingress")
		_, errOut := policy("fenced-egress")
		return apierrors.IsNotFound(errIn) && apierrors.IsNotFound(errOut)
	}).WithTimeout(waitTimeout).Should(BeTrue(), "disabled: the policies go")
}
