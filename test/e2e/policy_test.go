package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
)

// TestAdmissionPolicyOnTheLocalCluster applies config/policy as
// docs/security.md says (`kubectl apply -k config/policy`, then the settings
// ConfigMap edited to allow the engine image this cluster runs) and checks
// what the local cluster's API server lets through: an engine image from an
// unlisted registry and a ServiceAccount not on the list are refused, at
// creation and on update, with the policy's message; an allowed image with the
// allowed ServiceAccount is admitted and reaches Ready (on the real node, where
// the run has one: its engine really runs from the allowed image, as that
// ServiceAccount).
//
// The policy is bound to the test's namespace alone, so that the tests beside
// it are not judged by it; TestRealNodeOperatorPodFromTheChart applies it as
// shipped, bound to every namespace.
func TestAdmissionPolicyOnTheLocalCluster(t *testing.T) {
	shared.share(t)
	if realNodeAsked() {
		reserveRealPods(t, 1)
	}
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	settings := applyAdmissionPolicy(t, g, ns)

	// The object to admit: on the real node, the simulator's image; else one of
	// the shipped prefixes.
	var allowed *servingv1.AIInference
	if realNodeAsked() {
		allowed = realInference(t, cluster.ObjectStore(), ns, "allowed")
		prefix := allowed.Spec.Engine.Image[:strings.Index(allowed.Spec.Engine.Image, "/")+1]
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(settings), settings)).To(Succeed())
		settings.Data["allowedImagePrefixes"] += "," + prefix
		g.Expect(k8s.Update(ctx, settings)).To(Succeed())
		t.Logf("allowedImagePrefixes: %s", settings.Data["allowedImagePrefixes"])
	} else {
		allowed = inference(ns, "allowed", 1, localcluster.GPUProductL4)
		allowed.Spec.Engine.Image = "vllm/vllm-openai:v0.11.0"
	}
	allowed.Spec.ServiceAccountName = "model-server"
	g.Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model-server"}})).To(Succeed())

	with := func(image, sa string) *servingv1.AIInference {
		obj := allowed.DeepCopy()
		obj.Name = "candidate"
		obj.Spec.Engine.Image, obj.Spec.ServiceAccountName = image, sa
		return obj
	}
	// The policy takes effect once the API server has compiled it and read its settings.
	g.Eventually(func() error { return k8s.Create(ctx, with("evil.example/miner:latest", ""), client.DryRunAll) }).
		WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(HaveOccurred(), "the policy is not in force 30 s after kubectl apply")
	admitted := with(allowed.Spec.Engine.Image, allowed.Spec.ServiceAccountName)
	g.Eventually(func() error { return k8s.Create(ctx, admitted, client.DryRunAll) }).
		WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Succeed(), "the edited settings are not in force 30 s after the edit")

	for _, c := range []struct {
		image, sa string
		refused   string // the policy's message, or empty when admitted
	}{
		{"evil.example/miner:latest", "", "ValidatingAdmissionPolicy 'aiinference-images-and-serviceaccounts' with binding 'aiinference-images-and-serviceaccounts' denied request: spec.engine.image evil.example/miner:latest is not from an allowed registry; allowed prefixes: registry.example/inference/, vllm/vllm-openai:"},
		{"registry.example/other/vllm:v1", "", "spec.engine.image registry.example/other/vllm:v1 is not from an allowed registry"},
		{allowed.Spec.Engine.Image, "cluster-admin-sa", "spec.serviceAccountName cluster-admin-sa is not allowed; allowed: model-server"},
		{allowed.Spec.Engine.Image, "default", "spec.serviceAccountName default is not allowed; allowed: model-server"},
		{"", "", ""},
		{"registry.example/inference/vllm:v1", "model-server", ""},
	} {
		err := k8s.Create(ctx, with(c.image, c.sa), client.DryRunAll)
		if c.refused == "" {
			g.Expect(err).NotTo(HaveOccurred(), "image %q, ServiceAccount %q", c.image, c.sa)
			t.Logf("admitted: image %q, ServiceAccount %q", c.image, c.sa)
			continue
		}
		g.Expect(err).To(HaveOccurred(), "image %q, ServiceAccount %q admitted", c.image, c.sa)
		g.Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		g.Expect(err.Error()).To(ContainSubstring(c.refused))
		t.Logf("refused: %v", err)
	}

	// The allowed one is admitted for real and serves.
	g.Expect(k8s.Create(ctx, allowed)).To(Succeed())
	timeout := readyTimeout
	if realNodeAsked() {
		timeout = realReadyTimeout
	}
	begin := time.Now()
	waitFor(t, g, allowed, timeout, beReady(1))
	t.Logf("admitted %s (image %s, ServiceAccount %s) Ready %s after creation", allowed.Name, allowed.Spec.Engine.Image, allowed.Spec.ServiceAccountName,
		time.Since(begin).Round(100*time.Millisecond))
	if realNodeAsked() {
		pods := oneServingPod(g, allowed)
		g.Expect(pods[0].Spec.ServiceAccountName).To(Equal("model-server"))
		g.Expect(pods[0].Spec.Containers[0].Image).To(Equal(allowed.Spec.Engine.Image))
	}

	// An update to an image from elsewhere is refused too, and the object keeps serving.
	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(allowed), got)).To(Succeed())
	got.Spec.Engine.Image = "evil.example/miner:latest"
	err := k8s.Update(ctx, got)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("spec.engine.image evil.example/miner:latest is not from an allowed registry"))
	t.Logf("update refused: %v", err)
	waitFor(t, g, allowed, 5*time.Second, beReady(1))
}

// applyAdmissionPolicy runs `kubectl apply -k config/policy` on the local
// cluster (in aiinference-system, made if missing), and deletes what it applied
// at the end; it returns the policy's settings ConfigMap. With onlyNamespace set, it
// applies config/policy through an overlay that binds the policy to that
// namespace alone, so that tests in other namespaces go on beside it.
func applyAdmissionPolicy(t *testing.T, g *WithT, onlyNamespace string) *corev1.ConfigMap {
	t.Helper()
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	assets, err := testutil.EnvtestAssets()
	g.Expect(err).NotTo(HaveOccurred())
	kubectl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", cluster.Kubeconfig()}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The namespace stays once made: the next test that applies the policy
	// finds it, and deleting it would cost about 5 s of the namespace
	// controller's work, on the shared cluster, for nothing.
	system := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "aiinference-system"}}
	if err := k8s.Create(context.Background(), system); err != nil {
		g.Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "%v", err)
	}
	policy := filepath.Join(root, "config", "policy")
	if onlyNamespace != "" {
		overlay := t.TempDir()
		base, err := filepath.Rel(overlay, policy) // kustomize takes no absolute path
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(fmt.Sprintf(`resources:
  - %s
patches:
  - target: {kind: ValidatingAdmissionPolicyBinding}
    patch: |-
      - op: add
        path: /spec/matchResources
        value: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}}
`, base, onlyNamespace)), 0o644)).To(Succeed())
		policy = overlay
	}
	out, err := kubectl("apply", "-k", policy)
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.Logf("kubectl apply -k config/policy (bound to namespace %q, empty for all):\n%s", onlyNamespace, strings.TrimSpace(out))
	t.Cleanup(func() {
		if out, err := kubectl("delete", "-k", policy, "--wait"); err != nil {
			t.Errorf("kubectl delete -k config/policy: %v: %s", err, out)
		}
	})
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: system.Name, Name: "aiinference-admission-policy"}}
}
