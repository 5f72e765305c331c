package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// These tests pin down that status tells the truth in the everyday situations a
// review found it lying in. Pod and Deployment statuses are written as a kubelet
// and the Deployment controller write them (envtest runs neither).

func condition(obj *servingv1.AIInference, condType string) metav1.Condition {
	if c := meta.FindStatusCondition(obj.Status.Conditions, condType); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// setDeploymentRollout writes the status the Deployment controller reports while
// it replaces old pods by new ones.
func setDeploymentRollout(g *WithT, key client.ObjectKey, replicas, updated, ready int32) {
	updateStatus(g, key, func(d *appsv1.Deployment) {
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: updated,
			ReadyReplicas: ready, AvailableReplicas: ready, UnavailableReplicas: replicas - ready}
	})
}

func servingPod(t *testing.T, g *WithT, obj *servingv1.AIInference, name string) *corev1.Pod {
	pod := boundPod(t, g, obj, name, "gpu-node-1")
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodRunning
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = loaderStatus(loaderExited(0, loadspec.Summary{Files: 1, Bytes: 1}, time.Now()))
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
	return pod
}

func updateInference(g *WithT, key client.ObjectKey, mutate func(*servingv1.AIInference)) {
	updateObject(g, key, mutate)
}

// Case 1: Ready only once the current spec serves; a stuck rollout says why.
func TestReadyWaitsForTheNewSpecDuringARollout(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "rollout")
	servingPod(t, g, obj, "rollout-old")
	setDeploymentStatus(g, key, 1, 1)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady))
	})

	// The edit asks for a GPU product no node has: the new pod cannot be scheduled
	// while the old one keeps serving.
	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.GPU.Products = []string{"NVIDIA-B200"} })
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(context.Background(), key, d)).To(Succeed())
		g.Expect(d.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{"NVIDIA-B200"}))
	}).WithTimeout(waitTimeout).Should(Succeed())
	stuck := podFor(t, g, obj, "rollout-new")
	setPodStatus(g, stuck, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodPending
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/8 nodes are available: 8 node(s) didn't match Pod's node affinity/selector.", LastTransitionTime: metav1.Now()}}
	})
	setDeploymentRollout(g, key, 2, 1, 1)

	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		ready := condition(obj, servingv1.ConditionReady)
		g.Expect(ready.Status).To(Equal(metav1.ConditionFalse), "Ready while the only ready replica runs the old spec")
		g.Expect(ready.ObservedGeneration).To(Equal(obj.Generation))
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(ready.Message).To(And(ContainSubstring("0 of 1 replicas run the current spec"), ContainSubstring("didn't match Pod's node affinity")))
		g.Expect(condition(obj, servingv1.ConditionReconciling).Status).To(Equal(metav1.ConditionTrue))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue), "the old replica still serves")
		g.Expect(obj.Status.Phase).NotTo(Equal(servingv1.PhaseReady))
		g.Expect(obj.Status.LastFailure).NotTo(BeNil())
		g.Expect(obj.Status.LastFailure.Reason).To(Equal(servingv1.ReasonUnschedulable))
		g.Expect(obj.Status.LastFailure.Pod).To(Equal("rollout-new"))
	})
}

// loaderRestarted is the status a kubelet writes while it restarts a failed init
// container in place: the next run is running (or waits in back-off) and the
// failed one is in lastState.
func loaderRestarted(restarts, code int32, summary loadspec.Summary, finished time.Time, backingOff bool) []corev1.ContainerStatus {
	msg, _ := json.Marshal(summary)
	cs := corev1.ContainerStatus{Name: servingv1.LoaderContainerName, RestartCount: restarts,
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Reason: "Error", Message: string(msg), StartedAt: metav1.NewTime(finished.Add(-time.Minute)), FinishedAt: metav1.NewTime(finished)}},
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(finished.Add(time.Second))}},
	}
	if backingOff {
		cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s restarting failed container"}}
	}
	return []corev1.ContainerStatus{cs}
}

func loaderBudget(g Gomega, key client.ObjectKey) loadspec.Budget {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-loader"}, cm)).To(Succeed())
	var b loadspec.Budget
	g.Expect(json.Unmarshal([]byte(cm.Data[loadspec.BudgetFileName]), &b)).To(Succeed())
	return b
}

