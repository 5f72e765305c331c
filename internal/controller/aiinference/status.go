package aiinference

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/internal/units"
)

// rollout is how far the current spec has rolled out.
type rollout struct {
	desired int32
	// ready counts ready replicas of any spec: they serve traffic.
	ready int32
	// updated counts replicas of the current spec; currentReady those that are ready.
	updated, currentReady int32
	// replicas counts what the workload's status counts, of any spec.
	replicas int32
	// stableReady counts the serving pods that are not a canary's.
	stableReady int32
	// done is true when the current spec is served by the desired number of
	// ready, available replicas and no others (kstatus's rule for Deployments).
	done bool
	// createFailure is the Deployment's ReplicaFailure message; deadlineExceeded
	// its Progressing message once the progress deadline passed.
	createFailure, deadlineExceeded string
}

// rolledOut is kstatus's rule for a Deployment: it has seen its spec, and want
// replicas run its template, all ready and available, and no others.
func rolledOut(d *appsv1.Deployment, want int32) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
		d.Status.Replicas == want && d.Status.AvailableReplicas >= want && d.Status.ReadyReplicas >= want
}

func observeRollout(obj *servingv1.AIInference, obs observation, templateHash string) rollout {
	ro := rollout{desired: obj.DesiredReplicas()}
	for _, p := range obs.pods {
		if p.Current && p.Serves {
			ro.currentReady++
		}
		if !p.Canary && p.Serves {
			ro.stableReady++
		}
	}
	if obj.SpansNodes() {
		// A replica is a group: the current ones ready are the groups of the
		// current template whose leader serves and whose workers are all
		// ready (a leader alone is no replica).
		var current []podView
		for _, p := range obs.pods {
			if p.Current {
				current = append(current, p)
			}
		}
		ro.currentReady = readyGroups(current, obj.NodesPerReplica())
	}
	d := obs.deployment
	if d == nil {
		return ro
	}
	ro.ready, ro.replicas = d.Status.ReadyReplicas, d.Status.Replicas
	current := d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash] == templateHash
	if current {
		ro.updated = d.Status.UpdatedReplicas
	}
	if c := obs.canary; c != nil {
		// A canary's pods serve too, but while they exist the rollout is not done.
		ro.ready += c.Status.ReadyReplicas
		ro.replicas += c.Status.Replicas
		if c.Spec.Template.Annotations[servingv1.AnnotationTemplateHash] == templateHash {
			ro.updated += c.Status.UpdatedReplicas
		}
	}
	ro.done = obs.canary == nil && current && !obs.childChanged && rolledOut(d, ro.desired)
	if obj.SpansNodes() {
		// The group counts may predate the spec (see groupsAsDeployment): the
		// groups of its template must be ready too.
		ro.done = ro.done && ro.currentReady >= ro.desired
	}
	for _, c := range d.Status.Conditions {
		switch {
		case c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue:
			ro.createFailure = cmp.Or(c.Message, c.Reason)
		case c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded":
			ro.deadlineExceeded = cmp.Or(c.Message, c.Reason)
		}
	}
	return ro
}

