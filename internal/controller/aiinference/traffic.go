package aiinference

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

// Traffic of a canary rollout with a Gateway: an HTTPRoute <name> attached to the
// user's Gateway, whose two weighted backends are the Services (or
// InferencePools) <name>-stable and <name>-canary, each selecting one track.
// The Service <name> keeps selecting both.

var (
	httpRouteKind     = schema.GroupKind{Group: gatewayv1.GroupName, Kind: "HTTPRoute"}
	inferencePoolKind = schema.GroupKind{Group: inferencev1.GroupName, Kind: "InferencePool"}
)

// Traffic split modes, as status.rollout.trafficSplit says them.
const (
	splitGateway       = "Gateway"
	splitInferencePool = "InferencePool"
	splitReplicaCount  = "ReplicaCount"
)

// gatewayTraffic is the Gateway traffic the spec asks for; nil: none.
func gatewayTraffic(obj *servingv1.AIInference) *servingv1.GatewayTraffic {
	if !isCanary(obj) || obj.Spec.Rollout.Canary.Traffic == nil {
		return nil
	}
	return &obj.Spec.Rollout.Canary.Traffic.Gateway
}

func usesInferencePools(gw *servingv1.GatewayTraffic) bool {
	return gw != nil && gw.Backend == servingv1.BackendInferencePool
}

// trafficSplit names how the split is made.
func trafficSplit(obj *servingv1.AIInference) string {
	switch gw := gatewayTraffic(obj); {
	case gw == nil:
		return splitReplicaCount
	case usesInferencePools(gw):
		return splitInferencePool
	}
	return splitGateway
}

// desiredTrackService selects the pods of one track.
func desiredTrackService(obj *servingv1.AIInference, eng engine.Engine, name, track string) *corev1.Service {
	svc := desiredService(obj, eng)
	svc.Name = name
	svc.Spec.Selector = trackSelector(obj, track)
	return svc
}

func trackSelector(obj *servingv1.AIInference, track string) map[string]string {
	selector := maps.Clone(selectorLabels(obj))
	selector[servingv1.LabelTrack] = track
	return selector
}

// desiredInferencePool is the pool of one track, served by its endpoint picker.
func desiredInferencePool(obj *servingv1.AIInference, eng engine.Engine, name, track string, picker servingv1.EndpointPicker) *inferencev1.InferencePool {
	matchLabels := map[inferencev1.LabelKey]inferencev1.LabelValue{}
	for k, v := range trackSelector(obj, track) {
		matchLabels[inferencev1.LabelKey(k)] = inferencev1.LabelValue(v)
	}
	return &inferencev1.InferencePool{
		TypeMeta:   metav1.TypeMeta{APIVersion: inferencev1.GroupVersion.String(), Kind: "InferencePool"},
		ObjectMeta: childMeta(obj, name),
		Spec: inferencev1.InferencePoolSpec{
			Selector:    inferencev1.LabelSelector{MatchLabels: matchLabels},
			TargetPorts: []inferencev1.Port{{Number: inferencev1.PortNumber(enginePort(obj, eng))}},
			EndpointPickerRef: &inferencev1.EndpointPickerRef{
				Kind: "Service",
				Name: inferencev1.ObjectName(picker.Name),
				Port: &inferencev1.Port{Number: inferencev1.PortNumber(cmp.Or(picker.Port, 9002))},
			},
		},
	}
}

