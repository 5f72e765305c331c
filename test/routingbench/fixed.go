package routingbench

import (
	"context"
	networkingv1 "k8s.io/api/networking/v1"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/router"
)

// FixedDirectory is a router.Directory of one model and a set of replicas
// given by the test, for a router in front of simulators on loopback (no
// cluster: the Kubernetes side is router.KubeDirectory, tested apart). Every
// host leads to the model.
type FixedDirectory struct {
	mu               sync.Mutex
	model            *servingv1.AIInference
	endpoints        []router.Endpoint
	namespaceAddress bool
}

// NewFixedDirectory is a directory of a vLLM model namespace/name served by the sims.
func NewFixedDirectory(namespace, name string, sims []*Sim) *FixedDirectory {
	obj := &servingv1.AIInference{}
	obj.Namespace, obj.Name = namespace, name
	obj.Spec.Model.Name = Model
	obj.Spec.Engine.Type = servingv1.EngineVLLM
	d := &FixedDirectory{model: obj}
	d.SetSims(sims)
	return d
}

// SetSims makes the sims the serving replicas (a replica not among them is
// not ready).
func (d *FixedDirectory) SetSims(sims []*Sim) {
	var eps []router.Endpoint
	for _, s := range sims {
		eps = append(eps, EndpointOf(s))
	}
	d.SetEndpoints(eps)
}

// EndpointOf is a simulator as a router endpoint.
func EndpointOf(s *Sim) router.Endpoint {
	return router.Endpoint{Name: s.Name, Addr: s.Addr, MetricsURL: "http://" + s.Addr + "/metrics", Track: servingv1.TrackStable}
}

// SetEndpoints sets the serving replicas.
func (d *FixedDirectory) SetEndpoints(eps []router.Endpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endpoints = eps
}

// EnableNetworkPolicy sets the model's spec.networkPolicy: enabled, letting
// in the peers given.
func (d *FixedDirectory) EnableNetworkPolicy(from ...networkingv1.NetworkPolicyPeer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.model.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true, From: from}
}

// Key is the model's name.
func (d *FixedDirectory) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: d.model.Namespace, Name: d.model.Name}
}

// Update changes the model (its spec.adapters and status, say) as the
// API server would.
func (d *FixedDirectory) Update(change func(*servingv1.AIInference)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	change(d.model)
}

// NamespaceAddress makes every host the namespace's OpenAI address, where the
// body's model picks the AIInference, rather than the model's Service.
func (d *FixedDirectory) NamespaceAddress() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.namespaceAddress = true
}

// Target implements router.Directory.
func (d *FixedDirectory) Target(context.Context, string, netip.Addr) (router.Target, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.namespaceAddress {
		return router.Target{Namespace: d.model.Namespace}, true
	}
	return router.Target{Namespace: d.model.Namespace, Model: d.model.Name}, true
}

// Model implements router.Directory.
func (d *FixedDirectory) Model(_ context.Context, key types.NamespacedName) (*servingv1.AIInference, error) {
	if key != d.Key() {
		return nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.model.DeepCopy(), nil
}

// Models implements router.Directory.
func (d *FixedDirectory) Models(_ context.Context, namespace string) ([]servingv1.AIInference, error) {
	if namespace != d.model.Namespace {
		return nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return []servingv1.AIInference{*d.model.DeepCopy()}, nil
}

// Endpoints implements router.Directory.
func (d *FixedDirectory) Endpoints(context.Context, *servingv1.AIInference) ([]router.Endpoint, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]router.Endpoint(nil), d.endpoints...), nil
}

// ClientNamespace implements router.Directory: every client is of the
// model's namespace (no pods here).
func (d *FixedDirectory) ClientNamespace(context.Context, netip.Addr) string {
	return d.model.Namespace
}

// ServeRouter serves the router on a loopback port until the test ends; its base URL.
func ServeRouter(t testing.TB, rt *router.Router) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rt.Serve(ctx, l)
	}()
	t.Cleanup(func() {
		// Closing the listener too ends the router's drain delay: no client
		// is left to connect.
		cancel()
		_ = l.Close()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("the router did not stop within 15s")
		}
	})
	return "http://" + l.Addr().String()
}
