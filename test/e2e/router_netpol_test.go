package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/kubectlaii"
)

// routerMetricsPort is the router's metrics port (internal/router's
// --metrics-bind-address in the chart): /metrics, /healthz, /readyz.
const routerMetricsPort = "9090"

// TestRealNodeRouterMetricsOnlyWhereThePolicyAdmits installs the router as
// the chart does, its NetworkPolicy on by default (the monitoring namespaces
// set to one of the test's), with kube-router enforcing it on the real
// nodes, in front of a routed, autoscaled model. A pod of the model's
// namespace gets a completion through the router's requests port but cannot
// connect to its metrics port; a pod of the admitted monitoring namespace,
// and one labelled as the operator's in the operator's namespace, read
// /metrics; an unlabelled pod of the operator's namespace cannot. The
// operator's own reads (it runs on the host here, which kube-router lets in
// as the pod's node) keep ScalingActive true, and `kubectl aii status` reads
// both router pods' metrics through the API server's pod proxy.
func TestRealNodeRouterMetricsOnlyWhereThePolicyAdmits(t *testing.T) {
	// One replica (a core), the two router pods (100m each, one a node) and
	// five client pods (10m each).
	g, _, obj := startRealNodeTest(t, 2, "metered")
	ctx := context.Background()
	begin := time.Now()
	at := func(what string) { t.Logf("%6s  %s", time.Since(begin).Round(100*time.Millisecond), what) }
	agent := startNetworkPolicy(t)
	monitoring := newNamespace(t)
	routers := installRouter(t, g, fmt.Sprintf(`router:
  networkPolicy:
    metrics:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
`, monitoring))
	policy := &networkingv1.NetworkPolicy{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: routerService}, policy)).To(Succeed(),
		"the chart renders the router's NetworkPolicy by default")
	var routerIPs []string
	for _, r := range routers {
		routerIPs = append(routerIPs, r.Status.PodIP)
		g.Eventually(func() (bool, error) { return agent.Enforces(r.Status.PodIP, policy.Name) }).
			WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "kube-router enforces %s for %s", policy.Name, r.Name)
		// Where the host's own connections to the pod (the API server's pod
		// proxy, the operator, the kubelet) come from: the node's bridge.
		route, err := exec.Command("ip", "route", "get", r.Status.PodIP).CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "%s", route)
		t.Logf("router pod %s on %s at %s; the host reaches it as: %s", r.Name, r.Spec.NodeName, r.Status.PodIP, strings.TrimSpace(string(route)))
	}
	at("the router's two pods are ready, and kube-router enforces " + policy.Name + " on both")

	// A routed model whose autoscaler reads the router pods' metrics every
	// interval (2 s in the suite): aiinference_router_waiting_requests is
	// queue depth.
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 1,
		Targets: servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	g.Eventually(func(g Gomega) {
		slice := &discoveryv1.EndpointSlice{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: servingv1.RouterSliceName(obj.Name)}, slice)).To(Succeed())
		var addresses []string
		for _, e := range slice.Endpoints {
			addresses = append(addresses, e.Addresses...)
		}
		g.Expect(addresses).To(ConsistOf(routerIPs))
	}).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "the model's Service leads to the router's pods")
	url := serviceURL(g, obj)
	at("the model is Ready, its Service at " + url + " leads to the router")

	// The requests port: a client pod of the model's namespace (no admitted
	// namespace of the metrics port) gets a completion through the router.
	caller := clientPod(obj.Namespace, "caller", url, obj.Spec.Model.Name)
	g.Expect(k8s.Create(ctx, caller)).To(Succeed())
	waitAnswered(g, caller)
	at(fmt.Sprintf("the client %s (%s) had a completion through the router's port 8080", caller.Name, caller.Status.PodIP))

	// The metrics port, from four pods at once.
	asOperator := metricsReader(operatorNamespace, "metrics-as-operator", routers[0].Status.PodIP)
	asOperator.Labels = map[string]string{servingv1.LabelName: aiinference.OperatorPodName}
	readers := []struct {
		pod   *corev1.Pod
		admit bool
		who   string
	}{
		{metricsReader(obj.Namespace, "metrics-other", routers[0].Status.PodIP), false, "a pod of another namespace"},
		{metricsReader(obj.Namespace, "metrics-other-b", routers[1].Status.PodIP), false, "a pod of another namespace, at the other router pod"},
		{metricsReader(monitoring, "metrics-monitoring", routers[1].Status.PodIP), true, "a pod of the monitoring namespace"},
		{asOperator, true, "a pod labelled as the operator's, in its namespace"},
		{metricsReader(operatorNamespace, "metrics-neighbour", routers[0].Status.PodIP), false, "an unlabelled pod of the operator's namespace"},
	}
	for _, r := range readers {
		g.Expect(k8s.Create(ctx, r.pod)).To(Succeed(), "%s/%s", r.pod.Namespace, r.pod.Name)
		if r.pod.Namespace == operatorNamespace {
			t.Cleanup(func() { _ = k8s.Delete(context.Background(), r.pod, client.GracePeriodSeconds(0)) })
		}
	}
	for _, r := range readers {
		msg := readerResult(g, r.pod)
		t.Logf("%s (%s/%s at %s) reading %s: %s", r.who, r.pod.Namespace, r.pod.Name, r.pod.Status.PodIP, readerURL(r.pod), msg)
		if r.admit {
			// The exposition's start: the model's series where that router
			// pod has any, else the Go runtime's.
			g.Expect(msg).To(And(ContainSubstring("200 OK"), ContainSubstring("# TYPE ")), "%s reads the router's metrics", r.who)
			continue
		}
		g.Expect(msg).NotTo(ContainSubstring("200 OK"), "%s read the router's metrics", r.who)
		g.Expect(msg).To(MatchRegexp("connection refused|i/o timeout|deadline exceeded"), "%s cannot connect to the metrics port", r.who)
	}
	at("the metrics port admits the monitoring namespace and the operator's pods, and no other pod")

	// The operator's reads of the router pods, every 2 s: a router pod it
	// could not read would turn ScalingActive False (MetricsUnavailable).
	signalsRead := func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionScalingActive)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "ScalingActive: %s: %s", c.Reason, c.Message)
		g.Expect(c.Reason).To(Equal(servingv1.ReasonSignalsRead))
	}
	g.Eventually(signalsRead).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	g.Consistently(signalsRead).WithTimeout(8 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	at("the operator reads the router pods: ScalingActive True (SignalsRead) for 8 s")

	// kubectl aii status: the routing report, through the API server's pod proxy.
	text := aiiStatus(g, obj, "")
	t.Logf("kubectl aii status %s:\n%s", obj.Name, text)
	var report struct {
		Routing *kubectlaii.RoutingReport `json:"routing"`
	}
	g.Expect(json.Unmarshal([]byte(aiiStatus(g, obj, "json")), &report)).To(Succeed())
	g.Expect(report.Routing).NotTo(BeNil())
	g.Expect(report.Routing.Unreadable).To(BeEmpty())
	g.Expect(report.Routing.RouterPods).To(HaveLen(2))
	answered := 0.0
	for _, ep := range report.Routing.Endpoints {
		answered += ep.Requests["200"]
	}
	g.Expect(answered).To(BeNumerically(">=", 1), "the router's counts of the caller's completion: %+v", report.Routing.Endpoints)
	at(fmt.Sprintf("kubectl aii status read both router pods' metrics through the API server: %.0f answered", answered))
}

