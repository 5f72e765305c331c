package aiinference

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Options are the operator-wide settings that shape children.
type Options struct {
	// LoaderImage is the model loader's image.
	LoaderImage string
	// PrometheusURL is the Prometheus that canary analyses query, unless an
	// object names its own.
	PrometheusURL string
	// AutoscaleInterval is how often the autoscaler reads the signals; 0:
	// DefaultAutoscaleInterval.
	AutoscaleInterval time.Duration
	// OperatorNamespace is where the operator's pods run, which the models'
	// NetworkPolicies let in; "" when it runs outside the cluster.
	OperatorNamespace string
	// RouterService is the router's Service in OperatorNamespace; "":
	// DefaultRouterService.
	RouterService string
	// ImageVolumes tells that the cluster serves image volumes (Kubernetes
	// v1.35 and later): an oci source in mode Auto is then mounted as one.
	ImageVolumes bool
}

// selectorLabels select the pods of one AIInference.
func selectorLabels(obj *servingv1.AIInference) map[string]string {
	return map[string]string{
		servingv1.LabelName:      "aiinference",
		servingv1.LabelInstance:  obj.Name,
		servingv1.LabelInference: obj.Name,
	}
}

// servingSelector selects the pods that serve: all of a single-node model's,
// the leaders of one whose replicas span nodes (a worker has no server).
func servingSelector(obj *servingv1.AIInference) map[string]string {
	labels := selectorLabels(obj)
	if obj.SpansNodes() {
		labels[servingv1.LabelRole] = servingv1.RoleLeader
	}
	return labels
}

// childLabels go on every child: the selector labels plus the managed-by mark.
func childLabels(obj *servingv1.AIInference) map[string]string {
	labels := selectorLabels(obj)
	labels[servingv1.LabelManagedBy] = servingv1.ManagedByValue
	return labels
}

func childMeta(obj *servingv1.AIInference, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: obj.Namespace, Labels: childLabels(obj)}
}

