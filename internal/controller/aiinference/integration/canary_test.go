package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// These tests drive a canary rollout through its steps on a real API server, with
// the Gateway API and Inference Extension CRDs installed, writing pod and
// Deployment statuses as the kubelet and the Deployment controller would.

func canaryInference(ns, name string, steps ...servingv1.CanaryStep) *servingv1.AIInference {
	obj := newInference(ns, name)
	obj.Spec.Replicas = ptr.To[int32](2)
	obj.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1, MaxSurge: ptr.To[int32](0), Steps: steps,
		Traffic: &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{Name: "inference-gateway"}}},
	}}
	return obj
}

// podOf makes a ready pod of a Deployment's current template.
func podOf(t *testing.T, g *WithT, ns, deployment, name string) *corev1.Pod {
	t.Helper()
	d := getDeployment(g, client.ObjectKey{Namespace: ns, Name: deployment})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
		Spec:       d.Spec.Template.Spec,
	}
	g.Expect(k8s.Create(context.Background(), pod)).To(Succeed())
	bind(g, pod, "gpu-node-1")
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodRunning
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = nil
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
	return pod
}

func deletePod(g *WithT, pod *corev1.Pod) {
	g.Expect(client.IgnoreNotFound(k8s.Delete(context.Background(), pod, client.GracePeriodSeconds(0)))).To(Succeed())
}

func routeWeights(g Gomega, key client.ObjectKey) []int32 {
	route := &gatewayv1.HTTPRoute{}
	g.Expect(k8s.Get(context.Background(), key, route)).To(Succeed())
	var weights []int32
	for _, b := range route.Spec.Rules[0].BackendRefs {
		weights = append(weights, ptr.Deref(b.Weight, 1))
	}
	return weights
}

// startCanary brings the object to Ready on revision 1 with two stable pods, then
// changes the spec: it returns the stable revision, the canary's pod, and the
// stable pod that made room for it.
func startCanary(t *testing.T, g *WithT, obj *servingv1.AIInference) (string, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	key := client.ObjectKeyFromObject(obj)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	stable1, stable2 := podOf(t, g, obj.Namespace, obj.Name, obj.Name+"-s1"), podOf(t, g, obj.Namespace, obj.Name, obj.Name+"-s2")
	setDeploymentStatus(g, key, 2, 2)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady))
	})
	stableRev := getDeployment(g, key).Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, key)).To(Equal([]int32{100, 0})) }).WithTimeout(waitTimeout).Should(Succeed())

	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len=8192"} })
	// maxSurge 0: a stable replica goes first, keeping its template.
	g.Eventually(func(g Gomega) {
		d := getDeployment(g, key)
		g.Expect(*d.Spec.Replicas).To(Equal(int32(1)))
		g.Expect(d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(stableRev))
	}).WithTimeout(waitTimeout).Should(Succeed())
	canaryKey := client.ObjectKey{Namespace: obj.Namespace, Name: obj.Name + "-canary"}
	g.Consistently(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, canaryKey, &appsv1.Deployment{}))
	}).WithTimeout(time.Second).Should(BeTrue(), "the canary waits for the stable set to make room")
	deletePod(g, stable2)
	setDeploymentStatus(g, key, 1, 1)
	_ = stable1

	var canary *appsv1.Deployment
	g.Eventually(func(g Gomega) {
		canary = getDeployment(g, canaryKey)
		g.Expect(*canary.Spec.Replicas).To(Equal(int32(1)))
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Expect(canary.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).NotTo(Equal(stableRev))
	g.Expect(canary.Spec.Template.Labels[servingv1.LabelTrack]).To(Equal(servingv1.TrackCanary))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout).NotTo(BeNil())
		g.Expect(obj.Status.Rollout.Message).To(ContainSubstring("waiting for the canary's pods: 0 of 1 ready"))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))
	})
	pod := podOf(t, g, obj.Namespace, canaryKey.Name, obj.Name+"-c1")
	setDeploymentStatus(g, canaryKey, 1, 1)
	return stableRev, pod
}

