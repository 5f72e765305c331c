package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
)

// The shared cluster's Gateway API data plane: Traefik on the host, started by
// the first test that asks for it and stopped with the cluster.
var (
	gatewayOnce sync.Once
	gateway     *localcluster.Gateway
	gatewayErr  error
)

// routeTo is an HTTPRoute, namespace/name, that sends the requests for host
// on the shared Gateway's listener to port of the Service named service.
func routeTo(gw *localcluster.Gateway, namespace, name, host, service string, port int32) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
				Name: gatewayv1.ObjectName(gw.Name), Namespace: ptr.To(gatewayv1.Namespace(gw.Namespace)),
				SectionName: ptr.To(gatewayv1.SectionName(localcluster.GatewayListenerName))}}},
			Hostnames: []gatewayv1.Hostname{gatewayv1.Hostname(host)},
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(service), Port: ptr.To(gatewayv1.PortNumber(port))}}}}}},
		},
	}
}

func sharedGateway(t *testing.T) *localcluster.Gateway {
	t.Helper()
	gatewayOnce.Do(func() {
		begin := time.Now()
		gateway, gatewayErr = cluster.StartGateway(context.Background(), localcluster.GatewayOptions{RepoRoot: repoRoot})
		t.Logf("gateway started in %s", time.Since(begin).Round(100*time.Millisecond))
	})
	if gatewayErr != nil {
		t.Fatal(gatewayErr)
	}
	return gateway
}

// gatewaySplitRequests is how many requests measure the split at each step.
const gatewaySplitRequests = 1000

