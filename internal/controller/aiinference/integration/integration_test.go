package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/testutil"
)

const waitTimeout = 20 * time.Second

// newInference is testutil's AIInference on two GPUs, with two retries one
// second apart.
func newInference(ns, name string) *servingv1.AIInference {
	obj := testutil.Inference(ns, name, 2, "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")
	obj.Spec.Loading = servingv1.LoadingSpec{
		MaxRetries: ptr.To[int32](2),
		Backoff:    &metav1.Duration{Duration: time.Second},
	}
	return obj
}

func createS3Secret(t *testing.T, ns string) {
	t.Helper()
	if err := k8s.Create(context.Background(), testutil.S3Secret(ns, testutil.S3SecretName)); err != nil {
		t.Fatal(err)
	}
}

// credentialedNamespace gives a test its own namespace holding the S3 Secret that
// newInference names.
func credentialedNamespace(t *testing.T) string {
	t.Helper()
	ns := newNamespace(t)
	createS3Secret(t, ns)
	return ns
}

// startInference starts a test of one AIInference: it creates newInference(name),
// changed by mutate, in a credentialedNamespace, and returns the test's gomega,
// the object and its key.
func startInference(t *testing.T, name string, mutate ...func(*servingv1.AIInference)) (*WithT, *servingv1.AIInference, client.ObjectKey) {
	t.Helper()
	g := NewWithT(t)
	obj := newInference(credentialedNamespace(t), name)
	for _, m := range mutate {
		m(obj)
	}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	return g, obj, client.ObjectKeyFromObject(obj)
}

// objectPtr is a pointer to an API object of type T.
type objectPtr[T any] interface {
	*T
	client.Object
}

// updateObject reads the object at key afresh, changes it with mutate and writes
// it back, again on a conflict.
func updateObject[T any, P objectPtr[T]](g *WithT, key client.ObjectKey, mutate func(P)) {
	rewrite(g, key, mutate, func(obj client.Object) error { return k8s.Update(context.Background(), obj) })
}

// updateStatus is updateObject for the object's status, written as its
// controller (or the kubelet) writes it.
func updateStatus[T any, P objectPtr[T]](g *WithT, key client.ObjectKey, mutate func(P)) {
	rewrite(g, key, mutate, func(obj client.Object) error { return k8s.Status().Update(context.Background(), obj) })
}

