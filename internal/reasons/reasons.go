// Package reasons explains every reason the operator reports (the Ready,
// ModelLoaded and Available conditions' reasons of api/v1/conditions.go, and the
// reasons in status.lastFailure: the loader's, the kubelet's) to a person: what
// it means and what to do. kubectl-aii prints it and docs/failure-reasons.md is
// checked against it.
package reasons

import (
	"fmt"
	"strings"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// Explanation is what a reason means and what to do about it.
type Explanation struct {
	Reason string
	// Meaning says what the operator saw.
	Meaning string
	// Fix says what to do; empty when nothing is wrong.
	Fix string
	// Warning is true when a person may have to act: events of the reason are
	// Warnings, and a Ready condition that turns to it counts in the failures
	// metric.
	Warning bool
	// Unwatched is true when the operator does not watch the reason's cause (a
	// user's PVC, a CRD, the node cache's CSIDriver, an object it does not own
	// holding a child's name): it looks at the object again on a timer.
	Unwatched bool
	// Hint is added to a failed load's message in status: what to check.
	Hint string
}

// Whether a person may have to act (Explanation.Warning).
const (
	warning = true
	normal  = false
)

// How the operator learns that a reason's cause is gone (Explanation.Unwatched).
const (
	watched  = false
	onATimer = true
)

// retryHint is how to ask for loads again once a permanent cause is fixed.
const retryHint = "then set the " + servingv1.AnnotationRequestedAt + " annotation (kubectl annotate aii/NAME " +
	servingv1.AnnotationRequestedAt + `="$(date -Is)" --overwrite) or change the spec`

// All lists every reason, condition reasons first, in the order of docs/failure-reasons.md.
var All = []Explanation{
	{servingv1.ReasonReady, "Every desired replica runs the current spec, is ready and available.", "", normal, watched, ""},
	{servingv1.ReasonScaledToZero, "0 replicas are desired: spec.replicas is 0, or the autoscaler took an idle model to zero (autoscaling.minReplicas 0; the activator holds the next request and starts a replica). Nothing runs, no GPU is held.", "", normal, watched, ""},
	{servingv1.ReasonProgressing, "The operator is creating the children; no pod exists yet.", "Wait; if it lasts, run kubectl aii why NAME: a child may be refused.", normal, watched, ""},
	{servingv1.ReasonPodsPending, "Pods exist but are not scheduled or started yet.", "Wait; if it lasts, kubectl describe pod shows what the scheduler or kubelet waits for.", normal, watched, ""},
	{servingv1.ReasonUnschedulable, "The scheduler cannot place a replica: no node has enough free GPUs of an accepted product (spec.gpu.products), or taints, nodeSelector or resources exclude them. The message quotes the scheduler (how many nodes it considered and why each was refused).",
		"Free or add GPUs of an accepted product, accept another product in spec.gpu.products, lower spec.gpu.count, or fix spec.nodeSelector / tolerations.", warning, watched, ""},
	{servingv1.ReasonLoading, "The model loader is downloading and verifying the weights.", "Wait; kubectl aii status NAME shows the progress. If it outlasts loading.timeout it is retried.", normal, watched, ""},
	{servingv1.ReasonEngineStarting, "The model is loaded and the engine is starting (its health endpoint does not answer yet).", "Wait; a large model takes minutes to load onto the GPUs. If it lasts, read the engine's log (kubectl aii logs NAME).", normal, watched, ""},
	{servingv1.ReasonWarmingUp, "The engine answers its health checks; the warm-up gate waits for its first completion.", "Wait; if it lasts, read the engine's log.", normal, watched, ""},
	{servingv1.ReasonWarmupFailed, "The warm-up gate got no completion from the engine within loading.timeout; it exits and is run again. The message quotes its last error.",
		"Read the engine's log (kubectl aii logs NAME) and check spec.engine.args and the served model name; raise loading.timeout for slow warm-ups, or turn the gate off (spec.engine.warmup.enabled: false).", warning, watched, ""},
	{servingv1.ReasonEngineCrashLooping, "The engine container keeps exiting (crash, OOM kill, bad arguments); the message gives the exit code and the last line of its log (added at a later pass when the kubelet cannot serve the previous run's log yet, as happens right after a restart).",
		"Read the engine's log (kubectl aii logs NAME); fix spec.engine.args or image; on OOMKilled raise spec.resources memory or use more GPUs (spec.gpu.count).", warning, watched, ""},
	{servingv1.ReasonPodStartFailed, "A container cannot start: the image cannot be pulled (ErrImagePull, ImagePullBackOff, InvalidImageName) or its configuration is refused (CreateContainerConfigError: a Secret or key it names is missing, e.g. in spec.engine.env; the credentials Secret of spec.model.source gets SecretNotFound or SecretKeyMissing).",
		"Fix the image name or tag, add spec.imagePullSecrets for a private registry, or create the Secret or key the message names.", warning, watched, ""},
	{servingv1.ReasonPodCreateFailed, "The ReplicaSet cannot create pods: a ResourceQuota is exceeded, Pod Security admission or a policy webhook refuses them. The message quotes the API server.",
		"Raise the quota, or let the namespace admit the pods (the default pods pass Pod Security restricted; a spec.engine.securityContext may not).", warning, watched, ""},
	{servingv1.ReasonRetryingLoad, "A load failed with a retryable error (network, store busy, stalled download, loader killed) and is tried again after a back-off.",
		"Usually nothing: it recovers by itself. If it repeats, fix what lastFailure names (the store's reachability, the pod's memory).", warning, watched, ""},
	{servingv1.ReasonLoadFailed, "A load failed permanently (the source is missing, access is denied, the files do not match their checksums, the configuration is invalid); loads stopped.",
		"Fix the cause in lastFailure, " + retryHint + ".", warning, watched, ""},
	{servingv1.ReasonRetriesExhausted, "Loads failed more than loading.maxRetries times; loads stopped.", "Fix the cause in lastFailure (or raise loading.maxRetries), " + retryHint + ".", warning, watched, ""},
	{servingv1.ReasonLoadTimeout, "A loader ran past loading.timeout and did not stop by itself; its pod was replaced.", "Raise spec.loading.timeout for a large model or slow storage, or bring the store nearer.", warning, watched, ""},
	{servingv1.ReasonModelLoaded, "A replica holds the complete, verified model.", "", normal, watched, ""},
	{servingv1.ReasonNotLoaded, "No replica has finished loading yet.", "", normal, watched, ""},
	{servingv1.ReasonMinimumReplicasAvailable, "At least one replica serves traffic.", "", normal, watched, ""},
	{servingv1.ReasonNoReadyReplicas, "No replica serves traffic.", "See the Ready condition's reason.", normal, watched, ""},
	{servingv1.ReasonSecretNotFound, "A Secret that the spec names (S3 credentials, an HTTP bearer token) does not exist in the namespace: the kubelet cannot start the pod's loader (CreateContainerConfigError) and says so in the pod's status, where the operator reads it (it reads no Secret).", "Create the Secret with the keys the message lists (the kubelet then starts the pod), or fix the name in the spec.", warning, watched, ""},
	{servingv1.ReasonSecretKeyMissing, "A Secret that the spec names lacks a key it needs: the kubelet cannot start the pod's loader (CreateContainerConfigError) and says so in the pod's status.", "Add the key to the Secret (the kubelet then starts the pod), or name the key that holds it in the spec.", warning, watched, ""},
	{servingv1.ReasonPVCNotFound, "A PersistentVolumeClaim that the spec names (the model's source, or the cache) does not exist; nothing is started.", "Create the claim, or fix spec.model.source.pvc.claimName / spec.cache.pvc.claimName.", warning, onATimer, ""},
	{servingv1.ReasonRollingOut, "The current spec serves on every desired replica, and its workload is settling: replicas of an earlier spec or past the desired count are being removed, or the Deployment's (LeaderWorkerSet's) status has not counted the pods yet. The message says which.", "", normal, watched, ""},
	{servingv1.ReasonCanaryProgressing, "A canary of the current spec (rollout.strategy Canary) takes its step's share of the traffic while the stable pods serve the rest; status.rollout says the step, weight and analysis runs.", "", normal, watched, ""},
	{servingv1.ReasonCanaryPaused, "The canary waits at a pause step without a duration, or the rollout is paused by hand (annotation serving.aiinference.io/paused).",
		"Promote it with the annotation serving.aiinference.io/promote (a new value), or remove serving.aiinference.io/paused.", normal, watched, ""},
	{servingv1.ReasonAnalysisInconclusive, "More analysis runs than inconclusiveLimit could not judge the canary: too few requests (minSamples), no data, or Prometheus unreachable; the rollout holds its weight and waits.",
		"Check Prometheus and that it scrapes the engines (namespace and pod labels), or send more traffic; then promote (serving.aiinference.io/promote) or abort (serving.aiinference.io/abort).", warning, watched, ""},
	{servingv1.ReasonPromoting, "Every canary step passed; the stable pods take the new spec one by one while the canary serves, and the canary goes once they are all ready.", "", normal, watched, ""},
	{servingv1.ReasonRolledBack, "The canary failed an analysis, its loads stopped, or it was aborted: all traffic is back on the stable pods, which run the earlier spec, and the canary's pods are gone.",
		"Read status.rollout (the failed checks' values and thresholds), fix the spec, or set serving.aiinference.io/requestedAt to try the same revision again.", warning, watched, ""},
	{servingv1.ReasonModelCacheNotInstalled, "spec.cache.type is Node, and the cluster has no node-local model cache (no CSIDriver model-cache.aiinference.io): the kubelet could not mount the pods' cache volume, so no pod is made.",
		"Install the cache (the chart with modelCache.enabled true; see docs/model-cache.md) or choose another spec.cache.type. The operator looks again every 30 seconds.", warning, onATimer, ""},
	{servingv1.ReasonTrafficAPIMissing, "rollout.canary.traffic.gateway needs the Gateway API's HTTPRoute (and, for InferencePool backends, the Inference Extension's InferencePool), which the cluster does not serve.",
		"Install the Gateway API CRDs (and the Inference Extension's), or remove rollout.canary.traffic to split by ready replicas.", warning, onATimer, ""},
	{servingv1.ReasonLeaderWorkerSetMissing, "spec.gpu.nodes is above 1, so each replica is a group of pods on several nodes, which the LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1) runs, and the cluster does not serve LeaderWorkerSets. No pod is made.",
		"Install LeaderWorkerSet v0.7 or later (docs/multinode.md), or set spec.gpu.nodes to 1 with a GPU product that holds the model on one node. The operator looks again every 30 seconds.", warning, onATimer, ""},
	{servingv1.ReasonSignalsRead, "With spec.autoscaling, the autoscaler reads the signals of every serving replica and sets the count from them; status.autoscaling shows the readings behind the last change.", "", normal, watched, ""},
	{servingv1.ReasonMetricsUnavailable, "With spec.autoscaling, a serving replica's signals cannot be read: its /metrics does not answer, lacks a signal the targets need, or reads NaN. The count holds where it is (never down, never to zero) until every serving replica can be read; the message names the pod and the error.",
		"Check that the engine serves /metrics on its port (kubectl aii logs NAME), that nothing (a NetworkPolicy) keeps the operator from the pods, and that the engine version exports the signal the message names.", warning, watched, ""},
	{servingv1.ReasonNoServingReplicas, "With spec.autoscaling, no replica of the current spec serves yet, so there is no signal to read; the count holds.", "Wait for a replica to become ready; if it lasts, see the Ready condition's reason.", normal, watched, ""},
	{servingv1.ReasonInvalidName, "The object's name cannot be given to its children: the Service NAME needs a DNS-1035 label (no dots) of at most 63 characters, and canary Gateway traffic's Services NAME-stable and NAME-canary at most 56. Admission refuses such names; only an object created before that rule has one. Nothing is created.",
		"Create the AIInference again under a name that fits (names cannot be changed), then delete this one.", warning, watched, ""},
	{servingv1.ReasonUndecodableSpec, "The stored spec cannot be read as v1: it was written in another form without conversion (a v1alpha1 object created while no conversion webhook ran, whose engine is a string). The operator touches nothing of it.",
		"Apply the object again as serving.aiinference.io/v1, or install the operator with its webhooks so that v1alpha1 is converted.", warning, watched, ""},
	{servingv1.ReasonNameConflict, "An object with a child's name (ConfigMap NAME-loader, Deployment or Service NAME, PVC NAME-model-cache) exists and does not belong to this AIInference; the operator never adopts it.",
		"Delete or rename the other object, or give the AIInference another name.", warning, onATimer, ""},
	{servingv1.ReasonReconcileError, "A request of the operator to the API server failed (an admission policy, a quota, missing RBAC, the API server unreachable); the pass is retried with back-off. The message quotes the API server.",
		"Act on the message: allow the child in the policy, raise the quota, grant the operator's RBAC.", warning, watched, ""},
	{servingv1.ReasonProgressDeadlineExceeded, "The rollout made no progress within the Deployment's progress deadline (sized from loading.timeout); the message adds why the replicas do not become ready.",
		"Act on the cause in the message; the rollout goes on once it is fixed.", warning, watched, ""},
	{servingv1.ReasonPartiallyAvailable, "Some but not all desired replicas serve.", "Wait, or see why the others do not (kubectl aii why NAME).", normal, watched, ""},
	{servingv1.ReasonAdaptersLoaded, "Every serving replica of the current spec serves every adapter of spec.adapters (the AdaptersReady condition).", "", normal, watched, ""},
	{servingv1.ReasonAdaptersLoading, "Some serving replicas are still fetching or loading adapters of spec.adapters; they serve the base model and the adapters already loaded meanwhile.", "Wait; kubectl aii status NAME lists each adapter's replicas. If it lasts, see status.adapters[].lastFailure.", normal, watched, ""},
	{servingv1.ReasonAdapterFailed, "An adapter of spec.adapters could not be fetched (SourceNotFound, AccessDenied, ChecksumMismatch, ...) or the engine refused to load it (EngineRefused: files it cannot read, a rank above --max-lora-rank); status.adapters[].lastFailure names the pod and the message. It is retried with loading.backoff up to loading.maxRetries unless permanent; the replica keeps serving the base model and the other adapters.",
		"Fix the adapter's files or source (or the engine's --max-lora-rank), then give the adapter a new revision to try it again at once.", warning, watched, ""},
	{servingv1.ReasonAdaptersRollingOut, "The engine takes adapters only at start (TGI, through LORA_ADAPTERS), so the change of spec.adapters rolls the replicas; the old replicas serve the earlier adapters until they are replaced.", "Wait for the rolling update; serve the model with vLLM to add and remove adapters without a restart.", normal, watched, ""},
	{servingv1.ReasonAdaptersUnreachable, "The operator cannot reach a replica's adapter agent (port 8097) to put the adapter set or read where its adapters stand; it tries again every 2 seconds.",
		"Check that nothing (a NetworkPolicy) keeps the operator from the pods' port 8097, and the agent's log (kubectl logs POD -c adapters).", warning, watched, ""},
	{servingv1.ReasonReplicaEjected, "An event of the router: a replica of a routed model failed its answers in a row (a 5xx, a refused or broken connection, or no streamed answer within --stream-header-timeout), so the router sends it no request for a while (10 s, twice as long each time after, up to 5 minutes), then one trial request. At most half of a model's replicas are out at once; the requests it failed before answering went to another replica within the retry budget.",
		"Read the replica's engine log (kubectl aii logs NAME, or kubectl logs POD -c engine) for why it fails; kubectl aii status NAME lists the replicas out of the picking. A replica that fails for good should fail its readiness probe too.", warning, watched, ""},
	{servingv1.ReasonReplicaRestored, "An event of the router: a replica taken out of the picking answered its trial request and is picked again.", "", normal, watched, ""},

	// Reasons in status.lastFailure: the loader's, and the kubelet's for a killed loader.
	{loadspec.ReasonNotFound, "The loader found no model at the source: the bucket, prefix, URL or path does not exist or is empty, the OCI reference is not in the registry, or no file of a Hugging Face repository matches the include and exclude patterns. Permanent: loads stop.",
		"Fix spec.model.source (bucket, prefix, URL or path), " + retryHint + ".", warning, watched, "; check model.source (bucket, prefix, URL or path)"},
	{loadspec.ReasonAccessDenied, "The store refused the credentials (403/401): the S3 or HTTP credentials, the Hub token, or the registry's pull Secret. Permanent: loads stop.",
		"Fix the credentials Secret or the store's policy (read access to the bucket and prefix), " + retryHint + ".", warning, watched, "; check the credentials Secret and the store's permissions"},
	{loadspec.ReasonGatedModel, "The Hugging Face repository is gated: no token was given, or the token's account has not been granted access. Permanent: loads stop.",
		"Ask for access on the model's page on the Hub, put a token of the account granted access in a Secret and name it in spec.model.source.huggingface.tokenSecretRef, " + retryHint + ".", warning, watched, "; ask for access on the model's page and set model.source.huggingface.tokenSecretRef"},
	{loadspec.ReasonRepositoryNotFound, "The Hub (or the mirror in huggingface.endpoint) has no such repository, or it is private and the token may not read it. Permanent: loads stop.",
		"Fix spec.model.source.huggingface.repository (organisation/name as in the model's address), or give a token that may read the private repository, " + retryHint + ".", warning, watched, "; check model.source.huggingface.repository (and the token, for a private one)"},
	{loadspec.ReasonRevisionNotFound, "The Hugging Face repository has no such branch, tag or commit. Permanent: loads stop.",
		"Fix spec.model.source.huggingface.revision, " + retryHint + ".", warning, watched, "; check model.source.huggingface.revision"},
	{loadspec.ReasonChecksumMismatch, "A downloaded file does not match its checksum (the store's, or the manifest's): the stored model is corrupt or changed during the load. Permanent: loads stop.",
		"Re-upload the model (or let the upload finish), " + retryHint + ".", warning, watched, "; the stored model is corrupt or was changed during the load: re-upload it"},
	{loadspec.ReasonInvalidConfig, "The loader's configuration is invalid (an unusable source). Permanent: loads stop.", "Fix spec.model.source, " + retryHint + ".", warning, watched, "; check model.source"},
	{loadspec.ReasonTimeout, "The loader's download did not finish within loading.timeout; retried.", "Raise spec.loading.timeout for a large model or slow storage.", warning, watched, ""},
	{loadspec.ReasonTransient, "A retryable error: the network, the store busy (5xx, throttling), or a download that stalled (no byte for the stall timeout and cut by the watchdog); retried with back-off.",
		"Usually nothing; if it repeats, check the store's reachability from the nodes and its load.", warning, watched, ""},
	{loadspec.ReasonEngineRefused, "The engine answered an adapter's load request with an error (in status.adapters[].lastFailure): files it cannot read, a rank above --max-lora-rank, LoRA not enabled. Retried only when the engine answered 5xx.", "Fix the adapter's files, or the engine's LoRA arguments (--max-lora-rank, --max-loras) in spec.engine.args.", warning, watched, ""},
	{loadspec.ReasonHalted, "The loader refused to start: the operator halted loads, or this pod spent its attempts.", "See the object's Ready reason (LoadFailed or RetriesExhausted).", warning, watched, ""},
	{"OOMKilled", "The kubelet killed the loader for exceeding its memory limit (exit 137); retried.", "The loader's limit is 512Mi plus an in-memory cache's size: give spec.model.size (or spec.cache.sizeLimit) so a Memory cache is counted, or use a Disk or PVC cache (spec.cache) for a large model.", warning, watched, ""},
}

var byReason = func() map[string]Explanation {
	m := make(map[string]Explanation, len(All))
	for _, e := range All {
		m[e.Reason] = e
	}
	return m
}()

// Explain says what a reason means and how to fix it. Unknown reasons (a loader
// exit code without a report, "LoaderExitN") get a generic explanation.
func Explain(reason string) Explanation {
	if e, ok := byReason[reason]; ok {
		return e
	}
	return Explanation{Reason: reason, Meaning: "The loader exited with an unexpected code and left no report.",
		Fix: "Read the loader's log (kubectl aii logs NAME --loader).", Warning: true}
}

// MarkdownTable is the table of docs/failure-reasons.md.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| reason | event | what it means | what to do |\n| --- | --- | --- | --- |\n")
	for _, e := range All {
		fix := e.Fix
		if fix == "" {
			fix = "nothing"
		}
		event := "Normal"
		if e.Warning {
			event = "Warning"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", e.Reason, event, escape(e.Meaning), escape(fix))
	}
	return b.String()
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
