package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The pods of real nodes resolve names as pods everywhere do: the kubelet
// writes the kube-dns Service's ClusterIP into their resolv.conf (its
// clusterDNS) with the search path <namespace>.svc.cluster.local
// svc.cluster.local cluster.local, and a DNS server behind that Service
// answers for the cluster's Services and for the pods of headless Services
// (hostname.subdomain, the names LeaderWorkerSet gives a group's leader in
// LWS_LEADER_ADDRESS). Here that server is CoreDNS (hack/tools/build.sh
// coredns, with the kubernetes plugin over the cluster's API server), run on
// the host as the cluster's other components are, once the first real node
// has its bridge. It listens on the bridge's address, which every real
// node's pods reach through the host, on a free port rather than 53 (which
// would clash with a DNS server the host may run on every address), and that
// address is the kube-dns Service's endpoint, to which kube-proxy leads the
// ClusterIP's port 53. Names outside the cluster go to the host's own
// resolvers (/etc/resolv.conf). Like every Service's, the ClusterIP routes
// once the cluster's kube-proxy runs (WaitKubeProxy).

const (
	// corednsBinary is in the real node binaries' folder (hack/tools/build.sh node).
	corednsBinary = "coredns"
	// ClusterDNSIP is the kube-dns Service's ClusterIP, the real nodes'
	// clusterDNS: the tenth address of the Service range, as kubeadm takes.
	// The API server hands out fixed addresses from the range's lower part
	// only when asked, so it is free when the first real node starts.
	ClusterDNSIP = "10.96.0.10"
	// ClusterDomain is the real nodes' clusterDomain, which CoreDNS serves.
	ClusterDomain = "cluster.local"
	// dnsServiceName is the Service of the cluster DNS, in kube-system, by
	// the name clusters give it.
	dnsServiceName = "kube-dns"
	// corednsUser is CoreDNS's user at the API server, as in a cluster's
	// ClusterRole and ClusterRoleBinding system:coredns.
	corednsUser = "system:coredns"
)

// clusterDNS is the cluster's CoreDNS, guarded by Cluster.mu.
type clusterDNS struct {
	// addr is where CoreDNS serves, the kube-dns Service's endpoint.
	addr *net.UDPAddr
	// readyURL answers 200 once the kubernetes plugin has read the cluster.
	readyURL string
	// ready is set once readyURL has answered 200.
	ready bool
	// started is when CoreDNS started.
	started time.Time
}

// startClusterDNS starts the cluster's CoreDNS on the bridge of node, its
// first real node, and makes it the kube-dns Service's endpoint; it does
// nothing for later nodes. waitClusterDNS waits for it to answer. c.real.mu
// is held.
func (c *Cluster) startClusterDNS(ctx context.Context, node RealNode) error {
	c.mu.Lock()
	started := c.real.dns != nil
	c.mu.Unlock()
	if started {
		return nil
	}
	ip, err := bridgeGateway(node)
	if err != nil {
		return err
	}
	port, err := freeDNSPort(ip)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.dir, corednsBinary)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.writeClientKubeconfig(kubeconfig, corednsUser, ""); err != nil {
		return err
	}
	if err := c.grantClusterDNS(ctx); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	healthAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	readyAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	corefile := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(corefile, []byte(corefileFor(ip, port, healthAddr, readyAddr, kubeconfig)), 0o600); err != nil {
		return err
	}
	addr := &net.UDPAddr{IP: ip, Port: port}
	c.mu.Lock()
	c.real.dns = &clusterDNS{addr: addr, readyURL: "http://" + readyAddr + "/ready", started: time.Now()}
	c.mu.Unlock()
	if err := c.start(corednsBinary, filepath.Join(c.real.options.BinDir, corednsBinary), "-conf", corefile); err != nil {
		return err
	}
	fmt.Fprintf(c.progress, "Pods resolve names at the kube-dns Service %s, served by CoreDNS at %s\n", ClusterDNSIP, addr)
	return c.publishClusterDNS(ctx, addr)
}

