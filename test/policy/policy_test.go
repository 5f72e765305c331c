// Package policy tests config/policy's ValidatingAdmissionPolicy on a real
// kube-apiserver.
package policy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/testutil"
)

// TestAdmissionPolicy applies config/policy as shipped and checks what it lets
// through: an allowed image and ServiceAccount, or none named, pass; an image
// from elsewhere or another ServiceAccount is refused with the policy's message.
func TestAdmissionPolicy(t *testing.T) {
	cfg, root := testutil.StartEnvtest(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"aiinference-system", "team"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "policy", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}

	n := 0
	create := func(image, sa string) error {
		n++
		obj := &servingv1.AIInference{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", GenerateName: "chat-"},
			Spec: servingv1.AIInferenceSpec{
				Model: servingv1.ModelSpec{Name: "m", Size: ptr.To(resource.MustParse("1Gi")),
					Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "m/"}}},
				Engine:             servingv1.EngineSpec{Type: servingv1.EngineVLLM, Image: image},
				GPU:                servingv1.GPUSpec{Count: 1, Products: []string{"NVIDIA-L4"}},
				ServiceAccountName: sa,
			},
		}
		return c.Create(ctx, obj)
	}
	// The policy takes effect once the API server has compiled it.
	deadline := time.Now().Add(30 * time.Second)
	for create("evil.example/miner:latest", "") == nil {
		if time.Now().After(deadline) {
			t.Fatal("an image from an unlisted registry is still admitted 30 s after the policy")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct {
		image, sa string
		refused   string // part of the message, or empty when admitted
	}{
		{"", "", ""},
		{"vllm/vllm-openai:v0.11.0", "", ""},
		{"registry.example/inference/vllm:v1", "model-server", ""},
		{"evil.example/miner:latest", "", "spec.engine.image evil.example/miner:latest is not from an allowed registry"},
		{"registry.example/other/vllm:v1", "", "is not from an allowed registry"},
		{"", "cluster-admin-sa", "spec.serviceAccountName cluster-admin-sa is not allowed; allowed: model-server"},
	} {
		err := create(c.image, c.sa)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("image %q, ServiceAccount %q refused: %v", c.image, c.sa, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("image %q, ServiceAccount %q: want refused with %q, got %v", c.image, c.sa, c.refused, err)
		case err != nil:
			t.Logf("refused: %v", err)
		}
	}
}