// computeStatus derives the whole status from this pass's observation. Conditions
// keep their transition times when their status does not change.
func computeStatus(obj *servingv1.AIInference, obs observation, loads loadAssessment, now time.Time) servingv1.AIInferenceStatus {
	st := *obj.Status.DeepCopy()
	st.ObservedGeneration = obj.Generation
	templateHash := ""
	if d := obs.deployment; d != nil {
		templateHash = d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
	}
	if loads.budget.Epoch != "" {
		templateHash = templateOf(loads.budget.Epoch)
	}
	ro := observeRollout(obj, obs, templateHash)

	st.Replicas, st.ReadyReplicas, st.UpdatedReplicas = 0, ro.ready, ro.updated
	if d := obs.deployment; d != nil {
		st.Replicas = d.Status.Replicas
	}
	if c := obs.canary; c != nil {
		st.Replicas += c.Status.Replicas
	}
	switch {
	case obs.rollout != nil:
		st.Rollout = obs.rollout.status
	case !isCanary(obj):
		st.Rollout = nil
	}
	st.Ready = fmt.Sprintf("%d/%d", st.ReadyReplicas, ro.desired)
	st.GPU = gpuSummary(obj.Spec.GPU)
	st.Selector = labels.SelectorFromSet(servingSelector(obj)).String()
	st.ModelCache = obs.modelCache
	if at := obj.Annotations[servingv1.AnnotationRequestedAt]; at != "" {
		st.LastHandledRequestedAt = at
	}
	st.Source = sourceStatus(obj, obs.sourceMode, nil)
	if obs.podsSeen {
		st.Source = sourceStatus(obj, obs.sourceMode, obs.pods)
		st.LoadRetries = loads.failed
		st.LoadBudget = loads.budget.DeepCopy()
		st.LastFailure = loads.failure
		st.ModelLoaded = false
		for _, p := range obs.pods {
			st.ModelLoaded = st.ModelLoaded || p.LoaderDone
		}
		if loaded := lastLoad(obs.pods); loaded != nil {
			st.LastLoad = loaded
		}
	}

	phase, ready := summarize(obj, obs, loads, ro, now)
	if ready.failure != nil && obs.podsSeen && loads.halted() == "" {
		st.LastFailure = stableFailure(obj.Status.LastFailure, ready.failure, now)
	}
	if obs.stepError != nil && !ready.stalled {
		if phase == servingv1.PhaseReady {
			phase = servingv1.PhaseDegraded // serving, but the spec could not be applied
		}
		ready = verdict{status: metav1.ConditionFalse, reason: servingv1.ReasonReconcileError,
			message: "The operator could not bring the children in line with the spec, and retries with back-off: " + obs.stepError.Error()}
	}
	setModelLoadedCondition(&st, obj.Generation, obs, loads)
	setAvailableCondition(&st, obj.Generation, ro)
	st.Phase, st.Reason = phase, ready.reason
	if obs.endpoint != "" {
		st.Endpoint = obs.endpoint
	}
	if obs.podsSeen {
		st.ServingRevision = servingRevision(obs, templateHash, st.ServingRevision)
	}
	setCondition(&st, obj.Generation, servingv1.ConditionReady, ready.status, ready.reason, ready.message)
	switch {
	case ready.stalled:
		setCondition(&st, obj.Generation, servingv1.ConditionStalled, metav1.ConditionTrue, ready.reason, ready.message)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionReconciling)
	case ready.status == metav1.ConditionTrue:
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionStalled)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionReconciling)
	default:
		setCondition(&st, obj.Generation, servingv1.ConditionReconciling, metav1.ConditionTrue, ready.reason, ready.message)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionStalled)
	}
	setScalingCondition(&st, obj, obs.autoscale)
	setAdapterStatus(&st, obj, obs, now)
	return st
}

// setScalingCondition says whether the autoscaler reads its signals or holds
// the count; a pass that did not run the autoscaler keeps what the last said.
func setScalingCondition(st *servingv1.AIInferenceStatus, obj *servingv1.AIInference, view *autoscaleView) {
	switch {
	case obj.Spec.Autoscaling == nil:
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionScalingActive)
	case view == nil:
	case view.hold != nil:
		setCondition(st, obj.Generation, servingv1.ConditionScalingActive, metav1.ConditionFalse, view.hold.reason, view.hold.message)
	case view.noActivator:
		setCondition(st, obj.Generation, servingv1.ConditionScalingActive, metav1.ConditionTrue, servingv1.ReasonSignalsRead,
			"the autoscaler reads the signals of every serving replica; minReplicas 0 is not applied, the count stays at 1 or more: "+
				"the operator runs no activator to hold the requests of a model at zero (start it with --activator-advertise-address, or in a pod, where POD_IP sets it)")
	default:
		setCondition(st, obj.Generation, servingv1.ConditionScalingActive, metav1.ConditionTrue, servingv1.ReasonSignalsRead,
			"the autoscaler reads the signals of every serving replica")
	}
}

