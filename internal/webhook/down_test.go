package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
)

// checkWebhookDownIsAClearAPIError stops the suite's operator and checks that
// users then get an API error that names the webhook that could not be called,
// instead of objects slipping past validation. It breaks every test that needs
// the webhooks, so TestMain runs it after them all rather than as a test, which
// -shuffle could put anywhere.
func checkWebhookDownIsAClearAPIError(logf func(format string, args ...any)) error {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "aii-webhook-down-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		return err
	}
	stored := validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Namespace, o.Name = ns.Name, "before" })
	if err := k8s.Create(ctx, stored); err != nil {
		return fmt.Errorf("create while the operator is up: %w", err)
	}

	stopManager()

	var errs []error
	err := k8s.Create(ctx, validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Namespace, o.Name = ns.Name, "after" }))
	logf("create while the operator is down: %v", err)
	if err == nil {
		errs = append(errs, errors.New("create while the operator is down succeeded"))
	} else if !strings.Contains(err.Error(), `failed calling webhook "default.aiinferences.serving.aiinference.io"`) &&
		!strings.Contains(err.Error(), "conversion webhook for serving.aiinference.io/v1alpha1, Kind=AIInference failed") {
		errs = append(errs, fmt.Errorf("create while the operator is down: the error does not name the webhook: %w", err))
	}

	err = k8s.Get(ctx, key(ns.Name, "before"), &servingv1alpha1.AIInference{})
	logf("read as v1alpha1 while the operator is down: %v", err)
	if err == nil {
		errs = append(errs, errors.New("read as v1alpha1 while the operator is down succeeded"))
	} else if !strings.Contains(err.Error(), "conversion webhook for serving.aiinference.io/v1, Kind=AIInference failed") {
		errs = append(errs, fmt.Errorf("read as v1alpha1 while the operator is down: the error does not name the conversion webhook: %w", err))
	}
	return errors.Join(errs...)
}
