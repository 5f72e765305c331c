package webhook_test

import (
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/webhook"
	"github.com/aiinference/operator/test/testutil"
)

// The CRD that `make install` and `make demo` apply, with no conversion
// webhook, serves v1 alone: a second served version without conversion is
// stored unconverted and its fields lost on a v1 read. With the webhook
// (config/webhook, the chart, LoadLocalManifests) both are served.
func TestV1Alpha1IsServedOnlyWithTheConversionWebhook(t *testing.T) {
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Conversion != nil && crd.Spec.Conversion.Strategy == apiextensionsv1.WebhookConverter {
		t.Fatal("config/crd/bases names a conversion webhook; the base CRD is meant for clusters without one")
	}
	for _, v := range crd.Spec.Versions {
		if v.Served != (v.Name == "v1") {
			t.Errorf("config/crd/bases: %s served=%v; without the conversion webhook only v1 may be served", v.Name, v.Served)
		}
	}

	local, err := webhook.LoadLocalManifests(root, "https://localhost:9443")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range local.CRD.Spec.Versions {
		if !v.Served {
			t.Errorf("with the conversion webhook, %s is not served", v.Name)
		}
	}
}
