package e2e

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// A step of load on a real engine: the simulator serves one request at a time,
// a second each, so a few clients in a loop fill its queue
// (vllm:num_requests_waiting). The autoscaler, reading the real pod's /metrics
// from its IP, asks for a second replica; a real pod loads, warms up and serves
// beside the first, and no request fails meanwhile. Once the load stops the
// count goes back to one. The figures go to the log (make bench-autoscale).
func TestRealNodeAutoscalerFollowsAStepOfLoad(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 2, "scaled")
	obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--max-num-seqs=1", "--mode=echo", "--latency-calculator=constant",
		"--time-to-first-token=1s", "--inter-token-latency=10ms")
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
		Targets:   servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](2)},
		ScaleDown: &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 10 * time.Second}}}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	url := serviceURL(g, obj)

	step := time.Now()
	load := startClosedLoop(t, url, obj.Spec.Model.Name, 6)

	key := client.ObjectKeyFromObject(obj)
	got := &servingv1.AIInference{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), key, got)).To(Succeed())
		g.Expect(got.Status.Autoscaling).NotTo(BeNil())
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(2)), "%v", meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionScalingActive))
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	decided := time.Since(step)
	var pods []corev1.Pod
	g.Eventually(func(g Gomega) {
		pods = servingPods(g, obj)
		g.Expect(pods).To(HaveLen(2))
	}).WithTimeout(realReadyTimeout).WithPolling(200 * time.Millisecond).Should(Succeed())
	serving := time.Since(step)
	load.stop()
	newest := pods[0]
	if pods[1].CreationTimestamp.After(newest.CreationTimestamp.Time) {
		newest = pods[1]
	}
	coldStart := time.Duration(0)
	for _, c := range newest.Status.Conditions {
		if c.Type == corev1.PodReady {
			coldStart = c.LastTransitionTime.Sub(newest.CreationTimestamp.Time)
		}
	}
	t.Logf("autoscale figure: step load to the decision to scale up %.1f s, to the new replica serving %.1f s (the new pod's own cold start, creation to Ready: %.0f s); %d completions answered, %d failed meanwhile",
		decided.Seconds(), serving.Seconds(), coldStart.Seconds(), load.ok.Load(), load.failed.Load())
	g.Expect(load.failed.Load()).To(BeZero(), "first failure: %v", load.firstErr.Load())
	g.Expect(got.Spec.Replicas).To(Equal(ptr.To[int32](1)), "spec.replicas is the user's")

	quiet := time.Now()
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(1)))
		g.Expect(got.Status.Autoscaling.Decisions[len(got.Status.Autoscaling.Decisions)-1].Reason).To(Equal(servingv1.ScalingDecisionDown))
	})
	t.Logf("autoscale figure: load stopped to the decision to scale down %.1f s (scale-down window 10 s)", time.Since(quiet).Seconds())
}

// closedLoop is clients that each send their next completion once the last
// is answered, until stop or for at most 3 minutes.
type closedLoop struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       func()
}

// startClosedLoop starts n such clients on url for model; the test's cleanup
// stops them if the test does not.
func startClosedLoop(t *testing.T, url, model string, n int) *closedLoop {
	l := &closedLoop{}
	done := make(chan struct{})
	var clients sync.WaitGroup
	httpClient := &http.Client{Timeout: 30 * time.Second}
	for range n {
		clients.Go(func() {
			deadline := time.After(3 * time.Minute)
			for {
				select {
				case <-done:
					return
				case <-deadline:
					return
				default:
				}
				if _, err := complete(httpClient, url, model); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err)
					continue
				}
				l.ok.Add(1)
			}
		})
	}
	l.stop = sync.OnceFunc(func() { close(done); clients.Wait() })
	t.Cleanup(l.stop)
	return l
}

// From zero on a real node: an idle model goes to zero (no pod, no GPU), and
// requests sent to its Service's ClusterIP meanwhile are held by the
// activator, through the host's real kube-proxy rules, until a real pod has
// loaded the model, warmed up and become ready; every one is answered. The
// figures (make bench-autoscale) put the first request's latency beside the
// new pod's own cold start.
func TestRealNodeAutoscalerScalesFromZero(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 1, "from-zero")
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 1,
		Targets:        servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)},
		ScaleDown:      &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 0}},
		IdleBeforeZero: &metav1.Duration{Duration: 5 * time.Second}}
	ctx := context.Background()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))

	// Idle: to zero, no pod left, and the Service leads to the activator.
	waitFor(t, g, obj, time.Minute, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(BeZero())
		g.Expect(got.Status.Reason).To(Equal(servingv1.ReasonScaledToZero))
	})
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "no pod, so no GPU, at zero")
	}).WithTimeout(time.Minute).Should(Succeed())
	latencies := sendHeldRequests(g, obj, 3)
	pods := servingPods(g, obj)
	g.Expect(pods).To(HaveLen(1))
	coldStart := time.Duration(0)
	for _, c := range pods[0].Status.Conditions {
		if c.Type == corev1.PodReady {
			coldStart = c.LastTransitionTime.Sub(pods[0].CreationTimestamp.Time)
		}
	}
	t.Logf("autoscale figure: from zero, the first held request answered after %.1f s (all 3 in %.1f s, 0 lost); the new pod's own cold start, creation to Ready: %.0f s",
		slices.Min(latencies).Seconds(), slices.Max(latencies).Seconds(), coldStart.Seconds())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.ActivatorSliceName()}, &discoveryv1.EndpointSlice{}))
	}).WithTimeout(time.Minute).Should(BeTrue(), "the Service leads to the pod alone once it serves")
}

// sendHeldRequests waits until the Service of obj, at zero, leads to the
// activator (its EndpointSlice, and kube-proxy's rule to it on the host),
// then sends n completions at once to the Service's ClusterIP, which the
// activator holds until a replica serves. Each must be answered by the model;
// it returns their latencies from the send.
func sendHeldRequests(g *WithT, obj *servingv1.AIInference, n int) []time.Duration {
	ctx := context.Background()
	svc := &corev1.Service{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), svc)).To(Succeed())
	// The activator takes the model's requests on a port of the model's own.
	slice := &discoveryv1.EndpointSlice{}
	g.Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.ActivatorSliceName()}, slice)
	}).WithTimeout(time.Minute).Should(Succeed())
	activatorIP, _, _ := net.SplitHostPort(activatorAddr)
	modelPort := net.JoinHostPort(activatorIP, strconv.Itoa(int(*slice.Ports[0].Port)))
	g.Eventually(func() (string, error) {
		nat, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
		return string(nat), err
	}).WithTimeout(serviceRouteTimeout).WithPolling(500*time.Millisecond).Should(ContainSubstring("--to-destination "+modelPort),
		"kube-proxy leads the Service to the activator")

	url := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	httpClient := &http.Client{Timeout: 3 * time.Minute}
	sent := time.Now()
	latencies := make([]time.Duration, n)
	answered := make([]string, n)
	errs := make([]error, n)
	var requests sync.WaitGroup
	for i := range n {
		requests.Go(func() {
			answered[i], errs[i] = complete(httpClient, url, obj.Spec.Model.Name)
			latencies[i] = time.Since(sent)
		})
	}
	requests.Wait()
	for i, err := range errs {
		g.Expect(err).NotTo(HaveOccurred(), "held request %d", i)
		g.Expect(answered[i]).To(Equal(obj.Spec.Model.Name), "held request %d", i)
	}
	return latencies
}
