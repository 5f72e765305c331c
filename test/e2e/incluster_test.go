package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/test/testutil"
)

// TestRealNodeOperatorPodFromTheChart installs the operator as a user would:
// `make images`' images (hack/images/release.sh, for this host's platform)
// imported into the real node's containerd, the Helm chart rendered with its
// defaults (webhooks with the self-managed certificate, secure metrics, leader
// election) but for one replica placed on the real node, applied to a namespace
// that enforces Pod Security "restricted". The real API server admits the
// operator's pod there, the kubelet runs it from the image as user 65532, it
// reaches the API server through the kubernetes Service with its
// ServiceAccount's token, and serves the admission and conversion webhooks the
// API server calls. A sample in another "restricted" namespace reaches Ready on
// the real node.
//
// It runs alone on the shared cluster (shared.own) from the moment it creates
// its namespaces: while it runs, the suite's operator is stopped and the CRD and
// the webhooks send every request to the pod.
func TestRealNodeOperatorPodFromTheChart(t *testing.T) {
	parallel(t)
	store := needRealNode(t)
	g := NewWithT(t)
	ctx := context.Background()
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	helmDir, err := testutil.BuildTools("helm")
	g.Expect(err).NotTo(HaveOccurred())

	// The images, as `make images` builds them, into the real node.
	begin := time.Now()
	imagesDir := t.TempDir()
	// At the lowest CPU priority: the tests that run meanwhile (this one waits
	// for them to end) are timed, and a compile on two cores would slow them.
	build := exec.Command("nice", "-n", "19", filepath.Join(root, "hack", "images", "release.sh"), imagesDir)
	build.Env = append(os.Environ(), "IMAGE_PLATFORMS=linux/"+runtime.GOARCH)
	var buildLog bytes.Buffer
	build.Stdout, build.Stderr = &buildLog, &buildLog
	g.Expect(build.Run()).To(Succeed(), "hack/images/release.sh:\n%s", buildLog.String())
	t.Logf("hack/images/release.sh (linux/%s) in %s", runtime.GOARCH, time.Since(begin).Round(time.Second))
	for name, want := range map[string]string{"operator": version.OperatorImage(), "model-loader": version.LoaderImage()} {
		image, err := cluster.ImportImage(ctx, filepath.Join(imagesDir, name+"-linux-"+runtime.GOARCH+".docker.tar"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(image.Ref).To(Equal(want), "the chart names the image by the version")
		t.Logf("imported %s into the real node's containerd", image.Ref)
	}

	shared.own(t)
	release := restrictedNamespace(t, "aiinference-")
	workloads := restrictedNamespace(t, "restricted-")
	nodes := cluster.RealNodes()
	g.Expect(nodes).NotTo(BeEmpty())
	node := nodes[0].Name

	// The chart's defaults, but one replica (two cores) on the real node, which
	// carries the GPU taint.
	values := filepath.Join(t.TempDir(), "values.yaml")
	g.Expect(os.WriteFile(values, []byte(fmt.Sprintf(`replicas: 1
nodeSelector: {kubernetes.io/hostname: %s}
tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
`, node)), 0o644)).To(Succeed())
	rendered, err := exec.Command(filepath.Join(helmDir, "helm"), "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"),
		"--namespace", release, "--values", values).Output()
	g.Expect(err).NotTo(HaveOccurred(), "helm template: %s", rendered)

	// The pod reaches the API server through the kubernetes Service, which
	// routes once kube-proxy runs (one cluster on the host at a time runs it).
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	g.Expect(cluster.WaitKubeProxy(waitCtx)).To(Succeed())

	// Only the operator in the pod acts meanwhile: the suite's leads through
	// another lease.
	op.Stop()
	t.Cleanup(func() {
		if err := op.Start(); err != nil {
			t.Errorf("restarting the suite's operator: %v", err)
		}
	})
	begin = time.Now()
	applyChart(t, g, rendered)

	pod := operatorPod(t, g, release)
	t.Logf("the operator's pod %s is Ready on node %s %s after the chart was applied (restarts: %d)", pod.Name, pod.Spec.NodeName,
		time.Since(begin).Round(100*time.Millisecond), pod.Status.ContainerStatuses[0].RestartCount)
	g.Expect(pod.Spec.NodeName).To(Equal(node))
	g.Expect(pod.Spec.Containers[0].Image).To(Equal(version.OperatorImage()))
	g.Expect(pod.Status.ContainerStatuses[0].ImageID).NotTo(BeEmpty())
	// Its process on the host runs as the image's non-root user, enforced by runc.
	uid, err := processUID("/manager", "--webhooks", "--metrics-secure")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(uid).To(Equal("65532"))

	// The operator put its CA into the CRD and the webhook configurations.
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: "aiinferences.serving.aiinference.io"}, crd)).To(Succeed())
	g.Expect(crd.Spec.Conversion.Webhook.ClientConfig.CABundle).NotTo(BeEmpty())

	// The validating webhook in the pod refuses what CEL cannot see.
	obj := realInference(t, store, workloads, "in-cluster")
	bad := obj.DeepCopy()
	bad.Spec.Engine.Args = append(bad.Spec.Engine.Args, "--port=9000")
	err = k8s.Create(ctx, bad, client.DryRunAll)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(And(ContainSubstring("denied the request"), ContainSubstring(`"--port" is set by the operator for vLLM`)))
	t.Logf("the webhook in the pod refused: %v", err)

	// A sample reaches Ready on the real node, reconciled by the pod.
	begin = time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	t.Logf("the sample is Ready %s after creation, its pods admitted under restricted", time.Since(begin).Round(100*time.Millisecond))
	pods := oneServingPod(g, obj)
	g.Expect(pods[0].Spec.InitContainers[0].Image).To(Equal(version.LoaderImage()), "the chart's default loader image")

	// Read as v1alpha1, it goes through the conversion webhook in the pod.
	old := &unstructured.Unstructured{}
	old.SetAPIVersion(servingv1.GroupVersion.Group + "/v1alpha1")
	old.SetKind("AIInference")
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), old)).To(Succeed())
	modelName, _, _ := unstructured.NestedString(old.Object, "spec", "modelName")
	g.Expect(modelName).To(Equal(obj.Spec.Model.Name), "v1alpha1 form: %v", old.Object["spec"])

	// config/policy's ValidatingAdmissionPolicy checks v1alpha1 objects too, as
	// converted to v1 by the webhook in the pod (matchPolicy: Equivalent).
	applyAdmissionPolicy(t, g, "")
	alpha := func(image string) *servingv1alpha1.AIInference {
		return &servingv1alpha1.AIInference{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: "alpha"},
			Spec: servingv1alpha1.AIInferenceSpec{ModelName: "m", ModelURI: "s3://models/m/", Engine: "vLLM",
				EngineImage: image, GPUs: 1, GPUProduct: realGPUProduct},
		}
	}
	refusal := ContainSubstring("spec.engine.image evil.example/miner:latest is not from an allowed registry")
	g.Eventually(func() error { return k8s.Create(ctx, alpha("evil.example/miner:latest"), client.DryRunAll) }).
		WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(MatchError(refusal))
	t.Logf("v1alpha1 refused: %v", k8s.Create(ctx, alpha("evil.example/miner:latest"), client.DryRunAll))
	g.Expect(k8s.Create(ctx, alpha("vllm/vllm-openai:v0.11.0"), client.DryRunAll)).To(Succeed(), "an allowed v1alpha1 image")

	logs := podLogs(t, g, pod)
	g.Expect(logs).NotTo(ContainSubstring("forbidden"), "the operator hit a permission the chart lacks")
	g.Expect(logs).To(ContainSubstring("Successfully acquired lease"))
}

