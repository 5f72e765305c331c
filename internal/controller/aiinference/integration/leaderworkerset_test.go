package integration

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// TestLeaderWorkerSetMissing: replicas that span nodes in a cluster that
// does not serve LeaderWorkerSets (this API server has no such CRD) make no
// pod and say what to install. (With the real controller: test/e2e's
// TestAReplicaOverTwoNodesIsPlacedRestartedAndScaledAsOneGroup.)
func TestLeaderWorkerSetMissing(t *testing.T) {
	t.Parallel()
	g, _, key := startInference(t, "no-lws", func(o *servingv1.AIInference) {
		o.Spec.GPU = servingv1.GPUSpec{Count: 8, Products: []string{"NVIDIA-H100-80GB-HBM3"}, Nodes: 2}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonLeaderWorkerSetMissing))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("install it (docs/multinode.md), or set spec.gpu.nodes to 1"))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
	})
	g.Expect(apierrors.IsNotFound(k8s.Get(t.Context(), key, &appsv1.Deployment{}))).To(BeTrue(), "no single-node pods either")
}