// servingRevision is the revision the serving pods run: the current one once
// one of its pods serves, the stable one during a canary rollout, the last one
// said while an update has no serving pod yet, and none when nothing serves.
func servingRevision(obs observation, current, previous string) string {
	serving := false
	for _, p := range obs.pods {
		if !p.Serves || p.Canary {
			continue
		}
		if p.Current && obs.rollout == nil {
			return current
		}
		serving = true
	}
	switch {
	case !serving:
		return ""
	case obs.rollout != nil && obs.rollout.status != nil && obs.rollout.status.StableRevision != "":
		return obs.rollout.status.StableRevision
	}
	return previous
}

// stableFailure records a replica's failure, keeping the recorded time while the
// same failure goes on, so an unchanged situation writes nothing.
func stableFailure(prev, cur *servingv1.LoadFailure, now time.Time) *servingv1.LoadFailure {
	if prev != nil && prev.Reason == cur.Reason && prev.Pod == cur.Pod && prev.Message == cur.Message {
		return prev
	}
	if cur.Time.IsZero() {
		cur.Time = metav1.NewTime(now.Truncate(time.Second))
	}
	return cur
}

// verdict is the Ready condition, whether the object is stalled, and the replica
// failure behind it, if any.
type verdict struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	stalled bool
	failure *servingv1.LoadFailure
}

// summarize picks the phase and the Ready condition. The order matters: a problem a
// person must fix outranks waiting, and the most advanced pod explains the wait.
func summarize(obj *servingv1.AIInference, obs observation, loads loadAssessment, ro rollout, now time.Time) (servingv1.Phase, verdict) {
	for _, p := range []*problem{obs.referenceProblem, missingSecret(obj, obs.pods), obs.nameConflict} {
		if p != nil {
			return servingv1.PhasePending, verdict{status: metav1.ConditionFalse, reason: p.reason, message: p.message, stalled: true}
		}
	}
	if phase, v, ok := canaryVerdict(obj, obs, loads, ro); ok {
		return phase, v
	}
	if reason := loads.halted(); reason != "" {
		phase, msg := servingv1.PhaseFailed, haltMessage(obj, loads)
		if f := loads.failure; f != nil {
			msg += reasons.Explain(f.Reason).Hint
		}
		if ro.ready > 0 {
			phase = servingv1.PhaseDegraded
			msg = fmt.Sprintf("%d of %d replicas serve; loads stopped: %s", ro.ready, ro.desired, msg)
		} else {
			msg = "Loads stopped: " + msg
		}
		return phase, verdict{status: metav1.ConditionFalse, reason: reason, message: msg, stalled: true}
	}
	if ro.done {
		if ro.desired == 0 {
			return servingv1.PhaseReady, verdict{status: metav1.ConditionTrue, reason: servingv1.ReasonScaledToZero, message: "Scaled to zero replicas"}
		}
		return servingv1.PhaseReady, verdict{status: metav1.ConditionTrue, reason: servingv1.ReasonReady,
			message: fmt.Sprintf("%d of %d replicas are ready to serve %s", ro.ready, ro.desired, obj.Spec.Model.Name)}
	}

	phase, v := waitingVerdict(obj, obs, loads, ro)
	if f := v.failure; v.reason == servingv1.ReasonEngineCrashLooping && f != nil && !f.Time.IsZero() && now.Sub(f.Time.Time) > obj.LoadTimeout() {
		// The kubelet restarts a crashing engine for ever; past the loading bound
		// waiting longer is no use: the spec or the image must change.
		v.stalled = true
		v.message = fmt.Sprintf("%s; it has crash-looped for %s, longer than loading.timeout (%s): read its log (kubectl aii logs %s) "+
			"and fix spec.engine (args, image) or spec.resources; the new spec's pods start afresh", v.message, now.Sub(f.Time.Time).Truncate(time.Second), obj.LoadTimeout(), obj.Name)
	}
	if ro.deadlineExceeded != "" {
		v.reason, v.stalled = servingv1.ReasonProgressDeadlineExceeded, true
		v.message = fmt.Sprintf("The rollout made no progress within progressDeadlineSeconds (%s); %s", ro.deadlineExceeded, v.message)
	}
	return phase, v
}

