package integration

import (
	"time"

	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

	// Keys added by hand to the policy's maps change whom it selects and whom it
	// lets in (one more label in podSelector selects none of the model's pods:
	// in an enforcing cluster the model is open to all): they are removed.
	rendered, err := policy("fenced-ingress")
	g.Expect(err).NotTo(HaveOccurred())
	for _, hand := range []string{
		`{"spec":{"podSelector":{"matchLabels":{"nothing":"here"}}}}`,
		`{"spec":{"podSelector":{"matchExpressions":[{"key":"nothing","operator":"Exists"}]}}}`,
	} {
		in, err := policy("fenced-ingress")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(k8s.Patch(ctx, in, client.RawPatch(types.MergePatchType, []byte(hand)))).To(Succeed())
		g.Eventually(func(g Gomega) {
			in, err := policy("fenced-ingress")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(in.Spec.PodSelector).To(Equal(rendered.Spec.PodSelector))
		}).WithTimeout(waitTimeout).Should(Succeed(), "after %s", hand)
	}
	// The operator may be writing the policy at the same moment: read it again
	// on a conflict, as any client of an object others write does.
	g.Eventually(func() error {
		in, err := policy("fenced-ingress")
		if err != nil {
			return err
		}
		in.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["also"] = "this"
		in.Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"only": "these"}}
		return k8s.Update(ctx, in)
	}).WithTimeout(waitTimeout).Should(Succeed(), "a peer narrowed by hand")
	g.Eventually(func(g Gomega) {
		in, err := policy("fenced-ingress")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(in.Spec.Ingress[0].From[0]).To(Equal(gateway))
	}).WithTimeout(waitTimeout).Should(Succeed(), "a peer narrowed by hand")
	// Put back, then left alone: no pass rewrites it for 2 s (a pass that had
	// already read the edit when the first put it back may write it once more).
	g.Eventually(func() bool {
		before, errBefore := policy("fenced-ingress")
		time.Sleep(2 * time.Second)
		after, errAfter := policy("fenced-ingress")
		return errBefore == nil && errAfter == nil && before.ResourceVersion == after.ResourceVersion
	}).WithTimeout(waitTimeout).Should(BeTrue(), "put back, then left alone")

	updateObject(g, key, func(o *servingv1.AIInference) { o.Spec.NetworkPolicy.Enabled = false })
	g.Eventually(func() bool {
		_, errIn := policy("fenced-ingress")
		_, errOut := policy("fenced-egress")
		return apierrors.IsNotFound(errIn) && apierrors.IsNotFound(errOut)
	}).WithTimeout(waitTimeout).Should(BeTrue(), "disabled: the policies go")
}
