package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Pods of real nodes reach the API server as in-cluster clients everywhere do:
// at the kubernetes Service (10.96.0.1:443, which the kubelet puts in every
// container's KUBERNETES_SERVICE_HOST and _PORT), routed by kube-proxy to the
// Service's endpoints. The API server listens on loopback only, which a pod's
// network namespace cannot reach, and its endpoint reconciler refuses a
// loopback address (so it runs with none). So once the first real node has its
// bridge, the cluster relays TCP from the bridge's address, which every real
// node's pods reach through the host, to the API server on loopback, and makes
// that address the kubernetes Service's endpoint. The relay passes the bytes
// through: TLS (the serving certificate names 10.96.0.1), authentication and
// authorization are the API server's own. It is reachable only at the bridge's
// address, not on the host's network.

// apiRelay relays TCP connections from its listener to the API server.
type apiRelay struct {
	ln     net.Listener
	target string // host:port of the API server on loopback

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startAPIRelay listens on a free port of ip and relays to target.
func startAPIRelay(ip net.IP, target string) (*apiRelay, error) {
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return nil, fmt.Errorf("the API server relay for real nodes' pods: %w", err)
	}
	r := &apiRelay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// addr is where pods reach the relay.
func (r *apiRelay) addr() *net.TCPAddr { return r.ln.Addr().(*net.TCPAddr) }

func (r *apiRelay) serve() {
	defer r.wg.Done()
	for {
		conn, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		if !r.track(conn) {
			conn.Close()
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.relay(conn)
		}()
	}
}

// track records conn for close, unless the relay is closed.
func (r *apiRelay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for _, c := range conns {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *apiRelay) untrack(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		delete(r.conns, c)
	}
}

// relay copies both ways between a pod's connection and a new one to the API
// server until either side ends.
func (r *apiRelay) relay(in net.Conn) {
	defer in.Close()
	out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		r.untrack(in)
		return // the API server restarts: the pod's client sees a reset and retries
	}
	defer out.Close()
	if !r.track(out) {
		return
	}
	defer r.untrack(in, out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close, so a side that has said all it will still gets the answer.
		if tcp, ok := dst.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

// close stops accepting, ends every relayed connection and waits for them.
func (r *apiRelay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

// apiServerEndpointsName is the kubernetes Service's name, and so its
// EndpointSlice's, in the default namespace.
const apiServerEndpointsName = "kubernetes"

// publishAPIServerEndpoint makes addr the only endpoint of the kubernetes
// Service, in the EndpointSlice kube-proxy routes by. (No Endpoints object:
// nothing here reads one, and the mirroring controller makes slices only from
// Endpoints.)
func (c *Cluster) publishAPIServerEndpoint(ctx context.Context, addr *net.TCPAddr) error {
	// The Service's port is named https, as the API server names it.
	ports := []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(addr.Port)), Protocol: ptr.To(corev1.ProtocolTCP)}}
	if err := c.publishEndpoint(ctx, metav1.NamespaceDefault, apiServerEndpointsName, addr.IP, ports); err != nil {
		return fmt.Errorf("the kubernetes Service's EndpointSlice: %w", err)
	}
	return nil
}

// publishEndpoint makes ip, on ports, the only endpoint of the Service
// namespace/name (one without a selector), in an EndpointSlice of the same
// name, made or replaced.
func (c *Cluster) publishEndpoint(ctx context.Context, namespace, name string, ip net.IP, ports []discoveryv1.EndpointPort) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   "localcluster.aiinference.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       ports,
	}
	slices := c.client.DiscoveryV1().EndpointSlices(namespace)
	_, err := slices.Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *discoveryv1.EndpointSlice
		if old, err = slices.Get(ctx, slice.Name, metav1.GetOptions{}); err == nil {
			slice.ResourceVersion = old.ResourceVersion
			_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		}
	}
	return err
}

// startAPIRelay starts the cluster's API server relay on the bridge of node,
// its first real node, and publishes it as the kubernetes Service's endpoint;
// it does nothing for later nodes. c.real.mu is held.
func (c *Cluster) startAPIRelay(ctx context.Context, node RealNode) error {
	c.mu.Lock()
	started := c.real.apiRelay != nil
	c.mu.Unlock()
	if started {
		return nil
	}
	_, subnet, err := net.ParseCIDR(node.PodCIDR)
	if err != nil {
		return err
	}
	gateway := subnet.IP.To4()
	if gateway == nil {
		return errors.New("real node pod subnet is not IPv4: " + node.PodCIDR)
	}
	gateway = net.IPv4(gateway[0], gateway[1], gateway[2], gateway[3]+1)
	relay, err := startAPIRelay(gateway, net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ports.apiServer)))
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		relay.close()
		return errors.New("cluster stopped while starting")
	}
	c.real.apiRelay = relay
	c.mu.Unlock()
	fmt.Fprintf(c.progress, "Pods reach the API server at the kubernetes Service, relayed from %s\n", relay.addr())
	return c.publishAPIServerEndpoint(ctx, relay.addr())
}