// metricsReader is a pod on the real nodes that reads a router pod's
// /metrics at podIP once a second for 10 s, then ends with what the last
// attempt got as its termination message. Its HTTP client is the warm-up
// gate's (the loader image's `warmup`), the one client the real nodes' images
// hold: it POSTs to its URL followed by /v1/completions, so the URL ends in
// "?" and that goes into the query; the router's /metrics handler answers
// any method. Every attempt then fails ("200 OK, but the answer has no
// choices: " and the answer's first 300 bytes), or fails to connect
// ("connection refused" where kube-router rejects it).
func metricsReader(ns, name, podIP string) *corev1.Pod {
	pod := realNodePod(ns, name, corev1.Container{
		Name: "reader", Image: loaderImage, ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"warmup", "--engine-url=http://" + net.JoinHostPort(podIP, routerMetricsPort) + "/metrics?", "--model=metrics",
			"--timeout=10s", "--request-timeout=3s", "--backoff=1s", "--max-backoff=1s"},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
	})
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	// The operator's namespace enforces Pod Security "restricted".
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	return pod
}

// readerURL is the URL a metricsReader reads.
func readerURL(pod *corev1.Pod) string {
	for _, a := range pod.Spec.Containers[0].Args {
		if u, ok := strings.CutPrefix(a, "--engine-url="); ok {
			return strings.TrimSuffix(u, "?")
		}
	}
	return ""
}

// readerResult waits for a metricsReader to end and returns its termination
// message.
func readerResult(g *WithT, pod *corev1.Pod) string {
	var msg string
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
		st := pod.Status.ContainerStatuses[0].State.Terminated
		g.Expect(st).NotTo(BeNil(), "%s/%s still reading", pod.Namespace, pod.Name)
		msg = st.Message
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	return msg
}

// aiiStatus runs `kubectl aii status` on obj as the cluster's admin, with
// output format output ("" for the text), and returns what it printed.
func aiiStatus(g *WithT, obj *servingv1.AIInference, output string) string {
	var out, errOut bytes.Buffer
	cmd := kubectlaii.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	args := []string{"--kubeconfig", cluster.Kubeconfig(), "-n", obj.Namespace, "status", obj.Name}
	if output != "" {
		args = append(args, "-o", output)
	}
	cmd.SetArgs(args)
	g.Expect(cmd.ExecuteContext(context.Background())).To(Succeed(), "kubectl aii status: %s", errOut.String())
	return out.String()
}
