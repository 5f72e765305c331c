/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AutoscalingSpec lets the operator set the replica count from the signals the
// engine exports: requests waiting, KV-cache utilisation, requests running.
// With it, spec.replicas is only the count to start from: the operator alone
// sets the Deployment's replicas, and never writes spec.replicas (so Argo CD
// and Flux have nothing to revert).
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="autoscaling.minReplicas is above autoscaling.maxReplicas: lower minReplicas or raise maxReplicas"
// +kubebuilder:validation:XValidation:rule="has(self.targets.queueDepth) || has(self.targets.kvCacheUtilization) || has(self.targets.runningRequests)",message="autoscaling.targets needs at least one target per replica: queueDepth, kvCacheUtilization or runningRequests"
type AutoscalingSpec struct {
	// MinReplicas is the fewest replicas the autoscaler keeps. 0 lets an idle
	// model go to zero after idleBeforeZero: no pod, no GPU; the operator's
	// activator then holds the first requests while a replica starts.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// MaxReplicas is the most replicas the autoscaler asks for: a bound on the
	// GPUs this model may hold.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxReplicas int32 `json:"maxReplicas"`

	// Targets are the values per ready replica the autoscaler steers to. With
	// several, the count is the largest any one of them asks for.
	Targets AutoscalingTargets `json:"targets"`

	// ScaleUp bounds how fast the count goes up.
	// +optional
	ScaleUp *ScalingRules `json:"scaleUp,omitempty"`

	// ScaleDown bounds how fast the count goes down. Its stabilization window
	// defaults to 5m: the count goes down only to the highest count asked for
	// over the window.
	// +optional
	ScaleDown *ScalingRules `json:"scaleDown,omitempty"`

	// IdleBeforeZero is how long a model with minReplicas 0 must serve nothing
	// (no request running or waiting, none held) before it goes to zero.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('5s') && duration(self) <= duration('24h')",message="autoscaling.idleBeforeZero must be a duration between 5s and 24h, e.g. 10m"
	// +optional
	IdleBeforeZero *metav1.Duration `json:"idleBeforeZero,omitempty"`
}

// AutoscalingTargets are the targets per ready replica.
type AutoscalingTargets struct {
	// QueueDepth is the requests waiting per replica (vLLM's
	// vllm:num_requests_waiting, TGI's tgi_queue_size, Triton's
	// nv_inference_pending_request_count).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	QueueDepth *int32 `json:"queueDepth,omitempty"`

	// KVCacheUtilization is the KV-cache use per replica, in percent (vLLM's
	// vllm:kv_cache_usage_perc). TGI and Triton export none.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	KVCacheUtilization *int32 `json:"kvCacheUtilization,omitempty"`

	// RunningRequests is the requests running per replica (vLLM's
	// vllm:num_requests_running, TGI's tgi_batch_current_size). Triton exports
	// none.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	RunningRequests *int32 `json:"runningRequests,omitempty"`
}

// ScalingRules bound one direction of scaling.
type ScalingRules struct {
	// StabilizationWindow: the count moves in this direction only as far as
	// every recommendation over the window agrees (the lowest of them going up,
	// the highest going down). Scale up defaults to 0s, scale down to 5m.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="a stabilizationWindow must be a duration between 0s and 1h, e.g. 5m"
	// +optional
	StabilizationWindow *metav1.Duration `json:"stabilizationWindow,omitempty"`
}

// AutoscalingSignal names a signal the autoscaler reads.
// +kubebuilder:validation:Enum=QueueDepth;KVCacheUtilization;RunningRequests
type AutoscalingSignal string

// Autoscaling signals.
const (
	SignalQueueDepth         AutoscalingSignal = "QueueDepth"
	SignalKVCacheUtilization AutoscalingSignal = "KVCacheUtilization"
	SignalRunningRequests    AutoscalingSignal = "RunningRequests"
)

// AutoscalingStatus is the autoscaler's view.
type AutoscalingStatus struct {
	// DesiredReplicas is the count the autoscaler set; the Deployment runs it.
	DesiredReplicas int32 `json:"desiredReplicas"`

	// Signals are the readings behind the last change of the count.
	// +optional
	// +listType=atomic
	Signals []SignalReading `json:"signals,omitempty"`

	// LastScaleTime is when the count last changed.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`

	// Decisions are the last changes of the count, oldest first (at most 10).
	// +optional
	// +listType=atomic
	Decisions []ScalingDecision `json:"decisions,omitempty"`
}

// SignalReading is one signal as the autoscaler read it.
type SignalReading struct {
	Signal AutoscalingSignal `json:"signal"`
	// PerReplica is the mean over the ready replicas, e.g. "3.5".
	PerReplica string `json:"perReplica"`
	// Target is the spec's target per replica.
	Target int32 `json:"target"`
	// Replicas is the count this signal alone asks for.
	Replicas int32 `json:"replicas"`
}

// Reasons of a ScalingDecision.
const (
	ScalingDecisionUp     = "ScaledUp"
	ScalingDecisionDown   = "ScaledDown"
	ScalingDecisionBounds = "ReplicaBounds"
)

// ScalingDecision is one change of the count.
type ScalingDecision struct {
	Time metav1.Time `json:"time"`
	From int32       `json:"from"`
	To   int32       `json:"to"`
	// Reason is ScaledUp, ScaledDown or ReplicaBounds (the spec's bounds moved).
	Reason  string `json:"reason"`
	Message string `json:"message"`
}