func rewrite[T any, P objectPtr[T]](g *WithT, key client.ObjectKey, mutate func(P), write func(client.Object) error) {
	g.Eventually(func() error {
		obj := P(new(T))
		if err := k8s.Get(context.Background(), key, obj); err != nil {
			return err
		}
		mutate(obj)
		return write(obj)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

func getDeployment(g Gomega, key client.ObjectKey) *appsv1.Deployment {
	d := &appsv1.Deployment{}
	g.Eventually(func() error { return k8s.Get(context.Background(), key, d) }).WithTimeout(waitTimeout).Should(Succeed())
	return d
}

func TestChildrenHaveTheRightShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, key := startInference(t, "shape")

	d := getDeployment(g, key)
	cm := &corev1.ConfigMap{}
	svc := &corev1.Service{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: "shape-loader"}, cm)
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Eventually(func() error { return k8s.Get(ctx, key, svc) }).WithTimeout(waitTimeout).Should(Succeed())

	for _, child := range []client.Object{d, cm, svc} {
		ref := metav1.GetControllerOf(child)
		g.Expect(ref).NotTo(BeNil(), "%T has no controller reference", child)
		g.Expect(ref.Kind).To(Equal("AIInference"))
		g.Expect(ref.Name).To(Equal("shape"))
		g.Expect(*ref.BlockOwnerDeletion).To(BeTrue())
	}

	var cfg loadspec.Config
	g.Expect(json.Unmarshal([]byte(cm.Data[loadspec.ConfigFileName]), &cfg)).To(Succeed())
	g.Expect(cfg.Source).To(Equal("s3://models/llama-3.1-8b/"))
	g.Expect(cfg.S3.Endpoint).To(Equal("http://minio.storage:9000"))
	g.Expect(cfg.S3.PathStyle).To(BeTrue())
	g.Expect(cfg.Dest).To(Equal("/models/llama-3.1-8b"))

	pod := d.Spec.Template.Spec
	g.Expect(pod.InitContainers).To(HaveLen(2))
	loader := pod.InitContainers[0]
	g.Expect(loader.Image).To(Equal("example.test/model-loader:test"))
	g.Expect(loader.Env).To(ContainElement(HaveField("ValueFrom.SecretKeyRef.Name", "s3-creds")))
	g.Expect(*loader.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
	g.Expect(*loader.SecurityContext.RunAsNonRoot).To(BeTrue())

	gate := pod.InitContainers[1]
	g.Expect(gate.Name).To(Equal(servingv1.WarmupContainerName))
	g.Expect(gate.Image).To(Equal(loader.Image))
	g.Expect(gate.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)))
	g.Expect(gate.Args).To(ContainElements("warmup", "--engine-url", "http://127.0.0.1:8000", "--model", "llama-3.1-8b"))
	g.Expect(gate.ReadinessProbe.HTTPGet.Path).To(Equal("/ready"))

	eng := pod.Containers[0]
	g.Expect(eng.Args).To(ContainElements("--model", "/models/llama-3.1-8b", "--tensor-parallel-size", "2"))
	g.Expect(eng.Resources.Limits[servingv1.GPUResource]).To(BeComparableTo(resource.MustParse("2")))
	g.Expect(eng.StartupProbe.HTTPGet.Path).To(Equal("/health"))
	g.Expect(eng.StartupProbe.FailureThreshold).To(Equal(int32(900)), "30m default timeout over 2s periods")
	g.Expect(eng.ReadinessProbe.HTTPGet.Path).To(Equal("/health"))

	required := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
	g.Expect(required.Key).To(Equal(servingv1.GPUProductLabel))
	g.Expect(required.Values).To(Equal([]string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}))
	preferred := pod.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	g.Expect(preferred).To(HaveLen(2))
	g.Expect(preferred[0].Weight).To(BeNumerically(">", preferred[1].Weight))
	g.Expect(pod.Tolerations).To(ContainElement(HaveField("Key", "nvidia.com/gpu")))
	g.Expect(pod.Volumes[0].EmptyDir).NotTo(BeNil(), "a 16Gi model without a cache choice gets a disk emptyDir")
	g.Expect(pod.Volumes[0].EmptyDir.Medium).To(Equal(corev1.StorageMediumDefault))

	g.Expect(svc.Spec.Selector).To(Equal(d.Spec.Selector.MatchLabels))
	g.Expect(svc.Spec.PublishNotReadyAddresses).To(BeFalse())
	g.Expect(svc.Spec.Ports[0].Port).To(Equal(int32(8000)))

	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
		g.Expect(obj.Status.GPU).To(Equal("2x NVIDIA-H100-80GB-HBM3 (+1)"))
		g.Expect(obj.Status.Ready).To(Equal("0/1"))
	})
}

// podFor makes the pod a ReplicaSet would make for the current template (envtest
// runs no controllers), optionally bound to a node.
func podFor(t *testing.T, g *WithT, obj *servingv1.AIInference, name string) *corev1.Pod {
	t.Helper()
	d := getDeployment(g, client.ObjectKeyFromObject(obj))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   obj.Namespace,
			Name:        name,
			Labels:      d.Spec.Template.Labels,
			Annotations: d.Spec.Template.Annotations,
		},
		Spec: d.Spec.Template.Spec,
	}
	g.Expect(k8s.Create(context.Background(), pod)).To(Succeed())
	return pod
}

// boundPod makes the object's pod (podFor) and binds it to a node, as the
// scheduler does.
func boundPod(t *testing.T, g *WithT, obj *servingv1.AIInference, name, node string) *corev1.Pod {
	t.Helper()
	pod := podFor(t, g, obj, name)
	bind(g, pod, node)
	return pod
}

func bind(g *WithT, pod *corev1.Pod, node string) {
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	g.Expect(k8s.SubResource("binding").Create(context.Background(), pod, binding)).To(Succeed())
}

