// Package aiinference holds the AIInference controller: it turns one AIInference
// into a loader ConfigMap, a Deployment whose init container pre-loads the model,
// a Service that only routes to ready pods (and optionally a cache PVC), and
// reports in status what it observed.
package aiinference

import (
	"context"
	"errors"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// FieldOwner is the server-side apply field manager of the operator.
const FieldOwner = "aiinference-operator"

// waitingRequeue is how often an object that waits on something the operator does
// not watch (a PVC a user has yet to create, a CRD not installed yet) is looked at again.
const waitingRequeue = 30 * time.Second

// staleRequeue is how soon a pass whose status write met a newer object than
// its cached one is run again.
const staleRequeue = 200 * time.Millisecond

// Reconciler reconciles AIInference objects.
type Reconciler struct {
	client.Client
	// APIReader reads objects the cache does not hold (users' PVCs).
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  recorder.EventRecorder
	Options   Options
	// Logs reads crash-looping engines' logs; nil: not read.
	Logs LogReader
	// Analyzer judges canaries on their metrics; nil: every analysis run is
	// Inconclusive.
	Analyzer Analyzer
	// Now is the clock; tests may replace it.
	Now func() time.Time

	// apis remembers which optional traffic kinds the cluster serves.
	apis servedAPIs
	// verified remembers the Deployment generations known to hold the desired
	// pod spec, which the cache does not keep.
	verified verifiedGenerations
}

// scope is what one reconcile pass knows.
type scope struct {
	// obj is the AIInference being reconciled.
	obj *servingv1.AIInference
	// now is the time of this pass.
	now time.Time
	// engine is the model server's knowledge.
	engine engine.Engine
	// config is the loader configuration, part of the pod template through its hash.
	config string
	// deployment is the desired Deployment; templateHash identifies its pods.
	deployment   *appsv1.Deployment
	templateHash string
	// loads is the verdict on the loads and the retry budget.
	loads loadAssessment
	// obs collects the observations the status is derived from; filled by every step.
	obs observation
	// mu guards what steps that run at once write to obs; conflictKindRank is
	// the conflictOrder of obs.nameConflict.
	mu               sync.Mutex
	conflictKindRank int
}

// +kubebuilder:rbac:groups=serving.aiinference.io,resources=aiinferences,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=serving.aiinference.io,resources=aiinferences/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;configmaps;persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods/log,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch;create;update;patch;delete

// Reconcile brings the children of one AIInference in line with its spec and
// writes what it observed to its status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	ctx, span := tracer.Start(ctx, "Reconcile", trace.WithAttributes(attrNamespace.String(req.Namespace), attrName.String(req.Name)))
	defer func() {
		ctrl.LoggerFrom(ctx).V(1).Info("Reconciled", "requeueAfter", result.RequeueAfter, "failed", retErr != nil)
		span.SetAttributes(attribute.String("requeueAfter", result.RequeueAfter.String()))
		endWith(span, retErr)
		span.End()
	}()
	if sc := span.SpanContext(); sc.IsValid() {
		ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("traceID", sc.TraceID().String()))
	}
	obj := &servingv1.AIInference{}
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			metricsState.forget(req.NamespacedName)
			r.verified.forget(req.NamespacedName)
			span.SetAttributes(attrDecision.String("skipped"), attrWhy.String("the AIInference is gone"))
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if isCanary(obj) {
		// A canary rollout's state (step, timers, analysis runs) is the status the
		// last pass wrote, which the cache may not hold yet: a plan made from an
		// older status would undo that pass's decisions (scale the canary back up
		// after its promotion). So it is read from the API server.
		if err := r.APIReader.Get(ctx, req.NamespacedName, obj); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	span.SetAttributes(attrGeneration.Int64(obj.Generation))
	if !obj.DeletionTimestamp.IsZero() {
		// Children carry owner references; the garbage collector removes them.
		metricsState.forget(req.NamespacedName)
		span.SetAttributes(attrDecision.String("skipped"), attrWhy.String("the AIInference is being deleted; the garbage collector removes its children"))
		return ctrl.Result{}, nil
	}
	if msg := obj.DecodeError(); msg != "" {
		// Stored in another form without conversion: say so, and touch nothing.
		s := &scope{obj: obj, now: r.Now()}
		s.obs.referenceProblem = &problem{servingv1.ReasonUndecodableSpec, msg + "; it was probably written as v1alpha1 while no conversion webhook ran. " +
			"Apply the object again as " + servingv1.GroupVersion.String() + " (see docs/api-versions.md), or install the operator with its webhooks (config/default, or the chart's webhook.enabled)"}
		span.SetAttributes(attrDecision.String("skipped"), attrWhy.String("the stored spec cannot be read"))
		err := r.patchStatus(ctx, s)
		if apierrors.IsInvalid(err) {
			// The API server validates the whole object on a status write, and its
			// spec fails the schema: an event is all that can carry the message,
			// and retrying cannot help until someone applies the object again.
			r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, servingv1.ReasonUndecodableSpec, "Reconcile", "%s (its status cannot be written either: %v)", s.obs.referenceProblem.message, err)
			return ctrl.Result{}, reconcile.TerminalError(err)
		}
		return ctrl.Result{}, err
	}
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		// Admission only admits known engines; an unknown one cannot be fixed by retrying.
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	s := &scope{obj: obj, now: r.Now(), engine: eng}

	defer func() {
		err := traced(ctx, "patchStatus", func(ctx context.Context) error { return r.patchStatus(ctx, s) })
		if apierrors.IsConflict(err) {
			// The pass started from a cached object older than the stored one:
			// look again once the cache has it.
			result, err = lowestRequeue(result, ctrl.Result{RequeueAfter: staleRequeue}), nil
		}
		if err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
	}()
	result, err = r.reconcileSteps(ctx, s)
	if err != nil {
		// Shown in status, and the pass is retried with the controller's back-off.
		s.obs.stepError = err
	}
	return result, err
}

