package localcluster

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aiinference/operator/internal/webhook"
)

// GroupPodWebhookName names the webhook configuration that
// RegisterGroupPodWebhook makes. Like the operator's own
// (aiinference-mutating-webhook-configuration) it sorts before
// LeaderWorkerSet's, so the API server calls it first, and again after
// LeaderWorkerSet's webhook labels the pod (reinvocationPolicy IfNeeded).
const GroupPodWebhookName = "aiinference-group-pods"

// RegisterGroupPodWebhook registers the operator's pod webhook of multi-node
// groups, as config/webhook has it, for an operator on the host that serves
// its webhooks on port with the certificate this writes into certDir: run it
// with --webhooks --webhook-cert-mode=cert-manager --webhook-cert-dir=certDir
// --webhook-port=port. The webhook names each group's PodGroup in its pods,
// which the cluster's scheduler then places all or nothing.
func (c *Cluster) RegisterGroupPodWebhook(ctx context.Context, repoRoot, certDir string, port int) error {
	caBundle, err := writeLoopbackServingCert(certDir)
	if err != nil {
		return fmt.Errorf("writing the operator's webhook certificate: %w", err)
	}
	manifests, err := webhook.LoadLocalManifests(repoRoot, fmt.Sprintf("https://127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	config := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: GroupPodWebhookName}}
	for _, w := range manifests.Mutating.Webhooks {
		if w.ClientConfig.URL != nil && *w.ClientConfig.URL == fmt.Sprintf("https://127.0.0.1:%d%s", port, webhook.GroupPodPath) {
			w.ClientConfig.CABundle = caBundle
			config.Webhooks = append(config.Webhooks, w)
		}
	}
	if len(config.Webhooks) != 1 {
		return fmt.Errorf("config/webhook/manifests.yaml has %d webhooks at %s, not one; run make manifests", len(config.Webhooks), webhook.GroupPodPath)
	}
	if _, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, config, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("registering the operator's pod webhook: %w", err)
	}
	return nil
}