func setPodStatus(g *WithT, pod *corev1.Pod, mutate func(*corev1.PodStatus)) {
	g.Eventually(func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		mutate(&pod.Status)
		return k8s.Status().Update(context.Background(), pod)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// setInitStatuses writes the statuses of the pod's init containers, as the kubelet does.
func setInitStatuses(g *WithT, pod *corev1.Pod, statuses []corev1.ContainerStatus) {
	setPodStatus(g, pod, func(s *corev1.PodStatus) { s.InitContainerStatuses = statuses })
}

func loaderStatus(state corev1.ContainerState) []corev1.ContainerStatus {
	return []corev1.ContainerStatus{{Name: servingv1.LoaderContainerName, State: state}}
}

func loaderExited(code int32, summary loadspec.Summary, finished time.Time) corev1.ContainerState {
	msg, _ := json.Marshal(summary)
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Message: string(msg), StartedAt: metav1.NewTime(finished.Add(-time.Minute)), FinishedAt: metav1.NewTime(finished),
	}}
}

func setDeploymentStatus(g *WithT, key client.ObjectKey, replicas, ready int32) {
	updateStatus(g, key, func(d *appsv1.Deployment) {
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas, ReadyReplicas: ready, AvailableReplicas: ready}
	})
}

func readyCondition(obj *servingv1.AIInference) metav1.Condition {
	if c := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func TestPhasesFollowPodsFromPendingToReady(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "phases")

	pod := podFor(t, g, obj, "phases-pod-1")
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("Insufficient nvidia.com/gpu"))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionReconciling)).To(BeTrue())
	})

	bind(g, pod, "gpu-node-1")
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = loaderStatus(corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseLoading))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonLoading))
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionModelLoaded).Reason).To(Equal(servingv1.ReasonLoading))
	})

	summary := loadspec.Summary{Files: 7, Bytes: 16_000_000_000, BytesFetched: 16_000_000_000, Seconds: 20, ThroughputMBps: 800, Verified: true,
		Checks: map[string]int{"crc64nvme": 6, "md5": 1}}
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.InitContainerStatuses = loaderStatus(loaderExited(0, summary, time.Now()))
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseLoading))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonEngineStarting))
		g.Expect(obj.Status.ModelLoaded).To(BeTrue())
		g.Expect(obj.Status.LastLoad).NotTo(BeNil())
		g.Expect(obj.Status.LastLoad.Throughput).To(Equal("800.0 MB/s"))
		g.Expect(obj.Status.LastLoad.Duration.Duration).To(Equal(20 * time.Second))
		g.Expect(obj.Status.LastLoad.Checks).To(Equal(map[string]int32{"crc64nvme": 6, "md5": 1}))
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionModelLoaded).Message).To(
			And(ContainSubstring("7 files (16.0 GB)"), ContainSubstring("verified (crc64nvme 6, md5 1)")))
	})

	setPodStatus(g, pod, func(s *corev1.PodStatus) { s.ContainerStatuses[0].Ready = true })
	setDeploymentStatus(g, key, 1, 1)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady))
		g.Expect(obj.Status.Ready).To(Equal("1/1"))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionReady)).To(BeTrue())
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionAvailable)).To(BeTrue())
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReconciling)).To(BeNil())
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeNil())
	})

	// Events carry the same reasons as the Ready condition.
	g.Eventually(func(g Gomega) {
		events := &corev1.EventList{}
		g.Expect(k8s.List(context.Background(), events, client.InNamespace(key.Namespace))).To(Succeed())
		var reasons []string
		for _, e := range events.Items {
			reasons = append(reasons, e.Reason)
		}
		g.Expect(reasons).To(ContainElements(servingv1.ReasonUnschedulable, servingv1.ReasonLoading, servingv1.ReasonReady))
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// Failures add up across pods: one restarted in place, then replaced (a node
// drain), and the next pod's failure passes the bound.
func TestRetriesAddUpAcrossReplacedPods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, obj, key := startInference(t, "retries")
	transient := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "connection reset by peer", Retryable: true}}

	// maxRetries is 2. The first pod fails twice, restarted in place, then goes.
	first := boundPod(t, g, obj, "retries-pod-1", "gpu-node-1")
	setInitStatuses(g, first, loaderRestarted(1, loadspec.ExitRetryable, transient, time.Now(), true))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(2)))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonRetryingLoad))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("attempt 3 of 3"))
		g.Expect(obj.Status.LastFailure.Retried).To(BeTrue())
	})
	g.Expect(k8s.Delete(ctx, first, client.GracePeriodSeconds(0))).To(Succeed())

	second := boundPod(t, g, obj, "retries-pod-2", "gpu-node-2")
	setInitStatuses(g, second, loaderStatus(loaderExited(loadspec.ExitRetryable, transient, time.Now())))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonRetriesExhausted))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("3 loads failed, past loading.maxRetries (2)"))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(3)))
		g.Expect(obj.Status.LastFailure.Pod).To(Equal(second.Name))
		g.Expect(obj.Status.LastFailure.Retried).To(BeFalse())
	})
	// The failed pod stays for inspection; its loader is told to stop.
	g.Consistently(func() error {
		return k8s.Get(ctx, client.ObjectKeyFromObject(second), &corev1.Pod{})
	}).WithTimeout(2 * time.Second).Should(Succeed())

	// Fixing the spec starts afresh.
	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Prefix = "llama-3.1-8b-fixed/" })
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LoadRetries).To(BeZero())
		g.Expect(obj.Status.Phase).NotTo(Equal(servingv1.PhaseFailed))
	})
	g.Eventually(func(g Gomega) { g.Expect(loaderBudget(g, key).Halt).To(BeNil()) }).WithTimeout(waitTimeout).Should(Succeed())
}

