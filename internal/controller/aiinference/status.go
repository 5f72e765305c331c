package aiinference

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// observation is what one reconcile pass saw; the status is derived from it alone.
type observation struct {
	// referenceProblem is set when a referenced Secret or PVC is missing or incomplete.
	referenceProblem *problem
	// deployment is the observed Deployment; nil until it exists.
	deployment *appsv1.Deployment
	// pods are the AIInference's pods, oldest first.
	pods []podView
	// retry is the verdict on load failures.
	retry retryPlan
	// childChanged is true when this pass wrote a child, so what was observed of the
	// children may describe the previous spec.
	childChanged bool
}

// problem is a reason and a message a person can act on.
type problem struct {
	reason  string
	message string
}

// retryPlan is what to do about failed loads.
type retryPlan struct {
	// retries is the retry count after this pass.
	retries int32
	// failure is the load failure this plan is about; nil when none.
	failure *servingv1.LoadFailure
	// terminalReason is set when no retry is left: LoadFailed or RetriesExhausted.
	terminalReason string
	// deletePod is the pod to delete now, so its ReplicaSet starts a new attempt.
	deletePod *podView
	// wait is the time until the next retry may start.
	wait time.Duration
	// nextTimeout is the time until the oldest running load overruns the timeout.
	nextTimeout time.Duration
}

// planRetries decides what to do about failed or overrunning loads of current pods.
// A failure already retried (its pod deleted) is recognised by the last failure in
// status, so a stale cache that still shows the pod does not count it twice.
func planRetries(obj *servingv1.AIInference, pods []podView, now time.Time) retryPlan {
	plan := retryPlan{retries: obj.Status.LoadRetries, failure: obj.Status.LastFailure}
	if obj.Status.ObservedGeneration != obj.Generation {
		// A changed spec is a fresh start: earlier failures were about another spec.
		plan.retries = 0
	}
	timeout := loadTimeout(obj)
	for i := range pods {
		pod := &pods[i]
		if !pod.Current {
			continue
		}
		exit := pod.LoaderFailed
		if exit == nil && !pod.LoaderStarted.IsZero() {
			deadline := pod.LoaderStarted.Add(timeout)
			if now.Before(deadline) {
				if left := deadline.Sub(now); plan.nextTimeout == 0 || left < plan.nextTimeout {
					plan.nextTimeout = left
				}
				continue
			}
			exit = &loaderExit{
				Reason:   servingv1.ReasonLoadTimeout,
				Message:  fmt.Sprintf("the model loader ran longer than loading.timeout (%s); raise it for large models or slow storage", timeout),
				Finished: deadline,
			}
		}
		if exit == nil {
			continue
		}
		failure := &servingv1.LoadFailure{
			Reason:    exit.Reason,
			Message:   exit.Message,
			Pod:       pod.Name,
			ExitCode:  exit.ExitCode,
			Retryable: exit.ExitCode == 0 || loadspec.IsRetryableExit(exit.ExitCode),
			Time:      metav1.NewTime(exit.Finished.Truncate(time.Second)),
		}
		if last := obj.Status.LastFailure; last != nil && last.Retried && last.Pod == failure.Pod && last.Time.Equal(&failure.Time) {
			continue // already retried; the pod is on its way out
		}
		plan.failure = failure
		switch {
		case !failure.Retryable:
			plan.terminalReason = servingv1.ReasonLoadFailed
		case plan.retries >= maxRetries(obj):
			plan.terminalReason = servingv1.ReasonRetriesExhausted
		default:
			wait := retryDelay(obj, plan.retries) - now.Sub(failure.Time.Time)
			if wait > 0 {
				plan.wait = wait
			} else {
				plan.deletePod = pod
				plan.retries++
				failure.Retried = true
			}
		}
		return plan
	}
	return plan
}