// hashOf is a short, stable hash of values encoded as JSON.
func hashOf(values ...any) string {
	h := sha256.New()
	for _, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			// Only plain API structs are hashed; they always encode.
			panic(fmt.Sprintf("hashing %T: %v", v, err))
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// The RBAC the children's kinds need (the children table lists the kinds).
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;configmaps;persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=leaderworkerset.x-k8s.io,resources=leaderworkersets,verbs=get;list;watch;create;update;patch;delete

// A child is one step that writes objects for an AIInference. The children
// table is the one place that lists them: writeChildren runs their steps,
// SetupWithManager watches their kinds, a name conflict is ranked by their
// kinds, apply keeps their kinds' exact maps, and kubectl aii why looks at
// their objects (Children).
type child struct {
	// step names the step in traces.
	step string
	// write brings the child's objects in line with the spec.
	write func(*Reconciler, context.Context, *scope) error
	// round is when the step runs.
	round round
	// deploymentNeeds is true when the Deployment's pods need what the step
	// writes (the loader configuration's hash, the cache claim, the PodGroup
	// a group's pods wait for): those steps run one after the other in the
	// table's order, and a failure holds the Deployment back.
	deploymentNeeds bool
	// wanted says whether the step runs in this pass; nil: always.
	wanted func(*Reconciler, *scope) bool
	// kinds are the kinds of object the step writes.
	kinds []*childKind
}

// round orders the steps of a pass.
type round int

const (
	// firstRound steps run at once: what depends on nothing.
	firstRound round = iota
	// deploymentRound runs once the first round left what the Deployment
	// names, unless a child's name is taken (pods that no Service of theirs
	// would reach would hold GPUs for nothing).
	deploymentRound
)

// childKind is a kind of object the operator makes.
type childKind struct {
	kind string
	// object is an empty object of the kind.
	object func() client.Object
	// names are the names objects of this kind take.
	names func(*servingv1.AIInference) []string
	// conflictRank orders the kinds whose name may be taken, so that a pass
	// reports the same conflict whichever step finds its own first.
	conflictRank int
	// exactMaps are the maps whose every key the operator sets: a key added
	// there by hand changes what the child does (a Service selector with one
	// more key selects no pod; a node selector or a resource limit moves or
	// starves the pods), so it is removed as a changed value is put back. "*" is
	// every item of a list of named items. (Resource requests are not exact: the
	// API server copies a limit into a request left unset.) Other maps (metadata
	// labels and annotations, the pod template's annotations, where kubectl
	// rollout restart writes) keep what others add.
	exactMaps [][]string
	// exactSpec is true when the operator sets the kind's whole spec, every map
	// and field in it: a NetworkPolicy's selectors say whom it fences and whom
	// it lets in, and a key or a selector added by hand anywhere (one more label
	// in podSelector selects none of the model's pods, leaving them open to
	// all) is removed. The API server defaults nothing there that the operator
	// leaves unset.
	exactSpec bool
	// watched says whether the operator watches the kind; nil: always.
	watched func(*Reconciler) bool
}

var (
	configMaps = &childKind{kind: "ConfigMap", object: func() client.Object { return &corev1.ConfigMap{} },
		names: func(o *servingv1.AIInference) []string {
			return []string{o.LoaderConfigMapName(), o.CanaryLoaderConfigMapName()}
		},
		conflictRank: 1, exactMaps: [][]string{{"data"}}}
	claims = &childKind{kind: "PersistentVolumeClaim", object: func() client.Object { return &corev1.PersistentVolumeClaim{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.CachePVCName()} },
		conflictRank: 2}
	deployments = &childKind{kind: "Deployment", object: func() client.Object { return &appsv1.Deployment{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.ServiceName(), o.CanaryName()} },
		conflictRank: 3, exactMaps: [][]string{
			{"spec", "template", "metadata", "labels"},
			{"spec", "template", "spec", "nodeSelector"},
			{"spec", "template", "spec", "containers", "*", "resources", "limits"},
			{"spec", "template", "spec", "initContainers", "*", "resources", "limits"},
		}}
	services = &childKind{kind: "Service", object: func() client.Object { return &corev1.Service{} },
		names: func(o *servingv1.AIInference) []string {
			return []string{o.ServiceName(), o.StableBackendName(), o.CanaryBackendName()}
		},
		conflictRank: 4, exactMaps: [][]string{{"spec", "selector"}}}
	inferencePools = &childKind{kind: "InferencePool", object: func() client.Object { return &inferencev1.InferencePool{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.StableBackendName(), o.CanaryBackendName()} },
		conflictRank: 5, watched: func(r *Reconciler) bool { return r.served(inferencePoolKind) }}
	httpRoutes = &childKind{kind: "HTTPRoute", object: func() client.Object { return &gatewayv1.HTTPRoute{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.HTTPRouteName()} },
		conflictRank: 6, watched: func(r *Reconciler) bool { return r.served(httpRouteKind) }}
	networkPolicies = &childKind{kind: "NetworkPolicy", object: func() client.Object { return &networkingv1.NetworkPolicy{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.IngressPolicyName(), o.EgressPolicyName()} },
		conflictRank: 7, exactSpec: true}
	leaderWorkerSets = &childKind{kind: "LeaderWorkerSet", object: func() client.Object { return &lwsv1.LeaderWorkerSet{} },
		names:        func(o *servingv1.AIInference) []string { return []string{o.GroupSetName()} },
		conflictRank: 9, watched: func(r *Reconciler) bool { return r.served(leaderWorkerSetKind) }}
	podGroups = &childKind{kind: "PodGroup", object: func() client.Object { return &schedulingv1beta1.PodGroup{} },
		names: func(o *servingv1.AIInference) []string {
			if !o.SpansNodes() {
				return nil
			}
			var names []string
			for i := range o.DesiredReplicas() {
				names = append(names, servingv1.GroupPodGroupName(o.GroupSetName(), strconv.Itoa(int(i))))
			}
			return names
		},
		conflictRank: 10, watched: func(r *Reconciler) bool { return r.served(podGroupKind) }}
	endpointSlices = &childKind{kind: "EndpointSlice", object: func() client.Object { return &discoveryv1.EndpointSlice{} },
		names: func(o *servingv1.AIInference) []string {
			return []string{o.ActivatorSliceName(), servingv1.RouterSliceName(o.Name)}
		},
		conflictRank: 8, watched: func(r *Reconciler) bool { return r.Activator != nil || r.RouterEndpoints != nil }}
)

// children are the steps that write children, in the order a pass starts them.
// (Set in init: the steps reach the table again, through apply's exact maps.)
var children []child

func init() {
	children = []child{
		{step: "reconcileConfigMap", write: (*Reconciler).reconcileConfigMap, deploymentNeeds: true, kinds: []*childKind{configMaps}},
		{step: "reconcileCachePVC", write: (*Reconciler).reconcileCachePVC, deploymentNeeds: true, kinds: []*childKind{claims}},
		{step: "reconcilePodGroups", write: (*Reconciler).reconcilePodGroups, deploymentNeeds: true, kinds: []*childKind{podGroups},
			wanted: func(r *Reconciler, _ *scope) bool { return r.served(podGroupKind) }},
		{step: "reconcileService", write: (*Reconciler).reconcileService, kinds: []*childKind{services}},
		{step: "reconcileNetworkPolicies", write: (*Reconciler).reconcileNetworkPolicies, kinds: []*childKind{networkPolicies}},
		{step: "reconcileActivatorSlice", write: (*Reconciler).reconcileActivatorSlice, kinds: []*childKind{endpointSlices},
			wanted: func(r *Reconciler, _ *scope) bool { return r.Activator != nil }},
		{step: "reconcileRouting", write: (*Reconciler).reconcileRouting, kinds: []*childKind{endpointSlices}},
		{step: "reconcileTraffic", write: (*Reconciler).reconcileTraffic, kinds: []*childKind{services, inferencePools, httpRoutes},
			wanted: func(_ *Reconciler, s *scope) bool { return s.obs.referenceProblem == nil }},
		{step: "reconcileDeployment", write: (*Reconciler).reconcileDeployment, round: deploymentRound, kinds: []*childKind{deployments, leaderWorkerSets}},
	}
}

// childKinds are the kinds of the children, each once, in the table's order.
func childKinds() []*childKind {
	var kinds []*childKind
	for _, c := range children {
		for _, k := range c.kinds {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	return kinds
}

// kindOf is the table's entry for a kind; an empty one (no exact maps, the
// first conflict rank) for a kind that is no child's, which the children
// table's test keeps from happening.
func kindOf(kind string) *childKind {
	for _, k := range childKinds() {
		if k.kind == kind {
			return k
		}
	}
	return &childKind{kind: kind}
}

// ChildObject is an object the operator may make, named but otherwise empty.
type ChildObject struct {
	Kind   string
	Object client.Object
}

// Children are the objects the operator may make for obj, one of each kind and
// name the children table lists: kubectl aii why looks for one held by another
// owner.
func Children(obj *servingv1.AIInference) []ChildObject {
	var out []ChildObject
	for _, k := range childKinds() {
		for _, name := range k.names(obj) {
			o := k.object()
			o.SetNamespace(obj.Namespace)
			o.SetName(name)
			out = append(out, ChildObject{k.kind, o})
		}
	}
	return out
}
