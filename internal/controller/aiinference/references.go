package aiinference

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// checkReferences looks up the PVCs the spec names, and the APIs its Gateway
// traffic needs. A missing one stops the Deployment from being applied (its pods
// could not start, or could not be routed to as asked) and is reported.
//
// The credentials Secrets the spec names are not read: the operator may not read
// Secrets. The kubelet says when one or a key of it is missing, in the status of
// the pod that cannot start (see missingSecret).
func (r *Reconciler) checkReferences(ctx context.Context, s *scope) error {
	obj := s.obj
	var p *problem
	var err error
	if src := obj.Spec.Model.Source; src.PVC != nil {
		p, err = r.checkPVC(ctx, obj.Namespace, src.PVC.ClaimName, "spec.model.source.pvc.claimName")
	}
	if err == nil && p == nil {
		if cache := resolvedCache(obj); cache.Type == servingv1.CachePVC && cache.PVC.ClaimName != "" {
			p, err = r.checkPVC(ctx, obj.Namespace, cache.PVC.ClaimName, "spec.cache.pvc.claimName")
		}
	}
	if err == nil && p == nil && resolvedCache(obj).Type == servingv1.CacheNode {
		p, err = r.checkNodeCacheInstalled(ctx)
	}
	if err == nil && p == nil {
		p = r.checkTrafficAPIs(s)
	}
	if err == nil && p == nil && obj.SpansNodes() && !r.served(leaderWorkerSetKind) {
		p = &problem{servingv1.ReasonLeaderWorkerSetMissing, fmt.Sprintf(
			"spec.gpu.nodes %d runs each replica as a LeaderWorkerSet group, which needs the LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1, v0.7 or later), and this cluster does not serve LeaderWorkerSets; install it (docs/multinode.md), or set spec.gpu.nodes to 1",
			obj.NodesPerReplica())}
	}
	if err != nil {
		return err
	}
	// Users' PVCs and CRDs are not watched: see reasons.Explanation.Unwatched.
	s.obs.referenceProblem = p
	return nil
}

func (r *Reconciler) checkPVC(ctx context.Context, namespace, name, field string) (*problem, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return &problem{servingv1.ReasonPVCNotFound, fmt.Sprintf(
				"PersistentVolumeClaim %q named in %s does not exist in namespace %s; create it or fix the name", name, field, namespace)}, nil
		}
		return nil, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", namespace, name, err)
	}
	return nil, nil
}