// computeStatus derives the whole status from this pass's observation. Conditions
// keep their transition times when their status does not change.
func computeStatus(obj *servingv1.AIInference, obs observation) servingv1.AIInferenceStatus {
	st := *obj.Status.DeepCopy()
	st.ObservedGeneration = obj.Generation
	desired := replicas(obj)

	var updated int32
	rolledOut := false
	st.Replicas, st.ReadyReplicas = 0, 0
	if d := obs.deployment; d != nil {
		st.Replicas, st.ReadyReplicas, updated = d.Status.Replicas, d.Status.ReadyReplicas, d.Status.UpdatedReplicas
		rolledOut = !obs.childChanged && d.Status.ObservedGeneration >= d.Generation && updated == desired && st.Replicas == desired
	}
	st.Ready = fmt.Sprintf("%d/%d", st.ReadyReplicas, desired)
	st.GPU = gpuSummary(obj.Spec.GPU)
	st.Selector = labels.SelectorFromSet(selectorLabels(obj)).String()
	st.LoadRetries = obs.retry.retries
	st.LastFailure = obs.retry.failure

	st.ModelLoaded = false
	for _, p := range obs.pods {
		st.ModelLoaded = st.ModelLoaded || p.LoaderDone
	}
	if loaded := lastLoad(obs.pods); loaded != nil {
		st.LastLoad = loaded
	}

	setModelLoadedCondition(&st, obj.Generation, obs)
	setAvailableCondition(&st, obj.Generation, desired)

	phase, ready := summarize(obj, obs, desired, st.ReadyReplicas)
	st.Phase = phase
	setCondition(&st, obj.Generation, servingv1.ConditionReady, ready.status, ready.reason, ready.message)
	switch {
	case ready.stalled:
		setCondition(&st, obj.Generation, servingv1.ConditionStalled, metav1.ConditionTrue, ready.reason, ready.message)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionReconciling)
	case ready.status == metav1.ConditionTrue && rolledOut:
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionStalled)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionReconciling)
	default:
		reason, message := ready.reason, ready.message
		if ready.status == metav1.ConditionTrue {
			reason = servingv1.ReasonProgressing
			message = fmt.Sprintf("Rolling out: %d of %d replicas run the current spec", updated, desired)
		}
		setCondition(&st, obj.Generation, servingv1.ConditionReconciling, metav1.ConditionTrue, reason, message)
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionStalled)
	}
	return st
}

// verdict is the Ready condition and whether the object is stalled.
type verdict struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	stalled bool
}

// summarize picks the phase and the Ready condition. The order matters: a problem a
// person must fix outranks waiting, and the most advanced pod explains the wait.
func summarize(obj *servingv1.AIInference, obs observation, desired, ready int32) (servingv1.Phase, verdict) {
	if p := obs.referenceProblem; p != nil {
		return servingv1.PhasePending, verdict{metav1.ConditionFalse, p.reason, p.message, true}
	}
	if r := obs.retry; r.terminalReason != "" {
		f := r.failure
		msg := fmt.Sprintf("Loading the model failed on pod %s (%s): %s", f.Pod, f.Reason, f.Message)
		if r.terminalReason == servingv1.ReasonRetriesExhausted {
			msg = fmt.Sprintf("Loading the model failed %d times, the loading.maxRetries bound; last failure on pod %s (%s): %s", r.retries+1, f.Pod, f.Reason, f.Message)
		}
		return servingv1.PhaseFailed, verdict{metav1.ConditionFalse, r.terminalReason, msg + fixHint(f.Reason), true}
	}
	if ready >= desired {
		if desired == 0 {
			return servingv1.PhaseReady, verdict{metav1.ConditionTrue, servingv1.ReasonScaledToZero, "Scaled to zero replicas", false}
		}
		return servingv1.PhaseReady, verdict{metav1.ConditionTrue, servingv1.ReasonReady, fmt.Sprintf("%d of %d replicas are ready to serve %s", ready, desired, obj.Spec.Model.Name), false}
	}

	waiting := fmt.Sprintf("%d of %d replicas ready", ready, desired)
	var current []podView
	for _, p := range obs.pods {
		if p.Current {
			current = append(current, p)
		}
	}
	phase := servingv1.PhasePending
	for _, p := range current {
		if p.Scheduled {
			phase = servingv1.PhaseLoading
		}
	}
	if r := obs.retry; r.wait > 0 || r.deletePod != nil {
		f := r.failure
		next := fmt.Sprintf("retry %d of %d starts after a back-off of %s", r.retries+1, maxRetries(obj), retryDelay(obj, r.retries))
		if r.deletePod != nil {
			next = fmt.Sprintf("retry %d of %d started", r.retries, maxRetries(obj))
		}
		return servingv1.PhaseLoading, verdict{metav1.ConditionFalse, servingv1.ReasonRetryingLoad,
			fmt.Sprintf("%s; loading failed on pod %s (%s: %s); %s", waiting, f.Pod, f.Reason, f.Message, next), false}
	}
	for _, p := range current {
		if p.StartFailure != "" {
			return phase, verdict{metav1.ConditionFalse, servingv1.ReasonPodStartFailed, fmt.Sprintf("%s; pod %s cannot start: %s; check the image names, imagePullSecrets and referenced Secrets", waiting, p.Name, p.StartFailure), false}
		}
	}
	for _, p := range current {
		if p.EngineCrashLoop != "" {
			return phase, verdict{metav1.ConditionFalse, servingv1.ReasonEngineCrashLooping, fmt.Sprintf("%s; pod %s: %s; check the engine's logs and engine.args", waiting, p.Name, p.EngineCrashLoop), false}
		}
	}
	for _, p := range current {
		if p.Unschedulable != "" {
			return phase, verdict{metav1.ConditionFalse, servingv1.ReasonUnschedulable, fmt.Sprintf("%s; pod %s cannot be scheduled (%s needed): %s", waiting, p.Name, gpuSummary(obj.Spec.GPU), p.Unschedulable), false}
		}
	}
	for _, p := range current {
		if p.LoaderDone && !p.EngineReady {
			return phase, verdict{metav1.ConditionFalse, servingv1.ReasonEngineStarting, fmt.Sprintf("%s; the model is loaded on pod %s and the engine is starting", waiting, p.Name), false}
		}
	}
	for _, p := range current {
		if !p.LoaderStarted.IsZero() {
			return phase, verdict{metav1.ConditionFalse, servingv1.ReasonLoading, fmt.Sprintf("%s; pod %s is loading the model", waiting, p.Name), false}
		}
	}
	if len(current) > 0 {
		return phase, verdict{metav1.ConditionFalse, servingv1.ReasonPodsPending, fmt.Sprintf("%s; waiting for pods to be scheduled and started", waiting), false}
	}
	return phase, verdict{metav1.ConditionFalse, servingv1.ReasonProgressing, waiting + "; creating pods", false}
}