// waitClusterDNS waits until the cluster's CoreDNS has read the cluster and
// answers (at once once it has). It does nothing before startClusterDNS.
func (c *Cluster) waitClusterDNS(ctx context.Context) error {
	c.mu.Lock()
	dns := c.real.dns
	c.mu.Unlock()
	if dns == nil || dns.ready {
		return nil
	}
	if err := c.waitHTTP(ctx, corednsBinary, dns.readyURL, nil); err != nil {
		return err
	}
	c.mu.Lock()
	dns.ready = true
	c.mu.Unlock()
	fmt.Fprintf(c.progress, "CoreDNS has read the cluster, %s after its start\n", time.Since(dns.started).Round(100*time.Millisecond))
	return nil
}

// ClusterDNSAddr is where the cluster's CoreDNS serves (the kube-dns
// Service's endpoint), nil before the first real node starts.
func (c *Cluster) ClusterDNSAddr() *net.UDPAddr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real.dns == nil {
		return nil
	}
	return c.real.dns.addr
}

// corefileFor is CoreDNS's configuration: the cluster's zone from the API
// server, and the reverse zones of its addresses (the rest of them to the
// host's resolvers), on ip:port; its health and readiness on loopback.
func corefileFor(ip net.IP, port int, healthAddr, readyAddr, kubeconfig string) string {
	return fmt.Sprintf(`.:%d {
    bind %s
    errors
    health %s
    ready %s
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s %s
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    forward . /etc/resolv.conf
    cache 30
}
`, port, ip, healthAddr, readyAddr, ClusterDomain, kubeconfig, contextName)
}

// grantClusterDNS lets CoreDNS's user read what its kubernetes plugin
// watches, as a cluster's system:coredns ClusterRole does.
func (c *Cluster) grantClusterDNS(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: corednsUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: corednsUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: corednsUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: corednsUser}},
	}
	rbac := c.client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("CoreDNS's ClusterRole: %w", err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("CoreDNS's ClusterRoleBinding: %w", err)
	}
	return nil
}

// publishClusterDNS makes the kube-dns Service (ClusterDNSIP, port 53 over
// UDP and TCP, no selector) and addr its only endpoint, in the
// EndpointSlice kube-proxy routes by.
func (c *Cluster) publishClusterDNS(ctx context.Context, addr *net.UDPAddr) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: dnsServiceName, Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{"k8s-app": dnsServiceName, "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: ClusterDNSIP,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
			},
		},
	}
	if _, err := c.client.CoreV1().Services(metav1.NamespaceSystem).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the kube-dns Service at %s: %w", ClusterDNSIP, err)
	}
	ports := []discoveryv1.EndpointPort{
		{Name: ptr.To("dns"), Port: ptr.To(int32(addr.Port)), Protocol: ptr.To(corev1.ProtocolUDP)},
		{Name: ptr.To("dns-tcp"), Port: ptr.To(int32(addr.Port)), Protocol: ptr.To(corev1.ProtocolTCP)},
	}
	if err := c.publishEndpoint(ctx, metav1.NamespaceSystem, dnsServiceName, addr.IP, ports); err != nil {
		return fmt.Errorf("the kube-dns Service's EndpointSlice: %w", err)
	}
	return nil
}

// bridgeGateway is the address of node's bridge, the first of its pod subnet.
func bridgeGateway(node RealNode) (net.IP, error) {
	_, subnet, err := net.ParseCIDR(node.PodCIDR)
	if err != nil {
		return nil, err
	}
	ip := subnet.IP.To4()
	if ip == nil {
		return nil, errors.New("real node pod subnet is not IPv4: " + node.PodCIDR)
	}
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1), nil
}

// freeDNSPort is a port of ip that is free for both UDP and TCP, as a DNS
// server listens on both.
func freeDNSPort(ip net.IP) (int, error) {
	var errs []error
	for range 10 {
		tcp, err := net.Listen("tcp4", net.JoinHostPort(ip.String(), "0"))
		if err != nil {
			return 0, fmt.Errorf("a port for the cluster DNS on %s: %w", ip, err)
		}
		port := tcp.Addr().(*net.TCPAddr).Port
		udp, err := net.ListenPacket("udp4", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		tcp.Close()
		if err == nil {
			udp.Close()
			return port, nil
		}
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("no port of %s free for both UDP and TCP for the cluster DNS: %w", ip, errors.Join(errs...))
}
