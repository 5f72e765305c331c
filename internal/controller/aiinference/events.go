package aiinference

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

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

// recordEvents makes an event for each rollout decision of the pass and one
// per change of the Ready reason.
func (r *Reconciler) recordEvents(obj *servingv1.AIInference, before *servingv1.AIInferenceStatus, s *scope) {
	if s.obs.rollout != nil {
		for _, d := range s.obs.rollout.decisions {
			eventType := corev1.EventTypeNormal
			if warningDecisions[d.Decision] {
				eventType = corev1.EventTypeWarning
			}
			r.Recorder.Eventf(obj, nil, eventType, d.Decision, "Rollout", "Revision %s, step %d, canary weight %d%%: %s", d.Revision, d.Step+1, d.Weight, d.Message)
		}
		metricsState.countDecisions(client.ObjectKeyFromObject(obj), s.obs.rollout.decisions)
	}
	after := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady)
	if after == nil || !r.readyReasons.moved(client.ObjectKeyFromObject(obj), before, after.Reason) {
		return
	}
	eventType := corev1.EventTypeNormal
	if warningReasons[after.Reason] {
		eventType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(obj, nil, eventType, after.Reason, "Reconcile", "%s", after.Message)
}

// readyReasons remembers, per object, the Ready reason of the last event. A
// pass that started from a cached status older than the one the previous pass
// wrote computes the same change again, and it is not a new change: events are
// counted against what this process last recorded, not the status a pass
// started from.
type readyReasons struct {
	mu   sync.Mutex
	last map[types.NamespacedName]string
}

// moved records reason for key and says whether it differs from the last one
// recorded, or, at first sight, from the reason in before.
func (m *readyReasons) moved(key types.NamespacedName, before *servingv1.AIInferenceStatus, reason string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	last, seen := m.last[key]
	if !seen {
		if c := meta.FindStatusCondition(before.Conditions, servingv1.ConditionReady); c != nil {
			last = c.Reason
		}
	}
	if m.last == nil {
		m.last = map[types.NamespacedName]string{}
	}
	m.last[key] = reason
	return last != reason
}

func (m *readyReasons) forget(key types.NamespacedName) {
	m.mu.Lock()
	delete(m.last, key)
	m.mu.Unlock()
}

// warningReasons are the Ready reasons that need a person's attention.
var warningReasons = map[string]bool{
	servingv1.ReasonLoadFailed:               true,
	servingv1.ReasonRetriesExhausted:         true,
	servingv1.ReasonRetryingLoad:             true,
	servingv1.ReasonEngineCrashLooping:       true,
	servingv1.ReasonWarmupFailed:             true,
	servingv1.ReasonPodStartFailed:           true,
	servingv1.ReasonUnschedulable:            true,
	servingv1.ReasonSecretNotFound:           true,
	servingv1.ReasonSecretKeyMissing:         true,
	servingv1.ReasonPVCNotFound:              true,
	servingv1.ReasonNameConflict:             true,
	servingv1.ReasonInvalidName:              true,
	servingv1.ReasonUndecodableSpec:          true,
	servingv1.ReasonReconcileError:           true,
	servingv1.ReasonPodCreateFailed:          true,
	servingv1.ReasonProgressDeadlineExceeded: true,
}