// desiredHTTPRoute sends weight percent of the requests to the canary backend
// and the rest to the stable one.
func desiredHTTPRoute(obj *servingv1.AIInference, eng engine.Engine, gw *servingv1.GatewayTraffic, weight int32) *gatewayv1.HTTPRoute {
	parent := gatewayv1.ParentReference{Name: gatewayv1.ObjectName(gw.ParentRef.Name)}
	if gw.ParentRef.Namespace != "" {
		parent.Namespace = ptr.To(gatewayv1.Namespace(gw.ParentRef.Namespace))
	}
	if gw.ParentRef.SectionName != "" {
		parent.SectionName = ptr.To(gatewayv1.SectionName(gw.ParentRef.SectionName))
	}
	backend := func(name string, weight int32) gatewayv1.HTTPBackendRef {
		ref := gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name)}
		if usesInferencePools(gw) {
			ref.Group = ptr.To(gatewayv1.Group(inferencev1.GroupName))
			ref.Kind = ptr.To(gatewayv1.Kind("InferencePool"))
		} else {
			ref.Port = ptr.To(gatewayv1.PortNumber(enginePort(obj, eng)))
		}
		return gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: ref, Weight: ptr.To(weight)}}
	}
	var hostnames []gatewayv1.Hostname
	for _, h := range gw.Hostnames {
		hostnames = append(hostnames, gatewayv1.Hostname(h))
	}
	return &gatewayv1.HTTPRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: gatewayv1.GroupVersion.String(), Kind: "HTTPRoute"},
		ObjectMeta: childMeta(obj, obj.Name),
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent}},
			Hostnames:       hostnames,
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{
				backend(obj.StableBackendName(), 100-weight),
				backend(obj.CanaryBackendName(), weight),
			}}},
		},
	}
}

// checkTrafficAPIs reports a Gateway traffic spec whose APIs the cluster lacks.
func (r *Reconciler) checkTrafficAPIs(s *scope) *problem {
	gw := gatewayTraffic(s.obj)
	if gw == nil {
		return nil
	}
	if !r.served(httpRouteKind) {
		return &problem{servingv1.ReasonTrafficAPIMissing, "rollout.canary.traffic.gateway needs the Gateway API's HTTPRoute (gateway.networking.k8s.io/v1), which this cluster does not serve; install the Gateway API CRDs, or remove traffic to split by ready replicas"}
	}
	if usesInferencePools(gw) && !r.served(inferencePoolKind) {
		return &problem{servingv1.ReasonTrafficAPIMissing, "rollout.canary.traffic.gateway.backend InferencePool needs inference.networking.k8s.io/v1 InferencePools, which this cluster does not serve; install the Gateway API Inference Extension CRDs, or use backend Service"}
	}
	return nil
}

// served is true when the API server serves the kind. A kind the cluster lacks
// costs the REST mapper a discovery request per lookup, so answers are kept for
// a minute: a CRD installed later is seen within that. The lookup runs outside
// the lock: the other reconciles do not wait on its round trip (two may then
// ask at once, once a minute).
func (r *Reconciler) served(gk schema.GroupKind) bool {
	r.apis.Lock()
	seen, ok := r.apis.served[gk]
	r.apis.Unlock()
	if ok && r.Now().Sub(seen.at) < apiRecheck {
		return seen.served
	}
	_, err := r.RESTMapper().RESTMapping(gk)
	r.apis.Lock()
	defer r.apis.Unlock()
	if r.apis.served == nil {
		r.apis.served = map[schema.GroupKind]apiSeen{}
	}
	r.apis.served[gk] = apiSeen{served: err == nil, at: r.Now()}
	return err == nil
}

// apiRecheck is how long the answer to "does the cluster serve this kind" is kept.
const apiRecheck = time.Minute

// servedAPIs remembers which optional kinds the cluster serves.
type servedAPIs struct {
	sync.Mutex
	served map[schema.GroupKind]apiSeen
}

type apiSeen struct {
	served bool
	at     time.Time
}

// routedWeight is the canary's weight the route carries: the step's, but none
// while no canary pod serves and all while no stable pod does. A Gateway sends
// a backend's share whether or not it has a ready endpoint, and answers it 503
// when it has none (Traefik does, seen on the real node): a crash, an eviction
// or a restart of the canary's pod would cost its whole share. A pod counts
// once its backend Service's EndpointSlices list it ready too (backends, when
// known): the Gateway reads those, which follow the pod's readiness a moment
// later (a promotion under load gave a new stable pod its share while Traefik
// still had no server for it: 79 of 1862 requests answered 503). The step's
// own weight and clock stay in status.rollout.
func routedWeight(step int32, obs observation, backends *trackEndpoints) int32 {
	if !obs.podsSeen {
		return step
	}
	var canary, stable int32
	for _, p := range obs.pods {
		switch {
		case !p.Serves:
		case p.Canary:
			canary++
		default:
			stable++
		}
	}
	if backends != nil {
		canary, stable = min(canary, backends.canary), min(stable, backends.stable)
	}
	switch {
	case canary == 0 && stable > 0:
		return 0
	case stable == 0 && canary > 0:
		return 100
	}
	return step
}