// missingSecret is the problem of a credentials Secret the spec names that is
// missing, or lacks a key the loader reads, as the kubelet tells it in a pod of
// the current spec; nil when none says so. The operator does not read Secrets
// itself (it may not), so the Deployment is applied and its pods say it: the
// kubelet cannot build the loader's environment, and its container waits with
// CreateContainerConfigError and the error of makeEnvironmentVariables
// (k8s.io/kubernetes pkg/kubelet) for a secretKeyRef that is not optional:
//   - `secret "NAME" not found` (the kubelet's Secret manager, which watches the
//     Secrets its pods use; `secrets "NAME" not found` from the API server when
//     it is set to read them directly);
//   - `couldn't find key KEY in Secret NAMESPACE/NAME`.
//
// Matched against the spec's reference, so that the message names the spec's
// field; any other CreateContainerConfigError stays PodStartFailed. Once the
// Secret or key is there, the kubelet starts the container at its next try, and
// the pod's status change brings the next pass.
func missingSecret(obj *servingv1.AIInference, pods []podView) *problem {
	var name, field string
	var keys []string
	switch src := obj.Spec.Model.Source; {
	case src.S3 != nil && src.S3.CredentialsSecretRef != nil:
		ref := src.S3.CredentialsSecretRef
		name, field, keys = ref.Name, "spec.model.source.s3.credentialsSecretRef", []string{ref.AccessKeyID(), ref.SecretAccessKey()}
	case src.HTTP != nil && src.HTTP.BearerTokenSecretRef != nil:
		ref := src.HTTP.BearerTokenSecretRef
		name, field, keys = ref.Name, "spec.model.source.http.bearerTokenSecretRef", []string{ref.Key}
	default:
		return nil
	}
	for _, p := range pods {
		if !p.Current || p.ConfigError == "" {
			continue
		}
		if msg := p.ConfigError; msg == fmt.Sprintf("secret %q not found", name) || msg == fmt.Sprintf("secrets %q not found", name) {
			return &problem{servingv1.ReasonSecretNotFound, fmt.Sprintf(
				"Secret %q named in %s does not exist in namespace %s; create it with the keys %v", name, field, obj.Namespace, keys)}
		}
		for _, key := range keys {
			if p.ConfigError == fmt.Sprintf("couldn't find key %s in Secret %s/%s", key, obj.Namespace, name) {
				return &problem{servingv1.ReasonSecretKeyMissing, fmt.Sprintf(
					"Secret %q named in %s has no key %q; add it, or name the key that holds it", name, field, key)}
			}
		}
	}
	return nil
}

