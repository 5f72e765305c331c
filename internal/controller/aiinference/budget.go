package aiinference

import (
	"fmt"
	"maps"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// The retry budget. A kubelet restarts a failed loader in place for ever, so the
// operator counts every failed run of every current pod (restartCount tells how
// many), halts loads once the budget is spent or a failure is permanent, and tells
// the loaders through budget.json, which they obey before contacting the store.

const (
	// refillAfterReady is how long an object must stay Ready before its spent
	// retries are forgiven: failures weeks apart should not add up.
	refillAfterReady = 10 * time.Minute
	// loaderGrace is how long past its own deadline a loader may run before the
	// operator replaces its pod: the loader stops itself, this only catches a hang.
	loaderGrace = time.Minute
	// deletedForTimeout marks, in the ledger, a pod replaced for overrunning its
	// deadline, so that a cache that still lists it does not count it twice.
	deletedForTimeout = -1
)

// loadAssessment is the verdict on the loads of the current pods in one pass.
type loadAssessment struct {
	// budget is the ledger to record in status.
	budget servingv1.LoadBudget
	// failed is how many failed loads the budget counted (status.loadRetries).
	failed int32
	// failure is the latest load failure (status.lastFailure), nil if none.
	failure *servingv1.LoadFailure
	// newFailure is true when failure was seen in this pass.
	newFailure bool
	// deletePods are pods to replace: a hung loader, or a failed one when the user
	// asked for a retry.
	deletePods []podView
	// requeue is when to look again: the next loader deadline or budget refill.
	requeue time.Duration
}

// halted is the reason loads stopped, empty while they may go on.
func (a loadAssessment) halted() string { return a.budget.Halted }

// budgetEpoch names the budget: a new pod template or a new retry request
// (the requestedAt annotation) starts another.
func budgetEpoch(obj *servingv1.AIInference, templateHash string) string {
	if at := obj.Annotations[servingv1.AnnotationRequestedAt]; at != "" {
		return templateHash + "/" + at
	}
	return templateHash
}

// assessLoads counts the failed loads of current pods against loading.maxRetries.
func assessLoads(obj *servingv1.AIInference, pods []podView, templateHash string, now time.Time) loadAssessment {
	epoch := budgetEpoch(obj, templateHash)
	a := loadAssessment{failed: obj.Status.LoadRetries, failure: obj.Status.LastFailure}
	counted := map[string]int32{}
	if prev := obj.Status.LoadBudget; prev != nil {
		a.budget.Halted = prev.Halted
		maps.Copy(counted, prev.CountedByPod)
	}
	current := make([]podView, 0, len(pods))
	for _, p := range pods {
		if p.Current {
			current = append(current, p)
		}
	}

	switch prev := obj.Status.LoadBudget; {
	case prev == nil || templateOf(prev.Epoch) != templateHash:
		// Another spec: earlier failures were about another configuration.
		a.failed, a.budget.Halted, counted = 0, "", map[string]int32{}
	case prev.Epoch != epoch:
		// A retry request: forgive what failed so far and give failed pods a fresh start.
		a.failed, a.budget.Halted, counted = 0, "", baseline(current)
		for _, p := range current {
			if p.LoaderFailures > 0 && !p.LoaderDone {
				a.deletePods = append(a.deletePods, p)
			}
		}
	case a.failed > 0 && a.budget.Halted == "":
		if since, ok := readySince(obj); ok {
			if left := since.Add(refillAfterReady).Sub(now); left > 0 {
				a.requeue = left
			} else {
				a.failed, counted = 0, baseline(current)
			}
		}
	}
	a.budget.Epoch = epoch

	limit := obj.MaxRetries()
	timeout := obj.LoadTimeout()
	for _, p := range current {
		if counted[p.Name] == deletedForTimeout || a.budget.Halted != "" {
			continue // once halted the ledger is frozen: halted runs are not failures
		}
		if n := p.LoaderFailures - counted[p.Name]; n > 0 {
			counted[p.Name] = p.LoaderFailures
			a.failed += n
			a.failure = failureOf(p, now)
			a.newFailure = true
			switch {
			case !a.failure.Retryable:
				a.budget.Halted = servingv1.ReasonLoadFailed
			case a.failed > limit:
				a.budget.Halted = servingv1.ReasonRetriesExhausted
			}
			a.failure.Retried = a.budget.Halted == ""
			continue
		}
		if p.LoaderStarted.IsZero() {
			continue
		}
		// The loader waits out its back-off, then downloads for at most the timeout.
		deadline := p.LoaderStarted.Add(timeout + loaderGrace)
		if p.LoaderFailures > 0 {
			deadline = deadline.Add(loadspec.RetryDelay(obj.Backoff(), int(p.LoaderFailures)))
		}
		if left := deadline.Sub(now); left > 0 {
			a.requeue = minPositive(a.requeue, left)
			continue
		}
		counted[p.Name] = deletedForTimeout
		a.failed++
		a.failure = &servingv1.LoadFailure{
			Reason:    servingv1.ReasonLoadTimeout,
			Message:   fmt.Sprintf("the model loader ran past loading.timeout (%s) and did not stop; its pod is replaced. Raise the timeout for large models or slow storage", timeout),
			Pod:       p.Name,
			Retryable: true,
			Time:      metav1.NewTime(now.Truncate(time.Second)),
		}
		a.newFailure = true
		if a.failed > limit {
			a.budget.Halted = servingv1.ReasonRetriesExhausted
		}
		a.failure.Retried = a.budget.Halted == ""
		a.deletePods = append(a.deletePods, p)
	}

	// Keep the ledger to the pods that still exist.
	a.budget.CountedByPod = nil
	for _, p := range current {
		if n, ok := counted[p.Name]; ok && n != 0 {
			if a.budget.CountedByPod == nil {
				a.budget.CountedByPod = map[string]int32{}
			}
			a.budget.CountedByPod[p.Name] = n
		}
	}
	return a
}

// templateOf is the pod template part of a budget epoch.
func templateOf(epoch string) string {
	template, _, _ := strings.Cut(epoch, "/")
	return template
}

// baseline counts what the pods failed so far, so that only later failures count.
func baseline(pods []podView) map[string]int32 {
	counted := map[string]int32{}
	for _, p := range pods {
		counted[p.Name] = p.LoaderFailures
	}
	return counted
}

// readySince is when the object last became Ready, if it is Ready for its spec.
func readySince(obj *servingv1.AIInference) (time.Time, bool) {
	if c := obj.Status.ReadyFor(obj.Generation); c != nil {
		return c.LastTransitionTime.Time, true
	}
	return time.Time{}, false
}

// failureOf is the status record of a pod's latest failed load.
func failureOf(p podView, now time.Time) *servingv1.LoadFailure {
	exit := p.LoaderLastFailure
	if exit == nil {
		// The kubelet counted a restart but no longer shows the run that failed.
		exit = &loaderExit{Reason: loadspec.ReasonTransient, Message: "the model loader exited; its exit is no longer shown", Finished: now}
	}
	return &servingv1.LoadFailure{
		Reason:    exit.Reason,
		Message:   exit.Message,
		Pod:       p.Name,
		ExitCode:  exit.ExitCode,
		Retryable: exit.ExitCode == 0 || loadspec.IsRetryableExit(exit.ExitCode),
		Time:      metav1.NewTime(exit.Finished.Truncate(time.Second)),
	}
}

// loaderBudget is what the loaders are told: how many runs a pod may make, how
// long to wait between them, and whether loads stopped.
func loaderBudget(obj *servingv1.AIInference, a loadAssessment) loadspec.Budget {
	b := loadspec.Budget{
		Epoch:       a.budget.Epoch,
		MaxAttempts: int(obj.MaxRetries()) + 1,
		Backoff:     loadspec.Duration{Duration: obj.Backoff()},
	}
	if reason := a.halted(); reason != "" {
		b.Halt = &loadspec.Failure{Reason: reason, Message: haltMessage(obj, a)}
	}
	return b
}

// haltMessage says why loads stopped and how to start them again.
func haltMessage(obj *servingv1.AIInference, a loadAssessment) string {
	what := "a load failed permanently"
	if a.halted() == servingv1.ReasonRetriesExhausted {
		what = fmt.Sprintf("%d loads failed, past loading.maxRetries (%d)", a.failed, obj.MaxRetries())
	}
	if f := a.failure; f != nil {
		what += fmt.Sprintf("; last on pod %s (%s): %s", f.Pod, f.Reason, f.Message)
	}
	return what + "; fix the cause, then change the spec or set the " + servingv1.AnnotationRequestedAt + " annotation to retry"
}

func minPositive(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// keptAssessment keeps the budget as status holds it, for a pass that could not
// see the pods.
func keptAssessment(obj *servingv1.AIInference) loadAssessment {
	a := loadAssessment{failed: obj.Status.LoadRetries, failure: obj.Status.LastFailure}
	if b := obj.Status.LoadBudget; b != nil {
		a.budget = *b.DeepCopy()
	}
	return a
}
