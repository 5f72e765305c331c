package e2e

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
)

const readyTimeout = 90 * time.Second

func inference(ns, name string, gpus int32, products ...string) *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name: name + "-model",
				Size: ptr.To(resource.MustParse("8Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{
					Bucket: "models", Prefix: name + "/", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
				}},
			},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: gpus, Products: products},
			Replicas: ptr.To[int32](1),
			Loading:  servingv1.LoadingSpec{Backoff: &metav1.Duration{Duration: time.Second}, MaxRetries: ptr.To[int32](2)},
		},
	}
}

func beReady(replicas int32) func(g Gomega, got *servingv1.AIInference) {
	return func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady), "Ready condition: %+v", meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady))
		g.Expect(got.Status.ReadyReplicas).To(Equal(replicas))
		g.Expect(meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReconciling)).To(BeNil())
	}
}

func readyReason(got *servingv1.AIInference) string {
	if c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// podProducts maps each running pod of the object to its node's GPU product.
func podProducts(g Gomega, obj *servingv1.AIInference) []string {
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
		client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	var products []string
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" {
			continue
		}
		node := &corev1.Node{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Name: pod.Spec.NodeName}, node)).To(Succeed())
		products = append(products, node.Labels[servingv1.GPUProductLabel])
	}
	return products
}

func TestReadyOnPreferredGPUsWhileTheyHaveRoom(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ns := newNamespace(t)
	// Whole-node replicas: the two H100 nodes are preferred, the third replica spills to an A100.
	obj := inference(ns, "llama-70b", 8, localcluster.GPUProductH100, localcluster.GPUProductA100)
	obj.Spec.Replicas = ptr.To[int32](3)
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, readyTimeout, beReady(3))
	g.Expect(podProducts(g, obj)).To(ConsistOf(localcluster.GPUProductH100, localcluster.GPUProductH100, localcluster.GPUProductA100))
	waitFor(t, g, obj, 10*time.Second, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.ModelLoaded).To(BeTrue())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionAvailable)).To(BeTrue())
	})
}

func TestPendingUntilASuitableNodeIsAdded(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ns, nodes := newNamespaceWithNodes(t)
	const h200 = "NVIDIA-H200-141GB-HBM3"
	obj := inference(ns, "needs-h200", 4, h200)
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhasePending))
		g.Expect(readyReason(got)).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady).Message).To(ContainSubstring("node(s) didn't match Pod's node affinity/selector"))
	})

	pool := localcluster.NodePool{Name: "h200", Count: 1, GPUProduct: h200, GPUCount: 8,
		CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti")}
	g.Expect(nodes.add(pool)).To(Succeed())
	// No touch on the object: the scheduler places the pending pod, the operator sees it.
	waitFor(t, g, obj, readyTimeout, beReady(1))
	g.Expect(podProducts(g, obj)).To(ConsistOf(h200))
}

func TestLoaderFailureRetriesThenFailsThenRecovers(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ns := newNamespace(t)
	obj := inference(ns, "flaky-store", 1, localcluster.GPUProductL4)
	failing := metav1.ObjectMeta{}
	localcluster.InitContainerFailure{Container: servingv1.LoaderContainerName, ExitCode: 10, Reason: "Error", Message: "connection reset by peer"}.Apply(&failing)
	obj.Spec.PodMetadata = &servingv1.PodMetadata{Labels: failing.Labels, Annotations: failing.Annotations}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	// Fixing the spec (here: the pods no longer fail) recovers without other help.
	retriedInPlaceThenFixed(t, g, obj, func(o *servingv1.AIInference) { o.Spec.PodMetadata = nil }, readyTimeout)
}

// retriedInPlaceThenFixed is what a kubelet (simulated or real) and the operator
// do with an object whose loads keep failing with a retryable error: the kubelet
// restarts the loader in place, every run counts, past loading.maxRetries the
// object is Failed and stays so, counting nothing more; fixing the spec brings it
// to Ready with a fresh budget.
func retriedInPlaceThenFixed(t *testing.T, g *WithT, obj *servingv1.AIInference, fix func(*servingv1.AIInference), timeout time.Duration) {
	t.Helper()
	bound := *obj.Spec.Loading.MaxRetries + 1
	waitFor(t, g, obj, 2*timeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(readyReason(got)).To(Equal(servingv1.ReasonRetriesExhausted))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
		g.Expect(got.Status.LoadRetries).To(Equal(bound))
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Retryable).To(BeTrue())
		g.Expect(got.Status.LastFailure.Retried).To(BeFalse())
	})
	// One pod, restarted in place: the kubelet, not the operator, ran the retries.
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
		client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1))
	g.Expect(loaderRestarts(g, obj)).To(BeNumerically(">=", bound-1))
	// The kubelet goes on restarting the loader; the object stays Failed and
	// counts nothing more.
	g.Consistently(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(got.Status.LoadRetries).To(Equal(bound))
	}).WithTimeout(5 * time.Second).Should(Succeed())

	update(g, obj, fix)
	waitFor(t, g, obj, timeout, beReady(1))
	waitFor(t, g, obj, 10*time.Second, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.LoadRetries).To(BeZero())
		g.Expect(meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionStalled)).To(BeNil())
	})
}

