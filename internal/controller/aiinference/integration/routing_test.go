package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// routerSlice stands for the EndpointSlice kube-controller-manager keeps for
// the router's Service (envtest runs no controller): the router's pods and
// whether each is ready.
func setRouterPods(g *WithT, ready map[string]bool) {
	setRouterSlice(g, ready, 8080, 0)
}

// setRouterSlice is setRouterPods with the router's ports: http, and
// metrics when not 0.
func setRouterSlice(g *WithT, ready map[string]bool, httpPort, metricsPort int32) {
	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: aiinference.DefaultRouterService + "-abcde", Labels: map[string]string{
			discoveryv1.LabelServiceName: aiinference.DefaultRouterService, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(httpPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if metricsPort != 0 {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To("metrics"), Port: ptr.To(metricsPort), Protocol: ptr.To(corev1.ProtocolTCP)})
	}
	for ip, r := range ready {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r)}})
	}
	existing := &discoveryv1.EndpointSlice{}
	err := k8s.Get(ctx, client.ObjectKeyFromObject(slice), existing)
	if apierrors.IsNotFound(err) {
		g.Expect(k8s.Create(ctx, slice)).To(Succeed())
		return
	}
	g.Expect(err).NotTo(HaveOccurred())
	existing.Endpoints, existing.Ports = slice.Endpoints, slice.Ports
	g.Expect(k8s.Update(ctx, existing)).To(Succeed())
}

