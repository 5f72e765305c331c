package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// setV1Alpha1Served serves v1alpha1 of the CRD, or stops serving it, with no
// conversion: the CRD as the demo and `make install` applied it before v1alpha1
// was served only with the webhook.
func setV1Alpha1Served(g *WithT, served bool) {
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	crd.SetName("aiinferences.serving.aiinference.io")
	patch := `[{"op": "test", "path": "/spec/versions/1/name", "value": "v1alpha1"},
		{"op": "replace", "path": "/spec/versions/1/served", "value": ` + map[bool]string{true: "true", false: "false"}[served] + `}]`
	g.Expect(k8s.Patch(context.Background(), crd, client.RawPatch(types.JSONPatchType, []byte(patch)))).To(Succeed())
}

// A v1alpha1 object stored without conversion cannot be read as v1 (its
// spec.engine is a string): it gets a status that says so, and the operator
// keeps seeing every other object (a failed decode failed the whole watch).
func TestAnObjectStoredWithoutConversionGetsAStatusThatSaysSo(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := credentialedNamespace(t)
	setV1Alpha1Served(g, true)
	t.Cleanup(func() { setV1Alpha1Served(NewWithT(t), false) })

	old := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.aiinference.io/v1alpha1", "kind": "AIInference",
		"metadata": map[string]any{"name": "stored-as-alpha", "namespace": ns},
		"spec":     map[string]any{"modelName": "llama-3.1-8b", "modelURI": "s3://models/llama-3.1-8b/", "engine": "vLLM", "gpus": int64(1)},
	}}
	g.Eventually(func() error { return k8s.Create(ctx, old) }).WithTimeout(waitTimeout).Should(Succeed())
	key := client.ObjectKeyFromObject(old)
	obj := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, key, obj)).To(Succeed(), "the object reads, with its metadata")
	g.Expect(obj.DecodeError()).To(ContainSubstring("the stored spec cannot be read as serving.aiinference.io/v1"))
	// The API server refuses any write to the object (its spec fails the v1
	// schema), status included: a Warning event carries the message.
	g.Eventually(func(g Gomega) {
		events := &eventsv1.EventList{}
		g.Expect(k8s.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		var found []string
		for _, e := range events.Items {
			if e.Regarding.Name == "stored-as-alpha" && e.Reason == servingv1.ReasonUndecodableSpec {
				found = append(found, e.Note)
			}
		}
		g.Expect(found).To(ConsistOf(And(ContainSubstring("written as v1alpha1 while no conversion webhook ran"), ContainSubstring("Apply the object again"))))
	}).WithTimeout(waitTimeout).Should(Succeed())

	// Another object is still seen and served.
	other := newInference(ns, "after-the-undecodable")
	g.Expect(k8s.Create(ctx, other)).To(Succeed())
	getDeployment(g, client.ObjectKeyFromObject(other))
	g.Consistently(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "stored-as-alpha"}, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment"}})).NotTo(Succeed(), "a Deployment was made from an unread spec")
	}).WithTimeout(2 * time.Second).Should(Succeed())
}
