package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/autoscale"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/routingbench"
	"github.com/aiinference/operator/test/testutil"
)

// routerPodLabel selects the router's pods (config/router, the chart).
var routerPodLabel = client.MatchingLabels{"app.kubernetes.io/name": servingv1.RouterPodName}

// routerSerial keeps the tests that install the router apart: its namespace
// is one test's at a time.
var routerSerial sync.Mutex

// installRouter installs the router as a user of the chart does
// (router.enabled=true), with the image hack/tools/build.sh images built from
// this tree, into operatorNamespace, made to enforce Pod Security
// "restricted"; its pods go on the real nodes. More values files (YAML
// documents, e.g. router.networkPolicy's) go after the test's own. It returns
// the router's pods once both are ready; the cleanups remove it all.
func installRouter(t *testing.T, g *WithT, moreValues ...string) []corev1.Pod {
	t.Helper()
	ctx := context.Background()
	routerSerial.Lock()
	t.Cleanup(routerSerial.Unlock)
	image, err := localcluster.FindImage(cluster.Images(), localcluster.RouterImage)
	g.Expect(err).NotTo(HaveOccurred())
	colon := strings.LastIndex(image.Ref, ":")
	g.Expect(colon).To(BeNumerically(">", 0), "image reference %s has no tag", image.Ref)
	helmDir, err := testutil.BuildTools("helm")
	g.Expect(err).NotTo(HaveOccurred())

	// The namespace stays for the next test that installs the router: its
	// deletion can take long (it waits on every API group the server lists
	// and on every object's finalizers), and in one CI run the next test still
	// found it there after 2 minutes.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, k8s, ns, func() error {
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels["pod-security.kubernetes.io/enforce"], ns.Labels["pod-security.kubernetes.io/enforce-version"] = "restricted", "latest"
		return nil
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ns.DeletionTimestamp).To(BeNil(), "namespace %s is being deleted", ns.Name)
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, ns.Name)
		}
		shared.emptyNamespace(t, ns.Name)
	})

	// The chart's router, on the real nodes (the GPU taint is theirs).
	values := filepath.Join(t.TempDir(), "values.yaml")
	g.Expect(os.WriteFile(values, []byte(fmt.Sprintf(`router:
  enabled: true
  image: {repository: %q, tag: %q}
  nodeSelector: {%s: %s}
  tolerations: [{key: %s, operator: Exists, effect: NoSchedule}]
`, image.Ref[:colon], image.Ref[colon+1:], localcluster.GPUProductLabel, realGPUProduct, localcluster.GPUTaintKey)), 0o644)).To(Succeed())
	args := []string{"template", "aiinference", filepath.Join(repoRoot, "charts", "aiinference-operator"),
		"--namespace", operatorNamespace, "--values", values, "--show-only", "templates/router.yaml"}
	for i, more := range moreValues {
		file := filepath.Join(filepath.Dir(values), fmt.Sprintf("values-%d.yaml", i))
		g.Expect(os.WriteFile(file, []byte(more), 0o644)).To(Succeed())
		args = append(args, "--values", file)
	}
	rendered, err := exec.Command(filepath.Join(helmDir, "helm"), args...).Output()
	g.Expect(err).NotTo(HaveOccurred(), "helm template: %s", rendered)
	var created []*unstructured.Unstructured
	t.Cleanup(func() {
		for _, obj := range created {
			if err := k8s.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	})
	var deployment string
	for _, doc := range bytes.Split(rendered, []byte("\n---")) {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		if len(obj.Object) == 0 {
			continue
		}
		g.Expect(k8s.Create(ctx, obj)).To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
		created = append(created, obj)
		switch {
		case obj.GetKind() == "Deployment":
			deployment = obj.GetName()
		case obj.GetKind() == "Service":
			g.Expect(obj.GetName()).To(Equal(routerService), "the operator's default --router-service")
		}
	}
	g.Expect(deployment).NotTo(BeEmpty(), "the chart renders the router's Deployment")

	var pods []corev1.Pod
	g.Eventually(func(g Gomega) {
		dep := &appsv1.Deployment{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: deployment}, dep)).To(Succeed())
		g.Expect(dep.Status.ReadyReplicas).To(Equal(int32(2)), "Deployment status: %+v", dep.Status.Conditions)
		list := &corev1.PodList{}
		g.Expect(k8s.List(ctx, list, client.InNamespace(operatorNamespace), routerPodLabel)).To(Succeed())
		pods = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
		g.Expect(pods).To(HaveLen(2))
	}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "the router's pods are not Ready")
	return pods
}