func TestPermanentLoadFailureFailsAtOnce(t *testing.T) {
	t.Parallel()
	g, obj, _ := startInference(t, "corrupt")
	pod := boundPod(t, g, obj, "corrupt-pod", "gpu-node-1")
	checksum := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "model-00001-of-00004.safetensors: sha256 mismatch"}}
	setInitStatuses(g, pod, loaderStatus(loaderExited(loadspec.ExitChecksum, checksum, time.Now())))
	eventually(t, g, client.ObjectKeyFromObject(obj), waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonLoadFailed))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("model-00001-of-00004.safetensors"))
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(1)))
		g.Expect(obj.Status.LastFailure.Reason).To(Equal(loadspec.ReasonChecksumMismatch))
		g.Expect(obj.Status.LastFailure.ExitCode).To(Equal(int32(loadspec.ExitChecksum)))
		g.Expect(obj.Status.LastFailure.Retryable).To(BeFalse())
	})
	g.Consistently(func() error {
		return k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), &corev1.Pod{})
	}).WithTimeout(2*time.Second).Should(Succeed(), "a permanent failure is not retried")
}

// TestMissingReferencesAreReportedAndRecovered: a missing credentials Secret or
// key is told by the kubelet in the status of the pod that cannot start (the
// operator may not read Secrets); a missing claim by the operator, which then
// applies no Deployment. envtest runs no kubelet: the test writes the pod
// status a real one writes (its messages as in k8s.io/kubernetes v1.37.2's
// makeEnvironmentVariables); TestRealNodeFailureReasons runs the same on a real
// kubelet.
func TestMissingReferencesAreReportedAndRecovered(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	obj := newInference(ns, "no-secret")
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	key := client.ObjectKeyFromObject(obj)
	// The Deployment is applied: the operator does not know the Secret is missing.
	getDeployment(g, key)

	pod := boundPod(t, g, obj, "no-secret-pod", "gpu-node-1")
	configError := func(message string) func(*corev1.PodStatus) {
		return func(s *corev1.PodStatus) {
			s.InitContainerStatuses = loaderStatus(corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: message}})
		}
	}
	setPodStatus(g, pod, configError(`secret "s3-creds" not found`))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonSecretNotFound), readyCondition(obj).Message)
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
		g.Expect(readyCondition(obj).Message).To(Equal(`Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef does not exist in namespace ` +
			ns + `; create it with the keys [AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY]`))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
	})

	// The Secret, with a key short: the kubelet's next try fails on the key.
	g.Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3-creds"},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "id"}})).To(Succeed())
	setPodStatus(g, pod, configError("couldn't find key AWS_SECRET_ACCESS_KEY in Secret "+ns+"/s3-creds"))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonSecretKeyMissing), readyCondition(obj).Message)
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
		g.Expect(readyCondition(obj).Message).To(Equal(`Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef has no key "AWS_SECRET_ACCESS_KEY"; add it, or name the key that holds it`))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
	})

	// The key added, the kubelet starts the loader: the pod's change, not a
	// periodic look, brings the next pass.
	updateObject(g, client.ObjectKey{Namespace: ns, Name: "s3-creds"}, func(secret *corev1.Secret) {
		secret.Data["AWS_SECRET_ACCESS_KEY"] = []byte("secret")
	})
	setInitStatuses(g, pod, loaderStatus(corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonLoading))
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeNil())
	})
	g.Expect(secretReadsOf(ns)).To(BeZero(), "the operator asked for the namespace's Secrets")

	pvc := newInference(ns, "no-pvc")
	pvc.Spec.Model.Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "weights", Path: "llama"}}
	g.Expect(k8s.Create(ctx, pvc)).To(Succeed())
	eventually(t, g, client.ObjectKeyFromObject(pvc), waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonPVCNotFound))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("spec.model.source.pvc.claimName"))
	})
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), &appsv1.Deployment{}))).To(BeTrue(),
		"no Deployment while its claim is missing")
}

func TestUnchangedObjectCausesNoWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, key := startInference(t, "quiet")
	ns := key.Namespace
	getDeployment(g, key)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ObservedGeneration).To(Equal(obj.Generation))
	})

	// Let the operator settle: a reconcile of this object, then a quiet window.
	settle := func() {
		g.Eventually(func() []string {
			before := managerWrites.Load()
			time.Sleep(time.Second)
			return writesSince(before, ns)
		}).WithTimeout(waitTimeout).Should(BeEmpty())
	}
	settle()
	// Touch a child: its watch triggers a reconcile of the unchanged object, which
	// must write nothing, in the window after it as well.
	before, reconciles := managerWrites.Load(), reconcilesOf(ns)
	svc := &corev1.Service{}
	g.Expect(k8s.Get(ctx, key, svc)).To(Succeed())
	svc.Annotations["test.aiinference.io/touch"] = "1"
	g.Expect(k8s.Update(ctx, svc)).To(Succeed())
	g.Eventually(func() int64 { return reconcilesOf(ns) }).WithTimeout(waitTimeout).Should(BeNumerically(">", reconciles), "the touched child brings a reconcile")
	g.Consistently(func() []string { return writesSince(before, ns) }).WithTimeout(2*time.Second).Should(BeEmpty(), "writes made by reconciling an unchanged object")

	// The same after a retry request: the request is handled once, then nothing.
	updateInference(g, key, func(fresh *servingv1.AIInference) {
		fresh.Annotations = map[string]string{servingv1.AnnotationRequestedAt: "2026-12-03T09:00:00Z"}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LastHandledRequestedAt).To(Equal("2026-12-03T09:00:00Z"))
	})
	settle()
	before, reconciles = managerWrites.Load(), reconcilesOf(ns)
	g.Expect(k8s.Get(ctx, key, svc)).To(Succeed())
	svc.Annotations["test.aiinference.io/touch"] = "2"
	g.Expect(k8s.Update(ctx, svc)).To(Succeed())
	g.Eventually(func() int64 { return reconcilesOf(ns) }).WithTimeout(waitTimeout).Should(BeNumerically(">", reconciles))
	g.Consistently(func() []string { return writesSince(before, ns) }).WithTimeout(2 * time.Second).Should(BeEmpty())
}

func canaryRollout(steps ...servingv1.CanaryStep) *servingv1.RolloutSpec {
	return &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{Replicas: 1, Steps: steps}}
}

