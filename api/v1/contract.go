/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The contract between the operator and everything that reads what it makes
// (admission, kubectl aii, dashboards, users' selectors): the labels and
// annotations on its children, the names of its containers, the GPU resource
// and node label it schedules on, and the defaults of the spec. It lives with
// the types, so that a reader links the API, not the reconciler.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// LabelInference names the AIInference a pod or child belongs to.
	LabelInference = "serving.aiinference.io/inference"
	// ManagedByValue marks every child; the operator's cache only holds objects with it.
	ManagedByValue = "aiinference-operator"
	// LabelTrack tells a stable pod from a canary pod (rollout.strategy Canary), so
	// that each set can have its own Service or InferencePool.
	LabelTrack = "serving.aiinference.io/track"
	// TrackStable and TrackCanary are the values of LabelTrack.
	TrackStable = "stable"
	TrackCanary = "canary"
	// LabelRole tells, in a replica that spans nodes (gpu.nodes above 1), the
	// leader, which serves, from its workers, which only lend their GPUs to
	// the leader's engine; the Service, the router and status count leaders.
	LabelRole = "serving.aiinference.io/role"
	// RoleLeader and RoleWorker are the values of LabelRole.
	RoleLeader = "leader"
	RoleWorker = "worker"

	// AnnotationSpecHash on a child is the hash of what the operator last applied,
	// so that an unchanged child is not written again.
	AnnotationSpecHash = "serving.aiinference.io/spec-hash"
	// AnnotationTemplateHash on a pod is the hash of its template, which tells pods
	// of the current spec from those of an earlier one during a rollout.
	AnnotationTemplateHash = "serving.aiinference.io/template-hash"

	// GPUResource is the extended resource of NVIDIA GPUs.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// GPUProductLabel is the node label naming the GPU product (set by GPU feature discovery).
	GPUProductLabel = "nvidia.com/gpu.product"

	// LoaderContainerName is the init container that downloads the model.
	LoaderContainerName = "model-loader"
	// EngineContainerName is the model server container.
	EngineContainerName = "engine"
	// WarmupContainerName is the warm-up gate (engine.warmup), a native sidecar
	// after the loader that holds the pod's readiness until the engine has
	// answered one real completion.
	WarmupContainerName = "warmup"
	// AdapterAgentContainerName is the adapter agent (spec.adapters with an
	// engine that loads them at run time), a native sidecar after the loader
	// that fetches the adapters and loads them into the engine; its readiness
	// waits until each adapter the pod started with was tried once.
	AdapterAgentContainerName = "adapters"
)

// Defaults for fields the user left out. The CRD defaults them too; these cover
// objects that were stored before a default existed.
const (
	DefaultReplicas    = 1
	DefaultLoadTimeout = 30 * time.Minute
	DefaultMaxRetries  = 3
	DefaultBackoff     = 30 * time.Second

	DefaultMinReplicas     = 1
	DefaultScaleUpWindow   = 0 * time.Second
	DefaultScaleDownWindow = 5 * time.Minute
	DefaultIdleBeforeZero  = 10 * time.Minute
)

// DesiredReplicas is the replica count asked for, with its default. With
// autoscaling it is the count the autoscaler last set (spec.replicas before
// its first decision), within the spec's current bounds.
func (in *AIInference) DesiredReplicas() int32 {
	replicas := ptr.Deref(in.Spec.Replicas, DefaultReplicas)
	a := in.Spec.Autoscaling
	if a == nil {
		return replicas
	}
	if s := in.Status.Autoscaling; s != nil {
		replicas = s.DesiredReplicas
	}
	return min(max(replicas, a.Min()), a.MaxReplicas)
}

// NodesPerReplica is how many nodes (and pods) one replica spans, with its
// default of 1.
func (in *AIInference) NodesPerReplica() int32 {
	return max(in.Spec.GPU.Nodes, 1)
}

// SpansNodes is true when a replica is a group of pods on several nodes.
func (in *AIInference) SpansNodes() bool {
	return in.NodesPerReplica() > 1
}

// Min is the autoscaler's lowest count, with its default.
func (a *AutoscalingSpec) Min() int32 { return ptr.Deref(a.MinReplicas, DefaultMinReplicas) }

// IdleTime is how long the model must be idle before it goes to zero.
func (a *AutoscalingSpec) IdleTime() time.Duration {
	if a.IdleBeforeZero != nil && a.IdleBeforeZero.Duration > 0 {
		return a.IdleBeforeZero.Duration
	}
	return DefaultIdleBeforeZero
}

// StabilizationWindows are how long a change up and a change down must be
// agreed on, with their defaults.
func (a *AutoscalingSpec) StabilizationWindows() (up, down time.Duration) {
	up, down = DefaultScaleUpWindow, DefaultScaleDownWindow
	if a.ScaleUp != nil && a.ScaleUp.StabilizationWindow != nil {
		up = a.ScaleUp.StabilizationWindow.Duration
	}
	if a.ScaleDown != nil && a.ScaleDown.StabilizationWindow != nil {
		down = a.ScaleDown.StabilizationWindow.Duration
	}
	return up, down
}

// LoadTimeout bounds each stage of a load attempt, with its default.
func (in *AIInference) LoadTimeout() time.Duration {
	if t := in.Spec.Loading.Timeout; t != nil && t.Duration > 0 {
		return t.Duration
	}
	return DefaultLoadTimeout
}

// MaxRetries is how many failed loads are forgiven, with its default.
func (in *AIInference) MaxRetries() int32 {
	return ptr.Deref(in.Spec.Loading.MaxRetries, DefaultMaxRetries)
}

// Backoff is the first wait before a load is retried, with its default.
func (in *AIInference) Backoff() time.Duration {
	if b := in.Spec.Loading.Backoff; b != nil && b.Duration > 0 {
		return b.Duration
	}
	return DefaultBackoff
}

// The rules for reading what the operator made. The reconciler, its metrics
// and kubectl aii all decide "serves" and "Ready" by these, so they cannot
// disagree.

// PodServes is true when a model pod serves traffic: its engine passes its
// readiness probe, its warm-up gate (engine.warmup), where it has one, has
// seen the engine answer a completion, and its adapter agent, where it has
// one, has tried each adapter the pod started with.
func PodServes(pod *corev1.Pod) bool {
	if pod.Labels[LabelRole] == RoleWorker {
		return false // a worker's engine serves through its leader
	}
	engineReady, warmedUp := false, true
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == WarmupContainerName || cs.Name == AdapterAgentContainerName {
			warmedUp = warmedUp && cs.Ready
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == EngineContainerName {
			engineReady = cs.Ready
		}
	}
	return engineReady && warmedUp
}

// PodRunsTemplate is true when a pod was made from the given pod template
// (the operator stamps each template with AnnotationTemplateHash).
func PodRunsTemplate(pod *corev1.Pod, template *corev1.PodTemplateSpec) bool {
	return pod.Annotations[AnnotationTemplateHash] == template.Annotations[AnnotationTemplateHash]
}

// ReadyFor is the Ready condition when it is True for the given generation,
// and nil otherwise: a Ready of an earlier spec says nothing of this one.
func (in *AIInferenceStatus) ReadyFor(generation int64) *metav1.Condition {
	c := meta.FindStatusCondition(in.Conditions, ConditionReady)
	if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != generation {
		return nil
	}
	return c
}
