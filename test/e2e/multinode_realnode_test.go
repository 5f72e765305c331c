package e2e

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// A replica over the two real nodes, where its pods really run: the real
// LeaderWorkerSet controller and scheduler place its leader on one node and
// its worker on the other, and both run the operator's multi-node command
// lines in the engine image, whose bash, multi-node-serving.sh, ray and
// python3 are fake-vllm's stand-ins (hack/images/fakevllm): the worker
// resolves LWS_LEADER_ADDRESS through the cluster DNS (CoreDNS, with the
// kubelets' clusterDNS) and joins the leader's Ray head on port 6379; the
// leader waits for it, then runs llm-d-inference-sim as its engine.

// realGroupTimeout bounds a group's way to Ready on the real nodes: both
// members load from the store, the worker joins, and the leader looks for it
// every 5 s (multi-node-serving.sh's period) before its engine starts.
const realGroupTimeout = 3 * time.Minute

// The figure of docs/multinode.md: seconds from a worker killed to its
// group recreated and a completion through the model's Service answered.
func TestRealNodeMultiNodeGroupServesAndRecoversAsOne(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 2, "mn")
	ctx := context.Background()
	obj.Spec.GPU.Nodes = 2
	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realGroupTimeout, beReady(1))
	t.Logf("multinode figure: apply -> Ready, one group over the two real nodes: %.1f s", time.Since(begin).Seconds())

	first := realGroup(g, obj, 0)
	// The worker found its leader by name through the cluster DNS, and the
	// leader started its engine once the worker had joined.
	address := envValue(first.workers[0], lwsv1.LwsLeaderAddress)
	g.Expect(address).To(Equal(obj.GroupSetName() + "-0." + obj.GroupSetName() + "." + obj.Namespace))
	g.Expect(engineLog(g, first.workers[0])).To(ContainSubstring("Joined the Ray head at "+address+":6379 ("+first.leader.Status.PodIP+":6379)"),
		"the worker resolved %s to its leader's address", address)
	g.Expect(engineLog(g, first.leader)).To(And(
		ContainSubstring("joined: 2 nodes alive"),
		ContainSubstring("All ray workers are active and the ray cluster is initialized successfully.")))

	// The model's Service leads to the leader only, which answers.
	url := serviceURL(g, obj)
	g.Expect(serviceEndpoints(g, obj)).To(ConsistOf(first.leader.Status.PodIP))

	// The worker is killed: its whole group is made again, and serves again.
	killed := time.Now()
	g.Expect(k8s.Delete(ctx, &first.workers[0])).To(Succeed())
	var waits []string
	g.Eventually(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		if c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse &&
			!slices.Contains(waits, c.Reason+": "+c.Message) {
			waits = append(waits, c.Reason+": "+c.Message)
			t.Logf("%.1f s after the kill: Ready False %s: %s", time.Since(killed).Seconds(), c.Reason, c.Message)
		}
		leader := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&first.leader), leader)
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		g.Expect(apierrors.IsNotFound(err) || leader.UID != first.leader.UID).To(BeTrue(), "the group's leader is recreated with it")
		model, err := complete(newConnectionClient, url, obj.Spec.Model.Name)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(model).To(Equal(obj.Spec.Model.Name))
	}).WithTimeout(realGroupTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	recovered := time.Since(killed)
	t.Logf("multinode figure: a worker deleted on the real nodes -> its group recreated and a completion through the Service answered again: %.1f s", recovered.Seconds())
	second := realGroup(g, obj, 0)
	g.Expect(second.leader.UID).NotTo(Equal(first.leader.UID))
	g.Expect(second.workers[0].UID).NotTo(Equal(first.workers[0].UID))
	g.Eventually(func() []string { return serviceEndpoints(g, obj) }).WithTimeout(30 * time.Second).Should(ConsistOf(second.leader.Status.PodIP))
	// While it waited, status named the member that held the group.
	g.Expect(waits).To(ContainElement(MatchRegexp(`pod `+obj.GroupSetName()+`-0(-1)?[ ,]`)), "Ready's messages while the group waited: %q", waits)
}