// waitingVerdict explains why the current spec does not serve yet.
func waitingVerdict(obj *servingv1.AIInference, obs observation, loads loadAssessment, ro rollout) (servingv1.Phase, verdict) {
	waiting := fmt.Sprintf("%d of %d replicas run the current spec and are ready", ro.currentReady, ro.desired)
	if old := ro.ready - ro.currentReady; old > 0 {
		waiting += fmt.Sprintf(" (%d of an earlier spec still serve)", old)
	}
	waitingOn := func(reason, format string, args ...any) verdict {
		return verdict{status: metav1.ConditionFalse, reason: reason, message: waiting + "; " + fmt.Sprintf(format, args...)}
	}
	var current []podView
	phase := servingv1.PhasePending
	for _, p := range obs.pods {
		if p.Current {
			current = append(current, p)
			if p.Scheduled {
				phase = servingv1.PhaseLoading
			}
		}
	}
	if ro.createFailure != "" {
		return phase, waitingOn(servingv1.ReasonPodCreateFailed, "pods cannot be created: %s; fix the quota, admission policy or Pod Security level that refuses them", ro.createFailure)
	}
	if f := loads.failure; f != nil && f.Retried {
		for _, p := range current {
			if p.Name == f.Pod && !p.LoaderDone {
				next := loads.failed + 1
				return phase, waitingOn(servingv1.ReasonRetryingLoad, "loading failed on pod %s (%s: %s); attempt %d of %d follows after a back-off",
					f.Pod, f.Reason, f.Message, next, obj.MaxRetries()+1)
			}
		}
	}
	for _, wait := range podWaits {
		for _, p := range current {
			if wait.holds(p) {
				w := wait.wait(obj, p)
				v := waitingOn(w.reason, "%s", w.message)
				if w.failure != "" {
					v.failure = &servingv1.LoadFailure{Reason: w.reason, Message: w.failure, Pod: p.Name, Time: metav1.NewTime(w.since)}
				}
				return phase, v
			}
		}
	}
	switch {
	case len(current) == 0:
		return phase, waitingOn(servingv1.ReasonProgressing, "creating pods")
	case ro.currentReady >= ro.desired && ro.replicas > ro.updated:
		return phase, waitingOn(servingv1.ReasonRollingOut, "replicas of an earlier spec are being removed")
	case ro.currentReady >= ro.desired && ro.replicas > ro.desired:
		return phase, waitingOn(servingv1.ReasonRollingOut, "replicas past the desired %d are being removed", ro.desired)
	case ro.currentReady >= ro.desired:
		// The pods serve and nothing else is counted: the workload's status
		// has not caught up with them yet (seen for a fraction of a second).
		workload := deployments.kind
		if obj.SpansNodes() {
			workload = leaderWorkerSets.kind
		}
		return phase, waitingOn(servingv1.ReasonRollingOut, "waiting for the %s's status to count them", workload)
	case ro.ready > 0:
		return phase, waitingOn(servingv1.ReasonPartiallyAvailable, "waiting for the other replicas")
	}
	return phase, waitingOn(servingv1.ReasonPodsPending, "waiting for pods to be scheduled and started")
}

// podWait is what keeps one pod from serving: a reason, the message after the
// replica counts, and for a failure the pod's own words and since when.
type podWait struct {
	reason, message, failure string
	since                    time.Time
}

// podWaits are what can keep a current pod from serving, the most telling
// first: the first that holds for any current pod is the verdict.
var podWaits = []struct {
	holds func(p podView) bool
	wait  func(obj *servingv1.AIInference, p podView) podWait
}{
	{func(p podView) bool { return p.StartFailure != "" },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonPodStartFailed, failure: p.StartFailure,
				message: fmt.Sprintf("pod %s cannot start: %s; check the image names, imagePullSecrets and referenced Secrets", p.Name, p.StartFailure)}
		}},
	{func(p podView) bool { return p.EngineCrashLoop != "" },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonEngineCrashLooping, failure: p.EngineCrashLoop, since: p.EngineCrashLoopSince,
				message: fmt.Sprintf("pod %s: %s; check the engine's logs and engine.args", p.Name, p.EngineCrashLoop)}
		}},
	{func(p podView) bool { return p.WarmupFailure != "" },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonWarmupFailed, failure: p.WarmupFailure,
				message: fmt.Sprintf("pod %s: %s; check the engine's logs and engine.args, or turn the gate off with engine.warmup.enabled: false", p.Name, p.WarmupFailure)}
		}},
	{func(p podView) bool { return p.Unschedulable != "" },
		func(obj *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonUnschedulable, failure: p.Unschedulable, since: p.UnschedulableSince,
				message: fmt.Sprintf("pod %s cannot be scheduled (%s needed): %s", p.Name, gpuSummary(obj.Spec.GPU), p.Unschedulable)}
		}},
	// A group's leader starts its engine only once its workers have joined
	// it (the engine's multi-node start waits for them): a worker still
	// loading is what holds the group, so it is named before the leader
	// whose engine waits for it.
	{func(p podView) bool {
		return p.Role == servingv1.RoleWorker && !p.LoaderStarted.IsZero() && !p.LoaderDone
	},
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonLoading,
				message: fmt.Sprintf("pod %s, a worker its group's leader waits for, is loading the model", p.Name)}
		}},
	{func(p podView) bool { return p.LoaderDone && !p.EngineReady },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonEngineStarting,
				message: fmt.Sprintf("the model is loaded on pod %s and the engine is starting", p.Name)}
		}},
	{func(p podView) bool { return p.LoaderDone && p.WarmupPending },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonWarmingUp,
				message: fmt.Sprintf("the engine on pod %s answers its health checks; waiting for its first completion (engine.warmup)", p.Name)}
		}},
	{func(p podView) bool { return !p.LoaderStarted.IsZero() },
		func(_ *servingv1.AIInference, p podView) podWait {
			return podWait{reason: servingv1.ReasonLoading, message: fmt.Sprintf("pod %s is loading the model", p.Name)}
		}},
}

