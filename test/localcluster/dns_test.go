package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// testClusterDNS resolves names as the real node's pods do. From the host,
// at the kube-dns Service's ClusterIP (kube-proxy leads it to CoreDNS on the
// first node's bridge): the kubernetes Service's full name. In pods, through
// the resolv.conf the kubelet writes from its clusterDNS: a Service's short
// name, and a pod of a headless Service by hostname.subdomain, the form of
// the LWS_LEADER_ADDRESS that LeaderWorkerSet gives a group's members. The
// pods are the engine image's Ray stand-in (hack/images/fakevllm): a head,
// and two workers that resolve it by one name each and join it.
func testClusterDNS(ctx context.Context, t *testing.T, c *Cluster, engineImage string) {
	t.Helper()
	if err := c.WaitKubeProxy(ctx); err != nil {
		t.Fatal(err)
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(ClusterDNSIP, "53"))
	}}
	name := "kubernetes.default.svc." + ClusterDomain
	var addrs []string
	if err := c.poll(ctx, name+" through the kube-dns Service", func(ctx context.Context) (bool, error) {
		lookup, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var err error
		addrs, err = resolver.LookupHost(lookup, name)
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(addrs, []string{serviceClusterIP}) {
		t.Fatalf("%s resolves to %v at %s, want %s", name, addrs, ClusterDNSIP, serviceClusterIP)
	}

	ns := metav1.NamespaceDefault
	pods, services := c.Client().CoreV1().Pods(ns), c.Client().CoreV1().Services(ns)
	labels := map[string]string{"app": "dns-head"}
	port := []corev1.ServicePort{{Name: "ray", Port: 6379, TargetPort: intstr.FromInt32(6379)}}
	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "dns-heads"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "dns-ray"}, Spec: corev1.ServiceSpec{Selector: labels, Ports: port}},
	} {
		if _, err := services.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string, command ...string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName:                      "real-0",
				Tolerations:                   []corev1.Toleration{{Key: GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "ray", Image: engineImage, ImagePullPolicy: corev1.PullNever, Command: command,
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}}},
			},
		}
	}
	head := pod("dns-head", "/ray", "start", "--head", "--port=6379", "--block")
	head.Labels, head.Spec.Hostname, head.Spec.Subdomain = labels, "head", "dns-heads"
	// The operator's worker command line, with the head's name in HEAD.
	worker := func(name, address string) *corev1.Pod {
		p := pod(name, "/bin/bash", "-c",
			`exec bash /vllm-workspace/examples/online_serving/multi-node-serving.sh worker --ray_address="$HEAD"`)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "HEAD", Value: address}}
		return p
	}
	byService, byHostname := worker("dns-by-service", "dns-ray"), worker("dns-by-hostname", "head.dns-heads")
	for _, p := range []*corev1.Pod{head, byService, byHostname} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The head counts itself and each worker that joined it.
	began := time.Now()
	var nodes int
	if err := c.poll(ctx, "both workers to resolve and join the head", func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, head.Name, metav1.GetOptions{})
		if err != nil || p.Status.PodIP == "" {
			return false, err
		}
		nodes, err = rayNodes(net.JoinHostPort(p.Status.PodIP, "6379"))
		return nodes == 3, err
	}); err != nil {
		for _, p := range []*corev1.Pod{head, byService, byHostname} {
			logs, _ := pods.GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			t.Logf("pod %s's log:\n%s", p.Name, logs)
		}
		t.Fatalf("%v (the head counts %d nodes, want 3)", err, nodes)
	}
	for _, p := range []*corev1.Pod{byService, byHostname} {
		logs, err := pods.GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil || !strings.Contains(string(logs), "Joined the Ray head at "+envOf(p, "HEAD")+":6379") {
			t.Fatalf("pod %s's log: %v: %s", p.Name, err, logs)
		}
	}
	t.Logf("Pods resolved a Service (dns-ray) and a headless Service's pod (head.dns-heads) and joined in %s", time.Since(began).Round(100*time.Millisecond))
}

// rayNodes asks the engine image's Ray head stand-in at addr how many nodes
// it counts (its STATUS line).
func rayNodes(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(conn, "STATUS"); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(line))
}

func envOf(p *corev1.Pod, name string) string {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
