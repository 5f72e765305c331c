package aiinference

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The router's children (spec.routing). The router runs as its own
// Deployment in the operator's namespace (config/router, the chart's
// router.enabled) behind the Service Options.RouterService. A routed model's
// Service keeps its name, port and ClusterIP but loses its selector: its one
// EndpointSlice, <name>-router, lists the router's ready pods, so clients of
// the Service reach the router, which picks the engine pod. The namespace's
// OpenAI address, the Service aiinference-openai, leads to the router the same
// way for all the routed models of the namespace. While no router pod is
// ready, a routed model's Service keeps its selector: requests go round robin
// to the pods rather than nowhere.

// RouterPodName is the value of OperatorPodLabel on the router's pods, which
// the routed models' NetworkPolicies let in.
const RouterPodName = servingv1.RouterPodName

// DefaultRouterService is the router's Service in the operator's namespace.
const DefaultRouterService = "aiinference-router"

// OpenAIServiceName is the Service, in each namespace with a routed model,
// that leads to the router for all of them: the model in the request's body
// selects the AIInference.
const OpenAIServiceName = "aiinference-openai"

// labelOpenAIAddress, "true" on a Service, tells the router that the Service
// is a namespace's OpenAI address (internal/router's contract).
const labelOpenAIAddress = "serving.aiinference.io/openai"

// OpenAIServicePort is the port of OpenAIServiceName.
const OpenAIServicePort = 80

// routerView is where the router's ready pods are, read once per pass.
type routerView struct {
	// addresses are the router's ready pods' IPs, sorted; none while no router
	// pod is ready or no router is installed.
	addresses []string
	// port is the port the router's pods serve on.
	port int32
	// metricsPort is where they serve /metrics (the port named "metrics");
	// 0 when the Service names none.
	metricsPort int32
}

// routed is true when the model's Service leads to the router in this pass.
func (s *scope) routed() bool {
	return s.obj.RoutingEnabled() && len(s.router.addresses) > 0
}

// observeRouter reads the router's ready pods from the EndpointSlices of its
// Service, for a routed model.
func (r *Reconciler) observeRouter(ctx context.Context, s *scope) error {
	s.router = routerView{}
	if !s.obj.RoutingEnabled() || r.RouterEndpoints == nil {
		return nil
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := r.RouterEndpoints.List(ctx, slices, client.InNamespace(r.Options.OperatorNamespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: r.routerService()}); err != nil {
		return fmt.Errorf("reading the router's endpoints: %w", err)
	}
	s.router = routerEndpoints(slices.Items)
	return nil
}

func (r *Reconciler) routerService() string {
	if r.Options.RouterService != "" {
		return r.Options.RouterService
	}
	return DefaultRouterService
}

// routerEndpoints are the ready addresses and the port named "http" of the
// router Service's EndpointSlices.
func routerEndpoints(items []discoveryv1.EndpointSlice) routerView {
	var v routerView
	for _, slice := range items {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port, metricsPort int32
		for _, p := range slice.Ports {
			switch {
			case p.Port == nil:
			case ptr.Deref(p.Name, "") == "http":
				port = *p.Port
			case ptr.Deref(p.Name, "") == "metrics":
				metricsPort = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			v.addresses = append(v.addresses, ep.Addresses...)
			v.port, v.metricsPort = port, metricsPort
		}
	}
	slices.Sort(v.addresses)
	v.addresses = slices.Compact(v.addresses)
	return v
}

// routerSliceName is the EndpointSlice of a routed model's Service.
func routerSliceName(obj *servingv1.AIInference) string { return servingv1.RouterSliceName(obj.Name) }

// desiredRouterSlice leads the EndpointSlice's Service to the router's pods.
func desiredRouterSlice(meta metav1.ObjectMeta, service string, v routerView) *discoveryv1.EndpointSlice {
	addressType := discoveryv1.AddressTypeIPv4
	if len(v.addresses) > 0 && net.ParseIP(v.addresses[0]).To4() == nil {
		addressType = discoveryv1.AddressTypeIPv6
	}
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	meta.Labels[discoveryv1.LabelServiceName] = service
	meta.Labels[discoveryv1.LabelManagedBy] = servingv1.ManagedByValue
	slice := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: discoveryv1.SchemeGroupVersion.String(), Kind: "EndpointSlice"},
		ObjectMeta:  meta,
		AddressType: addressType,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(v.port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, ip := range v.addresses {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return slice
}

// reconcileRouting leads the model's Service and the namespace's OpenAI
// address to the router while the model is routed, and takes both back when
// it is not.
func (r *Reconciler) reconcileRouting(ctx context.Context, s *scope) error {
	slice := desiredRouterSlice(childMeta(s.obj, routerSliceName(s.obj)), s.obj.Name, s.router)
	if !s.routed() {
		if err := r.deleteOwned(ctx, s, slice, &discoveryv1.EndpointSlice{}); err != nil {
			return err
		}
		return r.leaveOpenAIService(ctx, s)
	}
	if _, err := r.apply(ctx, s, slice, &discoveryv1.EndpointSlice{}); err != nil {
		return err
	}
	return r.joinOpenAIService(ctx, s)
}

// The namespace's OpenAI address is shared by its routed models: each one
// applies it with a field manager of its own and an owner reference of its
// own (not a controller's), so that server-side apply keeps the union of the
// owner references, and the garbage collector removes the Service and its
// EndpointSlice once the last routed model is gone.

func openAIFieldOwner(obj *servingv1.AIInference) client.FieldOwner {
	return client.FieldOwner(FieldOwner + "/" + obj.Name)
}

func openAIMeta(obj *servingv1.AIInference, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: obj.Namespace,
		Labels: map[string]string{servingv1.LabelManagedBy: servingv1.ManagedByValue, servingv1.LabelName: OpenAIServiceName, labelOpenAIAddress: "true"},
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: servingv1.GroupVersion.String(), Kind: "AIInference", Name: obj.Name, UID: obj.UID,
		}},
	}
}

