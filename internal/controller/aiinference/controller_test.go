package aiinference

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// scope.result is where a pass's errors and waits become its result.
func TestAPassResultIsTheSoonestLookOrItsError(t *testing.T) {
	inference := schema.GroupResource{Group: servingv1.GroupVersion.Group, Resource: "aiinferences"}
	cases := []struct {
		name      string
		scope     *scope
		statusErr error
		requeue   time.Duration
		err       string // "", "retry" or "terminal"
	}{
		{name: "nothing to wait for", scope: &scope{}},
		{name: "a load times out later", scope: &scope{loads: loadAssessment{requeue: 5 * time.Minute}}, requeue: 5 * time.Minute},
		{name: "a missing PVC is not watched", scope: &scope{loads: loadAssessment{requeue: 5 * time.Minute},
			obs: observation{referenceProblem: &problem{reason: servingv1.ReasonPVCNotFound}}}, requeue: waitingRequeue},
		{name: "the node cache is not installed", scope: &scope{obs: observation{referenceProblem: &problem{reason: servingv1.ReasonModelCacheNotInstalled}}}, requeue: waitingRequeue},
		{name: "a name taken by an object not owned", scope: &scope{obs: observation{nameConflict: &problem{reason: servingv1.ReasonNameConflict}}}, requeue: waitingRequeue},
		{name: "an invalid name waits for a person", scope: &scope{obs: observation{referenceProblem: &problem{reason: servingv1.ReasonInvalidName}}}},
		{name: "the rollout's next step is sooner", scope: &scope{loads: loadAssessment{requeue: time.Minute},
			obs: observation{rollout: &rolloutPlan{requeue: 10 * time.Second}}}, requeue: 10 * time.Second},
		{name: "the status write met a newer object", scope: &scope{loads: loadAssessment{requeue: time.Minute}},
			statusErr: apierrors.NewConflict(inference, "llm", errors.New("changed")), requeue: staleRequeue},
		{name: "a step failed", scope: &scope{loads: loadAssessment{requeue: time.Minute}, obs: observation{stepError: errors.New("write failed")}}, err: "retry"},
		{name: "a spec no retry mends", scope: &scope{obs: observation{stepError: specError{errors.New("bad spec")}}}, err: "terminal"},
		{name: "a status the API server refuses", scope: &scope{}, statusErr: apierrors.NewInvalid(schema.GroupKind{Group: inference.Group, Kind: "AIInference"}, "llm", nil), err: "terminal"},
	}
	for _, c := range cases {
		result, err := c.scope.result(c.statusErr)
		got := ""
		switch {
		case errors.Is(err, reconcile.TerminalError(nil)):
			got = "terminal"
		case err != nil:
			got = "retry"
		}
		if got != c.err || result.RequeueAfter != c.requeue {
			t.Errorf("%s: got requeue %v and error %q (%v); want %v and %q", c.name, result.RequeueAfter, got, err, c.requeue, c.err)
		}
	}
}
