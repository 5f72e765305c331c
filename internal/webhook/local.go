package webhook

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// LocalManifests are the CRD and webhook configurations of config/, pointed at a
// webhook server the API server reaches by URL rather than through a Service: the
// operator running outside the cluster (envtest, the local cluster). The CA
// bundles are left empty for the operator to fill.
type LocalManifests struct {
	CRD        *apiextensionsv1.CustomResourceDefinition
	Mutating   *admissionv1.MutatingWebhookConfiguration
	Validating *admissionv1.ValidatingWebhookConfiguration
}

// LoadLocalManifests reads config/crd/bases and config/webhook under root and
// points every webhook at baseURL (e.g. https://localhost:9443).
func LoadLocalManifests(root, baseURL string) (*LocalManifests, error) {
	crdYAML, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml"))
	if err != nil {
		return nil, err
	}
	m := &LocalManifests{CRD: &apiextensionsv1.CustomResourceDefinition{}}
	if err := yaml.UnmarshalStrict(crdYAML, m.CRD); err != nil {
		return nil, fmt.Errorf("reading the CRD: %w", err)
	}
	// v1alpha1 is served only with the conversion webhook.
	for i := range m.CRD.Spec.Versions {
		m.CRD.Spec.Versions[i].Served = true
	}
	m.CRD.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: strPtr(baseURL + ConvertPath)},
			ConversionReviewVersions: []string{"v1"},
		},
	}

	whYAML, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(whYAML), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		doc, _ := yaml.Marshal(raw)
		switch raw["kind"] {
		case "MutatingWebhookConfiguration":
			m.Mutating = &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, m.Mutating); err != nil {
				return nil, err
			}
			for i := range m.Mutating.Webhooks {
				pointAt(&m.Mutating.Webhooks[i].ClientConfig, baseURL)
			}
		case "ValidatingWebhookConfiguration":
			m.Validating = &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, m.Validating); err != nil {
				return nil, err
			}
			for i := range m.Validating.Webhooks {
				pointAt(&m.Validating.Webhooks[i].ClientConfig, baseURL)
			}
		}
	}
	if m.Mutating == nil || m.Validating == nil {
		return nil, errors.New("config/webhook/manifests.yaml lacks a mutating or validating webhook configuration; run make manifests")
	}
	return m, nil
}

func pointAt(cc *admissionv1.WebhookClientConfig, baseURL string) {
	path := ""
	if cc.Service != nil && cc.Service.Path != nil {
		path = *cc.Service.Path
	}
	cc.Service = nil
	cc.URL = strPtr(baseURL + path)
}

func strPtr(s string) *string { return &s }