// realGroup is the model's group of that index, its leader and worker running
// on the two real nodes.
func realGroup(g *WithT, obj *servingv1.AIInference, index int) group {
	var gr group
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
			client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		gr = group{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Labels[lwsv1.GroupIndexLabelKey] != strconv.Itoa(index) {
				continue
			}
			switch p.Labels[servingv1.LabelRole] {
			case servingv1.RoleLeader:
				gr.leader = p
			case servingv1.RoleWorker:
				gr.workers = append(gr.workers, p)
			}
		}
		g.Expect(gr.leader.Name).To(Equal(obj.GroupSetName() + "-" + strconv.Itoa(index)))
		g.Expect(gr.workers).To(HaveLen(1))
		var nodes []string
		for _, n := range cluster.RealNodes() {
			nodes = append(nodes, n.Name)
		}
		g.Expect([]string{gr.leader.Spec.NodeName, gr.workers[0].Spec.NodeName}).To(ConsistOf(nodes), "leader and worker on the two real nodes")
		g.Expect(gr.leader.Status.PodIP).NotTo(BeEmpty())
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	return gr
}

// envValue is the value of a variable of the pod's engine container.
func envValue(pod corev1.Pod, name string) string {
	for _, c := range pod.Spec.Containers {
		if c.Name != servingv1.EngineContainerName {
			continue
		}
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// engineLog is the log of the pod's engine container, through the API server.
func engineLog(g *WithT, pod corev1.Pod) string {
	var log string
	g.Eventually(func(g Gomega) {
		data, err := cluster.Client().CoreV1().Pods(pod.Namespace).GetLogs(pod.Name,
			&corev1.PodLogOptions{Container: servingv1.EngineContainerName}).DoRaw(context.Background())
		g.Expect(err).NotTo(HaveOccurred())
		log = string(data)
	}).WithTimeout(30 * time.Second).Should(Succeed())
	return strings.TrimSpace(log)
}

// serviceEndpoints are the ready addresses of the model's Service.
func serviceEndpoints(g *WithT, obj *servingv1.AIInference) []string {
	var ips []string
	g.Eventually(func(g Gomega) {
		list := &discoveryv1.EndpointSliceList{}
		g.Expect(k8s.List(context.Background(), list, client.InNamespace(obj.Namespace),
			client.MatchingLabels{discoveryv1.LabelServiceName: obj.Name})).To(Succeed())
		ips = nil
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if ptr.Deref(e.Conditions.Ready, false) {
					ips = append(ips, e.Addresses...)
				}
			}
		}
		g.Expect(ips).NotTo(BeEmpty())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	return ips
}

// Autoscaling counts groups: a model of one group over the two real nodes
// (minReplicas 0, maxReplicas 1) goes to zero when idle, its LeaderWorkerSet
// at 0 and no member left on either node, and its Service leads to the
// activator. Requests sent to the ClusterIP meanwhile are held; the
// autoscaler starts one group, whose leader loads, waits for its worker to
// join and warms up, and every held request is answered by that leader. The
// figures (docs/multinode.md) put the first held request's latency beside
// the group's own start.
func TestRealNodeAutoscalerScalesAMultiNodeModelFromZeroAsOneGroup(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 2, "mn-zero")
	ctx := context.Background()
	obj.Spec.GPU.Nodes = 2
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 1,
		Targets:        servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)},
		ScaleDown:      &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 0}},
		IdleBeforeZero: &metav1.Duration{Duration: 5 * time.Second}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	stopLog := logConditions(t, obj, servingv1.ConditionReady, servingv1.ConditionScalingActive)
	t.Cleanup(stopLog)
	waitFor(t, g, obj, realGroupTimeout, beReady(1))
	first := realGroup(g, obj, 0)

	// Idle: to zero. The model stays Ready while its group goes, as a
	// single-node model does (a Deployment counts no terminating pod): a
	// group whose leader is being deleted is no replica, though the
	// LeaderWorkerSet counts it until the leader's preStop (5 s) has run.
	// No member of the group is left on either node, the LeaderWorkerSet
	// runs no group, and the Service leads to the activator.
	idle := time.Now()
	var notReady notReadyWatch
	g.Eventually(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		notReady.observe(got)
		g.Expect(got.Status.Autoscaling).NotTo(BeNil())
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(BeZero(), "%v", meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionScalingActive))
		g.Expect(got.Status.Reason).To(Equal(servingv1.ReasonScaledToZero))
		g.Expect(got.Status.Replicas).To(BeZero())
	}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
	t.Logf("multinode figure: Ready with one group -> ScaledToZero (idleBeforeZero 5 s): %.1f s, Ready not True for %.1f s of it", time.Since(idle).Seconds(), notReady.lasted().Seconds())
	notReady.expectBriefOnTheWayTo(g, "zero")
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "no member, so no GPU on either node, at zero")
	}).WithTimeout(time.Minute).Should(Succeed())
	lws := &lwsv1.LeaderWorkerSet{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.GroupSetName()}, lws)).To(Succeed())
	g.Expect(lws.Spec.Replicas).To(Equal(ptr.To[int32](0)))
	// Three requests to the ClusterIP, at once: held, then answered by the
	// new group's leader.
	latencies := sendHeldRequests(g, obj, 3)
	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	up := got.Status.Autoscaling.Decisions[len(got.Status.Autoscaling.Decisions)-1]
	g.Expect(up.Reason).To(Equal(servingv1.ScalingDecisionUp))
	g.Expect(up.From).To(BeZero(), "the last decision is 0 -> 1: %+v", up)
	g.Expect(up.To).To(Equal(int32(1)), "the last decision is 0 -> 1: %+v", up)
	g.Expect(up.Message).To(ContainSubstring("held by the activator"))

	// One new group, on the two real nodes, whose leader answered.
	second := realGroup(g, obj, 0)
	g.Expect(second.leader.UID).NotTo(Equal(first.leader.UID))
	g.Expect(second.workers[0].UID).NotTo(Equal(first.workers[0].UID))
	leaderReady := time.Duration(0)
	for _, c := range second.leader.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			leaderReady = c.LastTransitionTime.Sub(second.leader.CreationTimestamp.Time)
		}
	}
	g.Expect(leaderReady).To(BeNumerically(">", 0), "the new leader is Ready")
	g.Expect(engineLog(g, second.leader)).To(ContainSubstring("All ray workers are active"),
		"the leader served once its worker had joined")
	t.Logf("multinode figure: from zero, the first held request answered after %.1f s (all 3 in %.1f s, 0 lost); the group's own start, leader created -> leader Ready: %.0f s",
		slices.Min(latencies).Seconds(), slices.Max(latencies).Seconds(), leaderReady.Seconds())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.ActivatorSliceName()}, &discoveryv1.EndpointSlice{}))
	}).WithTimeout(time.Minute).Should(BeTrue(), "the Service leads to the group alone once its leader serves")
	g.Eventually(func() []string { return serviceEndpoints(g, obj) }).WithTimeout(30*time.Second).Should(ConsistOf(second.leader.Status.PodIP),
		"the Service leads to the leader only")
	waitFor(t, g, obj, time.Minute, beReady(1))
	stopLog()
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	for _, d := range got.Status.Autoscaling.Decisions {
		t.Logf("decision at %s: %d -> %d %s: %s", d.Time.Format(time.TimeOnly), d.From, d.To, d.Reason, d.Message)
	}
}