// TestRealNodeGatewayCarriesTheCanarySplit sends real requests through a real
// Gateway (Traefik, from the HTTPRoute the operator writes) to real pods of a
// canary rollout, and counts which track answered each: the split at each step,
// the failed requests during a promotion and an abort, and what the Gateway does
// with the canary's share while the canary has no ready pod.
func TestRealNodeGatewayCarriesTheCanarySplit(t *testing.T) {
	// One stable and one canary pod. When one is replaced (the canary's pod
	// deleted, the stable one at the promotion), the old one stays through its
	// preStop sleep (5 s) beside its replacement: that one may wait for room.
	g, _, obj := startRealNodeTest(t, 2, "gw")
	gw := sharedGateway(t)
	ctx := context.Background()
	begin := time.Now()
	at := func(what string) { t.Logf("%6s  %s", time.Since(begin).Round(100*time.Millisecond), what) }
	// The simulator names the pod that answered in a header (x-inference-pod).
	obj.Spec.Engine.Env = []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	obj.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1, MaxSurge: ptr.To[int32](1),
		Traffic: &servingv1.CanaryTraffic{Gateway: servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{
			Name: gw.Name, Namespace: gw.Namespace, SectionName: localcluster.GatewayListenerName}}},
		Steps: []servingv1.CanaryStep{{Weight: 10, Pause: &servingv1.PauseStep{}}, {Weight: 50, Pause: &servingv1.PauseStep{}}},
	}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	at("Ready")
	stable, canary := obj.Name+"-stable", obj.Name+"-canary"
	track := func(pod string) string {
		if strings.HasPrefix(pod, obj.Name+"-canary-") {
			return "canary"
		}
		return "stable"
	}
	// waitWeights waits until Traefik applies the weights (it reads the route
	// and the endpoints at most every 2 s, its default providersThrottleDuration).
	waitWeights := func(stableWeight, canaryWeight int) {
		t.Helper()
		g.Eventually(func() (map[string]int, error) {
			return gw.WeightedBackends(ctx, obj.Namespace, stable)
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(
			Equal(map[string]int{stable: stableWeight, canary: canaryWeight}), "the weights Traefik applies")
	}
	waitWeights(100, 0)
	httpClient := &http.Client{Timeout: 10 * time.Second}
	g.Eventually(func() (string, error) { return gatewayComplete(httpClient, gw.URL, obj.Spec.Model.Name) }).
		WithTimeout(30*time.Second).WithPolling(500*time.Millisecond).Should(HavePrefix(obj.Name+"-"), "a completion through the Gateway")
	waitStep := func(step int32, weight int32) {
		t.Helper()
		waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
			g.Expect(got.Status.Rollout).NotTo(BeNil())
			g.Expect(got.Status.Rollout.Phase).To(Equal(servingv1.RolloutProgressing), got.Status.Rollout.Message)
			g.Expect(got.Status.Rollout.Step).To(Equal(step))
			g.Expect(got.Status.Rollout.Weight).To(Equal(weight))
		})
		waitWeights(100-int(weight), int(weight))
		// The weights can reach Traefik before the canary Service's ready
		// endpoint does (both come from its reads of the cluster, and the
		// EndpointSlice follows the pod's readiness): until then the canary's
		// share is answered 503. The split is measured once a canary pod answers.
		g.Eventually(func() (string, error) {
			pod, err := gatewayComplete(httpClient, gw.URL, obj.Spec.Model.Name)
			return track(pod), err
		}).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(Equal("canary"), "a canary pod answers through the Gateway")
		at(fmt.Sprintf("step %d at %d%%, applied by the Gateway", step+1, weight))
	}

	// A canary: the split at each step.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Engine.Args = append(o.Spec.Engine.Args, "--max-num-seqs=8") })
	for i, weight := range []int32{10, 50} {
		if i > 0 {
			annotate(g, obj, servingv1.AnnotationPromote)
		}
		waitStep(int32(i), weight)
		counts := sendThroughGateway(g, httpClient, gw.URL, obj.Spec.Model.Name, gatewaySplitRequests, track)
		share := 100 * float64(counts["canary"]) / float64(gatewaySplitRequests)
		t.Logf("gateway figure: step %d weight %d%%: canary %d, stable %d of %d requests: canary share %.1f%%",
			i+1, weight, counts["canary"], counts["stable"], gatewaySplitRequests, share)
		g.Expect(counts["canary"] + counts["stable"]).To(Equal(gatewaySplitRequests))
		g.Expect(share).To(BeNumerically("~", float64(weight), 3), "the canary's share at step %d", i+1)
	}

	// The canary's only pod goes (deleted, as a drain or an eviction does: out
	// of its Service's ready endpoints at once, serving on through its preStop
	// sleep) and its Deployment makes another. Until that one is ready the
	// canary has no ready endpoint, and the operator routes its share to the
	// stable pods (weight 0) once it has seen the pod go.
	var canaryPod *corev1.Pod
	for _, p := range servingPods(g, obj) {
		if track(p.Name) == "canary" {
			canaryPod = &p
		}
	}
	g.Expect(canaryPod).NotTo(BeNil())
	load := startGatewayLoad(httpClient, gw.URL, obj.Spec.Model.Name, track)
	gapBegin := time.Now()
	g.Expect(k8s.Delete(ctx, canaryPod)).To(Succeed())
	// Until a new canary pod serves through the Gateway.
	g.Eventually(func() string { return load.lastPod("canary") }).
		WithTimeout(realReadyTimeout).WithPolling(200 * time.Millisecond).Should(And(HavePrefix(obj.Name+"-canary-"), Not(Equal(canaryPod.Name))))
	gap := load.stop()
	t.Logf("gateway figure: canary without a ready pod at weight 50%% for %s: %d requests, stable answered %d, canary %d, failed %d %v",
		time.Since(gapBegin).Round(100*time.Millisecond), gap.total(), gap.ok["stable"], gap.ok["canary"], gap.failed, gap.statuses)
	// The stable share is served whatever the canary does: every failure is the
	// Gateway's own answer for the canary's share, never a stable request's.
	g.Expect(gap.other).To(BeZero(), "a failure other than the Gateway's 503 for the canary's share: %s", gap.firstOther)
	stableShare := float64(gap.ok["stable"]) / float64(gap.total())
	g.Expect(stableShare).To(BeNumerically(">=", 0.45), "the stable pods' share while the canary had no ready pod")

	// Abort, under load: all traffic back on the stable pod, the canary's pod goes.
	waitWeights(50, 50)
	load = startGatewayLoad(httpClient, gw.URL, obj.Spec.Model.Name, track)
	abortBegin := time.Now()
	annotate(g, obj, servingv1.AnnotationAbort)
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Rollout).NotTo(BeNil())
		g.Expect(got.Status.Rollout.Phase).To(Equal(servingv1.RolloutRolledBack))
	})
	waitWeights(100, 0)
	waitNoCanaryPod(g, obj)
	abort := load.stop()
	t.Logf("gateway figure: abort in %s: %d requests through the Gateway, %d failed (stable %d, canary %d)",
		time.Since(abortBegin).Round(100*time.Millisecond), abort.total(), abort.failed, abort.ok["stable"], abort.ok["canary"])
	g.Expect(abort.failed).To(BeZero(), "first failure: %s", abort.firstErr)

	// The rolled-back revision tried again, through both steps, then promoted
	// under load: the stable pod takes the new spec while the canary serves,
	// then the canary goes.
	annotate(g, obj, servingv1.AnnotationRequestedAt)
	waitStep(0, 10)
	annotate(g, obj, servingv1.AnnotationPromote)
	waitStep(1, 50)
	load = startGatewayLoad(httpClient, gw.URL, obj.Spec.Model.Name, track)
	promotionBegin := time.Now()
	annotate(g, obj, servingv1.AnnotationPromote)
	waitFor(t, g, obj, 2*realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Rollout).NotTo(BeNil())
		g.Expect(got.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoted))
		beReady(1)(g, got)
	})
	waitWeights(100, 0)
	waitNoCanaryPod(g, obj)
	promotion := load.stop()
	t.Logf("gateway figure: promotion in %s: %d requests through the Gateway, %d failed (stable %d, canary %d)",
		time.Since(promotionBegin).Round(100*time.Millisecond), promotion.total(), promotion.failed, promotion.ok["stable"], promotion.ok["canary"])
	g.Expect(promotion.failed).To(BeZero(), "first failure: %s", promotion.firstErr)
	g.Expect(promotion.ok["canary"]).To(BeNumerically(">", 0), "the canary served during the promotion")
	at("promoted")
}