// routedAnswer is one completion through a routed model's Service: the pod
// the simulator says answered (x-inference-pod), and the one the router says
// it sent the request to.
type routedAnswer struct{ pod, endpoint string }

// routedComplete sends one completion of prompt to url, on a new connection
// (so that kube-proxy picks a router pod for each), and returns who answered.
func routedComplete(httpClient *http.Client, url, model, prompt string) (routedAnswer, error) {
	answer, err := postCompletion(httpClient, url, "", model, prompt)
	if err != nil {
		return routedAnswer{}, err
	}
	if answer.model != model {
		return routedAnswer{}, fmt.Errorf("a completion of %s, not of %s", answer.model, model)
	}
	a := routedAnswer{pod: answer.header.Get("x-inference-pod"), endpoint: answer.header.Get(router.EndpointHeader)}
	if a.pod == "" || a.endpoint == "" {
		return a, fmt.Errorf("an answer without x-inference-pod (%q) or %s (%q): not the simulator through the router", a.pod, router.EndpointHeader, a.endpoint)
	}
	if a.pod != a.endpoint {
		return a, fmt.Errorf("the simulator %s answered, the router says it sent the request to %s", a.pod, a.endpoint)
	}
	return a, nil
}

// chatThrough sends one chat completion of model to url, streamed or not, on
// a new connection, and returns the pod that answered (x-inference-pod).
func chatThrough(httpClient *http.Client, url, model string, stream bool) (string, error) {
	header, data, err := postJSON(httpClient, url+"/v1/chat/completions", "", map[string]any{"model": model, "max_tokens": 4, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": "Hello"}}})
	if err != nil {
		return "", err
	}
	if stream && !strings.Contains(string(data), "data: [DONE]") {
		return "", fmt.Errorf("a stream without its end: %s", data)
	}
	if !stream && !strings.Contains(string(data), `"choices"`) {
		return "", fmt.Errorf("not a chat completion: %s", data)
	}
	pod := header.Get("x-inference-pod")
	if pod == "" || pod != header.Get(router.EndpointHeader) {
		return pod, fmt.Errorf("x-inference-pod %q, %s %q: not a replica through the router", pod, router.EndpointHeader, header.Get(router.EndpointHeader))
	}
	return pod, nil
}

// listModels is what GET /v1/models at url lists.
func listModels(httpClient *http.Client, url string) ([]string, error) {
	resp, err := httpClient.Get(url + "/v1/models")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

// routerCounts are what the router pods counted for one model: picks by pod
// name and reason, and answers by status code, per router pod.
type routerCounts struct {
	picks   map[string]map[string]float64 // router pod -> "endpoint reason" -> picks
	answers map[string]map[string]float64 // router pod -> code -> requests
}

// picksBy is the picks each router pod made, summed over endpoints and reasons.
func (c routerCounts) picksBy(routerPod string) float64 {
	total := 0.0
	for _, n := range c.picks[routerPod] {
		total += n
	}
	return total
}

// sub is what was counted between before and c.
func (c routerCounts) sub(before routerCounts) routerCounts {
	out := routerCounts{picks: map[string]map[string]float64{}, answers: map[string]map[string]float64{}}
	for _, pair := range []struct{ to, now, then map[string]map[string]float64 }{{out.picks, c.picks, before.picks}, {out.answers, c.answers, before.answers}} {
		for pod, counts := range pair.now {
			pair.to[pod] = map[string]float64{}
			for k, n := range counts {
				if d := n - pair.then[pod][k]; d != 0 {
					pair.to[pod][k] = d
				}
			}
		}
	}
	return out
}

// readRouterCounts reads each router pod's /metrics (the port named metrics,
// at the pod's IP: the host routes the real nodes' pod subnet).
func readRouterCounts(g Gomega, routers []corev1.Pod, obj *servingv1.AIInference) routerCounts {
	out := routerCounts{picks: map[string]map[string]float64{}, answers: map[string]map[string]float64{}}
	httpClient := &http.Client{Timeout: 5 * time.Second}
	for _, r := range routers {
		resp, err := httpClient.Get("http://" + net.JoinHostPort(r.Status.PodIP, "9090") + "/metrics")
		g.Expect(err).NotTo(HaveOccurred())
		data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		resp.Body.Close()
		g.Expect(err).NotTo(HaveOccurred())
		parser := expfmt.NewTextParser(prommodel.UTF8Validation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(data))
		g.Expect(err).NotTo(HaveOccurred())
		out.picks[r.Name], out.answers[r.Name] = map[string]float64{}, map[string]float64{}
		for name, to := range map[string]map[string]float64{autoscale.RouterPicksMetric: out.picks[r.Name], "aiinference_router_requests_total": out.answers[r.Name]} {
			f := families[name]
			if f == nil {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["namespace"] != obj.Namespace || labels["name"] != obj.Name {
					continue
				}
				key := labels["code"]
				if name == autoscale.RouterPicksMetric {
					key = labels["endpoint"] + " " + labels["reason"]
				}
				to[key] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// routerPrompt is a prompt of about 2 KB, eight of the router's 256-byte
// blocks and more: a system prompt that starts with head, then a question.
func routerPrompt(head string, question int) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString(" You are the support assistant of a company that sells garden tools. Answer in two sentences, politely, and name the product.")
	for i := range 24 {
		fmt.Fprintf(&b, " Rule %d: never promise a delivery date, never quote a price that the catalogue does not list, always ask for the order number.", i)
	}
	fmt.Fprintf(&b, "\n\nCustomer question %d: where is my order?", question)
	return b.String()
}

// TestRealNodeRouterRoutesThroughTheService runs the router as the chart
// installs it (two pods in the operator's namespace, Pod Security
// "restricted", on the real nodes) in front of a model with
// spec.routing.enabled and two simulator replicas, and calls the model's
// Service at its ClusterIP from the host, through the real kube-proxy: every
// answer comes from a replica through the router; the requests that share a
// long prompt prefix all land on one replica, whichever router pod took
// them, while distinct prefixes spread over the replicas, each one kept on
// its own; then, with spec.networkPolicy and kube-router enforcing it, a
// client pod the policy admits gets a completion through the router, one it
// does not admit is answered 403 by the router, and the same client calling
// a replica directly is refused by kube-router.
func TestRealNodeRouterRoutesThroughTheService(t *testing.T) {
	// Two replicas, but all the real nodes' room: a router pod on each node
	// (100m) leaves a node room for one replica (1 CPU) only.
	g, _, obj := startRealNodeTest(t, 4, "routed")
	ctx := context.Background()
	begin := time.Now()
	at := func(what string) { t.Logf("%6s  %s", time.Since(begin).Round(100*time.Millisecond), what) }
	agent := startNetworkPolicy(t)
	routers := installRouter(t, g)
	routerIPs := []string{}
	for _, r := range routers {
		routerIPs = append(routerIPs, r.Status.PodIP)
		t.Logf("router pod %s on node %s at %s", r.Name, r.Spec.NodeName, r.Status.PodIP)
	}
	at("the router's two pods are ready")

	obj.Spec.Replicas = ptr.To[int32](2)
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	// The simulator names the pod that answered (x-inference-pod) and keeps a
	// KV cache of prefix blocks (it needs its IP for that), whose hits it counts.
	obj.Spec.Engine.Env = []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
	}
	obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--enable-kvcache", "--block-size=16", "--max-model-len=32768")
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(2))
	at("the model is Ready with 2 replicas")

	// The model's Service leads to the router: no selector, and its one
	// EndpointSlice lists the router's pods.
	g.Eventually(func(g Gomega) {
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), svc)).To(Succeed())
		g.Expect(svc.Spec.Selector).To(BeEmpty())
		slice := &discoveryv1.EndpointSlice{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: servingv1.RouterSliceName(obj.Name)}, slice)).To(Succeed())
		var addresses []string
		for _, e := range slice.Endpoints {
			addresses = append(addresses, e.Addresses...)
		}
		g.Expect(addresses).To(ConsistOf(routerIPs))
	}).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "the model's Service leads to the router's pods")
	url := serviceURL(g, obj)
	at("a completion came back through the Service at " + url)
	replicas := map[string]corev1.Pod{}
	for _, p := range servingPods(g, obj) {
		replicas[p.Name] = p
	}
	g.Expect(replicas).To(HaveLen(2))

	// (a, b) Each request on a new connection: kube-proxy picks one of the two
	// router pods for each.
	newConnections := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	before := readRouterCounts(g, routers, obj)
	const sharedRequests = 30
	sharedPods := map[string]int{}
	sent := time.Now()
	for i := range sharedRequests {
		a, err := routedComplete(newConnections, url, obj.Spec.Model.Name, routerPrompt("Tenant garden-tools.", i))
		g.Expect(err).NotTo(HaveOccurred(), "request %d with the shared prefix", i)
		sharedPods[a.pod]++
	}
	sharedTook := time.Since(sent)
	afterShared := readRouterCounts(g, routers, obj)
	sharedCounts := afterShared.sub(before)
	at(fmt.Sprintf("%d requests sharing a 2 KB prefix answered by %v in %s; the routers' picks: %v",
		sharedRequests, sharedPods, sharedTook.Round(10*time.Millisecond), sharedCounts.picks))
	g.Expect(sharedPods).To(HaveLen(1), "requests sharing a prompt prefix land on one replica")
	for _, r := range routers {
		g.Expect(sharedCounts.picksBy(r.Name)).To(BeNumerically(">", 0),
			"router pod %s took none of the %d requests: the two routers' agreement is not shown", r.Name, sharedRequests)
	}

	// Distinct prefixes, each sent twice (another question the second time):
	// each stays on its replica, and they spread over the replicas.
	const prefixes = 20
	first := map[int]string{}
	spread := map[string]int{}
	sent = time.Now()
	for round := range 2 {
		for p := range prefixes {
			a, err := routedComplete(newConnections, url, obj.Spec.Model.Name, routerPrompt(fmt.Sprintf("Tenant %d of %d.", p, prefixes), round))
			g.Expect(err).NotTo(HaveOccurred(), "prefix %d, round %d", p, round)
			if round == 0 {
				first[p] = a.pod
				spread[a.pod]++
				continue
			}
			g.Expect(a.pod).To(Equal(first[p]), "prefix %d went to %s, then to %s", p, first[p], a.pod)
		}
	}
	distinctTook := time.Since(sent)
	distinctCounts := readRouterCounts(g, routers, obj).sub(afterShared)
	at(fmt.Sprintf("%d distinct prefixes, each sent twice, answered by %v (first round) in %s, each prefix by the same replica both times; the routers' picks: %v",
		prefixes, spread, distinctTook.Round(10*time.Millisecond), distinctCounts.picks))
	g.Expect(len(spread)).To(BeNumerically(">", 1), "distinct prefixes all went to one replica")

	// The README's calls: a chat completion at the model's Service, and the
	// namespace's one OpenAI address, the Service aiinference-openai on port 80
	// (/v1/models, a streamed chat completion).
	_, err := chatThrough(newConnections, url, obj.Spec.Model.Name, false)
	g.Expect(err).NotTo(HaveOccurred(), "a chat completion at the model's Service")
	openai := &corev1.Service{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: "aiinference-openai"}, openai)).To(Succeed())
	openaiURL := "http://" + net.JoinHostPort(openai.Spec.ClusterIP, strconv.Itoa(int(openai.Spec.Ports[0].Port)))
	g.Expect(openai.Spec.Ports[0].Port).To(Equal(int32(80)))
	g.Eventually(func() ([]string, error) { return listModels(newConnections, openaiURL) }).
		WithTimeout(serviceRouteTimeout).WithPolling(500*time.Millisecond).Should(ConsistOf(obj.Spec.Model.Name), "GET /v1/models at %s", openaiURL)
	streamed, err := chatThrough(newConnections, openaiURL, obj.Spec.Model.Name, true)
	g.Expect(err).NotTo(HaveOccurred(), "a streamed chat completion at the namespace's address, by the served name")
	g.Expect(replicas).To(HaveKey(streamed))
	// The README's example names the AIInference (metadata.name) there, which
	// is not the name its engine serves.
	g.Expect(obj.Name).NotTo(Equal(obj.Spec.Model.Name))
	byName, err := chatThrough(newConnections, openaiURL, obj.Name, true)
	g.Expect(err).NotTo(HaveOccurred(), "a streamed chat completion at the namespace's address, by the AIInference's name")
	g.Expect(replicas).To(HaveKey(byName))
	at(fmt.Sprintf("the namespace's address %s lists %s, and streams chat completions by the served name (from %s) and by the AIInference's name %q (from %s)",
		openaiURL, obj.Spec.Model.Name, streamed, obj.Name, byName))

	// The replicas' own KV caches say so: the shared prefix's replica had hits.
	for name, p := range replicas {
		c, err := (&routingbench.Sim{Addr: net.JoinHostPort(p.Status.PodIP, "8000")}).ReadCounters(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		t.Logf("replica %s: %.0f requests, prefix cache %.0f of %.0f tokens hit", name, c.Requests, c.PrefixHits, c.PrefixQueries)
		if sharedPods[name] > 0 {
			g.Expect(c.PrefixHits).To(BeNumerically(">", 0), "the replica that took the shared prefix counts no prefix-cache hit")
		}
	}

	// (c) spec.networkPolicy: only the pods labelled allowed may call.
	update(g, obj, func(o *servingv1.AIInference) {
		o.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{
			{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{clientRoleLabel: "allowed"}}},
		}}
	})
	waitFor(t, g, obj, realReadyTimeout, beReady(2))
	for _, p := range servingPods(g, obj) {
		g.Eventually(func() (bool, error) { return agent.Enforces(p.Status.PodIP, obj.Name+"-ingress") }).
			WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "kube-router enforces %s-ingress for %s", obj.Name, p.Name)
	}
	// The router has the policy once it refuses the host (no pod, no ipBlock
	// that lists it), before any client pod calls.
	g.Eventually(func() error {
		_, err := routedComplete(newConnections, url, obj.Spec.Model.Name, "Hello")
		return err
	}).WithTimeout(30*time.Second).WithPolling(250*time.Millisecond).Should(
		MatchError(ContainSubstring("403 Forbidden")), "the router applies the model's policy to the host")
	at("the policy holds: kube-router enforces it on the replicas, and the router refuses the host")

	beforeClients := readRouterCounts(g, routers, obj)
	target := servingPods(g, obj)[0]
	allowed := clientPod(obj.Namespace, "allowed", url, obj.Spec.Model.Name)
	denied := clientPod(obj.Namespace, "denied", url, obj.Spec.Model.Name)
	direct := clientPod(obj.Namespace, "denied", engineURL(target), obj.Spec.Model.Name)
	direct.Name = "client-denied-direct"
	for _, p := range []*corev1.Pod{allowed, denied, direct} {
		g.Expect(k8s.Create(ctx, p)).To(Succeed())
	}
	waitAnswered(g, allowed)
	at(fmt.Sprintf("the allowed client %s (%s) had a completion through the Service", allowed.Name, allowed.Status.PodIP))
	clientCounts := readRouterCounts(g, routers, obj).sub(beforeClients)
	answered := 0.0
	for _, codes := range clientCounts.answers {
		answered += codes["200"]
	}
	g.Expect(answered).To(BeNumerically(">=", 1), "the router counts no answer for the allowed client: %v", clientCounts.answers)

	refused := waitRefused(g, denied)
	t.Logf("the denied client %s (%s) through the Service, refused for %s: %s", denied.Name, denied.Status.PodIP,
		refused.FinishedAt.Sub(refused.StartedAt.Time), refused.Message)
	g.Expect(refused.Message).To(And(ContainSubstring("403 Forbidden"), ContainSubstring("does not admit a client at "+denied.Status.PodIP)),
		"the router refuses the denied client")
	refused = waitRefused(g, direct)
	t.Logf("the denied client %s (%s) at replica %s directly, refused for %s: %s", direct.Name, direct.Status.PodIP, target.Name,
		refused.FinishedAt.Sub(refused.StartedAt.Time), refused.Message)
	g.Expect(refused.Message).To(ContainSubstring("connection refused"), "kube-router refuses the denied client at the replica")
	at("the policy held through the router and around it")
}
