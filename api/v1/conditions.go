/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

// Condition types. Ready is always present; Reconciling and Stalled follow kstatus
// and are present only while True.
const (
	// ConditionReady summarises the object: True when every desired replica serves.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the operator is moving towards the desired state.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when progress needs a person: a bad reference, a
	// permanent load failure, or retries exhausted.
	ConditionStalled = "Stalled"
	// ConditionModelLoaded is True once a replica holds the complete, verified model.
	ConditionModelLoaded = "ModelLoaded"
	// ConditionAvailable is True when at least one replica serves traffic.
	ConditionAvailable = "Available"
	// ConditionScalingActive, with spec.autoscaling, is True while the
	// autoscaler reads every serving replica's signals, False while it holds the
	// count because it cannot.
	ConditionScalingActive = "ScalingActive"
	// ConditionAdaptersReady, with spec.adapters, is True when every ready
	// replica of the current spec serves every adapter.
	ConditionAdaptersReady = "AdaptersReady"
)

// Condition reasons. Events use the same words.
const (
	// ReasonReady: every desired replica is ready.
	ReasonReady = "Ready"
	// ReasonScaledToZero: zero replicas are desired.
	ReasonScaledToZero = "ScaledToZero"
	// ReasonProgressing: children are being created or updated.
	ReasonProgressing = "Progressing"
	// ReasonUnschedulable: no node can take a replica (e.g. no node with an accepted GPU).
	ReasonUnschedulable = "Unschedulable"
	// ReasonPodsPending: pods exist but are not yet scheduled or started.
	ReasonPodsPending = "PodsPending"
	// ReasonLoading: the model loader is downloading the weights.
	ReasonLoading = "Loading"
	// ReasonEngineStarting: the model is loaded and the engine is warming up.
	ReasonEngineStarting = "EngineStarting"
	// ReasonEngineCrashLooping: the engine container keeps exiting.
	ReasonEngineCrashLooping = "EngineCrashLooping"
	// ReasonWarmingUp: the engine answers its health checks and the warm-up gate
	// (engine.warmup) waits for its first completion.
	ReasonWarmingUp = "WarmingUp"
	// ReasonWarmupFailed: the warm-up gate got no completion from the engine within
	// loading.timeout, exited and is run again; the message quotes its last error.
	ReasonWarmupFailed = "WarmupFailed"
	// ReasonPodStartFailed: a container cannot start (image pull, bad configuration).
	ReasonPodStartFailed = "PodStartFailed"
	// ReasonRetryingLoad: a load failed and will be retried after a back-off.
	ReasonRetryingLoad = "RetryingLoad"
	// ReasonLoadFailed: a load failed permanently (see LastFailure for the loader's reason).
	ReasonLoadFailed = "LoadFailed"
	// ReasonRetriesExhausted: loads kept failing past loading.maxRetries.
	ReasonRetriesExhausted = "RetriesExhausted"
	// ReasonLoadTimeout: a load ran past loading.timeout.
	ReasonLoadTimeout = "LoadTimeout"
	// ReasonModelLoaded: a replica holds the complete, verified model.
	ReasonModelLoaded = "ModelLoaded"
	// ReasonNotLoaded: no replica has finished loading yet.
	ReasonNotLoaded = "NotLoaded"
	// ReasonMinimumReplicasAvailable: at least one replica serves traffic.
	ReasonMinimumReplicasAvailable = "MinimumReplicasAvailable"
	// ReasonNoReadyReplicas: no replica serves traffic.
	ReasonNoReadyReplicas = "NoReadyReplicas"
	// ReasonSecretNotFound: a referenced Secret does not exist.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonSecretKeyMissing: a referenced Secret lacks a referenced key.
	ReasonSecretKeyMissing = "SecretKeyMissing"
	// ReasonPVCNotFound: a referenced PersistentVolumeClaim does not exist.
	ReasonPVCNotFound = "PVCNotFound"
	// ReasonModelCacheNotInstalled: cache.type Node, and the cluster has no
	// node-local model cache (its CSIDriver); no pod is made.
	ReasonModelCacheNotInstalled = "ModelCacheNotInstalled"
	// ReasonRollingOut: the current spec is rolling out; earlier replicas may serve meanwhile.
	ReasonRollingOut = "RollingOut"
	// ReasonInvalidName: the object's name cannot be given to its children (a
	// Service name, a label value); admission refuses such names, so only an
	// object admitted before that rule has it. Nothing is created.
	ReasonInvalidName = "InvalidName"
	// ReasonUndecodableSpec: the stored spec cannot be read as v1 (written in
	// another form without conversion); nothing is done until it is applied again.
	ReasonUndecodableSpec = "UndecodableSpec"
	// ReasonNameConflict: an object the operator would create already exists and
	// belongs to someone else; the operator leaves it alone.
	ReasonNameConflict = "NameConflict"
	// ReasonReconcileError: a request to the API server failed; the pass is retried
	// with back-off and the message quotes the API server.
	ReasonReconcileError = "ReconcileError"
	// ReasonPodCreateFailed: the ReplicaSet cannot create pods (quota, Pod Security
	// admission, a webhook); the message quotes the API server.
	ReasonPodCreateFailed = "PodCreateFailed"
	// ReasonProgressDeadlineExceeded: the rollout made no progress within the
	// Deployment's progress deadline, sized from loading.timeout.
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	// ReasonPartiallyAvailable: some but not all desired replicas serve.
	ReasonPartiallyAvailable = "PartiallyAvailable"
	// ReasonCanaryProgressing: a canary of the current spec takes its share of the
	// traffic, step by step; the stable pods keep serving.
	ReasonCanaryProgressing = "CanaryProgressing"
	// ReasonCanaryPaused: the canary waits at a pause step or is paused by hand.
	ReasonCanaryPaused = "CanaryPaused"
	// ReasonAnalysisInconclusive: too many analysis runs could not judge the
	// canary (too few requests, no data, Prometheus unreachable); it waits for a
	// person to promote or abort.
	ReasonAnalysisInconclusive = "AnalysisInconclusive"
	// ReasonPromoting: the canary passed; the stable pods take the new spec.
	ReasonPromoting = "Promoting"
	// ReasonRolledBack: the canary failed its analysis or was aborted; all traffic
	// is back on the stable pods, which run the earlier spec.
	ReasonRolledBack = "RolledBack"
	// ReasonTrafficAPIMissing: the Gateway API (or Inference Extension) CRDs the
	// rollout's traffic needs are not installed.
	ReasonTrafficAPIMissing = "TrafficAPIMissing"
	// ReasonLeaderWorkerSetMissing: gpu.nodes above 1 runs each replica as a
	// LeaderWorkerSet group, and the cluster does not serve LeaderWorkerSets.
	ReasonLeaderWorkerSetMissing = "LeaderWorkerSetMissing"
	// ReasonSignalsRead: the autoscaler reads the signals of every serving replica.
	ReasonSignalsRead = "SignalsRead"
	// ReasonMetricsUnavailable: a serving replica's signals cannot be read (its
	// /metrics does not answer, lacks a signal, or reads NaN); the count holds.
	ReasonMetricsUnavailable = "MetricsUnavailable"
	// ReasonNoServingReplicas: no replica of the current spec serves yet, so there
	// is no signal to read; the count holds.
	ReasonNoServingReplicas = "NoServingReplicas"
	// ReasonAdaptersLoaded: every ready replica of the current spec serves every adapter.
	ReasonAdaptersLoaded = "AdaptersLoaded"
	// ReasonAdaptersLoading: some ready replicas are still fetching or loading
	// adapters; the base model and the adapters already loaded serve meanwhile.
	ReasonAdaptersLoading = "AdaptersLoading"
	// ReasonAdapterFailed: an adapter could not be fetched or loaded on a
	// replica (status.adapters[].lastFailure); it is retried with the model's
	// back-off up to loading.maxRetries, and the replica keeps serving.
	ReasonAdapterFailed = "AdapterFailed"
	// ReasonAdaptersRollingOut: the engine takes adapters only at start (TGI),
	// so the change of spec.adapters rolls the replicas; the old ones serve
	// the earlier adapters until they are replaced.
	ReasonAdaptersRollingOut = "AdaptersRollingOut"
	// ReasonAdaptersUnreachable: the operator cannot reach a replica's
	// adapter agent to learn or change its adapters; retried.
	ReasonAdaptersUnreachable = "AdaptersUnreachable"
	// ReasonReplicaEjected (an event of the router) says a replica failed
	// its answers in a row and gets no request for a while.
	ReasonReplicaEjected = "ReplicaEjected"
	// ReasonReplicaRestored (an event of the router) says an ejected
	// replica answered its trial request and is picked again.
	ReasonReplicaRestored = "ReplicaRestored"
)
