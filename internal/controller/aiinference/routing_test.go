package aiinference

import (
	"testing"

	. "github.com/onsi/gomega"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestRouterEndpointsAreTheReadyPodsOnThePortNamedHTTP(t *testing.T) {
	g := NewWithT(t)
	ep := func(ip string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	http := []discoveryv1.EndpointPort{{Name: ptr.To("metrics"), Port: ptr.To[int32](9090)}, {Name: ptr.To("http"), Port: ptr.To[int32](8080)}}
	v := routerEndpoints([]discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: http, Endpoints: []discoveryv1.Endpoint{
			ep("10.0.0.3", ptr.To(true)), ep("10.0.0.1", nil), ep("10.0.0.2", ptr.To(false))}},
		// The same pod in a second slice (a slice being replaced) counts once.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: http, Endpoints: []discoveryv1.Endpoint{ep("10.0.0.3", ptr.To(true))}},
		// No port named http: not the router's serving port.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: http[:1], Endpoints: []discoveryv1.Endpoint{ep("10.0.0.9", ptr.To(true))}},
		{AddressType: discoveryv1.AddressTypeFQDN, Ports: http, Endpoints: []discoveryv1.Endpoint{ep("router.example", ptr.To(true))}},
	})
	g.Expect(v.addresses).To(Equal([]string{"10.0.0.1", "10.0.0.3"}))
	g.Expect(v.port).To(Equal(int32(8080)))
	g.Expect(routerEndpoints(nil).addresses).To(BeEmpty())

	slice := desiredRouterSlice(metav1.ObjectMeta{Name: "chat-router", Namespace: "ml"}, "chat", v)
	g.Expect(slice.Labels).To(HaveKeyWithValue(discoveryv1.LabelServiceName, "chat"))
	g.Expect(slice.AddressType).To(Equal(discoveryv1.AddressTypeIPv4))
	g.Expect(slice.Endpoints).To(HaveLen(2))
	g.Expect(*slice.Ports[0].Port).To(Equal(int32(8080)))
	v6 := desiredRouterSlice(metav1.ObjectMeta{Name: "chat-router"}, "chat", routerView{addresses: []string{"fd00::1"}, port: 8080})
	g.Expect(v6.AddressType).To(Equal(discoveryv1.AddressTypeIPv6))
}