// restrictedNamespace makes a namespace that enforces Pod Security
// "restricted", emptied and deleted at the end, dumped on failure.
func restrictedNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, ns.Name)
		}
		deleteAll(t, ns.Name)
	})
	return ns.Name
}

// applyChart creates every object of a rendered chart, but updates the CRD the
// suite installed (and puts the suite's back at the end); the cluster-scoped
// objects go at the end, the webhook configurations first.
func applyChart(t *testing.T, g *WithT, rendered []byte) {
	t.Helper()
	ctx := context.Background()
	var clusterScoped []*unstructured.Unstructured
	t.Cleanup(func() {
		for i := len(clusterScoped) - 1; i >= 0; i-- {
			if err := k8s.Delete(context.Background(), clusterScoped[i]); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s %s: %v", clusterScoped[i].GetKind(), clusterScoped[i].GetName(), err)
			}
		}
	})
	for _, doc := range bytes.Split(rendered, []byte("\n---")) {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetKind() == "CustomResourceDefinition" {
			replaceCRD(t, g, obj)
			continue
		}
		err := k8s.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) && obj.GetNamespace() == "" {
			t.Fatalf("%s %s exists already: another install of the chart is in this cluster", obj.GetKind(), obj.GetName())
		}
		g.Expect(err).NotTo(HaveOccurred(), "%s %s", obj.GetKind(), obj.GetName())
		if obj.GetNamespace() == "" {
			clusterScoped = append(clusterScoped, obj)
		}
	}
	// Deleted in reverse order: the webhook configurations first, so nothing
	// calls the pod's webhooks once it is gone.
	sortWebhooksLast(clusterScoped)
}