// notReadyWatch follows an object's Ready condition through a change that
// should keep it True (a group going away is no replica, as a Deployment's
// terminating pod is none): from the first pass it saw Ready not True, and
// each message it said meanwhile.
type notReadyWatch struct {
	since    time.Time
	messages []string
}

func (w *notReadyWatch) observe(got *servingv1.AIInference) {
	c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
	if c == nil || c.Status == metav1.ConditionTrue {
		return
	}
	if w.since.IsZero() {
		w.since = time.Now()
	}
	if msg := c.Reason + ": " + c.Message; !slices.Contains(w.messages, msg) {
		w.messages = append(w.messages, msg)
	}
}

// lasted is how long Ready was not True, up to now.
func (w *notReadyWatch) lasted() time.Duration {
	if w.since.IsZero() {
		return 0
	}
	return time.Since(w.since)
}

// expectBriefOnTheWayTo fails unless Ready was not True for under 3 s (a pass
// or two of the operator while the workload's status catches up).
func (w *notReadyWatch) expectBriefOnTheWayTo(g *WithT, where string) {
	g.Expect(w.lasted()).To(BeNumerically("<", 3*time.Second),
		"a group going away is no replica: Ready was not True for %s on the way to %s (%q)", w.lasted().Round(100*time.Millisecond), where, w.messages)
}