// lastLoad is the report of the most recent successful load among the pods.
func lastLoad(pods []podView) *servingv1.LoadReport {
	var newest *podView
	for i := range pods {
		p := &pods[i]
		if p.LoaderDone && p.LoaderSummary != nil && (newest == nil || p.LoaderFinished.After(newest.LoaderFinished)) {
			newest = p
		}
	}
	if newest == nil {
		return nil
	}
	s := newest.LoaderSummary
	var checks map[string]int32
	for name, n := range s.Checks {
		if checks == nil {
			checks = map[string]int32{}
		}
		checks[name] = int32(n)
	}
	return &servingv1.LoadReport{
		Pod:          newest.Name,
		Files:        s.Files,
		Bytes:        s.Bytes,
		BytesFetched: s.BytesFetched,
		Duration:     metav1.Duration{Duration: time.Duration(s.Seconds * float64(time.Second)).Round(time.Millisecond)},
		Throughput:   fmt.Sprintf("%.1f MB/s", s.ThroughputMBps),
		Verified:     s.Verified,
		Checks:       checks,
		CacheHit:     s.CacheHit,
	}
}

// describeChecks says how many files each check covered, e.g. "crc64nvme 111, md5 1".
func describeChecks(checks map[string]int32) string {
	names := slices.Sorted(maps.Keys(checks))
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s %d", name, checks[name])
	}
	return strings.Join(parts, ", ")
}

func setModelLoadedCondition(st *servingv1.AIInferenceStatus, generation int64, obs observation, loads loadAssessment) {
	if l := st.LastLoad; st.ModelLoaded && l == nil {
		setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionTrue, servingv1.ReasonModelLoaded,
			"A replica loaded the model; the loader left no report")
		return
	} else if st.ModelLoaded {
		verified := "size-checked only"
		if l.Verified {
			verified = "verified"
		}
		if len(l.Checks) > 0 {
			verified += " (" + describeChecks(l.Checks) + ")"
		}
		msg := fmt.Sprintf("Pod %s loaded %d files (%s) in %s at %s, %s", l.Pod, l.Files, units.Bytes(l.Bytes), l.Duration.Duration, l.Throughput, verified)
		if l.CacheHit {
			msg = fmt.Sprintf("Pod %s found the complete model (%d files, %s) in its cache", l.Pod, l.Files, units.Bytes(l.Bytes))
		}
		setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionTrue, servingv1.ReasonModelLoaded, msg)
		return
	}
	if f := loads.failure; f != nil && loads.halted() != "" {
		setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionFalse, servingv1.ReasonLoadFailed,
			fmt.Sprintf("Pod %s: %s: %s", f.Pod, f.Reason, f.Message))
		return
	}
	for _, p := range obs.pods {
		if p.Current && !p.LoaderStarted.IsZero() {
			setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionFalse, servingv1.ReasonLoading,
				fmt.Sprintf("Pod %s is loading the model", p.Name))
			return
		}
	}
	setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionFalse, servingv1.ReasonNotLoaded, "No replica has loaded the model yet")
}

