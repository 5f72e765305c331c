package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// TestNodeCacheNotInstalled: cache.type Node in a cluster without the node
// cache's CSIDriver makes no pod (it would wait in ContainerCreating with
// nothing in its status to say why) and says what to install; once the driver
// is there, the pods are made. Not parallel: the driver is the cluster's, and
// the parallel tests run after it, with it installed.
func TestNodeCacheNotInstalled(t *testing.T) {
	ctx := context.Background()
	g, _, key := startInference(t, "no-node-cache", func(o *servingv1.AIInference) {
		o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).To(Equal(servingv1.ReasonModelCacheNotInstalled))
		g.Expect(readyCondition(obj).Message).To(ContainSubstring("modelCache.enabled=true"))
		g.Expect(meta.IsStatusConditionTrue(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
		g.Expect(obj.Status.Phase).To(Equal(servingv1.PhasePending))
	})
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key, &appsv1.Deployment{}))).To(BeTrue(), "pods made without the node cache")

	g.Expect(k8s.Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: nodecachespec.DriverName},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}},
	})).To(Succeed())
	// The driver is not watched: the object is looked at again after a while;
	// a change of the object brings that look now.
	updateObject(g, key, func(obj *servingv1.AIInference) {
		obj.Annotations = map[string]string{"test.aiinference.io/touch": "1"}
	})
	getDeployment(g, key)
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(readyCondition(obj).Reason).NotTo(Equal(servingv1.ReasonModelCacheNotInstalled))
		g.Expect(meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionStalled)).To(BeNil())
	})
}
