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
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/reasons"
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
	// Activator holds the requests of models at zero; nil: none runs, and no
	// model goes to zero.
	Activator Activator
	// Wake carries the models whose requests the activator holds, for a
	// reconcile at once; nil: none.
	Wake <-chan event.GenericEvent
	// ModelCacheReports holds the nodes' model cache reports (ConfigMaps
	// labelled nodecache.StateLabel, in the cache plugin's namespace), read for
	// status.modelCache and watched; nil: not read, and the field is left out.
	ModelCacheReports cache.Cache
	// RouterEndpoints holds the EndpointSlices of the router's Service
	// (Options.RouterService in Options.OperatorNamespace), which routed
	// models' Services lead to; nil: no router runs, and no model is routed.
	RouterEndpoints cache.Cache

	// apis remembers which optional traffic kinds the cluster serves.
	apis servedAPIs
	// verified remembers the Deployment generations known to hold the desired
	// pod spec, which the cache does not keep.
	verified verifiedGenerations
	// readyReasons remembers the Ready reason of each object's last event.
	readyReasons readyReasons
	// autoscaler remembers each autoscaled object's recent recommendations.
	autoscaler autoscalerMemory
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
	// statusRead is the status the pass started from, kept when a step changes
	// obj.Status for the rest of the pass (the autoscaler's count).
	statusRead *servingv1.AIInferenceStatus
	// router is where the router's ready pods are, for a routed model.
	router routerView
	// mu guards what steps that run at once write to obs; conflictKindRank is
	// the conflictRank of obs.nameConflict's kind.
	mu               sync.Mutex
	conflictKindRank int
}

// +kubebuilder:rbac:groups=serving.aiinference.io,resources=aiinferences,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=serving.aiinference.io,resources=aiinferences/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete;patch
// +kubebuilder:rbac:groups="",resources=pods/log,verbs=get
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

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
			r.forget(req.NamespacedName)
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
		r.forget(req.NamespacedName)
		span.SetAttributes(attrDecision.String("skipped"), attrWhy.String("the AIInference is being deleted; the garbage collector removes its children"))
		return ctrl.Result{}, nil
	}
	s := &scope{obj: obj, now: r.Now()}
	r.observeModelCache(ctx, s)
	// A step's error is shown in status as well as returned.
	s.obs.stepError = r.reconcileSteps(ctx, s)
	statusErr := traced(ctx, "patchStatus", func(ctx context.Context) error { return r.patchStatus(ctx, s) })
	return s.result(statusErr)
}

// forget drops what the operator remembers of an object that is gone.
func (r *Reconciler) forget(key types.NamespacedName) {
	metricsState.forget(key)
	r.verified.forget(key)
	r.readyReasons.forget(key)
	r.autoscaler.forget(key)
	if r.Activator != nil {
		r.Activator.Close(key)
	}
}