func TestCanaryWeightsMoveStepByStepThenPromote(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := credentialedNamespace(t)
	obj := canaryInference(ns, "canary",
		servingv1.CanaryStep{Weight: 20, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: 2 * time.Second}}},
		servingv1.CanaryStep{Weight: 30, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: 2 * time.Second}}},
		servingv1.CanaryStep{Weight: 50, Pause: &servingv1.PauseStep{}})
	key := client.ObjectKeyFromObject(obj)
	stableRev, _ := startCanary(t, g, obj)

	first := eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Step).To(Equal(int32(0)))
		g.Expect(obj.Status.Rollout.Weight).To(Equal(int32(20)))
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseCanary))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonCanaryProgressing))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))
	})
	g.Expect(routeWeights(g, key)).To(Equal([]int32{80, 20}))
	g.Expect(first.Status.Rollout.StableRevision).To(Equal(stableRev))

	// The 2 s pauses end by themselves; the last step waits to be promoted.
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Step).To(Equal(int32(2)))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonCanaryPaused))
	})
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, key)).To(Equal([]int32{50, 50})) }).WithTimeout(waitTimeout).Should(Succeed())

	updateInference(g, key, func(o *servingv1.AIInference) {
		o.Annotations = map[string]string{servingv1.AnnotationPromote: "1"}
	})
	// Promoting: the stable Deployment takes the new template, at its reduced size,
	// while the canary serves.
	var newRev string
	g.Eventually(func(g Gomega) {
		d := getDeployment(g, key)
		newRev = d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
		g.Expect(newRev).NotTo(Equal(stableRev))
		g.Expect(*d.Spec.Replicas).To(Equal(int32(1)))
	}).WithTimeout(waitTimeout).Should(Succeed())
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoting))
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonPromoting))
	})
	// The stable set rolls over to the new revision: then the canary goes and the
	// stable set grows back.
	podOf(t, g, ns, key.Name, "canary-n1")
	setDeploymentStatus(g, key, 1, 1)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "canary-canary"}, &appsv1.Deployment{}))
	}).WithTimeout(waitTimeout).Should(BeTrue(), "the canary's Deployment is removed after promotion")
	g.Eventually(func(g Gomega) { g.Expect(*getDeployment(g, key).Spec.Replicas).To(Equal(int32(2))) }).WithTimeout(waitTimeout).Should(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, key)).To(Equal([]int32{100, 0})) }).WithTimeout(waitTimeout).Should(Succeed())
	podOf(t, g, ns, key.Name, "canary-n2")
	setDeploymentStatus(g, key, 2, 2)
	done := eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		d := getDeployment(g, key)
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhaseReady), "Ready: %+v; deployment gen %d status %+v", readyCondition(obj), d.Generation, d.Status)
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoted))
		g.Expect(obj.Status.Rollout.StableRevision).To(Equal(newRev))
	})
	var decisions []string
	for _, d := range done.Status.Rollout.History {
		decisions = append(decisions, d.Decision)
	}
	g.Expect(decisions).To(Equal([]string{"CanaryStarted", "StepStarted", "PauseEnded", "StepStarted", "PauseEnded", "StepStarted", "StepPromoted", "Promoting", "Promoted"}))
	cm := &corev1.ConfigMap{}
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "canary-canary-loader"}, cm))
	}).WithTimeout(waitTimeout).Should(BeTrue(), "the canary's ConfigMap is removed after promotion")
}

func TestCanaryAbortReturnsAllTrafficToStable(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := credentialedNamespace(t)
	obj := canaryInference(ns, "abort", servingv1.CanaryStep{Weight: 30, Pause: &servingv1.PauseStep{}})
	key := client.ObjectKeyFromObject(obj)
	stableRev, _ := startCanary(t, g, obj)
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, key)).To(Equal([]int32{70, 30})) }).WithTimeout(waitTimeout).Should(Succeed())

	updateInference(g, key, func(o *servingv1.AIInference) {
		o.Annotations = map[string]string{servingv1.AnnotationAbort: "1"}
	})
	g.Eventually(func(g Gomega) { g.Expect(routeWeights(g, key)).To(Equal([]int32{100, 0})) }).WithTimeout(waitTimeout).Should(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "abort-canary"}, &appsv1.Deployment{}))
	}).WithTimeout(waitTimeout).Should(BeTrue(), "the canary's Deployment is removed")
	g.Eventually(func(g Gomega) {
		d := getDeployment(g, key)
		g.Expect(*d.Spec.Replicas).To(Equal(int32(2)), "the stable set grows back")
		g.Expect(d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(stableRev), "the stable pods keep the earlier spec")
	}).WithTimeout(waitTimeout).Should(Succeed())
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		ready := readyCondition(obj)
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonRolledBack))
		g.Expect(ready.Message).To(ContainSubstring("aborted by hand"))
		g.Expect(condition(obj, servingv1.ConditionStalled).Status).To(Equal(metav1.ConditionTrue))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue))
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutRolledBack))
	})

	// A retry request tries the same revision again.
	updateInference(g, key, func(o *servingv1.AIInference) { o.Annotations[servingv1.AnnotationRequestedAt] = "retry-1" })
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Rollout.Phase).To(Equal(servingv1.RolloutProgressing))
	})
}

func TestCanaryInferencePoolsAreAcceptedByTheirCRD(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := credentialedNamespace(t)
	obj := canaryInference(ns, "pools", servingv1.CanaryStep{Weight: 10, Pause: &servingv1.PauseStep{}})
	obj.Spec.Rollout.Canary.Traffic.Gateway.Backend = servingv1.BackendInferencePool
	obj.Spec.Rollout.Canary.Traffic.Gateway.InferencePool = &servingv1.InferencePoolBackends{
		StableEndpointPicker: servingv1.EndpointPicker{Name: "pools-stable-epp"},
		CanaryEndpointPicker: servingv1.EndpointPicker{Name: "pools-canary-epp"},
	}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	key := client.ObjectKeyFromObject(obj)
	for _, track := range []string{"stable", "canary"} {
		pool := &inferencev1.InferencePool{}
		g.Eventually(func() error {
			return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "pools-" + track}, pool)
		}).WithTimeout(waitTimeout).Should(Succeed())
		g.Expect(string(pool.Spec.Selector.MatchLabels[servingv1.LabelTrack])).To(Equal(track))
		g.Expect(string(pool.Spec.EndpointPickerRef.Name)).To(Equal("pools-" + track + "-epp"))
	}
	route := &gatewayv1.HTTPRoute{}
	g.Eventually(func() error { return k8s.Get(context.Background(), key, route) }).WithTimeout(waitTimeout).Should(Succeed())
	g.Expect(string(*route.Spec.Rules[0].BackendRefs[0].Kind)).To(Equal("InferencePool"))
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "pools-stable"}, &corev1.Service{})).NotTo(Succeed(), "no track Services with InferencePool backends")
}