// The demo check: an edit that cannot roll out is not Ready, says why,
// and the old replica keeps serving.
func TestAStuckRolloutIsNotReady(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ns := newNamespace(t)
	obj := inference(ns, "stuck", 1, localcluster.GPUProductL4)
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, readyTimeout, beReady(1))

	update(g, obj, func(o *servingv1.AIInference) { o.Spec.GPU.Products = []string{"NVIDIA-B200"} })
	waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(ready.Message).To(ContainSubstring("0 of 1 replicas run the current spec"))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionAvailable)).To(BeTrue(), "the old replica serves")
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(1)))
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Reason).To(Equal(servingv1.ReasonUnschedulable))
	})

	update(g, obj, func(o *servingv1.AIInference) { o.Spec.GPU.Products = []string{localcluster.GPUProductL4} })
	waitFor(t, g, obj, readyTimeout, beReady(1))
}

// Hundreds of replicas on a product with a few free GPUs: status names one
// pending pod, the same one whatever order the pods are listed in (the
// ReplicaSet creates them in batches, many in the same second), so once every
// pod is placed or waits, the object's status is written no more (a different
// pod named on each pass was a write per pass, each starting the next).
func TestHundredsOfUnschedulableReplicasStopWritingStatus(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	// A product of its own with 4 GPUs, so the other tests' GPUs stay free.
	const product, gpus, replicas = "NVIDIA-STORM-TEST", 4, 200
	ns, nodes := newNamespaceWithNodes(t)
	g.Expect(nodes.add(localcluster.NodePool{Name: "storm", Count: 1, GPUProduct: product, GPUCount: gpus,
		CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti")})).To(Succeed())
	obj := inference(ns, "many-pending", 1, product)
	obj.Spec.Replicas = ptr.To[int32](replicas)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, 2*readyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(readyReason(got)).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(got.Status.Replicas).To(Equal(int32(replicas)))
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(gpus)))
	})

	wc, err := client.NewWithWatch(cluster.RESTConfig(), client.Options{Scheme: k8s.Scheme()})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx, &servingv1.AIInferenceList{}, client.InNamespace(ns))
	g.Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	// The watch starts with the object as it is; then count its writes for a
	// while. The scheduler's message changes when another test adds or removes
	// a node, which is a real change: a few writes are allowed, not a stream.
	writes, deadline := -1, time.After(20*time.Second)
	for done := false; !done; {
		select {
		case <-w.ResultChan():
			writes++
		case <-deadline:
			done = true
		}
	}
	t.Logf("status writes in 20 s with %d unschedulable replicas: %d", replicas, writes)
	g.Expect(writes).To(BeNumerically("<=", 3), "status kept being written while nothing changed")
}

func TestScaleRollAndDelete(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	obj := inference(ns, "chat", 1, localcluster.GPUProductL4)
	obj.Spec.Replicas = ptr.To[int32](2)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, readyTimeout, beReady(2))

	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](3) })
	waitFor(t, g, obj, readyTimeout, beReady(3))

	// A rolling update of the engine args keeps every desired replica serving:
	// a new pod must be ready before an old one goes (one spare L4 is free for it).
	key := client.ObjectKeyFromObject(obj)
	before := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, key, before)).To(Succeed())
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len", "4096"} })
	minReady := int32(3)
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		minReady = min(minReady, d.Status.ReadyReplicas)
		g.Expect(d.Generation).To(BeNumerically(">", before.Generation))
		g.Expect(d.Status.ObservedGeneration).To(Equal(d.Generation))
		g.Expect(d.Status.UpdatedReplicas).To(Equal(int32(3)))
		g.Expect(d.Status.Replicas).To(Equal(int32(3)))
		g.Expect(d.Status.ReadyReplicas).To(Equal(int32(3)))
	}).WithTimeout(readyTimeout).WithPolling(50 * time.Millisecond).Should(Succeed())
	g.Expect(minReady).To(Equal(int32(3)), "ready replicas dropped below the desired count during the rollout")
	waitFor(t, g, obj, readyTimeout, beReady(3))

	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](1) })
	waitFor(t, g, obj, readyTimeout, beReady(1))

	g.Expect(k8s.Delete(ctx, obj)).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ConfigMapList{}, &corev1.PodList{}} {
			g.Expect(k8s.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
			g.Expect(meta.LenList(list)).To(BeZero(), "%T left after deleting the AIInference", list)
		}
	}).WithTimeout(readyTimeout).Should(Succeed())
}

// TestOperatorRestartConverges kills the operator while an object is created
// and another changed, and starts it again. On the solo cluster: it is the
// only operator there.
func TestOperatorRestartConverges(t *testing.T) {
	e := soloCluster.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	operator := e.operator("restart", e.cluster.Kubeconfig())
	g.Expect(operator.Start()).To(Succeed())
	defer operator.Stop()
	ns := e.newNamespace(t)
	first := inference(ns, "first", 1, localcluster.GPUProductL4)
	second := inference(ns, "second", 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(ctx, first)).To(Succeed())
	e.waitFor(t, g, first, readyTimeout, beReady(1))

	// Kill the operator mid-flight: an object created and one changed while it is down.
	g.Expect(e.k8s.Create(ctx, second)).To(Succeed())
	operator.Kill()
	e.update(g, first, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](2) })
	g.Expect(operator.Start()).To(Succeed())

	e.waitFor(t, g, first, 2*readyTimeout, beReady(2))
	e.waitFor(t, g, second, 2*readyTimeout, beReady(1))

	// Exactly one of each child per object, each owned by its object.
	for _, obj := range []*servingv1.AIInference{first, second} {
		got := &servingv1.AIInference{}
		g.Expect(e.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ConfigMapList{}} {
			g.Expect(e.k8s.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
			items, err := meta.ExtractList(list)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(items).To(HaveLen(1), "%T of %s", list, obj.Name)
			owner := metav1.GetControllerOf(items[0].(client.Object))
			g.Expect(owner).NotTo(BeNil())
			g.Expect(owner.UID).To(Equal(got.UID))
		}
	}
}