// reconcileSteps reads the spec, observes, and brings each child in line. It
// writes no child for a spec it cannot read, a name no child can take, or a
// referenced object that is missing.
func (r *Reconciler) reconcileSteps(ctx context.Context, s *scope) error {
	if p := unusableObject(s.obj); p != nil {
		s.obs.referenceProblem = p
		skipped(ctx, "reconcileSteps", p.message)
		return nil
	}
	var err error
	if s.engine, err = engine.For(s.obj.Spec.Engine.Type); err != nil {
		return specError{err} // admission admits only known engines
	}
	if err := traced(ctx, "checkReferences", func(ctx context.Context) error {
		err := r.checkReferences(ctx, s)
		if p := s.obs.referenceProblem; p != nil {
			trace.SpanFromContext(ctx).SetAttributes(attribute.String("problem", p.reason), attribute.String("problem.message", p.message))
		}
		return err
	}); err != nil {
		return err
	}
	s.obs.sourceMode = ociMode(s.obj, r.Options)
	if s.config, err = desiredConfig(s.obj); err != nil {
		return specError{err}
	}
	s.deployment = desiredDeployment(s.obj, s.engine, r.Options, hashOf(s.config))
	s.templateHash = podTemplateHash(s.deployment)
	if err := traced(ctx, "observe", func(ctx context.Context) error {
		err := r.observe(ctx, s)
		recordLoads(ctx, s)
		return err
	}); err != nil {
		return err
	}
	// The router's pods, which a routed model's Service leads to and whose
	// waiting requests the autoscaler counts.
	if err := traced(ctx, "observeRouter", func(ctx context.Context) error { return r.observeRouter(ctx, s) }); err != nil {
		return err
	}
	if runtimeAdapters(s.obj) && s.obs.podsSeen {
		_ = traced(ctx, "syncAdapters", func(ctx context.Context) error {
			r.syncAdapters(ctx, s)
			return nil
		})
	}
	if s.obj.Spec.Autoscaling != nil || s.obj.Status.Autoscaling != nil {
		_ = traced(ctx, "autoscale", func(ctx context.Context) error {
			r.autoscale(ctx, s)
			return nil
		})
	}
	if isCanary(s.obj) && s.obs.podsSeen && s.obs.referenceProblem == nil {
		_ = traced(ctx, "planRollout", func(ctx context.Context) error {
			r.planRollout(ctx, s)
			return nil
		})
	}
	return r.writeChildren(ctx, s)
}

// unusableObject is the problem of an object no child can be made for, which
// only a person can fix: a spec stored in another form without conversion, or
// a name admitted before admission refused such names.
func unusableObject(obj *servingv1.AIInference) *problem {
	if msg := obj.DecodeError(); msg != "" {
		return &problem{servingv1.ReasonUndecodableSpec, msg + "; it was probably written as v1alpha1 while no conversion webhook ran. " +
			"Apply the object again as " + servingv1.GroupVersion.String() + " (see docs/api-versions.md), or install the operator with its webhooks (config/default, or the chart's webhook.enabled)"}
	}
	if msg := obj.NameProblem(); msg != "" {
		return &problem{servingv1.ReasonInvalidName, msg + "; create the AIInference again under a name that fits"}
	}
	return nil
}

// writeChildren runs the children table's steps in two rounds. First, at
// once, what depends on nothing: the loader's ConfigMap and the cache claim
// (one after the other), the Service, the NetworkPolicies, the activator's
// slice and the traffic objects. Then the Deployment, which names the
// ConfigMap's hash and the claim, and which is not written while a child's
// name is taken (pods that no Service of theirs would reach would hold GPUs
// for nothing).
func (r *Reconciler) writeChildren(ctx context.Context, s *scope) error {
	var errs []error
	var errsMu sync.Mutex
	run := func(step string, write func(*Reconciler, context.Context, *scope) error) error {
		err := traced(ctx, step, func(ctx context.Context) error { return write(r, ctx, s) })
		if err != nil {
			errsMu.Lock()
			errs = append(errs, err)
			errsMu.Unlock()
		}
		return err
	}
	var needed, atOnce []child
	for _, c := range children {
		switch {
		case c.round != firstRound || (c.wanted != nil && !c.wanted(r, s)):
		case c.deploymentNeeds:
			needed = append(needed, c)
		default:
			atOnce = append(atOnce, c)
		}
	}
	dependenciesOK := true
	var writes sync.WaitGroup
	writes.Go(func() {
		for _, c := range needed {
			if run(c.step, c.write) != nil {
				dependenciesOK = false
				return
			}
		}
	})
	for _, c := range atOnce {
		writes.Go(func() { _ = run(c.step, c.write) })
	}
	writes.Wait()
	for _, c := range children {
		switch {
		case c.round != deploymentRound:
		case s.obs.referenceProblem != nil:
			skipped(ctx, c.step, "a referenced object is missing: "+s.obs.referenceProblem.reason)
		case !dependenciesOK:
			skipped(ctx, c.step, "a step it depends on failed (the loader ConfigMap, the cache claim or the groups' PodGroups)")
		case s.obs.nameConflict != nil:
			skipped(ctx, c.step, "a child's name is taken: "+s.obs.nameConflict.message)
		default:
			_ = run(c.step, c.write)
		}
	}
	_ = run("replacePods", (*Reconciler).replacePods)
	return kerrors.NewAggregate(errs)
}