// Routing on: the model's Service keeps its name and port but leads to the
// router's ready pods (its selector gone, an EndpointSlice of the router's
// addresses), and so does the namespace's OpenAI address, shared by its routed
// models; the NetworkPolicy lets the router in. The router's pods changing
// moves the slices; no ready router pod puts the selector back (round robin
// rather than nowhere); routing off takes everything back, and the OpenAI
// address goes with the last routed model.
func TestRoutingLeadsTheServicesToTheRouter(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	setRouterPods(g, map[string]bool{"10.0.7.1": true, "10.0.7.2": true})
	routed := func(o *servingv1.AIInference) {
		o.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
		o.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true}
	}
	_, a, keyA := startInference(t, "chat-a", routed)
	b := newInference(a.Namespace, "chat-b")
	routed(b)
	g.Expect(k8s.Create(ctx, b)).To(Succeed())
	keyB := client.ObjectKeyFromObject(b)

	service := func(g Gomega, name string) *corev1.Service {
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: name}, svc)).To(Succeed())
		return svc
	}
	addresses := func(g Gomega, name string) []string {
		slice := &discoveryv1.EndpointSlice{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: name}, slice)).To(Succeed())
		g.Expect(slice.Ports).To(HaveLen(1))
		g.Expect(*slice.Ports[0].Port).To(Equal(int32(8080)))
		var ips []string
		for _, ep := range slice.Endpoints {
			ips = append(ips, ep.Addresses...)
		}
		return ips
	}
	gone := func(obj client.Object, name string) func() bool {
		return func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: name}, obj))
		}
	}
	g.Eventually(func(g Gomega) {
		for _, name := range []string{"chat-a", "chat-b"} {
			svc := service(g, name)
			g.Expect(svc.Spec.Selector).To(BeEmpty(), "%s leads to the router", name)
			g.Expect(svc.Spec.Ports[0].Port).To(Equal(int32(8000)))
			g.Expect(addresses(g, name+"-router")).To(ConsistOf("10.0.7.1", "10.0.7.2"))
		}
		openai := service(g, aiinference.OpenAIServiceName)
		g.Expect(openai.Spec.Selector).To(BeEmpty())
		g.Expect(openai.Spec.Ports[0].Port).To(Equal(int32(aiinference.OpenAIServicePort)))
		g.Expect(openai.OwnerReferences).To(HaveLen(2), "one owner reference per routed model")
		g.Expect(addresses(g, aiinference.OpenAIServiceName+"-router")).To(ConsistOf("10.0.7.1", "10.0.7.2"))
		policy := &networkingv1.NetworkPolicy{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: "chat-a-ingress"}, policy)).To(Succeed())
		g.Expect(policy.Spec.Ingress[0].From).To(ContainElement(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: operatorNamespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{aiinference.OperatorPodLabel: aiinference.RouterPodName}},
		}))
	}).WithTimeout(waitTimeout).Should(Succeed())

	// A router pod stops being ready: it leaves every slice.
	setRouterPods(g, map[string]bool{"10.0.7.1": true, "10.0.7.2": false})
	g.Eventually(func(g Gomega) {
		g.Expect(addresses(g, "chat-a-router")).To(ConsistOf("10.0.7.1"))
		g.Expect(addresses(g, aiinference.OpenAIServiceName+"-router")).To(ConsistOf("10.0.7.1"))
	}).WithTimeout(waitTimeout).Should(Succeed())

	// No router pod is ready: the Service goes back to its pods.
	setRouterPods(g, map[string]bool{"10.0.7.1": false, "10.0.7.2": false})
	g.Eventually(func(g Gomega) {
		g.Expect(service(g, "chat-a").Spec.Selector).To(HaveKeyWithValue(servingv1.LabelInference, "chat-a"))
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Eventually(gone(&discoveryv1.EndpointSlice{}, "chat-a-router")).WithTimeout(waitTimeout).Should(BeTrue())
	setRouterPods(g, map[string]bool{"10.0.7.1": true, "10.0.7.2": true})
	g.Eventually(func(g Gomega) {
		g.Expect(service(g, "chat-a").Spec.Selector).To(BeEmpty())
	}).WithTimeout(waitTimeout).Should(Succeed())

	// Routing off for one model: its Service selects its pods again, and the
	// OpenAI address stays for the other.
	updateObject(g, keyA, func(o *servingv1.AIInference) { o.Spec.Routing.Enabled = false })
	g.Eventually(func(g Gomega) {
		g.Expect(service(g, "chat-a").Spec.Selector).To(HaveKeyWithValue(servingv1.LabelInference, "chat-a"))
		openai := service(g, aiinference.OpenAIServiceName)
		g.Expect(openai.OwnerReferences).To(HaveLen(1))
		g.Expect(openai.OwnerReferences[0].Name).To(Equal("chat-b"))
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Eventually(gone(&discoveryv1.EndpointSlice{}, "chat-a-router")).WithTimeout(waitTimeout).Should(BeTrue())

	// And for the last: the OpenAI address goes.
	updateObject(g, keyB, func(o *servingv1.AIInference) { o.Spec.Routing = nil })
	g.Eventually(gone(&corev1.Service{}, aiinference.OpenAIServiceName)).WithTimeout(waitTimeout).Should(BeTrue())
	g.Eventually(gone(&discoveryv1.EndpointSlice{}, aiinference.OpenAIServiceName+"-router")).WithTimeout(waitTimeout).Should(BeTrue())
	g.Expect(service(g, "chat-b").Spec.Selector).To(HaveKeyWithValue(servingv1.LabelInference, "chat-b"))
}

// A routed model at zero: its Service leads to the router (no activator
// slice), which holds the request (the real router, in this process, with no
// replica to send it to) and exports it as waiting; the autoscaler reads the
// router's /metrics through its Service's metrics port and starts a replica.
func TestTheRouterHoldsARoutedModelAtZero(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := credentialedNamespace(t)
	routerURL := serveRouter(t, g, routingbench.NewFixedDirectory(ns, "held", nil))

	obj := newInference(ns, "held")
	obj.Spec.Replicas = ptr.To[int32](0)
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2,
		Targets: servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](2)}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	key := client.ObjectKeyFromObject(obj)
	g.Eventually(func(g Gomega) {
		g.Expect(*getDeployment(g, key).Spec.Replicas).To(BeZero())
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, key, svc)).To(Succeed())
		g.Expect(svc.Spec.Selector).To(BeEmpty(), "the Service leads to the router")
	}).WithTimeout(waitTimeout).Should(Succeed())

	requestCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() {
		body := `{"model":"` + routingbench.Model + `","prompt":"hello","max_tokens":2}`
		req, _ := http.NewRequestWithContext(requestCtx, http.MethodPost, routerURL+"/v1/completions", strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Autoscaling).NotTo(BeNil())
		g.Expect(obj.Status.Autoscaling.DesiredReplicas).To(Equal(int32(1)))
		last := obj.Status.Autoscaling.Decisions[len(obj.Status.Autoscaling.Decisions)-1]
		g.Expect(last.Message).To(ContainSubstring("1 request(s) held by the router"))
	})
	g.Eventually(func(g Gomega) {
		g.Expect(*getDeployment(g, key).Spec.Replicas).To(Equal(int32(1)))
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.ActivatorSliceName()}, &discoveryv1.EndpointSlice{}))).
		To(BeTrue(), "a routed model's Service has no activator slice")
}