// Case 2: a kubelet restarts a failed loader in place; every attempt counts, the
// object stays Failed once the bound is reached, and loads stop until a retry is asked.
func TestLoaderRestartedInPlaceCountsEveryAttempt(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "inplace")
	transient := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "connection reset by peer", Retryable: true}}

	pod := boundPod(t, g, obj, "inplace-pod", "gpu-node-1")
	first := time.Now().Add(-time.Minute)
	// The first failure is visible while the kubelet's second run is already running.
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodPending
		s.InitContainerStatuses = loaderRestarted(1, loadspec.ExitRetryable, transient, first, false)
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(1)))
		g.Expect(obj.Status.LastFailure).NotTo(BeNil())
		g.Expect(obj.Status.LastFailure.Message).To(Equal("connection reset by peer"))
		g.Expect(condition(obj, servingv1.ConditionReady).Message).To(ContainSubstring("connection reset by peer"))
	})
	// The second failure, in back-off: still counted once each.
	setInitStatuses(g, pod, loaderRestarted(1, loadspec.ExitRetryable, transient, first.Add(20*time.Second), true))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(2)))
		g.Expect(obj.Status.Phase).NotTo(Equal(servingv1.PhaseFailed))
	})
	// The third failure is past maxRetries (2): Failed, and loads halt.
	setInitStatuses(g, pod, loaderRestarted(2, loadspec.ExitRetryable, transient, first.Add(40*time.Second), true))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(condition(obj, servingv1.ConditionReady).Reason).To(Equal(servingv1.ReasonRetriesExhausted))
		g.Expect(condition(obj, servingv1.ConditionStalled).Status).To(Equal(metav1.ConditionTrue))
	})
	g.Eventually(func(g Gomega) {
		g.Expect(loaderBudget(g, key).Halt).NotTo(BeNil(), "the loader is told to stop")
	}).WithTimeout(waitTimeout).Should(Succeed())

	// The kubelet goes on restarting it; the object stays Failed and counts nothing more.
	setInitStatuses(g, pod, loaderRestarted(3, loadspec.ExitHalted, loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonHalted, Message: "not downloading"}}, time.Now(), false))
	g.Consistently(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(context.Background(), key, got)).To(Succeed())
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(got.Status.LoadRetries).To(Equal(int32(3)))
		g.Expect(got.Status.LastFailure.Message).To(Equal("connection reset by peer"))
	}).WithTimeout(3 * time.Second).Should(Succeed())

	// A retry request: a fresh budget, and the failed pod makes way for a fresh one.
	updateInference(g, key, func(o *servingv1.AIInference) {
		o.Annotations = map[string]string{servingv1.AnnotationRequestedAt: "2026-12-02T10:00:00Z"}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LastHandledRequestedAt).To(Equal("2026-12-02T10:00:00Z"))
		g.Expect(obj.Status.LoadRetries).To(BeZero())
		g.Expect(obj.Status.Phase).NotTo(Equal(servingv1.PhaseFailed))
	})
	g.Eventually(func(g Gomega) {
		g.Expect(loaderBudget(g, key).Halt).To(BeNil())
		got := &corev1.Pod{}
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), got)
		g.Expect(apierrors.IsNotFound(err) || got.DeletionTimestamp != nil).To(BeTrue(), "the failed pod is replaced")
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// Case 2: a permanent failure seen in lastState while the kubelet's next run is
// already running fails the object at once.
func TestPermanentFailureSeenInLastStateFailsAtOnce(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "corrupt-inplace")
	pod := boundPod(t, g, obj, "corrupt-inplace-pod", "gpu-node-1")
	checksum := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "model.safetensors: crc64nvme mismatch"}}
	setInitStatuses(g, pod, loaderRestarted(1, loadspec.ExitChecksum, checksum, time.Now(), false))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(condition(obj, servingv1.ConditionReady).Reason).To(Equal(servingv1.ReasonLoadFailed))
		g.Expect(obj.Status.LastFailure.Reason).To(Equal(loadspec.ReasonChecksumMismatch))
	})
	g.Eventually(func(g Gomega) {
		halt := loaderBudget(g, key).Halt
		g.Expect(halt).NotTo(BeNil())
		g.Expect(halt.Reason).To(Equal(servingv1.ReasonLoadFailed))
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// Case 3: a scale change keeps the retry budget, and one failed replica among
// serving ones makes the object degraded, not Failed.
func TestScaleKeepsTheBudgetAndOneBadReplicaDegrades(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "degraded")
	servingPod(t, g, obj, "degraded-good")
	bad := boundPod(t, g, obj, "degraded-bad", "gpu-node-2")
	transient := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonTransient, Message: "i/o timeout", Retryable: true}}
	setInitStatuses(g, bad, loaderRestarted(1, loadspec.ExitRetryable, transient, time.Now(), false))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(1)))
	})

	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](2) })
	setDeploymentRollout(g, key, 2, 2, 1)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ObservedGeneration).To(Equal(obj.Generation))
		g.Expect(obj.Status.LoadRetries).To(Equal(int32(1)), "a scale change does not refill the budget")
	})

	checksum := loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch, Message: "shard 3: sha256 mismatch"}}
	setInitStatuses(g, bad, loaderRestarted(1, loadspec.ExitChecksum, checksum, time.Now(), true))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseDegraded))
		g.Expect(condition(obj, servingv1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))
		g.Expect(condition(obj, servingv1.ConditionReady).Reason).To(Equal(servingv1.ReasonLoadFailed))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))
	})
}