// desiredOpenAIService is the namespace's OpenAI address: selectorless, led
// to the router by its EndpointSlice.
func desiredOpenAIService(obj *servingv1.AIInference) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: openAIMeta(obj, OpenAIServiceName),
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Port: OpenAIServicePort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP,
		}}},
	}
}

func (r *Reconciler) joinOpenAIService(ctx context.Context, s *scope) error {
	owner := openAIFieldOwner(s.obj)
	svc := desiredOpenAIService(s.obj)
	slice := desiredRouterSlice(openAIMeta(s.obj, OpenAIServiceName+"-router"), OpenAIServiceName, s.router)
	for _, obj := range []client.Object{svc, slice} {
		if err := r.applyShared(ctx, s, obj, owner); err != nil {
			return err
		}
	}
	return nil
}

// applyShared applies a child shared by the namespace's routed models, unless
// it already lists this model as an owner and its spec is as desired.
func (r *Reconciler) applyShared(ctx context.Context, s *scope, desired client.Object, owner client.FieldOwner) error {
	kind := desired.GetObjectKind().GroupVersionKind().Kind
	existing, err := r.sharedChild(ctx, desired)
	if err != nil {
		return err
	}
	if existing != nil && ownedBy(existing, s.obj.UID) && sharedSpecMatches(existing, desired) {
		return nil
	}
	if existing != nil && existing.GetLabels()[servingv1.LabelName] != OpenAIServiceName {
		s.noteConflict(kind, &problem{servingv1.ReasonNameConflict, fmt.Sprintf(
			"%s %q already exists and was not made by the operator; the namespace's OpenAI address cannot take its name. Rename or delete that %s, or turn routing off",
			kind, desired.GetName(), kind)})
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("Applying shared "+kind, kind, klog.KObj(desired))
	u, err := toApplyConfiguration(desired)
	if err != nil {
		return err
	}
	if err := r.Patch(ctx, u, client.Apply, owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s: %w", kind, desired.GetName(), err)
	}
	s.noteChange()
	return nil
}

// leaveOpenAIService takes the model's owner reference (and its field
// manager's fields) off the namespace's OpenAI address, and deletes it once no
// routed model is left.
func (r *Reconciler) leaveOpenAIService(ctx context.Context, s *scope) error {
	owner := openAIFieldOwner(s.obj)
	for _, desired := range []client.Object{
		desiredRouterSlice(openAIMeta(s.obj, OpenAIServiceName+"-router"), OpenAIServiceName, routerView{}),
		desiredOpenAIService(s.obj),
	} {
		existing, err := r.sharedChild(ctx, desired)
		if err != nil || existing == nil || !ownedBy(existing, s.obj.UID) {
			return err
		}
		kind := desired.GetObjectKind().GroupVersionKind().Kind
		if len(existing.GetOwnerReferences()) == 1 {
			ctrl.LoggerFrom(ctx).Info("Deleting shared "+kind+": no routed model is left in the namespace", kind, klog.KObj(existing))
			uid := existing.GetUID()
			if err := r.Delete(ctx, existing, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("deleting %s %s: %w", kind, existing.GetName(), err)
			}
			s.noteChange()
			continue
		}
		// An apply naming nothing but the object releases every field this
		// model's manager owned, its owner reference included.
		u := emptyApplyConfiguration(desired)
		ctrl.LoggerFrom(ctx).Info("Leaving shared "+kind, kind, klog.KObj(existing))
		if err := r.Patch(ctx, u, client.Apply, owner, client.ForceOwnership); err != nil {
			return fmt.Errorf("leaving %s %s: %w", kind, desired.GetName(), err)
		}
		s.noteChange()
	}
	return nil
}

// sharedChild reads a shared child from the cache; nil when there is none.
func (r *Reconciler) sharedChild(ctx context.Context, desired client.Object) (client.Object, error) {
	var existing client.Object
	switch desired.(type) {
	case *corev1.Service:
		existing = &corev1.Service{}
	case *discoveryv1.EndpointSlice:
		existing = &discoveryv1.EndpointSlice{}
	default:
		return nil, fmt.Errorf("no shared child of kind %T", desired)
	}
	if err := r.Get(ctx, client.ObjectKeyFromObject(desired), existing); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading %s: %w", desired.GetName(), err)
	}
	return existing, nil
}