func TestInvalidSpecsAreRefusedWithAUsefulMessage(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := []struct {
		name    string
		mutate  func(*servingv1.AIInference)
		message string
	}{
		{"no model source", func(o *servingv1.AIInference) { o.Spec.Model.Source = servingv1.ModelSource{} }, "must set exactly one of s3, pvc, http, huggingface or oci"},
		{"two model sources", func(o *servingv1.AIInference) {
			o.Spec.Model.Source.HTTP = &servingv1.HTTPSource{URL: "https://example.com/model.gguf"}
		}, "must set exactly one of s3, pvc, http, huggingface or oci"},
		{"huggingface repository without organisation", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen2.5-0.5B"}}
		}, "huggingface.repository must be organisation/name"},
		{"huggingface repository climbing out", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "../etc"}}
		}, "huggingface.repository must be organisation/name"},
		{"huggingface revision with a space", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen/Qwen2.5-0.5B", Revision: "main branch"}}
		}, "huggingface.revision must be a branch, tag or commit name"},
		{"huggingface endpoint not a URL", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen/Qwen2.5-0.5B", Endpoint: "hf-mirror"}}
		}, "huggingface.endpoint must be an http:// or https:// URL"},
		{"oci reference without a tag", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "registry.example.com/models/qwen"}}
		}, "oci.reference must be registry/repository with a :tag or @sha256:digest"},
		{"oci reference without a registry", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "qwen:v1"}}
		}, "oci.reference must be registry/repository"},
		{"oci unknown mode", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "registry.example.com/models/qwen:v1", Mode: "Copy"}}
		}, `supported values: "Auto", "Loader", "ImageVolume"`},
		{"oci image volume with a cache", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "registry.example.com/models/qwen:v1", Mode: servingv1.OCIModeImageVolume}}
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk}
		}, "oci.mode ImageVolume mounts the artifact from the node's container runtime"},
		{"bucket with capitals", func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Bucket = "My_Models" }, "s3.bucket must be a valid bucket name"},
		{"endpoint not a URL", func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Endpoint = "minio:9000" }, "s3.endpoint must be an http:// or https:// URL"},
		{"http url with another scheme", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "ftp://example.com/model"}}
		}, "http.url must be an http:// or https:// URL"},
		{"pvc path escaping the volume", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "weights", Path: "../etc"}}
		}, "pvc.path must be relative to the volume root"},
		{"pvc path absolute", func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "weights", Path: "/models"}}
		}, "pvc.path must be relative to the volume root"},
		{"empty model name", func(o *servingv1.AIInference) { o.Spec.Model.Name = "" }, "spec.model.name"},
		{"unknown engine", func(o *servingv1.AIInference) { o.Spec.Engine.Type = "SGLang" }, `supported values: "vLLM", "TGI", "Triton", "Ollama"`},
		{"engine image with spaces", func(o *servingv1.AIInference) { o.Spec.Engine.Image = "vllm openai" }, "engine.image must be an image reference without spaces"},
		{"engine port out of range", func(o *servingv1.AIInference) { o.Spec.Engine.Port = 70000 }, "spec.engine.port"},
		{"engine port of the warm-up gate", func(o *servingv1.AIInference) { o.Spec.Engine.Port = 8099 }, "engine.port 8099 is the warm-up gate's readiness port"},
		{"warm-up turned on for Triton", func(o *servingv1.AIInference) {
			o.Spec.Engine.Type, o.Spec.Engine.Warmup = servingv1.EngineTriton, &servingv1.WarmupSpec{Enabled: ptr.To(true)}
		}, "engine.warmup is not available for Triton"},
		{"warm-up prompt too long", func(o *servingv1.AIInference) {
			o.Spec.Engine.Warmup = &servingv1.WarmupSpec{Prompt: strings.Repeat("a", 1025)}
		}, "spec.engine.warmup.prompt"},
		{"negative GPU count", func(o *servingv1.AIInference) { o.Spec.GPU.Count = -1 }, "spec.gpu.count"},
		{"too many GPUs", func(o *servingv1.AIInference) { o.Spec.GPU.Count = 64 }, "spec.gpu.count"},
		{"GPU products without GPUs", func(o *servingv1.AIInference) { o.Spec.GPU.Count = 0 }, "gpu.products lists acceptable GPU products, which needs gpu.count of at least 1"},
		{"duplicate GPU products", func(o *servingv1.AIInference) {
			o.Spec.GPU.Products = []string{"NVIDIA-L4", "NVIDIA-L4"}
		}, "Duplicate value"},
		{"negative replicas", func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](-1) }, "spec.replicas"},
		{"zero timeout", func(o *servingv1.AIInference) { o.Spec.Loading.Timeout = &metav1.Duration{} }, "loading.timeout must be a duration between 10s and 24h"},
		{"timeout over a day", func(o *servingv1.AIInference) {
			o.Spec.Loading.Timeout = &metav1.Duration{Duration: 48 * time.Hour}
		}, "loading.timeout must be a duration between 10s and 24h"},
		{"negative retries", func(o *servingv1.AIInference) { o.Spec.Loading.MaxRetries = ptr.To[int32](-1) }, "spec.loading.maxRetries"},
		{"zero backoff", func(o *servingv1.AIInference) { o.Spec.Loading.Backoff = &metav1.Duration{} }, "loading.backoff must be a duration between 1s and 1h"},
		{"PVC cache without claim", func(o *servingv1.AIInference) {
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CachePVC}
		}, "cache.pvc is required when cache.type is PVC"},
		{"disk cache with a claim", func(o *servingv1.AIInference) {
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk, PVC: &servingv1.CachePVCSpec{ClaimName: "cache"}}
		}, "cache.pvc is required when cache.type is PVC and not allowed otherwise"},
		{"cache claim and size together", func(o *servingv1.AIInference) {
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{ClaimName: "cache", Size: ptr.To(resource.MustParse("100Gi"))}}
		}, "cache.pvc must set either claimName"},
		{"huge model in memory", func(o *servingv1.AIInference) {
			o.Spec.Model.Size = ptr.To(resource.MustParse("140Gi"))
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheMemory}
		}, "cache.type Memory keeps the weights in RAM and is only for models up to 64Gi"},
		{"unknown cache type", func(o *servingv1.AIInference) { o.Spec.Cache = &servingv1.CacheSpec{Type: "Tmpfs"} }, `supported values: "Memory", "Disk", "PVC"`},
		{"empty credentials secret name", func(o *servingv1.AIInference) {
			o.Spec.Model.Source.S3.CredentialsSecretRef.Name = ""
		}, "credentialsSecretRef.name"},
		{"canary strategy without canary", func(o *servingv1.AIInference) {
			o.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary}
		}, "rollout.canary is required when rollout.strategy is Canary"},
		{"canary without steps", func(o *servingv1.AIInference) {
			o.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{}}
		}, "spec.rollout.canary.steps"},
		{"canary step with pause and analysis", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}, Analysis: &servingv1.AnalysisStep{
				Checks: []servingv1.AnalysisCheck{{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.5"}}}})
		}, "each canary step sets exactly one of pause or analysis"},
		{"canary weight over 100", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 120, Pause: &servingv1.PauseStep{}})
		}, "spec.rollout.canary.steps[0].weight"},
		{"canary leaving no stable replica", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
			o.Spec.Rollout.Canary.MaxSurge = ptr.To[int32](0)
		}, "a canary must leave at least one stable replica serving"},
		{"canary surge above its replicas", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
			o.Spec.Rollout.Canary.MaxSurge = ptr.To[int32](3)
		}, "rollout.canary.maxSurge cannot exceed rollout.canary.replicas"},
		{"analysis check without a bound", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Analysis: &servingv1.AnalysisStep{
				Checks: []servingv1.AnalysisCheck{{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken}}}})
		}, "each analysis check needs a bound"},
		{"analysis check with metric and query", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Analysis: &servingv1.AnalysisStep{
				Checks: []servingv1.AnalysisCheck{{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Query: "sum(x{{{selector}}})", Max: "1"}}}})
		}, "each analysis check sets exactly one of metric"},
		{"analysis query without selector", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Analysis: &servingv1.AnalysisStep{
				Checks: []servingv1.AnalysisCheck{{Name: "errors", Query: "sum(rate(errors_total[1m]))", Max: "1"}}}})
		}, "analysis query must contain {{selector}}"},
		{"time to first token on TGI", func(o *servingv1.AIInference) {
			o.Spec.Engine.Type = servingv1.EngineTGI
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Analysis: &servingv1.AnalysisStep{
				Checks: []servingv1.AnalysisCheck{{Name: "ttft", Metric: servingv1.MetricTimeToFirstToken, Max: "0.5"}}}})
		}, "TGI exports no time-to-first-token metric"},
		{"InferencePool backends without endpoint pickers", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
			o.Spec.Rollout.Canary.Traffic = &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{
				ParentRef: servingv1.GatewayRef{Name: "gw"}, Backend: servingv1.BackendInferencePool}}
		}, "gateway.inferencePool is required when gateway.backend is InferencePool"},
		{"autoscaling minimum above its maximum", func(o *servingv1.AIInference) {
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)})
			o.Spec.Autoscaling.MinReplicas = ptr.To[int32](5)
		}, "autoscaling.minReplicas is above autoscaling.maxReplicas"},
		{"autoscaling without a target", func(o *servingv1.AIInference) {
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{})
		}, "autoscaling.targets needs at least one target per replica"},
		{"Triton to zero", func(o *servingv1.AIInference) {
			o.Spec.Engine.Type = servingv1.EngineTriton
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)})
			o.Spec.Autoscaling.MinReplicas = ptr.To[int32](0)
		}, "set minReplicas to 1 or more for Triton"},
		{"idle for a moment", func(o *servingv1.AIInference) {
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)})
			o.Spec.Autoscaling.IdleBeforeZero = &metav1.Duration{Duration: time.Second}
		}, "autoscaling.idleBeforeZero must be a duration between 5s and 24h"},
		{"KV-cache target on TGI", func(o *servingv1.AIInference) {
			o.Spec.Engine.Type = servingv1.EngineTGI
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{KVCacheUtilization: ptr.To[int32](80)})
		}, "TGI and Triton export no KV-cache utilisation"},
		{"running-requests target on Triton", func(o *servingv1.AIInference) {
			o.Spec.Engine.Type = servingv1.EngineTriton
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{RunningRequests: ptr.To[int32](8)})
		}, "Triton exports no gauge of running requests"},
		{"autoscaling a canary", func(o *servingv1.AIInference) {
			o.Spec.Rollout = canaryRollout(servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)})
		}, "autoscaling and rollout.strategy Canary cannot be combined yet"},
		{"a scale-down window of a day", func(o *servingv1.AIInference) {
			o.Spec.Autoscaling = autoscaling(servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)})
			o.Spec.Autoscaling.ScaleDown = &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 24 * time.Hour}}
		}, "a stabilizationWindow must be a duration between 0s and 1h"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := newInference(ns, fmt.Sprintf("invalid-%d", i))
			tt.mutate(obj)
			err := k8s.Create(context.Background(), obj)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !containsFold(err.Error(), tt.message) {
				t.Errorf("message %q does not say %q", err.Error(), tt.message)
			}
		})
	}
}