// Autoscaling on load counts groups: a model of one group over the two real
// nodes (minReplicas 1, maxReplicas 2; groups do not repel each other, so a
// second group puts a member on each node too) whose engine serves one
// request at a time, a second each. Six clients fill the leader's queue; the
// autoscaler, reading the leaders' metrics only, asks for a second group,
// whose members load, join and warm up while the first group serves, and no
// request fails. Once the load stops the count goes back to one group: the
// second group's members go, the first's stay, and the model stays Ready.
// The figures are in docs/multinode.md.
func TestRealNodeAutoscalerAddsAGroupOnLoadAndRemovesIt(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 4, "mn-load")
	ctx := context.Background()
	obj.Spec.GPU.Nodes = 2
	obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--max-num-seqs=1", "--mode=echo", "--latency-calculator=constant",
		"--time-to-first-token=1s", "--inter-token-latency=10ms")
	obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
		Targets:   servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](2)},
		ScaleDown: &servingv1.ScalingRules{StabilizationWindow: &metav1.Duration{Duration: 10 * time.Second}}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	stopLog := logConditions(t, obj, servingv1.ConditionReady, servingv1.ConditionScalingActive)
	t.Cleanup(stopLog)
	waitFor(t, g, obj, realGroupTimeout, beReady(1))
	first := realGroup(g, obj, 0)
	url := serviceURL(g, obj)

	step := time.Now()
	load := startClosedLoop(t, url, obj.Spec.Model.Name, 6)
	waitFor(t, g, obj, time.Minute, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Autoscaling).NotTo(BeNil())
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(2)), "%v", meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionScalingActive))
	})
	decided := time.Since(step)
	waitFor(t, g, obj, realGroupTimeout, beReady(2))
	second := realGroup(g, obj, 1)
	g.Eventually(func() []string { return serviceEndpoints(g, obj) }).WithTimeout(30*time.Second).Should(
		ConsistOf(first.leader.Status.PodIP, second.leader.Status.PodIP), "the Service leads to both leaders, and to no worker")
	serving := time.Since(step)
	served := load.ok.Load()
	load.stop()
	leaderReady := time.Duration(0)
	for _, c := range second.leader.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			leaderReady = c.LastTransitionTime.Sub(second.leader.CreationTimestamp.Time)
		}
	}
	t.Logf("multinode figure: step load to the decision to add a group %.1f s, to the second group serving %.1f s (its own start, leader created -> leader Ready: %.0f s); %d completions answered, %d failed meanwhile",
		decided.Seconds(), serving.Seconds(), leaderReady.Seconds(), served, load.failed.Load())
	g.Expect(load.failed.Load()).To(BeZero(), "first failure: %v", load.firstErr.Load())
	g.Expect(realGroup(g, obj, 0).leader.UID).To(Equal(first.leader.UID), "the first group served throughout")

	// Quiet: back to one group, the second one's members gone, Ready throughout.
	quiet := time.Now()
	var notReady notReadyWatch
	waitFor(t, g, obj, 2*time.Minute, func(g Gomega, got *servingv1.AIInference) {
		notReady.observe(got)
		g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(1)))
		g.Expect(got.Status.Autoscaling.Decisions[len(got.Status.Autoscaling.Decisions)-1].Reason).To(Equal(servingv1.ScalingDecisionDown))
		g.Expect(got.Status.Replicas).To(Equal(int32(1)))
	})
	t.Logf("multinode figure: load stopped to one group again %.1f s (scale-down window 10 s), Ready not True for %.1f s of it", time.Since(quiet).Seconds(), notReady.lasted().Seconds())
	notReady.expectBriefOnTheWayTo(g, "one group")
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		g.Expect(names).To(ConsistOf(first.leader.Name, first.workers[0].Name), "the second group's members are gone, the first's stay")
	}).WithTimeout(time.Minute).Should(Succeed())
	g.Expect(serviceEndpoints(g, obj)).To(ConsistOf(first.leader.Status.PodIP))
}

// logConditions logs each new status and reason of the object's conditions
// of the given types, with the time it saw it, until the returned function
// is called: where a test's seconds went.
func logConditions(t *testing.T, obj *servingv1.AIInference, types ...string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		seen := map[string]string{}
		for {
			got := &servingv1.AIInference{}
			if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got); err == nil {
				for _, typ := range types {
					c := meta.FindStatusCondition(got.Status.Conditions, typ)
					if c == nil {
						continue
					}
					if now := string(c.Status) + " " + c.Reason + ": " + c.Message; seen[typ] != now {
						seen[typ] = now
						t.Logf("%s %s %s", time.Now().Format("15:04:05.0"), typ, now)
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}