// reconcileTraffic writes the route and its backends for the canary weight of
// this pass, and removes those the spec no longer asks for.
func (r *Reconciler) reconcileTraffic(ctx context.Context, s *scope) error {
	obj := s.obj
	gw := gatewayTraffic(obj)
	if gw == nil {
		trace.SpanFromContext(ctx).SetAttributes(attrWhy.String("the spec asks for no Gateway traffic; only what the operator made earlier is removed"))
	}
	var weight int32
	if plan := s.obs.rollout; plan.canaryActive() {
		var backends *trackEndpoints
		if gw != nil && !usesInferencePools(gw) {
			var err error
			if backends, err = r.readyEndpoints(ctx, obj); err != nil {
				return err
			}
		}
		weight = routedWeight(plan.status.Weight, s.obs, backends)
	}
	type child struct {
		want     bool
		desired  client.Object
		existing client.Object
	}
	services := gw != nil && !usesInferencePools(gw)
	children := []child{
		{services, desiredTrackService(obj, s.engine, obj.StableBackendName(), servingv1.TrackStable), &corev1.Service{}},
		{services, desiredTrackService(obj, s.engine, obj.CanaryBackendName(), servingv1.TrackCanary), &corev1.Service{}},
	}
	if r.served(inferencePoolKind) {
		var pools servingv1.InferencePoolBackends
		if usesInferencePools(gw) && gw.InferencePool != nil {
			pools = *gw.InferencePool
		}
		children = append(children,
			child{usesInferencePools(gw), desiredInferencePool(obj, s.engine, obj.StableBackendName(), servingv1.TrackStable, pools.StableEndpointPicker), &inferencev1.InferencePool{}},
			child{usesInferencePools(gw), desiredInferencePool(obj, s.engine, obj.CanaryBackendName(), servingv1.TrackCanary, pools.CanaryEndpointPicker), &inferencev1.InferencePool{}})
	}
	if r.served(httpRouteKind) {
		route := &gatewayv1.HTTPRoute{TypeMeta: metav1.TypeMeta{APIVersion: gatewayv1.GroupVersion.String(), Kind: "HTTPRoute"}, ObjectMeta: childMeta(obj, obj.Name)}
		if gw != nil {
			route = desiredHTTPRoute(obj, s.engine, gw, weight)
		}
		children = append(children, child{gw != nil, route, &gatewayv1.HTTPRoute{}})
	}
	for _, c := range children {
		if c.want {
			if _, err := r.apply(ctx, s, c.desired, c.existing); err != nil {
				return err
			}
			continue
		}
		if err := r.deleteOwned(ctx, s, c.desired, c.existing); err != nil {
			return err
		}
	}
	return nil
}

// trackEndpoints counts the ready endpoints of the two tracks' backend Services.
type trackEndpoints struct {
	stable, canary int32
}

// readyEndpoints reads the EndpointSlices of the stable and canary backend
// Services (the EndpointSlice controller gives them the Service's labels, so
// the operator's cache holds them, and a change of them starts a pass).
func (r *Reconciler) readyEndpoints(ctx context.Context, obj *servingv1.AIInference) (*trackEndpoints, error) {
	count := func(service string) (int32, error) {
		slices := &discoveryv1.EndpointSliceList{}
		if err := r.List(ctx, slices, client.InNamespace(obj.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
			return 0, fmt.Errorf("listing the EndpointSlices of Service %s: %w", service, err)
		}
		var ready int32
		for _, slice := range slices.Items {
			for _, e := range slice.Endpoints {
				if ptr.Deref(e.Conditions.Ready, false) {
					ready++
				}
			}
		}
		return ready, nil
	}
	var t trackEndpoints
	var err error
	if t.stable, err = count(obj.StableBackendName()); err != nil {
		return nil, err
	}
	if t.canary, err = count(obj.CanaryBackendName()); err != nil {
		return nil, err
	}
	return &t, nil
}