// Every v1 sample under config/samples is accepted by the real API server.
func TestSamplesAreAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "serving_v1_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			obj.SetNamespace(ns)
			if err := k8s.Create(context.Background(), obj, client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s refused: %v", filepath.Base(file), obj.GetKind(), obj.GetName(), err)
			}
		}
	}
}

// autoscaling is a valid spec.autoscaling with the targets given.
func autoscaling(targets servingv1.AutoscalingTargets) *servingv1.AutoscalingSpec {
	return &servingv1.AutoscalingSpec{MaxReplicas: 4, Targets: targets}
}

// The replica counts are stored even while they are 0 (a merge patch leaves
// out what did not change from the zero a missing field reads as), so that
// tools reading the field find 0, not nothing.
func TestReplicaCountsAreStoredAtZero(t *testing.T) {
	t.Parallel()
	g, _, key := startInference(t, "counted")
	g.Eventually(func(g Gomega) {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(servingv1.GroupVersion.WithKind("AIInference"))
		g.Expect(k8s.Get(context.Background(), key, obj)).To(Succeed())
		for _, field := range []string{"replicas", "readyReplicas", "updatedReplicas"} {
			v, found, err := unstructured.NestedInt64(obj.Object, "status", field)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(found).To(BeTrue(), "status.%s is not stored", field)
			g.Expect(v).To(BeZero())
		}
	}).WithTimeout(waitTimeout).Should(Succeed())
}
