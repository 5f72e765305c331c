package aiinference

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// checkReferences looks up the Secrets and PVCs the spec names. A missing one stops
// the Deployment from being applied (its pods could not start) and is reported.
func (r *Reconciler) checkReferences(ctx context.Context, s *scope) (ctrl.Result, error) {
	obj := s.obj
	src := obj.Spec.Model.Source
	var p *problem
	var err error
	switch {
	case src.S3 != nil && src.S3.CredentialsSecretRef != nil:
		ref := src.S3.CredentialsSecretRef
		p, err = r.checkSecret(ctx, obj.Namespace, ref.Name, "spec.model.source.s3.credentialsSecretRef", accessKeyIDKey(ref), secretAccessKeyKey(ref))
	case src.HTTP != nil && src.HTTP.BearerTokenSecretRef != nil:
		ref := src.HTTP.BearerTokenSecretRef
		p, err = r.checkSecret(ctx, obj.Namespace, ref.Name, "spec.model.source.http.bearerTokenSecretRef", ref.Key)
	case src.PVC != nil:
		p, err = r.checkPVC(ctx, obj.Namespace, src.PVC.ClaimName, "spec.model.source.pvc.claimName")
	}
	if err == nil && p == nil {
		if cache := resolvedCache(obj); cache.Type == servingv1.CachePVC && cache.PVC.ClaimName != "" {
			p, err = r.checkPVC(ctx, obj.Namespace, cache.PVC.ClaimName, "spec.cache.pvc.claimName")
		}
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	s.obs.referenceProblem = p
	if p != nil {
		// Secrets and foreign PVCs are not watched (that would cache every Secret in
		// the cluster), so look again after a while.
		return ctrl.Result{RequeueAfter: waitingRequeue}, nil
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) checkSecret(ctx context.Context, namespace, name, field string, keys ...string) (*problem, error) {
	secret := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return &problem{servingv1.ReasonSecretNotFound, fmt.Sprintf(
				"Secret %q named in %s does not exist in namespace %s; create it with the keys %v", name, field, namespace, keys)}, nil
		}
		return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, name, err)
	}
	for _, key := range keys {
		if _, ok := secret.Data[key]; !ok {
			return &problem{servingv1.ReasonSecretKeyMissing, fmt.Sprintf(
				"Secret %q named in %s has no key %q; add it, or name the key that holds it", name, field, key)}, nil
		}
	}
	return nil, nil
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

func (r *Reconciler) reconcileConfigMap(ctx context.Context, s *scope) (ctrl.Result, error) {
	cm, err := desiredConfigMap(s.obj)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.configHash = hashOf(cm.Data)
	_, err = r.apply(ctx, s, cm, &corev1.ConfigMap{})
	return ctrl.Result{}, err
}

func (r *Reconciler) reconcileCachePVC(ctx context.Context, s *scope) (ctrl.Result, error) {
	pvc := desiredCachePVC(s.obj)
	if pvc == nil {
		return ctrl.Result{}, nil
	}
	existing := &corev1.PersistentVolumeClaim{}
	err := r.Get(ctx, client.ObjectKeyFromObject(pvc), existing)
	switch {
	case err == nil:
		// A claim's size and class are (mostly) immutable once bound: keep the one made.
		return ctrl.Result{}, nil
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	_, err = r.apply(ctx, s, pvc, existing)
	return ctrl.Result{}, err
}

func (r *Reconciler) reconcileDeployment(ctx context.Context, s *scope) (ctrl.Result, error) {
	desired := desiredDeployment(s.obj, s.engine, r.Options, s.configHash)
	s.templateHash = podTemplateHash(desired)
	existing := &appsv1.Deployment{}
	if s.obs.referenceProblem != nil {
		// Keep what runs; only observe it.
		if err := r.Get(ctx, client.ObjectKeyFromObject(desired), existing); err == nil {
			s.obs.deployment = existing
		} else if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, nil
	}
	found, err := r.apply(ctx, s, desired, existing)
	if err != nil {
		return ctrl.Result{}, err
	}
	if found {
		s.obs.deployment = existing
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) reconcileService(ctx context.Context, s *scope) (ctrl.Result, error) {
	_, err := r.apply(ctx, s, desiredService(s.obj, s.engine), &corev1.Service{})
	return ctrl.Result{}, err
}

// reconcilePods observes the pods and retries failed loads: deleting the failed pod
// lets its ReplicaSet start a fresh attempt (the loader resumes what it had fetched
// when the cache survives).
func (r *Reconciler) reconcilePods(ctx context.Context, s *scope) (ctrl.Result, error) {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(s.obj.Namespace), client.MatchingLabels(selectorLabels(s.obj))); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing pods: %w", err)
	}
	s.obs.pods = observePods(pods.Items, s.templateHash)
	plan := planRetries(s.obj, s.obs.pods, s.now)
	s.obs.retry = plan

	var result ctrl.Result
	if p := plan.deletePod; p != nil {
		log := ctrl.LoggerFrom(ctx)
		log.Info("Deleting pod to retry the model load", "pod", klog.KRef(s.obj.Namespace, p.Name),
			"reason", plan.failure.Reason, "retry", plan.retries, "maxRetries", maxRetries(s.obj))
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.obj.Namespace, Name: p.Name}}
		if err := r.Delete(ctx, pod, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting pod %s to retry its load: %w", p.Name, err)
		}
	}
	if plan.wait > 0 {
		result.RequeueAfter = plan.wait
	}
	if plan.terminalReason == "" && plan.nextTimeout > 0 {
		result = lowestRequeue(result, ctrl.Result{RequeueAfter: plan.nextTimeout})
	}
	return result, nil
}

// apply writes a child with server-side apply, owned by the AIInference, unless the
// child already carries the hash of the same desired state: a pass with nothing to
// change makes no write. It reports whether the child existed, and fills existing
// with it.
func (r *Reconciler) apply(ctx context.Context, s *scope, desired, existing client.Object) (bool, error) {
	hash := hashOf(desired)
	annotations := desired.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnotationSpecHash] = hash
	desired.SetAnnotations(annotations)
	if err := controllerutil.SetControllerReference(s.obj, desired, r.Scheme); err != nil {
		return false, err
	}

	found := true
	if err := r.Get(ctx, client.ObjectKeyFromObject(desired), existing); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		found = false
	}
	if found && existing.GetAnnotations()[AnnotationSpecHash] == hash && metav1.IsControlledBy(existing, s.obj) {
		return true, nil
	}

	kind := desired.GetObjectKind().GroupVersionKind().Kind
	ctrl.LoggerFrom(ctx).Info("Applying "+kind, kind, klog.KObj(desired))
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return false, fmt.Errorf("converting %s: %w", kind, err)
	}
	delete(content, "status")
	u := &unstructured.Unstructured{Object: content}
	if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return found, fmt.Errorf("applying %s %s: %w", kind, desired.GetName(), err)
	}
	// The applied spec is new: whatever status was observed describes the old one.
	s.obs.childChanged = true
	return found, nil
}