// setAvailableCondition says whether traffic is served at all, by replicas of the
// current spec or of an earlier one: "serving, rolling out" is not "down".
func setAvailableCondition(st *servingv1.AIInferenceStatus, generation int64, ro rollout) {
	if ro.ready == 0 {
		setCondition(st, generation, servingv1.ConditionAvailable, metav1.ConditionFalse, servingv1.ReasonNoReadyReplicas, "No replica serves traffic")
		return
	}
	msg := fmt.Sprintf("%d of %d replicas serve traffic", ro.ready, ro.desired)
	if old := ro.ready - ro.currentReady; old > 0 && !ro.done {
		msg += fmt.Sprintf(", %d of them of an earlier spec", old)
	}
	setCondition(st, generation, servingv1.ConditionAvailable, metav1.ConditionTrue, servingv1.ReasonMinimumReplicasAvailable, msg)
}

// setCondition sets a condition, keeping its transition time when its status is unchanged.
func setCondition(st *servingv1.AIInferenceStatus, generation int64, condType string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	})
}

// canaryVerdict explains a canary rollout in progress or rolled back; ok is
// false when there is none and the Rolling rules apply.
func canaryVerdict(obj *servingv1.AIInference, obs observation, loads loadAssessment, ro rollout) (servingv1.Phase, verdict, bool) {
	plan := obs.rollout
	if plan == nil || plan.status == nil {
		return "", verdict{}, false
	}
	st := plan.status
	c := obj.Spec.Rollout.Canary
	stableServes := fmt.Sprintf("the stable pods (revision %s) serve with %d ready", st.StableRevision, ro.stableReady)
	split := "split by the HTTPRoute's weights"
	if st.TrafficSplit == splitReplicaCount {
		split = "one Service selects both, so the split follows the ready replicas"
	}
	canaryAt := fmt.Sprintf("Canary revision %s takes %d%% of the traffic (%s) at step %d of %d", st.CanaryRevision, st.Weight, split, min(int(st.Step)+1, len(c.Steps)), len(c.Steps))
	switch st.Phase {
	case servingv1.RolloutRolledBack:
		if !plan.keepStableTemplate {
			return "", verdict{}, false
		}
		phase := servingv1.PhaseDegraded
		if ro.ready == 0 {
			phase = servingv1.PhaseFailed
		}
		return phase, verdict{status: metav1.ConditionFalse, reason: servingv1.ReasonRolledBack, stalled: true, message: fmt.Sprintf(
			"Revision %s was rolled back: %s; %s. Fix the spec, or set the %s annotation to try the canary again",
			st.CanaryRevision, st.Message, stableServes, servingv1.AnnotationRequestedAt)}, true
	case servingv1.RolloutInconclusive:
		return servingv1.PhaseCanary, verdict{status: metav1.ConditionFalse, reason: servingv1.ReasonAnalysisInconclusive, stalled: true,
			message: canaryAt + "; " + st.Message + "; " + stableServes}, true
	case servingv1.RolloutPromoting:
		return servingv1.PhaseCanary, verdict{status: metav1.ConditionFalse, reason: servingv1.ReasonPromoting,
			message: fmt.Sprintf("Revision %s passed its canary steps; %d of %d replicas run it and are ready, the canary serves meanwhile", st.CanaryRevision, ro.currentReady, ro.desired)}, true
	case servingv1.RolloutProgressing, servingv1.RolloutPaused:
		if st.StepStartedAt == nil {
			// The canary's pods are not ready yet: say why, as for any pods.
			phase, v := waitingVerdict(obj, obs, loads, ro)
			v.message = fmt.Sprintf("Canary revision %s: %s; %s", st.CanaryRevision, v.message, stableServes)
			return phase, v, true
		}
		reason := servingv1.ReasonCanaryProgressing
		if step := c.Steps[min(int(st.Step), len(c.Steps)-1)]; st.Phase == servingv1.RolloutPaused || (step.Pause != nil && step.Pause.Duration == nil) {
			reason = servingv1.ReasonCanaryPaused
		}
		return servingv1.PhaseCanary, verdict{status: metav1.ConditionFalse, reason: reason,
			message: canaryAt + ": " + st.Message + "; " + stableServes}, true
	}
	return "", verdict{}, false
}