func ownedBy(obj client.Object, uid types.UID) bool {
	return slices.ContainsFunc(obj.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return o.UID == uid })
}

// sharedSpecMatches compares what the routed models write of a shared child:
// the Service's ports, the EndpointSlice's endpoints and ports.
func sharedSpecMatches(existing, desired client.Object) bool {
	switch d := desired.(type) {
	case *corev1.Service:
		e := existing.(*corev1.Service)
		return len(e.Spec.Selector) == 0 && len(e.Spec.Ports) == 1 && e.Spec.Ports[0].Port == d.Spec.Ports[0].Port &&
			e.Spec.Ports[0].TargetPort == d.Spec.Ports[0].TargetPort
	case *discoveryv1.EndpointSlice:
		e := existing.(*discoveryv1.EndpointSlice)
		return e.AddressType == d.AddressType && jsonEqual(e.Endpoints, d.Endpoints) && jsonEqual(e.Ports, d.Ports)
	}
	return false
}

func jsonEqual(a, b any) bool {
	x, errA := json.Marshal(a)
	y, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(x) == string(y)
}

func toApplyConfiguration(obj client.Object) (client.Object, error) {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	delete(content, "status")
	return &unstructured.Unstructured{Object: content}, nil
}

func emptyApplyConfiguration(obj client.Object) client.Object {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
	u.SetNamespace(obj.GetNamespace())
	u.SetName(obj.GetName())
	return u
}

// routerSlicesToInferences queues every routed model when the router's pods
// change: their Services' EndpointSlices list them.
func (r *Reconciler) routerSlicesToInferences(ctx context.Context, obj *discoveryv1.EndpointSlice) []reconcile.Request {
	if obj.GetNamespace() != r.Options.OperatorNamespace || obj.GetLabels()[discoveryv1.LabelServiceName] != r.routerService() {
		return nil
	}
	list := &servingv1.AIInferenceList{}
	if err := r.List(ctx, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the routed models for a change of the router's pods")
		return nil
	}
	var reqs []reconcile.Request
	for _, o := range list.Items {
		if o.RoutingEnabled() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&o)})
		}
	}
	return reqs
}

// RouterEndpointsCache is a cache of the router Service's EndpointSlices
// alone: the manager's cache holds only the operator's own.
func RouterEndpointsCache(mgr ctrl.Manager, namespace, service string) (cache.Cache, error) {
	if service == "" {
		service = DefaultRouterService
	}
	return cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject: map[client.Object]cache.ByObject{&discoveryv1.EndpointSlice{}: {
			Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}),
		}},
	})
}
