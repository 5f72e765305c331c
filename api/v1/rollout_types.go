/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RolloutStrategy names how a change of the spec reaches the pods.
// +kubebuilder:validation:Enum=Rolling;Canary
type RolloutStrategy string

// Rollout strategies.
const (
	// RolloutRolling replaces the pods one by one, a new one ready before an old one goes.
	RolloutRolling RolloutStrategy = "Rolling"
	// RolloutCanary runs the new spec as a separate set of pods that takes a share of
	// the traffic, step by step, judged by analysis, before the stable set takes it.
	RolloutCanary RolloutStrategy = "Canary"
)

// RolloutSpec says how a change of the model, engine or pods reaches the replicas.
// +kubebuilder:validation:XValidation:rule="self.strategy != 'Canary' || has(self.canary)",message="rollout.canary is required when rollout.strategy is Canary: give at least its steps"
// +kubebuilder:validation:XValidation:rule="self.strategy == 'Canary' || !has(self.canary)",message="rollout.canary is only read with rollout.strategy Canary; set strategy: Canary or remove rollout.canary"
type RolloutSpec struct {
	// Strategy is Rolling (the default: pods are replaced one by one) or Canary.
	// +kubebuilder:default=Rolling
	// +optional
	Strategy RolloutStrategy `json:"strategy,omitempty"`

	// Canary configures the Canary strategy.
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`
}

// CanarySpec is a canary rollout: the new spec runs as its own pods next to the
// stable ones, takes the traffic weight of each step in turn, and is promoted
// when the last step passes or rolled back when an analysis fails.
// +kubebuilder:validation:XValidation:rule="!has(self.maxSurge) || self.maxSurge <= self.replicas",message="rollout.canary.maxSurge cannot exceed rollout.canary.replicas: the surge is the canary pods that need no stable pod taken down"
type CanarySpec struct {
	// Replicas is the number of canary pods, set apart from the traffic weight
	// since GPUs are what limit it.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// MaxSurge is how many pods may run beyond spec.replicas during the canary and
	// its promotion. 0 takes a stable replica down for every canary pod before the
	// canary starts, for clusters with no spare GPU; the stable set keeps at least
	// one replica serving throughout.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxSurge *int32 `json:"maxSurge,omitempty"`

	// Steps are taken in order. Each gives the canary a traffic weight, then waits
	// (a pause) or judges it (an analysis). After the last step the canary is
	// promoted: the stable set takes the new spec and the canary's pods go away.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	Steps []CanaryStep `json:"steps"`

	// Traffic says how requests are split between the stable and the canary pods.
	// Unset: the AIInference's Service selects both, so the split follows the
	// ready replica counts, not the step weights.
	// +optional
	Traffic *CanaryTraffic `json:"traffic,omitempty"`

	// PrometheusURL is the Prometheus the analysis steps query, overriding the
	// operator's --prometheus-url (e.g. http://prometheus.monitoring:9090).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="rollout.canary.prometheusURL must be an http:// or https:// URL, e.g. http://prometheus.monitoring:9090"
	// +optional
	PrometheusURL string `json:"prometheusURL,omitempty"`
}

// CanaryStep is one step of a canary rollout: a traffic weight, then a pause or
// an analysis.
// +kubebuilder:validation:XValidation:rule="(has(self.pause) ? 1 : 0) + (has(self.analysis) ? 1 : 0) == 1",message="each canary step sets exactly one of pause or analysis"
type CanaryStep struct {
	// Weight is the canary's share of the requests, in percent, during this step.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Weight int32 `json:"weight"`

	// Pause holds the step for a duration, or until promoted by hand.
	// +optional
	Pause *PauseStep `json:"pause,omitempty"`

	// Analysis judges the canary on the model server's metrics.
	// +optional
	Analysis *AnalysisStep `json:"analysis,omitempty"`
}

// PauseStep holds a canary step.
type PauseStep struct {
	// Duration of the pause. Unset: until promoted by hand (the annotation
	// serving.aiinference.io/promote).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="pause.duration must be between 1s and 168h, e.g. 10m"
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
}

// AnalysisStep queries Prometheus once per interval and judges each run. The
// step passes after `runs` passing runs, rolls the canary back when more than
// failureLimit runs fail, and pauses the rollout for a person when more than
// inconclusiveLimit runs cannot judge (too few requests, no data, Prometheus
// unreachable).
type AnalysisStep struct {
	// Checks are judged in every run; a run passes when every check passes.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10
	// +listType=map
	// +listMapKey=name
	Checks []AnalysisCheck `json:"checks"`

	// Interval between runs; each run looks at the requests of the last interval.
	// Give it several of Prometheus's scrape intervals (the shipped PodMonitor
	// scrapes every 15s, so 1m or more): a shorter one sees too few points and
	// makes the run Inconclusive.
	// +kubebuilder:default="1m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('5s') && duration(self) <= duration('1h')",message="analysis.interval must be between 5s and 1h, e.g. 1m"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Runs is the number of passing runs that finish the step.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Runs int32 `json:"runs,omitempty"`

	// MinSamples is the fewest requests the canary (and, for a check relative to
	// stable, the stable set) must have finished in a run's window; fewer makes
	// the run Inconclusive, never a pass.
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinSamples int32 `json:"minSamples,omitempty"`

	// FailureLimit is how many failed runs are tolerated; one more rolls the
	// canary back.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +optional
	FailureLimit int32 `json:"failureLimit,omitempty"`

	// InconclusiveLimit is how many inconclusive runs are tolerated; one more
	// pauses the rollout (AnalysisInconclusive) until a person promotes or aborts.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=0
	// +optional
	InconclusiveLimit int32 `json:"inconclusiveLimit,omitempty"`
}

// AnalysisMetric names a built-in check, measured with the engine's own metrics.
// +kubebuilder:validation:Enum=ErrorRatio;TimeToFirstToken;InterTokenLatency;EndToEndLatency;QueueLength
type AnalysisMetric string

// Built-in analysis metrics.
const (
	// MetricErrorRatio is the share of requests that failed (server errors).
	MetricErrorRatio AnalysisMetric = "ErrorRatio"
	// MetricTimeToFirstToken is the 95th percentile of the time to the first token, in seconds.
	MetricTimeToFirstToken AnalysisMetric = "TimeToFirstToken"
	// MetricInterTokenLatency is the 95th percentile of the time between output tokens, in seconds.
	MetricInterTokenLatency AnalysisMetric = "InterTokenLatency"
	// MetricEndToEndLatency is the 95th percentile of a request's duration, in
	// seconds (for Triton, which counts durations without a histogram, the mean).
	MetricEndToEndLatency AnalysisMetric = "EndToEndLatency"
	// MetricQueueLength is the number of requests waiting for the engine, averaged
	// over the window and the pods.
	MetricQueueLength AnalysisMetric = "QueueLength"
)

// AnalysisCheck is one measurement and its bound.
// +kubebuilder:validation:XValidation:rule="(has(self.metric) ? 1 : 0) + (has(self.query) ? 1 : 0) == 1",message="each analysis check sets exactly one of metric (a built-in check) or query (PromQL)"
// +kubebuilder:validation:XValidation:rule="has(self.max) || has(self.maxRatioToStable)",message="each analysis check needs a bound: max (absolute) or maxRatioToStable (relative to the stable pods), or both"
type AnalysisCheck struct {
	// Name identifies the check in status and events.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Metric is a built-in check, measured with the engine's metrics.
	// +optional
	Metric AnalysisMetric `json:"metric,omitempty"`

	// Query is PromQL that gives one number. {{selector}} is replaced by the
	// label matchers of the pods being judged (namespace and pod) and {{window}}
	// by the run's window, e.g.
	// sum(rate(my_errors_total{{{selector}}}[{{window}}])).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.contains('{{selector}}')",message="analysis query must contain {{selector}}, which selects the canary's (or the stable) pods"
	// +optional
	Query string `json:"query,omitempty"`

	// Max is the highest passing value, a decimal number (seconds for latencies,
	// a fraction for ErrorRatio), e.g. "0.5".
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Max string `json:"max,omitempty"`

	// MaxRatioToStable bounds the canary's value by the stable pods' value over
	// the same window times this decimal factor, e.g. "1.2" for at most 20% worse.
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	MaxRatioToStable string `json:"maxRatioToStable,omitempty"`
}

// CanaryTraffic is how the requests are split.
type CanaryTraffic struct {
	// Gateway makes the operator write an HTTPRoute, attached to this Gateway,
	// whose backends are a stable and a canary Service (or InferencePool) with the
	// step's weights.
	Gateway GatewayTraffic `json:"gateway"`
}

// BackendKind is what the HTTPRoute's backends are.
// +kubebuilder:validation:Enum=Service;InferencePool
type BackendKind string

// Backend kinds.
const (
	BackendService       BackendKind = "Service"
	BackendInferencePool BackendKind = "InferencePool"
)

// GatewayTraffic is the Gateway and backends of the HTTPRoute the operator writes.
// +kubebuilder:validation:XValidation:rule="self.backend != 'InferencePool' || has(self.inferencePool)",message="gateway.inferencePool is required when gateway.backend is InferencePool: name the endpoint pickers of the two pools"
type GatewayTraffic struct {
	// ParentRef is the Gateway (and optionally its listener) the route attaches to.
	ParentRef GatewayRef `json:"parentRef"`

	// Hostnames the route matches; empty matches the Gateway's.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	Hostnames []string `json:"hostnames,omitempty"`

	// Backend is Service (the default) or InferencePool (Gateway API Inference
	// Extension: an endpoint picker chooses the pod for each request).
	// +kubebuilder:default=Service
	// +optional
	Backend BackendKind `json:"backend,omitempty"`

	// InferencePool names the endpoint pickers of the stable and the canary pools.
	// +optional
	InferencePool *InferencePoolBackends `json:"inferencePool,omitempty"`
}

// GatewayRef names a Gateway.
type GatewayRef struct {
	// Name of the Gateway.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Namespace of the Gateway; empty means the AIInference's.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// SectionName is the Gateway listener to attach to.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	SectionName string `json:"sectionName,omitempty"`
}

// InferencePoolBackends are the endpoint pickers of the two InferencePools: an
// endpoint picker serves one pool.
type InferencePoolBackends struct {
	// StableEndpointPicker serves the stable pool.
	StableEndpointPicker EndpointPicker `json:"stableEndpointPicker"`
	// CanaryEndpointPicker serves the canary pool.
	CanaryEndpointPicker EndpointPicker `json:"canaryEndpointPicker"`
}

// EndpointPicker is the Service of an endpoint picker (the Inference Extension's EPP).
type EndpointPicker struct {
	// Name of the endpoint picker's Service in the AIInference's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Port of its gRPC ext-proc server.
	// +kubebuilder:default=9002
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
}

// Annotations that steer a canary rollout by hand, as requestedAt does: set a new
// value (for example `date +%s`) to act once.
const (
	// AnnotationPromote ends the current step of a canary (a pause, an analysis, or
	// a rollout paused as inconclusive) and goes on to the next.
	AnnotationPromote = "serving.aiinference.io/promote"
	// AnnotationAbort rolls the canary back: all traffic to the stable pods, the
	// canary's pods removed. The same revision is tried again after a retry request
	// (serving.aiinference.io/requestedAt) or a new spec.
	AnnotationAbort = "serving.aiinference.io/abort"
	// AnnotationPaused, while "true", holds the rollout at its current step.
	AnnotationPaused = "serving.aiinference.io/paused"
)

// RolloutPhase is where a canary rollout is.
// +kubebuilder:validation:Enum=Progressing;Paused;Inconclusive;Promoting;Promoted;RolledBack
type RolloutPhase string

// Rollout phases.
const (
	RolloutProgressing  RolloutPhase = "Progressing"
	RolloutPaused       RolloutPhase = "Paused"
	RolloutInconclusive RolloutPhase = "Inconclusive"
	RolloutPromoting    RolloutPhase = "Promoting"
	RolloutPromoted     RolloutPhase = "Promoted"
	RolloutRolledBack   RolloutPhase = "RolledBack"
)

// Verdict is the outcome of an analysis check or run.
// +kubebuilder:validation:Enum=Pass;Fail;Inconclusive
type Verdict string

// Verdicts.
const (
	VerdictPass         Verdict = "Pass"
	VerdictFail         Verdict = "Fail"
	VerdictInconclusive Verdict = "Inconclusive"
)

// RolloutStatus is the state of a canary rollout.
type RolloutStatus struct {
	// StableRevision is the template hash of the pods that serve as stable.
	// +optional
	StableRevision string `json:"stableRevision,omitempty"`
	// CanaryRevision is the template hash of the spec under canary, or the last
	// one promoted or rolled back.
	// +optional
	CanaryRevision string `json:"canaryRevision,omitempty"`
	// Phase of the rollout.
	// +optional
	Phase RolloutPhase `json:"phase,omitempty"`
	// Step is the index (from 0) of the current step; equal to the number of steps
	// once they are done.
	// +optional
	Step int32 `json:"step"`
	// Weight is the canary's share of the requests now, in percent.
	// +optional
	Weight int32 `json:"weight"`
	// StepStartedAt is when the current step began.
	// +optional
	StepStartedAt *metav1.Time `json:"stepStartedAt,omitempty"`
	// TrafficSplit says how the split is made: Gateway, InferencePool, or
	// ReplicaCount (one Service selects both sets, so the split follows ready replicas).
	// +optional
	TrafficSplit string `json:"trafficSplit,omitempty"`
	// Message says what the rollout waits for, for a person.
	// +optional
	Message string `json:"message,omitempty"`
	// Analysis is the latest analysis runs, of this step and the ones before,
	// newest last (at most 10).
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	Analysis []AnalysisRun `json:"analysis,omitempty"`
	// StepVerdicts counts the current step's analysis runs by verdict, against
	// its runs, failureLimit and inconclusiveLimit.
	// +optional
	StepVerdicts *VerdictCounts `json:"stepVerdicts,omitempty"`
	// History is the rollout's decisions, newest last (at most 20).
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	// +optional
	History []RolloutDecision `json:"history,omitempty"`
	// LastHandledPromote and LastHandledAbort are the values of the promote and
	// abort annotations the operator acted on.
	// +optional
	LastHandledPromote string `json:"lastHandledPromote,omitempty"`
	// +optional
	LastHandledAbort string `json:"lastHandledAbort,omitempty"`
}

// VerdictCounts counts analysis runs by verdict.
type VerdictCounts struct {
	Pass         int32 `json:"pass"`
	Fail         int32 `json:"fail"`
	Inconclusive int32 `json:"inconclusive"`
}

// AnalysisRun is one run of an analysis step.
type AnalysisRun struct {
	// Step is the index of the step the run belongs to.
	Step int32 `json:"step"`
	// Time the run was made.
	Time metav1.Time `json:"time"`
	// Verdict of the run: Pass when every check passed, Fail when one failed,
	// Inconclusive otherwise.
	Verdict Verdict `json:"verdict"`
	// Checks are the checks' results.
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	Checks []CheckResult `json:"checks"`
}

// CheckResult is the result of one check in one run.
type CheckResult struct {
	// Name of the check.
	Name string `json:"name"`
	// Query is the PromQL sent for the canary.
	Query string `json:"query"`
	// Value measured for the canary, as text ("" when none).
	// +optional
	Value string `json:"value,omitempty"`
	// Threshold the value was held to, as text (for a relative check: the stable
	// value times the ratio).
	// +optional
	Threshold string `json:"threshold,omitempty"`
	// Samples is the number of requests the canary finished in the window.
	Samples int64 `json:"samples"`
	// Verdict of the check.
	Verdict Verdict `json:"verdict"`
	// Message explains an Inconclusive or Fail verdict.
	// +optional
	Message string `json:"message,omitempty"`
}

// Rollout decisions, recorded in status.rollout.history and as events.
const (
	DecisionCanaryStarted  = "CanaryStarted"
	DecisionStepStarted    = "StepStarted"
	DecisionAnalysisPassed = "AnalysisPassed"
	DecisionPauseEnded     = "PauseEnded"
	DecisionPaused         = "Paused"
	DecisionResumed        = "Resumed"
	DecisionPromotedStep   = "StepPromoted"
	DecisionInconclusive   = "Inconclusive"
	DecisionPromoting      = "Promoting"
	DecisionPromoted       = "Promoted"
	DecisionRolledBack     = "RolledBack"
	DecisionAborted        = "Aborted"
	DecisionSuperseded     = "Superseded"
)

// IsWarningDecision is true for the decisions that need a person's attention:
// their events are Warnings.
func IsWarningDecision(decision string) bool {
	return decision == DecisionRolledBack || decision == DecisionAborted || decision == DecisionInconclusive
}

// RolloutDecision is a decision the rollout took.
type RolloutDecision struct {
	// Time of the decision.
	Time metav1.Time `json:"time"`
	// Decision is a stable word: CanaryStarted, StepStarted, PauseEnded,
	// AnalysisPassed, StepPromoted (by hand), Paused, Resumed, Inconclusive,
	// Promoting, Promoted, RolledBack, Aborted, Superseded.
	Decision string `json:"decision"`
	// Revision the decision is about.
	Revision string `json:"revision"`
	// Step and Weight when the decision was taken.
	Step   int32 `json:"step"`
	Weight int32 `json:"weight"`
	// Message explains the decision.
	// +optional
	Message string `json:"message,omitempty"`
}
