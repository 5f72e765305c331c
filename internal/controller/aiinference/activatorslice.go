package aiinference

import (
	"context"
	"net"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Activator is what the reconciler needs of the activator.
type Activator interface {
	// Held is how many requests for the model wait.
	Held(key types.NamespacedName) int
	// IP is the operator's address, where the models' Services send requests
	// while the models are at zero.
	IP() string
	// Open gives the model a port of the activator's own, where its Service
	// sends requests while it is at zero; the port names the model, so that a
	// request reaches no other.
	Open(key types.NamespacedName) (port int32, err error)
	// Close shuts the model's port: its Service no longer leads there.
	Close(key types.NamespacedName)
}

// activatorSliceWanted is true while the model's Service must lead to the
// activator: the model may go to zero, and no replica of it serves.
func activatorSliceWanted(obj *servingv1.AIInference, obs observation) bool {
	if a := obj.Spec.Autoscaling; a == nil || a.Min() > 0 {
		return false
	}
	for _, p := range obs.pods {
		if p.Serves {
			return false
		}
	}
	return obs.podsSeen
}

// desiredActivatorSlice is an EndpointSlice of the model's Service, beside the
// one the Service's selector makes, that leads to the activator. kube-proxy
// routes to the endpoints of every slice of a Service.
func desiredActivatorSlice(obj *servingv1.AIInference, ip string, port int32) *discoveryv1.EndpointSlice {
	addressType := discoveryv1.AddressTypeIPv4
	if parsed := net.ParseIP(ip); parsed != nil && parsed.To4() == nil {
		addressType = discoveryv1.AddressTypeIPv6
	}
	meta := childMeta(obj, obj.ActivatorSliceName())
	meta.Labels[discoveryv1.LabelServiceName] = obj.Name
	meta.Labels[discoveryv1.LabelManagedBy] = servingv1.ManagedByValue
	return &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: discoveryv1.SchemeGroupVersion.String(), Kind: "EndpointSlice"},
		ObjectMeta:  meta,
		AddressType: addressType,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
}

// reconcileActivatorSlice leads the model's Service to the activator while
// the model is at zero and until a replica serves, and back to the pods alone
// once one does.
func (r *Reconciler) reconcileActivatorSlice(ctx context.Context, s *scope) error {
	key := client.ObjectKeyFromObject(s.obj)
	// A routed model's Service leads to the router, which holds its requests.
	if !activatorSliceWanted(s.obj, s.obs) || s.routed() {
		r.Activator.Close(key)
		return r.deleteOwned(ctx, s, desiredActivatorSlice(s.obj, r.Activator.IP(), 0), &discoveryv1.EndpointSlice{})
	}
	port, err := r.Activator.Open(key)
	if err != nil {
		return err
	}
	_, err = r.apply(ctx, s, desiredActivatorSlice(s.obj, r.Activator.IP(), port), &discoveryv1.EndpointSlice{})
	return err
}
