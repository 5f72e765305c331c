package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/routingbench"
)

// routingBenchEnv runs TestRealNodeRoutingBench (make bench-routing).
const routingBenchEnv = "ROUTING_BENCH"

// simPort is the port the simulator pods serve on.
const simPort = 8000

// TestRealNodeRoutingBench is the routing bench's sweep on the real nodes:
// four llm-d-inference-sim pods of the bench's profile, sent the same chat
// workload through their Service (kube-proxy on the real node picks a pod per
// connection), through the Gateway (Traefik, an HTTPRoute to the Service,
// weighted round robin per request), and through the router (the router's
// code on the host, over the pods' addresses); and the bound, one simulator
// pod with the cache and batch of all four. Each kind of routing runs the
// whole sweep on fresh pods, so that no cache carries from one to the next.
func TestRealNodeRoutingBench(t *testing.T) {
	if os.Getenv(routingBenchEnv) != "1" {
		t.Skipf("set %s=1 (make bench-routing) to run the routing bench on the real nodes", routingBenchEnv)
	}
	shared.share(t)
	needRealNode(t)
	// The bench's pods ask for little, but it wants the nodes' CPUs alone.
	reserveRealPods(t, int64(realNodes*runtime.NumCPU()))
	gw := sharedGateway(t)
	g := NewWithT(t)
	ctx := context.Background()
	out := os.Stdout
	ns := newNamespace(t)
	profile := routingbench.H100Llama8B
	points := routingbench.LoadSweep(t, filepath.Join(repoRoot, "test", "routingbench", routingbench.SweepFile))
	engine, err := localcluster.FindImage(cluster.Images(), localcluster.EngineSimImage)
	g.Expect(err).NotTo(HaveOccurred())

	const replicas, selected = 4, "routing-bench"
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sims"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{selected: "service"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(simPort)}},
		},
	}
	g.Expect(k8s.Create(ctx, svc)).To(Succeed())
	host := ns + ".routing.test"
	route := routeTo(gw, ns, "sims", host, "sims", 80)
	g.Expect(k8s.Create(ctx, route)).To(Succeed())
	generation := 0

	// startSims starts n simulator pods of p, selected by the Service when
	// selector is "service", and returns them once each answers.
	startSims := func(n int, p routingbench.Profile, selector string) []*routingbench.Sim {
		generation++
		var names []string
		for i := range n {
			pod := simPod(ns, fmt.Sprintf("sim-%d-%d", generation, i), engine.Ref, p)
			pod.Labels = map[string]string{selected: selector}
			g.Expect(k8s.Create(ctx, pod)).To(Succeed())
			names = append(names, pod.Name)
		}
		var sims []*routingbench.Sim
		g.Eventually(func(g Gomega) {
			sims = nil
			for _, name := range names {
				pod := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod)).To(Succeed())
				g.Expect(isReady(pod)).To(BeTrue(), "%s is not ready: %+v", name, pod.Status.ContainerStatuses)
				sims = append(sims, &routingbench.Sim{Name: name, Addr: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(simPort))})
			}
		}).WithTimeout(2*time.Minute).WithPolling(500*time.Millisecond).Should(Succeed(), "the simulator pods are ready")
		return sims
	}
	stopSims := func(sims []*routingbench.Sim) {
		for _, s := range sims {
			g.Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Name}}, client.GracePeriodSeconds(0)))).To(Succeed())
		}
		g.Eventually(func(g Gomega) {
			pods := &corev1.PodList{}
			g.Expect(k8s.List(ctx, pods, client.InNamespace(ns))).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty())
		}).WithTimeout(time.Minute).Should(Succeed())
	}
	// reachesAll waits until requests sent as o reach every sim: the
	// Service's endpoints (kube-proxy) or the route's (Traefik) are current.
	reachesAll := func(sims []*routingbench.Sim, o routingbench.RunOptions) {
		want := []string{}
		for _, s := range sims {
			want = append(want, s.Name)
		}
		seen := map[string]bool{}
		g.Eventually(func(g Gomega) {
			pod, err := simThrough(o)
			g.Expect(err).NotTo(HaveOccurred())
			seen[pod] = true
			var got []string
			for _, w := range want {
				if seen[w] {
					got = append(got, w)
				}
			}
			g.Expect(got).To(Equal(want))
		}).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).Should(Succeed(), "requests reach every simulator pod")
	}
	sweep := func(name string, sims []*routingbench.Sim, o routingbench.RunOptions) []routingbench.Summary {
		var summaries []routingbench.Summary
		for _, p := range points {
			s, err := routingbench.Measure(ctx, out, fmt.Sprintf("%s %.1f/s", name, p.Rate), sims, o, p)
			g.Expect(err).NotTo(HaveOccurred())
			summaries = append(summaries, s)
		}
		return summaries
	}

	fmt.Fprintf(out, "routing bench (real nodes): %d simulator pods of %s\n", replicas, profile)
	routingbench.PrintWorkload(out)
	sims := startSims(replicas, profile, "service")
	viaService := routingbench.RunOptions{Targets: []string{clusterIPURL(g, svc)}}
	reachesAll(sims, viaService)
	service := sweep("service", sims, viaService)
	stopSims(sims)

	sims = startSims(replicas, profile, "service")
	viaGateway := routingbench.RunOptions{Targets: []string{gw.URL}, Host: host}
	reachesAll(sims, viaGateway)
	gateway := sweep("gateway", sims, viaGateway)
	stopSims(sims)

	sims = startSims(replicas, profile, "router")
	rt := router.New(router.Options{}, routingbench.NewFixedDirectory("bench", "chat", sims), router.NetworkPolicyCheck{}, nil, logr.Discard())
	routed := sweep("router", sims, routingbench.RunOptions{Targets: []string{routingbench.ServeRouter(t, rt)}})
	stopSims(sims)

	big := profile
	big.KVCacheBlocks *= replicas
	big.MaxNumSeqs *= replicas
	one := startSims(1, big, "bound")
	bound := sweep("bound", one, routingbench.RunOptions{Targets: []string{"http://" + one[0].Addr}})
	stopSims(one)

	for i, p := range points {
		routingbench.PrintTable(out, fmt.Sprintf("\nrouting figure (real nodes): %.1f conversations/s (%d requests)", p.Rate, service[i].Requests),
			service[i], gateway[i], routed[i], bound[i])
	}
	routingbench.AtSaturation(out, "the Service (kube-proxy)", points, service, routed, bound)
	routingbench.AtSaturation(out, "the Gateway (Traefik)", points, gateway, routed, bound)
}

// simPod is one llm-d-inference-sim pod of profile p on a real node, named
// in its answers (x-inference-pod), its KV cache keyed by its IP.
func simPod(ns, name, image string, p routingbench.Profile) *corev1.Pod {
	return realNodePod(ns, name, corev1.Container{
		Name: "engine", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
		Args:  p.Args(strconv.Itoa(simPort)),
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: simPort}},
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(simPort)}},
			PeriodSeconds: 1,
		},
		// A quarter of a core: 10m would give the pod 10 CPU shares against
		// the 1,024 of the host's processes (the router, the load
		// generator), and starve it when the host is busy.
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
	})
}

// simThrough sends one short chat completion as o would and returns the
// simulator pod that answered.
func simThrough(o routingbench.RunOptions) (string, error) {
	url := o.Targets[0]
	header, _, err := postJSON(newConnectionClient, url+"/v1/chat/completions", o.Host, map[string]any{"model": routingbench.Model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": "Hello"}}})
	if err != nil {
		return "", err
	}
	return header.Get("x-inference-pod"), nil
}

// isReady says whether the pod's Ready condition is True.
func isReady(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}