// reconcileSteps observes, then brings each child in line. A step that fails stops
// the steps that depend on it: the Deployment names the ConfigMap's hash and the
// cache claim, so it is not written while those are not.
func (r *Reconciler) reconcileSteps(ctx context.Context, s *scope) (ctrl.Result, error) {
	var result ctrl.Result
	if msg := s.obj.NameProblem(); msg != "" {
		// Admitted before admission refused such names: no child can take it, so
		// none is written, and nothing but a new object can fix it.
		s.obs.referenceProblem = &problem{servingv1.ReasonInvalidName, msg + "; create the AIInference again under a name that fits"}
		skipped(ctx, "reconcileSteps", "the name cannot be given to the children")
		return result, nil
	}
	err := traced(ctx, "checkReferences", func(ctx context.Context) (err error) {
		result, err = r.checkReferences(ctx, s)
		if p := s.obs.referenceProblem; p != nil {
			trace.SpanFromContext(ctx).SetAttributes(attribute.String("problem", p.reason), attribute.String("problem.message", p.message))
		}
		return err
	})
	if err != nil {
		return result, err
	}
	if s.config, err = desiredConfig(s.obj); err != nil {
		return result, reconcile.TerminalError(err)
	}
	s.deployment = desiredDeployment(s.obj, s.engine, r.Options, hashOf(s.config))
	s.templateHash = podTemplateHash(s.deployment)
	if err := traced(ctx, "observe", func(ctx context.Context) error {
		err := r.observe(ctx, s)
		recordLoads(ctx, s)
		return err
	}); err != nil {
		return result, err
	}
	result = lowestRequeue(result, ctrl.Result{RequeueAfter: s.loads.requeue})
	if isCanary(s.obj) && s.obs.podsSeen && s.obs.referenceProblem == nil {
		_ = traced(ctx, "planRollout", func(ctx context.Context) error {
			r.planRollout(ctx, s)
			return nil
		})
		result = lowestRequeue(result, ctrl.Result{RequeueAfter: s.obs.rollout.requeue})
	}

	var errs []error
	var errsMu sync.Mutex
	run := func(name string, step func(context.Context, *scope) error) error {
		err := traced(ctx, name, func(ctx context.Context) error { return step(ctx, s) })
		if err != nil {
			errsMu.Lock()
			errs = append(errs, err)
			errsMu.Unlock()
		}
		return err
	}
	// Two rounds of writes. First, at once, what depends on nothing: the
	// loader's ConfigMap and the cache claim, the Service and the traffic
	// objects. Then the Deployment, which names the ConfigMap's hash and the
	// claim, and which is not written while a child's name is taken (pods that
	// no Service of theirs would reach would hold GPUs for nothing).
	dependenciesOK := true
	var writes sync.WaitGroup
	writes.Go(func() {
		for _, step := range []struct {
			name string
			fn   func(context.Context, *scope) error
		}{{"reconcileConfigMap", r.reconcileConfigMap}, {"reconcileCachePVC", r.reconcileCachePVC}} {
			if run(step.name, step.fn) != nil {
				dependenciesOK = false
			}
		}
	})
	writes.Go(func() { _ = run("reconcileService", r.reconcileService) })
	if s.obs.referenceProblem == nil {
		writes.Go(func() { _ = run("reconcileTraffic", r.reconcileTraffic) })
	}
	writes.Wait()
	switch {
	case s.obs.referenceProblem != nil:
		skipped(ctx, "reconcileDeployment", "a referenced object is missing: "+s.obs.referenceProblem.reason)
	case !dependenciesOK:
		skipped(ctx, "reconcileDeployment", "a step it depends on failed (the loader ConfigMap or the cache claim)")
	case s.obs.nameConflict != nil:
		skipped(ctx, "reconcileDeployment", "a child's name is taken: "+s.obs.nameConflict.message)
	default:
		_ = run("reconcileDeployment", r.reconcileDeployment)
	}
	_ = run("replacePods", r.replacePods)
	if s.obs.nameConflict != nil {
		// The operator does not watch objects it does not own: look again later.
		result = lowestRequeue(result, ctrl.Result{RequeueAfter: waitingRequeue})
	}
	return result, kerrors.NewAggregate(errs)
}