// annotate sets a steering annotation (promote, abort) to a new value.
func annotate(g *WithT, obj *servingv1.AIInference, key string) {
	update(g, obj, func(o *servingv1.AIInference) {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[key] = strconv.FormatInt(time.Now().UnixNano(), 10)
	})
}

// waitNoCanaryPod waits until the canary's pods are all gone.
func waitNoCanaryPod(g *WithT, obj *servingv1.AIInference) {
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
			client.MatchingLabels{servingv1.LabelInference: obj.Name, servingv1.LabelTrack: servingv1.TrackCanary})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
	}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// gatewayComplete sends one short completion to the Gateway and returns the pod
// that answered. An answer other than 200 is an error that holds the status and
// the body (Traefik's "no available server" for a backend with no endpoint).
func gatewayComplete(httpClient *http.Client, baseURL, model string) (string, error) {
	answer, err := postCompletion(httpClient, baseURL, "", model, "Hello")
	if err != nil {
		return "", err
	}
	if answer.model != model {
		return "", fmt.Errorf("a completion of %s, not of %s", answer.model, model)
	}
	pod := answer.header.Get("x-inference-pod")
	if pod == "" {
		return "", fmt.Errorf("no x-inference-pod header in the answer")
	}
	return pod, nil
}

// noAvailableServer is Traefik's answer for a backend with no server: 503 with
// this body.
func noAvailableServer(err error) bool {
	ge, ok := err.(*statusError)
	return ok && ge.status == http.StatusServiceUnavailable && ge.body == "no available server"
}

// sendThroughGateway sends n completions, 8 at a time, and counts them by the
// track that answered; any failure fails the test.
func sendThroughGateway(g *WithT, httpClient *http.Client, url, model string, n int, track func(pod string) string) map[string]int {
	var mu sync.Mutex
	counts := map[string]int{}
	var firstErr error
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range next {
				pod, err := gatewayComplete(httpClient, url, model)
				mu.Lock()
				if err != nil {
					counts["failed"]++
					firstErr = cmpErr(firstErr, err)
				} else {
					counts[track(pod)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	g.Expect(counts["failed"]).To(BeZero(), "first failure: %v", firstErr)
	return counts
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// gatewayLoad sends completions through the Gateway, two at a time with 20 ms
// between a client's requests, until stopped.
type gatewayLoad struct {
	stopCh chan struct{}
	wg     sync.WaitGroup

	mu sync.Mutex
	gatewayTally
	lastPods map[string]string // the pod of each track that answered last
}

// gatewayTally counts a load's requests.
type gatewayTally struct {
	ok       map[string]int // answered, by track
	failed   int
	firstErr string
	// statuses counts the failures by status (0: no answer).
	statuses map[int]int
	// other counts the failures that are not Traefik's 503 "no available server".
	other      int
	firstOther string
}

func (t gatewayTally) total() int {
	n := t.failed
	for _, c := range t.ok {
		n += c
	}
	return n
}

func startGatewayLoad(httpClient *http.Client, url, model string, track func(pod string) string) *gatewayLoad {
	l := &gatewayLoad{stopCh: make(chan struct{}), lastPods: map[string]string{},
		gatewayTally: gatewayTally{ok: map[string]int{}, statuses: map[int]int{}}}
	for range 2 {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stopCh:
					return
				case <-time.After(20 * time.Millisecond):
				}
				pod, err := gatewayComplete(httpClient, url, model)
				l.mu.Lock()
				switch {
				case err == nil:
					l.ok[track(pod)]++
					l.lastPods[track(pod)] = pod
				default:
					l.failed++
					if l.firstErr == "" {
						l.firstErr = err.Error()
					}
					status := 0
					if ge, ok := err.(*statusError); ok {
						status = ge.status
					}
					l.statuses[status]++
					if !noAvailableServer(err) {
						l.other++
						if l.firstOther == "" {
							l.firstOther = err.Error()
						}
					}
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// lastPod is the pod of the track that answered last.
func (l *gatewayLoad) lastPod(track string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastPods[track]
}

func (l *gatewayLoad) stop() gatewayTally {
	close(l.stopCh)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gatewayTally
}