// fixHint tells a person what to do about a permanent loader failure.
func fixHint(reason string) string {
	switch reason {
	case loadspec.ReasonNotFound:
		return "; check model.source (bucket, prefix, URL or path)"
	case loadspec.ReasonAccessDenied:
		return "; check the credentials Secret and the store's permissions"
	case loadspec.ReasonChecksumMismatch:
		return "; the stored model is corrupt or was changed during the load: re-upload it"
	case loadspec.ReasonInvalidConfig:
		return "; check model.source"
	}
	return ""
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

func setModelLoadedCondition(st *servingv1.AIInferenceStatus, generation int64, obs observation) {
	if st.ModelLoaded && st.LastLoad == nil {
		setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionTrue, servingv1.ReasonModelLoaded,
			"A replica loaded the model; the loader left no report")
		return
	}
	if l := st.LastLoad; st.ModelLoaded {
		verified := "size-checked only"
		if l.Verified {
			verified = "verified"
		}
		if len(l.Checks) > 0 {
			verified += " (" + describeChecks(l.Checks) + ")"
		}
		msg := fmt.Sprintf("Pod %s loaded %d files (%s) in %s at %s, %s", l.Pod, l.Files, humanBytes(l.Bytes), l.Duration.Duration, l.Throughput, verified)
		if l.CacheHit {
			msg = fmt.Sprintf("Pod %s found the complete model (%d files, %s) in its cache", l.Pod, l.Files, humanBytes(l.Bytes))
		}
		setCondition(st, generation, servingv1.ConditionModelLoaded, metav1.ConditionTrue, servingv1.ReasonModelLoaded, msg)
		return
	}
	if f := obs.retry.failure; f != nil && obs.retry.terminalReason != "" {
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

func setAvailableCondition(st *servingv1.AIInferenceStatus, generation int64, desired int32) {
	if st.ReadyReplicas > 0 {
		setCondition(st, generation, servingv1.ConditionAvailable, metav1.ConditionTrue, servingv1.ReasonMinimumReplicasAvailable,
			fmt.Sprintf("%d of %d replicas serve traffic", st.ReadyReplicas, desired))
		return
	}
	setCondition(st, generation, servingv1.ConditionAvailable, metav1.ConditionFalse, servingv1.ReasonNoReadyReplicas, "No replica serves traffic yet")
}

// setCondition sets a condition, keeping its transition time when its status is unchanged.
func setCondition(st *servingv1.AIInferenceStatus, generation int64, condType string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
	})
}

func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