// lowestRequeue merges two results, keeping the soonest non-zero requeue.
func lowestRequeue(a, b ctrl.Result) ctrl.Result {
	switch {
	case a.RequeueAfter == 0:
		return b
	case b.RequeueAfter == 0 || a.RequeueAfter < b.RequeueAfter:
		return a
	}
	return b
}

// patchStatus derives the status from this pass's observations and writes it only
// when it changed, with an event when the Ready reason changes.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope) error {
	obj := s.obj
	status := computeStatus(obj, s.obs, s.loads, s.now)
	recordStatus(ctx, &obj.Status, &status)
	if equality.Semantic.DeepEqual(obj.Status, status) {
		metricsState.record(obj, &status, &status, s.now)
		return nil
	}
	after := meta.FindStatusCondition(status.Conditions, servingv1.ConditionReady)

	original := obj.DeepCopy()
	obj.Status = status
	// A merge patch carries only what differs from the object the pass started
	// from. When the cache had not yet seen the last pass's status write, a field
	// this pass sets back to its older value would be left out, and the last
	// pass's value would stay (Ready saying SecretNotFound, the phase still
	// Loading): the resourceVersion in the patch makes the API server refuse it
	// then, and the pass is run again (see Reconcile).
	if err := r.Status().Patch(ctx, obj, client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{})); err != nil {
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return client.IgnoreNotFound(err)
	}
	readyReasonMoved := metricsState.record(obj, &original.Status, &status, s.now)
	if s.obs.rollout != nil {
		for _, d := range s.obs.rollout.decisions {
			eventType := corev1.EventTypeNormal
			if warningDecisions[d.Decision] {
				eventType = corev1.EventTypeWarning
			}
			r.Recorder.Eventf(obj, nil, eventType, d.Decision, "Rollout", "Revision %s, step %d, canary weight %d%%: %s", d.Revision, d.Step+1, d.Weight, d.Message)
		}
		metricsState.countDecisions(client.ObjectKeyFromObject(obj), s.obs.rollout.decisions)
	}
	// One event per change of the Ready reason, counted against what this
	// process last saw rather than the cached status the pass started from.
	if readyReasonMoved {
		eventType := corev1.EventTypeNormal
		if warningReasons[after.Reason] {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(obj, nil, eventType, after.Reason, "Reconcile", "%s", after.Message)
	}
	return nil
}

