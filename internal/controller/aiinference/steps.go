package aiinference

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
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
	if err != nil {
		return err
	}
	// Users' PVCs and CRDs are not watched: see unwatchedReasons.
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

// reconcileConfigMap writes the loader configuration. In a canary rollout the
// canary has its own, and the stable pods keep theirs until promotion: a
// restarted stable pod must load the stable model.
func (r *Reconciler) reconcileConfigMap(ctx context.Context, s *scope) error {
	budget := loaderBudget(s.obj, s.loads)
	canary, err := desiredCanaryConfigMap(s.obj, s.config, budget)
	if err != nil {
		return err
	}
	if s.obs.rollout.canaryActive() {
		if _, err := r.apply(ctx, s, canary, &corev1.ConfigMap{}); err != nil {
			return err
		}
	} else if err := r.deleteOwned(ctx, s, canary, &corev1.ConfigMap{}); err != nil {
		return err
	}
	if isCanary(s.obj) && (s.obs.rollout == nil || s.obs.rollout.keepStableTemplate) {
		trace.SpanFromContext(ctx).SetAttributes(attrDecision.String("skipped"), attrWhy.String("the stable pods keep their configuration during a canary rollout"))
		return nil
	}
	cm, err := desiredConfigMap(s.obj, s.config, budget)
	if err != nil {
		return err
	}
	_, err = r.apply(ctx, s, cm, &corev1.ConfigMap{})
	return err
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

func (r *Reconciler) reconcileDeployment(ctx context.Context, s *scope) error {
	desired := s.deployment
	if s.obs.rollout != nil {
		desired = desiredStableDeployment(s.deployment, s.obs.deployment, s.obs.rollout)
	}
	existing := &appsv1.Deployment{}
	res, err := r.apply(ctx, s, desired, existing)
	if err != nil {
		return err
	}
	if res == applyUnchanged || res == applyUpdated {
		s.obs.deployment = existing
	}
	return r.reconcileCanaryDeployment(ctx, s)
}

// reconcileCanaryDeployment runs the canary's pods while the plan wants them and
// removes them otherwise. A new canary waits until the stable set has shrunk to
// make room for it, so that its pods do not sit unschedulable on a full cluster.
func (r *Reconciler) reconcileCanaryDeployment(ctx context.Context, s *scope) error {
	desired := desiredCanaryDeployment(s.obj, s.deployment, 1)
	if !s.obs.rollout.canaryActive() {
		return r.deleteOwned(ctx, s, desired, &appsv1.Deployment{})
	}
	desired.Spec.Replicas = ptr.To(s.obs.rollout.canaryReplicas)
	if stable := s.obs.deployment; s.obs.canary == nil && stable != nil && stable.Status.Replicas > s.obs.rollout.stableReplicas {
		trace.SpanFromContext(ctx).SetAttributes(attrDecision.String("skipped"), attrWhy.String("the stable pods are making room for the canary"))
		return nil
	}
	_, err := r.apply(ctx, s, desired, &appsv1.Deployment{})
	return err
}

func (r *Reconciler) reconcileService(ctx context.Context, s *scope) error {
	svc := desiredService(s.obj, s.engine)
	res, err := r.apply(ctx, s, svc, &corev1.Service{})
	if err != nil || res == applyConflict {
		return err
	}
	s.mu.Lock()
	s.obs.endpoint = fmt.Sprintf("http://%s.%s.svc:%d", svc.Name, svc.Namespace, svc.Spec.Ports[0].Port)
	s.mu.Unlock()
	return nil
}

// replacePods deletes the pods the load assessment gave up on (a hung loader, or
// a failed one when the user asked for a retry); their ReplicaSet starts fresh ones.
func (r *Reconciler) replacePods(ctx context.Context, s *scope) error {
	for _, p := range s.loads.deletePods {
		ctrl.LoggerFrom(ctx).Info("Deleting pod so its ReplicaSet starts a fresh load", "pod", klog.KRef(s.obj.Namespace, p.Name),
			"loadRetries", s.loads.failed, "maxRetries", s.obj.MaxRetries())
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.obj.Namespace, Name: p.Name}}
		if err := r.Delete(ctx, pod, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting pod %s: %w", p.Name, err)
		}
	}
	return nil
}