// specError is an error no retry can mend: only a new spec can.
type specError struct{ error }

func (e specError) Unwrap() error { return e.error }

// result turns what a pass met into its result, in one place: an error is
// retried with the controller's back-off unless no retry can mend it; without
// one, the pass asks for the soonest look again that something it saw needs.
func (s *scope) result(statusErr error) (ctrl.Result, error) {
	// A status write that met a newer object than the cached one the pass
	// started from: look again once the cache has it.
	stale := apierrors.IsConflict(statusErr)
	if stale {
		statusErr = nil
	}
	err := kerrors.NewAggregate([]error{s.obs.stepError, statusErr})
	var spec specError
	switch {
	case errors.As(s.obs.stepError, &spec):
		return ctrl.Result{}, reconcile.TerminalError(err)
	case apierrors.IsInvalid(statusErr):
		// The API server validates the whole object on a status write: when it
		// refuses it, only a new write of the object can help (see patchStatus).
		return ctrl.Result{}, reconcile.TerminalError(err)
	case err != nil:
		return ctrl.Result{}, err
	}
	soonest := s.loads.requeue
	if s.obs.rollout != nil {
		soonest = soonestOf(soonest, s.obs.rollout.requeue)
	}
	if s.obs.autoscale != nil {
		soonest = soonestOf(soonest, s.obs.autoscale.requeue)
	}
	soonest = soonestOf(soonest, s.obs.adapters.requeue())
	for _, p := range []*problem{s.obs.referenceProblem, s.obs.nameConflict} {
		if p != nil && reasons.Explain(p.reason).Unwatched {
			soonest = soonestOf(soonest, waitingRequeue)
		}
	}
	if stale {
		soonest = soonestOf(soonest, staleRequeue)
	}
	return ctrl.Result{RequeueAfter: soonest}, nil
}

// soonestOf is the sooner of two looks again; 0 is none.
func soonestOf(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
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
		Named("aiinference")
	// The traffic APIs are optional: their objects are watched when the cluster
	// serves them at start-up; the EndpointSlices when the activator or the
	// router runs.
	for _, k := range childKinds() {
		if k.watched == nil || k.watched(r) {
			b = b.Owns(k.object())
		}
	}
	if r.RouterEndpoints != nil {
		b = b.WatchesRawSource(source.Kind(r.RouterEndpoints, &discoveryv1.EndpointSlice{}, handler.TypedEnqueueRequestsFromMapFunc(r.routerSlicesToInferences)))
	}
	if r.Wake != nil {
		b = b.WatchesRawSource(source.Channel(r.Wake, &handler.EnqueueRequestForObject{}))
	}
	if r.ModelCacheReports != nil {
		b = b.WatchesRawSource(source.Kind(r.ModelCacheReports, &corev1.ConfigMap{}, handler.TypedEnqueueRequestsFromMapFunc(r.reportToInferences)))
	}
	return b.
		Watches(&servingv1.AIInference{}, unansweredFirst).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToInference)).
		// The EndpointSlices of the model's Services (made by Kubernetes with
		// the Service's labels): a canary's route follows what they list.
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(podToInference)).
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

// noteConflict records that a child's name is taken.
func (s *scope) noteConflict(kind string, p *problem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rank := kindOf(kind).conflictRank
	if s.obs.nameConflict == nil || rank < s.conflictKindRank {
		s.obs.nameConflict, s.conflictKindRank = p, rank
	}
}

// noteChange records that this pass wrote a child.
func (s *scope) noteChange() {
	s.mu.Lock()
	s.obs.childChanged = true
	s.mu.Unlock()
}