// gpuSummary is the GPU column of `kubectl get aii`.
func gpuSummary(gpu servingv1.GPUSpec) string {
	nodes := ""
	if gpu.Nodes > 1 {
		nodes = fmt.Sprintf("%d nodes x ", gpu.Nodes)
	}
	switch {
	case gpu.Count == 0:
		return "none"
	case len(gpu.Products) == 0:
		return fmt.Sprintf("%s%dx any", nodes, gpu.Count)
	case len(gpu.Products) == 1:
		return fmt.Sprintf("%s%dx %s", nodes, gpu.Count, gpu.Products[0])
	default:
		return fmt.Sprintf("%s%dx %s (+%d)", nodes, gpu.Count, gpu.Products[0], len(gpu.Products)-1)
	}
}

// patchStatus derives the status from this pass's observations and writes it
// only when it changed, with events for the changes a person should see.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope) error {
	obj := s.obj
	status := computeStatus(obj, s.obs, s.loads, s.now)
	read := &obj.Status
	if s.statusRead != nil {
		read = s.statusRead
	}
	recordStatus(ctx, read, &status)
	if equality.Semantic.DeepEqual(*read, status) {
		metricsState.record(obj, &status, &status, s.now)
		return nil
	}
	original := obj.DeepCopy()
	original.Status = *read
	obj.Status = status
	// A merge patch carries only what differs from the object the pass started
	// from. When the cache had not yet seen the last pass's status write, a field
	// this pass sets back to its older value would be left out, and the last
	// pass's value would stay (Ready saying SecretNotFound, the phase still
	// Loading): the resourceVersion in the patch makes the API server refuse it
	// then, and the pass is run again (see scope.result).
	err := r.Status().Patch(ctx, obj, withReplicaCounts{client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{}), &status})
	switch {
	case errors.Is(err, context.Canceled) || apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err):
		// The API server validates the whole object on a status write (a spec
		// stored without conversion fails the schema): an event is all that can
		// carry the message.
		if ready := meta.FindStatusCondition(status.Conditions, servingv1.ConditionReady); ready != nil {
			r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, ready.Reason, "Reconcile", "%s (its status cannot be written either: %v)", ready.Message, err)
		}
		return err
	case err != nil:
		return err
	}
	metricsState.record(obj, &original.Status, &status, s.now)
	r.recordEvents(obj, &original.Status, s)
	r.recordAdapterEvents(obj, &original.Status)
	return nil
}

// withReplicaCounts is a status merge patch that always carries the replica
// counts. A merge patch carries only what differs from the object the pass
// started from, in which a count missing from storage reads 0: a count that
// stayed 0 since creation would never be stored, and tools that read the field
// (a multi-cluster hub's status feedback, the scale subresource) would find
// nothing rather than 0.
type withReplicaCounts struct {
	client.Patch
	status *servingv1.AIInferenceStatus
}

func (p withReplicaCounts) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	var patch map[string]any
	if err := json.Unmarshal(data, &patch); err != nil {
		return nil, err
	}
	status, _ := patch["status"].(map[string]any)
	if status == nil {
		status = map[string]any{}
		patch["status"] = status
	}
	status["replicas"], status["readyReplicas"], status["updatedReplicas"] = p.status.Replicas, p.status.ReadyReplicas, p.status.UpdatedReplicas
	return json.Marshal(patch)
}
