// Package world is the fixed directory of the router that test/routerfaults
// runs as its own process (routerproc): the models, their replicas, the Host
// names that lead to them and the clients' namespaces, read once from a file
// (JSON or YAML) instead of the Kubernetes cache that router.KubeDirectory
// reads. It is a fake of the cluster, for a harness on loopback; the real
// directory is router.KubeDirectory, tested apart.
package world

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/router"
)

// File is what the world file holds.
type File struct {
	// Models are the AIInferences the router knows, each with its replicas.
	Models []Model `json:"models"`
	// NamespaceHosts are Host names that lead to a namespace's OpenAI
	// address (the body's `model` picks the AIInference): host -> namespace.
	NamespaceHosts map[string]string `json:"namespaceHosts,omitempty"`
	// Clients are the namespaces of client addresses ("127.0.0.2": "a"),
	// as the router learns a client pod's namespace from its IP; an address
	// not listed is outside every namespace.
	Clients map[string]string `json:"clients,omitempty"`
}

// Model is one AIInference, its replicas and the Host names that lead to it.
type Model struct {
	// Object is the AIInference as the API server would hold it: any spec
	// field works (spec.networkPolicy, spec.routing, spec.adapters, ...).
	Object servingv1.AIInference `json:"object"`
	// Hosts lead to the model's Service (without port; a port a request
	// gives is ignored).
	Hosts []string `json:"hosts,omitempty"`
	// Endpoints are the model's serving replicas.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Deny makes the fake ingress policy (DenyPolicy) refuse every client
	// of the model.
	Deny bool `json:"deny,omitempty"`
}

// Endpoint is one serving replica.
type Endpoint struct {
	Name string `json:"name"`
	// Addr is host:port of the engine's HTTP port.
	Addr string `json:"addr"`
	// MetricsURL is the engine's /metrics; empty: http://<addr>/metrics.
	MetricsURL string `json:"metricsURL,omitempty"`
	// Track is stable (the default) or canary.
	Track string `json:"track,omitempty"`
}

// Read reads a world file, JSON or YAML.
func Read(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, m := range f.Models {
		if m.Object.Name == "" || m.Object.Namespace == "" {
			return nil, fmt.Errorf("%s: models[%d] has no metadata.name or metadata.namespace", path, i)
		}
	}
	for addr := range f.Clients {
		if _, err := netip.ParseAddr(addr); err != nil {
			return nil, fmt.Errorf("%s: clients: %w", path, err)
		}
	}
	return &f, nil
}

// Directory is the fixed directory: a router.Directory over a File, which
// never changes while the router runs.
type Directory struct {
	file    *File
	targets map[string]router.Target
	clients map[netip.Addr]string
}

// NewDirectory is the directory of the file's world.
func NewDirectory(f *File) (*Directory, error) {
	d := &Directory{file: f, targets: map[string]router.Target{}, clients: map[netip.Addr]string{}}
	add := func(host string, t router.Target) error {
		host = normalHost(host)
		if prev, ok := d.targets[host]; ok && prev != t {
			return fmt.Errorf("host %q leads to both %v and %v", host, prev, t)
		}
		d.targets[host] = t
		return nil
	}
	for _, m := range f.Models {
		for _, h := range m.Hosts {
			if err := add(h, router.Target{Namespace: m.Object.Namespace, Model: m.Object.Name}); err != nil {
				return nil, err
			}
		}
	}
	for h, ns := range f.NamespaceHosts {
		if err := add(h, router.Target{Namespace: ns}); err != nil {
			return nil, err
		}
	}
	for addr, ns := range f.Clients {
		d.clients[netip.MustParseAddr(addr).Unmap()] = ns
	}
	return d, nil
}

func normalHost(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

func (d *Directory) model(key types.NamespacedName) *Model {
	for i := range d.file.Models {
		m := &d.file.Models[i]
		if m.Object.Namespace == key.Namespace && m.Object.Name == key.Name {
			return m
		}
	}
	return nil
}

// Target implements router.Directory: a host not listed leads nowhere (404).
func (d *Directory) Target(_ context.Context, host string, _ netip.Addr) (router.Target, bool) {
	t, ok := d.targets[normalHost(host)]
	return t, ok
}

// Model implements router.Directory.
func (d *Directory) Model(_ context.Context, key types.NamespacedName) (*servingv1.AIInference, error) {
	if m := d.model(key); m != nil {
		return m.Object.DeepCopy(), nil
	}
	return nil, nil
}

// Models implements router.Directory.
func (d *Directory) Models(_ context.Context, namespace string) ([]servingv1.AIInference, error) {
	var out []servingv1.AIInference
	for i := range d.file.Models {
		if d.file.Models[i].Object.Namespace == namespace {
			out = append(out, *d.file.Models[i].Object.DeepCopy())
		}
	}
	return out, nil
}

// Endpoints implements router.Directory.
func (d *Directory) Endpoints(_ context.Context, obj *servingv1.AIInference) ([]router.Endpoint, error) {
	m := d.model(types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name})
	if m == nil {
		return nil, nil
	}
	out := make([]router.Endpoint, 0, len(m.Endpoints))
	for _, e := range m.Endpoints {
		ep := router.Endpoint{Name: e.Name, Addr: e.Addr, MetricsURL: e.MetricsURL, Track: e.Track}
		if ep.MetricsURL == "" {
			ep.MetricsURL = "http://" + e.Addr + "/metrics"
		}
		if ep.Track == "" {
			ep.Track = servingv1.TrackStable
		}
		out = append(out, ep)
	}
	return out, nil
}

// ClientNamespace is the namespace of the client at addr, from the file's
// clients; "" when it lists none.
func (d *Directory) ClientNamespace(_ context.Context, addr netip.Addr) string {
	return d.clients[addr.Unmap()]
}

// DenyPolicy is a fake router.IngressPolicy: it refuses every client of a
// model whose world entry says deny, and admits the rest. It stands for the
// real check, router.NetworkPolicyCheck (spec.networkPolicy evaluated as the
// rendered NetworkPolicy would be), which is tested elsewhere: the harness
// needs only a refusal that costs what the real one costs after it.
type DenyPolicy struct {
	Directory *Directory
}

// Admits implements router.IngressPolicy.
func (p DenyPolicy) Admits(_ context.Context, obj *servingv1.AIInference, _ netip.Addr) (bool, error) {
	m := p.Directory.model(types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name})
	return m != nil && !m.Deny, nil
}

// Interfaces the router takes.
var (
	_ router.Directory     = (*Directory)(nil)
	_ router.IngressPolicy = DenyPolicy{}
)
