package aiinference

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/reasons"
)

// recordEvents makes an event for each rollout decision of the pass and one
// per change of the Ready reason.
func (r *Reconciler) recordEvents(obj *servingv1.AIInference, before *servingv1.AIInferenceStatus, s *scope) {
	if s.obs.rollout != nil {
		for _, d := range s.obs.rollout.decisions {
			eventType := corev1.EventTypeNormal
			if servingv1.IsWarningDecision(d.Decision) {
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
	if reasons.Explain(after.Reason).Warning {
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
