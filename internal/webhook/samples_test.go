package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/webhook"
	"github.com/aiinference/operator/test/testutil"
)

// Every AIInference sample, of either version, passes the validating webhooks
// without a warning and the API server's checks of the CRD, and the v1alpha1 sample describes the same model as its v1
// counterpart.
func TestSamplesAreValid(t *testing.T) {
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The demo's real-node samples too, with the values make demo fills in.
	demoFiles, err := filepath.Glob(filepath.Join(root, "config", "localcluster", "demo-*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, demoFiles...)
	demoValues := map[string]string{
		"OBJECT_STORE_MODEL_BYTES":  "268435456",
		"OBJECT_STORE_BUCKET":       "models",
		"OBJECT_STORE_MODEL_PREFIX": "tiny/",
		"OBJECT_STORE_ENDPOINT":     "http://192.0.2.1:9000",
		"IMAGE_LLM_D_INFERENCE_SIM": "localcluster.local/llm-d-inference-sim:0123456789abcdef",
		"OBJECT_STORE_GGUF_PREFIX":  "tinyllama-random/",
		"OBJECT_STORE_GGUF_BYTES":   "43021216",
		"IMAGE_OLLAMA":              "localcluster.local/ollama:v0.9.6-0123456789abcdef",
		"GATEWAY_NAME":              "traefik",
		"GATEWAY_NAMESPACE":         "localcluster-gateway",
	}
	byName := map[string]any{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(os.Expand(string(data), func(name string) string { return demoValues[name] }))
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var raw map[string]any
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if raw["kind"] != "AIInference" {
				continue
			}
			doc, _ := yaml.Marshal(raw)
			var warnings []string
			switch raw["apiVersion"] {
			case "serving.aiinference.io/v1":
				obj := &servingv1.AIInference{}
				if err := yaml.UnmarshalStrict(doc, obj); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				warnings, err = webhook.ValidatorV1{}.ValidateCreate(context.Background(), obj)
				byName[obj.Name] = obj
			case "serving.aiinference.io/v1alpha1":
				obj := &servingv1alpha1.AIInference{}
				if err := yaml.UnmarshalStrict(doc, obj); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				warnings, err = webhook.ValidatorV1Alpha1{}.ValidateCreate(context.Background(), obj)
				byName[obj.Name] = obj
			default:
				t.Fatalf("%s: unknown apiVersion %v", file, raw["apiVersion"])
			}
			// The real node's product is one no simulated node has, on purpose.
			warnings = slices.DeleteFunc(warnings, func(w string) bool {
				return strings.Contains(w, `"NVIDIA-T4" is not a GPU product`) && strings.HasPrefix(filepath.Base(file), "demo-")
			})
			if err != nil || len(warnings) > 0 {
				t.Errorf("%s: %v, warnings %v", filepath.Base(file), err, warnings)
			}
			// And the real API server takes it: the CRD's schema (enums,
			// formats) and CEL rules, then the webhooks, without writing it.
			obj := &unstructured.Unstructured{Object: raw}
			obj.SetNamespace("default")
			if err := k8s.Create(context.Background(), obj, client.DryRunAll); err != nil {
				t.Errorf("%s: the API server refuses %s: %v", filepath.Base(file), obj.GetName(), err)
			}
		}
	}
	alpha, ok1 := byName["llama-chat-v1alpha1"].(*servingv1alpha1.AIInference)
	v1obj, ok2 := byName["llama-chat"].(*servingv1.AIInference)
	if !ok1 || !ok2 {
		t.Fatalf("samples llama-chat (v1) and llama-chat-v1alpha1 not found among %d", len(byName))
	}
	hub := &servingv1.AIInference{}
	if err := alpha.ConvertTo(hub); err != nil {
		t.Fatal(err)
	}
	if hub.Spec.Model.Name != v1obj.Spec.Model.Name || hub.Spec.Model.Source.S3.Bucket != v1obj.Spec.Model.Source.S3.Bucket ||
		hub.Spec.Model.Source.S3.Prefix != v1obj.Spec.Model.Source.S3.Prefix || hub.Spec.GPU.Count != v1obj.Spec.GPU.Count ||
		hub.Spec.GPU.Products[0] != v1obj.Spec.GPU.Products[0] || !strings.EqualFold(string(hub.Spec.Engine.Type), string(v1obj.Spec.Engine.Type)) {
		t.Errorf("the v1alpha1 sample no longer describes the v1 sample's model:\n%+v\n%+v", hub.Spec, v1obj.Spec)
	}
}
