package e2e

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/warmup"
	"github.com/aiinference/operator/test/localcluster"
)

// networkPolicyUsers counts the tests running with the NetworkPolicy agent:
// the last one to end stops it (the tests that use it run side by side).
var networkPolicyUsers struct {
	sync.Mutex
	n int
}

// startNetworkPolicy runs the shared cluster's NetworkPolicy implementation on
// the real nodes (kube-router's firewall on the host) for the test, and until
// the last test that asked for it ends: the other tests' pods, which no policy
// selects, are let through meanwhile, as before.
func startNetworkPolicy(t *testing.T) *localcluster.NetworkPolicyAgent {
	t.Helper()
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	networkPolicyUsers.Lock()
	networkPolicyUsers.n++
	agent, err := cluster.StartNetworkPolicy(ctx, localcluster.NetworkPolicyOptions{RepoRoot: repoRoot})
	networkPolicyUsers.Unlock()
	t.Cleanup(func() {
		networkPolicyUsers.Lock()
		defer networkPolicyUsers.Unlock()
		if networkPolicyUsers.n--; networkPolicyUsers.n > 0 {
			return
		}
		if err := cluster.StopNetworkPolicy(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NetworkPolicy agent started in %s", time.Since(begin).Round(100*time.Millisecond))
	return agent
}

// clientRoleLabel marks the test's client pods; the allowed one's value is
// the model's listed peer.
const clientRoleLabel = "netpol.e2e/role"

// TestRealNodeNetworkPolicyIsEnforced runs a model with spec.networkPolicy
// on the real node under a real NetworkPolicy implementation: the loader
// still downloads from the store (egress: the store's address and port), a
// client pod that the policy lists gets a completion through the model's
// Service, one it does not list is refused, and the Gateway (Traefik, on the
// host) still reaches the pods.
func TestRealNodeNetworkPolicyIsEnforced(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 1, "np")
	agent := startNetworkPolicy(t)
	gw := sharedGateway(t)
	ctx := context.Background()
	obj.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{clientRoleLabel: "allowed"}}},
	}}
	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	t.Logf("netpol figure: apply to Ready with both policies: %s", time.Since(begin).Round(100*time.Millisecond))

	// The loader reached the store through NAME-egress.
	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	g.Expect(got.Status.LastLoad).NotTo(BeNil())
	g.Expect(got.Status.LastLoad.BytesFetched).To(Equal(store.ModelBytes), "the loader downloaded the whole model from the store")
	t.Logf("netpol figure: the loader fetched %d bytes from the store at %s in %s", got.Status.LastLoad.BytesFetched, store.Endpoint, got.Status.LastLoad.Duration.Duration)

	// Both policies are in the serving pod's chain before any client calls.
	pod := oneServingPod(g, obj)[0]
	g.Eventually(func() (bool, error) { return agent.Enforces(pod.Status.PodIP, obj.Name+"-ingress") }).
		WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "kube-router enforces %s-ingress for %s", obj.Name, pod.Name)
	g.Eventually(func() (bool, error) { return agent.Enforces(pod.Status.PodIP, obj.Name+"-egress") }).
		WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(), "kube-router enforces %s-egress for %s", obj.Name, pod.Name)
	svc := &corev1.Service{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), svc)).To(Succeed())
	serviceURL := "http://" + svc.Spec.ClusterIP + ":" + strconv.Itoa(int(svc.Spec.Ports[0].Port))

	// Two client pods on the real node call the Service with the warm-up
	// gate's client: ready once a completion came back, exiting 1 with the
	// last error when none did within 20 s.
	allowed := clientPod(obj.Namespace, "allowed", serviceURL, obj.Spec.Model.Name)
	denied := clientPod(obj.Namespace, "denied", serviceURL, obj.Spec.Model.Name)
	g.Expect(k8s.Create(ctx, allowed)).To(Succeed())
	g.Expect(k8s.Create(ctx, denied)).To(Succeed())
	created := time.Now()
	waitAnswered(g, allowed)
	t.Logf("netpol figure: the allowed client had a completion %s after its creation", time.Since(created).Round(100*time.Millisecond))

	refused := waitRefused(g, denied)
	g.Expect(refused.Message).To(ContainSubstring("connection refused"), "kube-router rejects the connection")
	t.Logf("netpol figure: the denied client ran %s, refused every attempt: %s",
		refused.FinishedAt.Sub(refused.StartedAt.Time), refused.Message)

	// The Gateway on the host reaches the pod: a route of the test's own
	// (a hostname of its own, beside other tests' routes on the listener) to
	// the model's Service.
	host := obj.Namespace + ".netpol.test"
	route := routeTo(gw, obj.Namespace, obj.Name, host, obj.Name, svc.Spec.Ports[0].Port)
	g.Expect(k8s.Create(ctx, route)).To(Succeed())
	httpClient := &http.Client{Timeout: 10 * time.Second}
	g.Eventually(func() error { return completeWithHost(httpClient, gw.URL, host, obj.Spec.Model.Name) }).
		WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "a completion through the Gateway")
	const gatewayRequests = 50
	failed := 0
	var firstErr error
	for range gatewayRequests {
		if err := completeWithHost(httpClient, gw.URL, host, obj.Spec.Model.Name); err != nil {
			failed++
			firstErr = cmpErr(firstErr, err)
		}
	}
	t.Logf("netpol figure: %d completions through the Gateway, %d failed", gatewayRequests, failed)
	g.Expect(failed).To(BeZero(), "first failure: %v", firstErr)
}

// clientPod is a pod on the real node that asks url for one completion of
// model with the warm-up gate's client (the loader image's `warmup`): ready
// once one came back; exits 1 with the last error as its termination message
// when none did within 20 s.
func clientPod(ns, role, url, model string) *corev1.Pod {
	pod := realNodePod(ns, "client-"+role, corev1.Container{
		Name: "client", Image: loaderImage, ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"warmup", "--engine-url=" + url, "--model=" + model, "--timeout=20s",
			"--request-timeout=3s", "--backoff=1s", "--max-backoff=2s"},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: warmup.ReadyPath, Port: intstr.FromInt32(warmup.Port)}},
			PeriodSeconds: 1,
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
	})
	pod.Labels = map[string]string{clientRoleLabel: role}
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	return pod
}

// waitAnswered waits until the client pod has had its completion (Ready).
func waitAnswered(g *WithT, pod *corev1.Pod) {
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
		st := pod.Status.ContainerStatuses[0]
		g.Expect(st.State.Terminated).To(BeNil(), "%s gave up: %+v", pod.Name, st.State.Terminated)
		g.Expect(st.Ready).To(BeTrue())
	}).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "%s gets a completion", pod.Name)
}

// waitRefused waits until the client pod has given up without a completion,
// and returns how it ended (its message is the last error).
func waitRefused(g *WithT, pod *corev1.Pod) *corev1.ContainerStateTerminated {
	var refused *corev1.ContainerStateTerminated
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
		st := pod.Status.ContainerStatuses[0]
		g.Expect(st.Ready).To(BeFalse(), "%s got a completion", pod.Name)
		g.Expect(st.State.Terminated).NotTo(BeNil())
		refused = st.State.Terminated
	}).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "%s gives up", pod.Name)
	g.Expect(refused.ExitCode).To(Equal(int32(warmup.ExitTimedOut)), refused.Message)
	return refused
}

// completeWithHost sends one completion to the Gateway at url for the route
// of host.
func completeWithHost(httpClient *http.Client, url, host, model string) error {
	_, err := postCompletion(httpClient, url, host, model, "Hello")
	return err
}