// warningReasons are the Ready reasons that need a person's attention.
var warningReasons = map[string]bool{
	servingv1.ReasonLoadFailed:               true,
	servingv1.ReasonRetriesExhausted:         true,
	servingv1.ReasonRetryingLoad:             true,
	servingv1.ReasonEngineCrashLooping:       true,
	servingv1.ReasonWarmupFailed:             true,
	servingv1.ReasonPodStartFailed:           true,
	servingv1.ReasonUnschedulable:            true,
	servingv1.ReasonSecretNotFound:           true,
	servingv1.ReasonSecretKeyMissing:         true,
	servingv1.ReasonPVCNotFound:              true,
	servingv1.ReasonNameConflict:             true,
	servingv1.ReasonInvalidName:              true,
	servingv1.ReasonUndecodableSpec:          true,
	servingv1.ReasonReconcileError:           true,
	servingv1.ReasonPodCreateFailed:          true,
	servingv1.ReasonProgressDeadlineExceeded: true,
}

// SetupWithManager registers the controller, reconciling up to concurrency
// objects at once. Pods are watched through the label their template carries,
// since their owner is a ReplicaSet, not the AIInference.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	b := ctrl.NewControllerManagedBy(mgr).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(concurrency, 1)}).
		// A new generation, or a retry asked for through the requestedAt annotation.
		For(&servingv1.AIInference{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.PersistentVolumeClaim{})
	// The traffic APIs are optional: their objects are watched when the cluster
	// serves them at start-up.
	if r.served(httpRouteKind) {
		b = b.Owns(&gatewayv1.HTTPRoute{})
	}
	if r.served(inferencePoolKind) {
		b = b.Owns(&inferencev1.InferencePool{})
	}
	return b.
		Watches(&servingv1.AIInference{}, unansweredFirst).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToInference)).
		Named("aiinference").
		Complete(r)
}

// unansweredFirst queues, at normal priority, the objects of the informer's
// first list whose spec no status has answered yet: created, or changed, while
// no operator ran. controller-runtime queues the whole first list at low
// priority so that fresh events go first; on a busy cluster an object no pass
// has seen then waits behind every pod event, with an empty status, for as long
// as events keep coming (90 s and more in the e2e suite). Objects whose status
// is current keep the low priority For gives them; the queue keeps the higher
// of the two.
var unansweredFirst = handler.Funcs{
	CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
		if !ok || !e.IsInInitialList {
			return
		}
		if obj, ok := e.Object.(*servingv1.AIInference); ok && obj.Status.ObservedGeneration < obj.Generation {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(0)}, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
		}
	},
}

func podToInference(_ context.Context, obj client.Object) []reconcile.Request {
	name, ok := obj.GetLabels()[servingv1.LabelInference]
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
}

// conflictOrder ranks the kinds of children whose name may be taken, so that a
// pass reports the same conflict whichever step finds its own first.
var conflictOrder = map[string]int{"ConfigMap": 1, "PersistentVolumeClaim": 2, "Deployment": 3, "Service": 4, "InferencePool": 5, "HTTPRoute": 6}

// noteConflict records that a child's name is taken.
func (s *scope) noteConflict(kind string, p *problem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs.nameConflict == nil || conflictOrder[kind] < s.conflictKindRank {
		s.obs.nameConflict, s.conflictKindRank = p, conflictOrder[kind]
	}
}

// noteChange records that this pass wrote a child.
func (s *scope) noteChange() {
	s.mu.Lock()
	s.obs.childChanged = true
	s.mu.Unlock()
}
