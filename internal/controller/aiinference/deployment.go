package aiinference

import (
	"context"
	"fmt"
	"maps"
	"math"
	"time"

	"go.opentelemetry.io/otel/trace"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

// progressDeadline is the Deployment's progress deadline: room for every load
// attempt the budget allows with its back-offs, one warm-up, and scheduling, so a
// slow load is never reported as a stalled rollout before the budget decides.
func progressDeadline(obj *servingv1.AIInference) int32 {
	attempts := int(obj.MaxRetries()) + 1
	total := time.Duration(attempts+1)*obj.LoadTimeout() + 5*time.Minute
	for n := 1; n < attempts; n++ {
		total += loadspec.RetryDelay(obj.Backoff(), n)
	}
	return int32(min(total.Seconds(), math.MaxInt32))
}

// desiredDeployment is the model server: an init container that loads the model
// into the cache volume, then the engine, gated by probes on its health endpoint
// and by the warm-up gate's first completion.
// configHash is the hash of the loader ConfigMap, so a changed configuration rolls
// the pods.
func desiredDeployment(obj *servingv1.AIInference, eng engine.Engine, opts Options, configHash string) *appsv1.Deployment {
	template := podTemplate(obj, eng, opts)
	if template.Annotations == nil {
		template.Annotations = map[string]string{}
	}
	template.Annotations[servingv1.AnnotationTemplateHash] = hashOf(template, configHash)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: childMeta(obj, obj.Name),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(obj.DesiredReplicas()),
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(obj)},
			// A new replica must be ready before an old one goes, so a rollout never
			// drops serving capacity below the desired count.
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
				},
			},
			RevisionHistoryLimit:    ptr.To[int32](3),
			ProgressDeadlineSeconds: ptr.To(progressDeadline(obj)),
			Template:                template,
		},
	}
}

// podTemplateHash is the template hash of the desired Deployment's pods.
func podTemplateHash(d *appsv1.Deployment) string {
	return d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
}

// DesiredDeployment is the Deployment the operator makes for obj, built as a
// reconcile builds it: the scale benchmark runs the same pods without the
// operator as its baseline.
func DesiredDeployment(obj *servingv1.AIInference, opts Options) (*appsv1.Deployment, error) {
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		return nil, err
	}
	config, err := desiredConfig(obj)
	if err != nil {
		return nil, err
	}
	return desiredDeployment(obj, eng, opts, hashOf(config)), nil
}

// desiredCanaryDeployment runs the desired pods as canaries: the same template
// and revision as the stable Deployment would get, marked as canary and reading
// the canary's ConfigMap. A new canary revision replaces its pods one by one
// without a surge, as GPUs are scarce.
func desiredCanaryDeployment(obj *servingv1.AIInference, desired *appsv1.Deployment, replicas int32) *appsv1.Deployment {
	d := desired.DeepCopy()
	d.Name = obj.CanaryName()
	d.Labels[servingv1.LabelTrack] = servingv1.TrackCanary
	selector := maps.Clone(selectorLabels(obj))
	selector[servingv1.LabelTrack] = servingv1.TrackCanary
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: selector}
	d.Spec.Replicas = ptr.To(replicas)
	d.Spec.Template.Labels[servingv1.LabelTrack] = servingv1.TrackCanary
	for i := range d.Spec.Template.Spec.Volumes {
		if v := &d.Spec.Template.Spec.Volumes[i]; v.Name == configVolume && v.ConfigMap != nil {
			v.ConfigMap.Name = obj.CanaryLoaderConfigMapName()
		}
	}
	d.Spec.Strategy = noSurgeStrategy()
	return d
}

// noSurgeStrategy replaces pods one at a time, taking one down before starting
// its successor: the GPUs a canary rollout may use are already in use.
func noSurgeStrategy() appsv1.DeploymentStrategy {
	return appsv1.DeploymentStrategy{
		Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			MaxSurge:       ptr.To(intstr.FromInt32(0)),
		},
	}
}

// desiredStableDeployment is the stable Deployment in a canary rollout: the
// desired one, or, while a canary runs or after it was rolled back, the template
// it runs now. Its replicas make room for the canary, and it replaces pods
// without a surge (the canary holds the surge).
func desiredStableDeployment(desired, observed *appsv1.Deployment, plan *rolloutPlan) *appsv1.Deployment {
	d := desired.DeepCopy()
	if plan.keepStableTemplate && observed != nil {
		d.Spec.Template = *observed.Spec.Template.DeepCopy()
	}
	d.Spec.Replicas = ptr.To(plan.stableReplicas)
	d.Spec.Strategy = noSurgeStrategy()
	return d
}

func (r *Reconciler) reconcileDeployment(ctx context.Context, s *scope) error {
	if s.obj.SpansNodes() {
		return r.reconcileLeaderWorkerSet(ctx, s)
	}
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
	if err := r.retireOtherForm(ctx, s); err != nil {
		return err
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
