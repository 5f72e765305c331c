package aiinference

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// desiredCachePVC is the cache claim the operator creates, or nil when the spec does
// not ask for one.
func desiredCachePVC(obj *servingv1.AIInference) *corev1.PersistentVolumeClaim {
	cache := resolvedCache(obj)
	if cache.Type != servingv1.CachePVC || cache.PVC == nil || cache.PVC.Size == nil {
		return nil
	}
	modes := cache.PVC.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: childMeta(obj, obj.CachePVCName()),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      modes,
			StorageClassName: cache.PVC.StorageClassName,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: *cache.PVC.Size},
			},
		},
	}
}

func (r *Reconciler) reconcileCachePVC(ctx context.Context, s *scope) error {
	pvc := desiredCachePVC(s.obj)
	if pvc == nil {
		trace.SpanFromContext(ctx).SetAttributes(attrDecision.String("skipped"), attrWhy.String("the spec asks for no cache claim to create"))
		return nil
	}
	existing := &corev1.PersistentVolumeClaim{}
	found, err := r.getChild(ctx, client.ObjectKeyFromObject(pvc), existing)
	switch {
	case err != nil:
		return fmt.Errorf("reading PersistentVolumeClaim %s: %w", pvc.Name, err)
	case found && metav1.IsControlledBy(existing, s.obj):
		// A claim's size and class are (mostly) immutable once bound: keep the one made.
		trace.SpanFromContext(ctx).SetAttributes(attrDecision.String("unchanged"), attrWhy.String("a claim made once is kept"))
		return nil
	}
	_, err = r.apply(ctx, s, pvc, existing)
	return err
}
