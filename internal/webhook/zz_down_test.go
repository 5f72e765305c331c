package webhook_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
)

// With the operator down, users get an API error that names the webhook that
// could not be called, instead of objects slipping past validation. This test
// stops the suite's operator, so it lives in the last file and runs last.
func TestWebhookDownIsAClearAPIError(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	stored := validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Namespace, o.Name = ns, "before" })
	g.Expect(k8s.Create(ctx, stored)).To(Succeed())

	stopManager()

	err := k8s.Create(ctx, validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Namespace, o.Name = ns, "after" }))
	g.Expect(err).To(HaveOccurred())
	t.Logf("create while the operator is down: %v", err)
	g.Expect(err.Error()).To(SatisfyAny(
		ContainSubstring(`failed calling webhook "default.aiinferences.serving.aiinference.io"`),
		ContainSubstring("conversion webhook for serving.aiinference.io/v1alpha1, Kind=AIInference failed")))

	err = k8s.Get(ctx, key(ns, "before"), &servingv1alpha1.AIInference{})
	g.Expect(err).To(HaveOccurred())
	t.Logf("read as v1alpha1 while the operator is down: %v", err)
	g.Expect(strings.Contains(err.Error(), "conversion webhook for serving.aiinference.io/v1, Kind=AIInference failed")).To(BeTrue(), err.Error())
}