// Case 4: a failing ConfigMap write stops the Deployment write that depends on it,
// and the API server's message shows in a condition.
func TestAFailingStepStopsTheStepsThatDependOnIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, key := startInference(t, "frozen")
	ns := key.Namespace
	before := getDeployment(g, key)
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "frozen-loader"}, &corev1.ConfigMap{})
	}).WithTimeout(waitTimeout).Should(Succeed())

	// An admission policy refuses every change to ConfigMaps in this namespace.
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "freeze-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update, admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "configmaps are frozen in " + ns}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "freeze-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}},
		},
	}
	g.Expect(k8s.Create(ctx, policy)).To(Succeed())
	g.Expect(k8s.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() { _ = k8s.Delete(ctx, binding); _ = k8s.Delete(ctx, policy) })
	// The policy takes a moment to load: wait until it refuses a ConfigMap of ours.
	g.Eventually(func() error {
		return k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "probe-"}})
	}).WithTimeout(waitTimeout).ShouldNot(Succeed())

	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Prefix = "llama-3.1-8b-v2/" })
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		reconciling := condition(obj, servingv1.ConditionReconciling)
		g.Expect(reconciling.Reason).To(Equal(servingv1.ReasonReconcileError))
		g.Expect(reconciling.Message).To(ContainSubstring("configmaps are frozen in " + ns))
		g.Expect(condition(obj, servingv1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))
	})
	g.Consistently(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(before.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]),
			"the Deployment moved to a configuration its ConfigMap does not hold")
	}).WithTimeout(2 * time.Second).Should(Succeed())
}

// Case 5: children edited by hand converge back; a same-named object the
// AIInference does not control is never adopted.
func TestChildrenEditedByHandConvergeBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, key := startInference(t, "drift")
	getDeployment(g, key)

	// kubectl scale, and kubectl edit removing the GPU toleration.
	updateObject(g, key, func(d *appsv1.Deployment) {
		d.Spec.Replicas = ptr.To[int32](5)
		d.Spec.Template.Spec.Tolerations = nil
	})
	// kubectl edit of the Service port.
	updateObject(g, key, func(svc *corev1.Service) { svc.Spec.Ports[0].Port = 9999 })

	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(*d.Spec.Replicas).To(Equal(int32(1)))
		g.Expect(d.Spec.Template.Spec.Tolerations).To(ContainElement(HaveField("Key", "nvidia.com/gpu")))
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, key, svc)).To(Succeed())
		g.Expect(svc.Spec.Ports[0].Port).To(Equal(int32(8000)))
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// Keys added by hand to a child's maps that the operator sets whole are removed
// (a Service selector with one more key routes to nothing), while what other
// tools add to metadata and to the template's annotations stays.
func TestKeysAddedByHandAreRemoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, _, key := startInference(t, "added")
	getDeployment(g, key)
	cmKey := client.ObjectKey{Namespace: key.Namespace, Name: "added-loader"}

	updateObject(g, key, func(svc *corev1.Service) {
		svc.Spec.Selector["tier"] = "gold"
		svc.Labels["team"] = "search"
	})
	updateObject(g, key, func(d *appsv1.Deployment) {
		d.Spec.Template.Labels["tier"] = "gold"
		if d.Spec.Template.Spec.NodeSelector == nil {
			d.Spec.Template.Spec.NodeSelector = map[string]string{}
		}
		d.Spec.Template.Spec.NodeSelector["zone"] = "nowhere"
		if d.Spec.Template.Spec.Containers[0].Resources.Limits == nil {
			d.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
		}
		d.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Mi")
		d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = "2026-12-04T10:00:00Z"
	})
	updateObject(g, cmKey, func(cm *corev1.ConfigMap) { cm.Data["extra.json"] = "{}" })

	g.Eventually(func(g Gomega) {
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, key, svc)).To(Succeed())
		g.Expect(svc.Spec.Selector).NotTo(HaveKey("tier"))
		g.Expect(svc.Labels).To(HaveKeyWithValue("team", "search"), "a label another tool added was removed")
		d := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, key, d)).To(Succeed())
		g.Expect(d.Spec.Template.Labels).NotTo(HaveKey("tier"))
		g.Expect(d.Spec.Template.Spec.NodeSelector).NotTo(HaveKey("zone"))
		g.Expect(d.Spec.Template.Spec.Containers[0].Resources.Limits).NotTo(HaveKey(corev1.ResourceMemory))
		g.Expect(d.Spec.Template.Annotations).To(HaveKey("kubectl.kubernetes.io/restartedAt"), "kubectl rollout restart was undone")
		cm := &corev1.ConfigMap{}
		g.Expect(k8s.Get(ctx, cmKey, cm)).To(Succeed())
		g.Expect(cm.Data).NotTo(HaveKey("extra.json"))
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// A creating pass writes its children without reading them first: the cache
// holds every child the operator made, and the create-only apply refuses to
// touch an object of someone else's (TestASameNamedServiceIsNeverAdopted).
func TestACreatingPassReadsNoChild(t *testing.T) {
	t.Parallel()
	g, _, key := startInference(t, "fresh")
	getDeployment(g, key)
	g.Expect(k8s.Get(context.Background(), key, &corev1.Service{})).To(Succeed())
	g.Expect(childReadsOf(key.Namespace)).To(BeEmpty(), "children read from the API server")
}