// serveRouter runs the real router in this process over dir, as the
// router's one ready pod: its Service's slice names it, with its metrics
// port. It listens on the host's address (an EndpointSlice may not name a
// loopback one); its URL.
func serveRouter(t *testing.T, g *WithT, dir router.Directory) string {
	reg := prometheus.NewRegistry()
	rt := router.New(router.Options{HoldTimeout: time.Minute, DrainDelay: time.Millisecond, ShutdownTimeout: time.Second}, dir, router.NetworkPolicyCheck{}, router.NewMetrics(reg), logr.Discard())
	listen := func() net.Listener {
		l, err := net.Listen("tcp", net.JoinHostPort(activatorIP, "0"))
		g.Expect(err).NotTo(HaveOccurred())
		return l
	}
	routerListener := listen()
	serveCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go func() { _ = rt.Serve(serveCtx, routerListener) }()
	routerURL := "http://" + routerListener.Addr().String()
	metrics := &httptest.Server{Listener: listen(), Config: &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}}
	metrics.Start()
	t.Cleanup(metrics.Close)
	setRouterSlice(g, map[string]bool{activatorIP: true}, portOf(t, routerURL), portOf(t, metrics.URL))
	return routerURL
}

// Before a scale-down of a routed model, each pod is marked with how much
// traffic the router sends it for the prefixes it holds (the pod deletion
// cost the ReplicaSet controller reads): the replica holding the shared
// prompt prefix stays, the other goes. Two real simulators stand for the
// pods' engines behind the real router.
func TestAScaleDownKeepsTheReplicaHoldingThePrefixes(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ns := credentialedNamespace(t)
	profile := routingbench.Profile{Name: "fast", PrefillOverhead: 5 * time.Millisecond, PrefillPerToken: 10 * time.Microsecond,
		InterTokenLatency: 5 * time.Millisecond, MaxNumSeqs: 16, KVCacheBlocks: 4096}
	sims := []*routingbench.Sim{routingbench.StartSim(t, "keep-0", profile), routingbench.StartSim(t, "keep-1", profile)}
	routerURL := serveRouter(t, g, routingbench.NewFixedDirectory(ns, "keep", sims))

	obj := newInference(ns, "keep")
	obj.Spec.Replicas = ptr.To[int32](2)
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	obj.Spec.Engine.Port = int32(portOf(t, "http://"+sims[0].Addr))
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
		Targets:   servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)},
		ScaleDown: &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 6 * time.Second}}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	key := client.ObjectKeyFromObject(obj)
	var pods []*corev1.Pod
	for _, sim := range sims {
		pod := servingPod(t, g, obj, sim.Name)
		setPodStatus(g, pod, func(s *corev1.PodStatus) { s.PodIP, s.PodIPs = "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}} })
		pods = append(pods, pod)
	}

	// Conversations sharing one long system prompt: the router sends them
	// to the replica that holds it.
	system := strings.Repeat("You are the support assistant of a company that sells bicycles. ", 40)
	for i := range 8 {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, routingbench.Model, system+fmt.Sprintf("Question %d?", i))
		resp, err := http.Post(routerURL+"/v1/completions", "application/json", strings.NewReader(body))
		g.Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	}
	served := make([]float64, len(sims))
	for i, sim := range sims {
		c, err := sim.ReadCounters(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		served[i] = c.Requests
	}
	holder, other := 0, 1
	if served[1] > served[0] {
		holder, other = 1, 0
	}
	g.Expect(served[holder]).To(BeNumerically(">=", 7), "the shared prefix goes to one replica: %v", served)

	// Idle: the count goes to 1, and the pods say which to remove.
	g.Eventually(func(g Gomega) {
		g.Expect(*getDeployment(g, key).Spec.Replicas).To(Equal(int32(1)))
	}).WithTimeout(waitTimeout).Should(Succeed())
	cost := func(pod *corev1.Pod) int {
		got := &corev1.Pod{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), got)).To(Succeed())
		v, err := strconv.Atoi(got.Annotations["controller.kubernetes.io/pod-deletion-cost"])
		g.Expect(err).NotTo(HaveOccurred(), "pod %s's deletion cost %q", pod.Name, got.Annotations["controller.kubernetes.io/pod-deletion-cost"])
		return v
	}
	g.Expect(cost(pods[holder])).To(BeNumerically(">", cost(pods[other])), "the replica holding the prefix costs more to remove")
}

func portOf(t *testing.T, rawURL string) int32 {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return int32(p)
}