// sortWebhooksLast moves the webhook configurations to the end of objs.
func sortWebhooksLast(objs []*unstructured.Unstructured) {
	var others, webhooks []*unstructured.Unstructured
	for _, o := range objs {
		if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
			webhooks = append(webhooks, o)
		} else {
			others = append(others, o)
		}
	}
	copy(objs, append(others, webhooks...))
}

// replaceCRD gives the suite's CRD the chart's spec (its conversion webhook),
// and the suite's spec back at the end.
func replaceCRD(t *testing.T, g *WithT, chartCRD *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	want := &apiextensionsv1.CustomResourceDefinition{}
	data, err := chartCRD.MarshalJSON()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.Unmarshal(data, want)).To(Succeed())
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: want.Name}, crd)).To(Succeed())
	suiteSpec := crd.Spec.DeepCopy()
	crd.Spec = want.Spec
	g.Expect(k8s.Update(ctx, crd)).To(Succeed())
	t.Cleanup(func() {
		ctx := context.Background()
		for attempt := 0; ; attempt++ {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			err := k8s.Get(ctx, client.ObjectKey{Name: want.Name}, crd)
			if err == nil {
				crd.Spec = *suiteSpec
				err = k8s.Update(ctx, crd)
			}
			if err == nil {
				return
			}
			if attempt == 5 {
				t.Errorf("putting the suite's CRD back: %v", err)
				return
			}
			time.Sleep(time.Second)
		}
	})
}

// operatorPod waits for the operator's pod in ns to be Ready and returns it.
func operatorPod(t *testing.T, g *WithT, ns string) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	g.Eventually(func(g Gomega) {
		dep := &appsv1.Deployment{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "aiinference-controller-manager"}, dep)).To(Succeed())
		g.Expect(dep.Status.ReadyReplicas).To(Equal(int32(1)), "Deployment status: %+v", dep.Status.Conditions)
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "aiinference-operator"})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		pod = pods.Items[0]
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "the operator's pod is not Ready")
	return pod
}

// podLogs is the log of the pod's first container, through the API server and
// the real kubelet.
func podLogs(t *testing.T, g *WithT, pod corev1.Pod) string {
	t.Helper()
	stream, err := cluster.Client().CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).Stream(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	defer stream.Close()
	data, err := io.ReadAll(stream)
	g.Expect(err).NotTo(HaveOccurred())
	return string(data)
}