func TestASameNamedServiceIsNeverAdopted(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	createS3Secret(t, ns)
	mine := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama-chat", Labels: map[string]string{"app": "mine"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "mine"},
			Ports: []corev1.ServicePort{{Name: "web", Port: 1234, TargetPort: intstr.FromInt32(1234)}}},
	}
	g.Expect(k8s.Create(ctx, mine)).To(Succeed())
	obj := newInference(ns, "llama-chat")
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	key := client.ObjectKeyFromObject(obj)

	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		stalled := condition(obj, servingv1.ConditionStalled)
		g.Expect(stalled.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(stalled.Reason).To(Equal(servingv1.ReasonNameConflict))
		g.Expect(stalled.Message).To(ContainSubstring(`Service "llama-chat"`))
		g.Expect(condition(obj, servingv1.ConditionReady).Reason).To(Equal(servingv1.ReasonNameConflict))
	})
	got := &corev1.Service{}
	g.Expect(k8s.Get(ctx, key, got)).To(Succeed())
	g.Expect(got.OwnerReferences).To(BeEmpty(), "the user's Service was adopted")
	g.Expect(got.Spec.Ports).To(HaveLen(1))
	g.Expect(got.Spec.Ports[0].Port).To(Equal(int32(1234)))
	g.Expect(got.Spec.Selector).To(Equal(map[string]string{"app": "mine"}))
}

// Case 6: every pod the operator makes passes the Pod Security "restricted"
// profile, enforced by the real API server; pods that cannot be created say why.
func TestPodsPassRestrictedPodSecurity(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "restricted-", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	g.Expect(k8s.Create(ctx, ns)).To(Succeed())
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	createS3Secret(t, ns.Name)
	for _, engine := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton, servingv1.EngineOllama} {
		obj := newInference(ns.Name, "restricted-"+strings.ToLower(string(engine)))
		obj.Spec.Engine.Type = engine
		if engine == servingv1.EngineOllama {
			obj.Spec.GPU = servingv1.GPUSpec{} // on CPU
		}
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		podFor(t, g, obj, obj.Name+"-pod") // fails when admission refuses the pod
	}
}

func TestPodCreationFailuresAreReported(t *testing.T) {
	t.Parallel()
	g, obj, key := startInference(t, "quota", func(o *servingv1.AIInference) {
		o.Spec.Loading.Timeout = &metav1.Duration{Duration: 20 * time.Minute}
	})
	d := getDeployment(g, key)
	g.Expect(d.Spec.ProgressDeadlineSeconds).NotTo(BeNil())
	g.Expect(*d.Spec.ProgressDeadlineSeconds).To(BeNumerically(">=", 2*20*60), "the deadline leaves room for a download and a warm-up")

	const quotaMsg = `pods "quota-7d9f-x" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8`
	updateStatus(g, key, func(d *appsv1.Deployment) {
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 0, UnavailableReplicas: 1, Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: quotaMsg},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetCreated"},
		}}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		ready := condition(obj, servingv1.ConditionReady)
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonPodCreateFailed))
		g.Expect(ready.Message).To(ContainSubstring("exceeded quota: gpu-quota"))
	})

	updateStatus(g, key, func(d *appsv1.Deployment) {
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
			Reason: "ProgressDeadlineExceeded", Message: fmt.Sprintf(`ReplicaSet "%s-7d9f" has timed out progressing.`, obj.Name)}}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		ready := condition(obj, servingv1.ConditionReady)
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonProgressDeadlineExceeded))
		g.Expect(ready.Message).To(ContainSubstring("has timed out progressing"))
		g.Expect(condition(obj, servingv1.ConditionStalled).Status).To(Equal(metav1.ConditionTrue))
	})
}
