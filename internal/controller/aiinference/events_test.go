package aiinference

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// One event per change of the Ready reason: a pass that starts from a cached
// status older than the previous pass's write computes the same change again.
func TestOneEventPerReadyReasonChange(t *testing.T) {
	g := NewWithT(t)
	now := time.Now()
	key := types.NamespacedName{Namespace: "events-ns", Name: "llm"}
	pending := servingv1.AIInferenceStatus{Conditions: []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonProgressing, 1, now)}}
	var reasons readyReasons

	g.Expect(reasons.moved(key, &pending, servingv1.ReasonRetryingLoad)).To(BeTrue(), "Ready's reason moved: an event")
	g.Expect(reasons.moved(key, &pending, servingv1.ReasonRetryingLoad)).To(BeFalse(), "the same change again from a stale cache: no second event")
	g.Expect(reasons.moved(key, &pending, servingv1.ReasonReady)).To(BeTrue())

	reasons.forget(key)
	g.Expect(reasons.moved(key, &pending, servingv1.ReasonProgressing)).To(BeFalse(), "at first sight, the reason the status already shows is no change")
}
