package e2e

import (
	"context"
	"slices"
	"strings"
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

	first := realGroup(g, obj)
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
	second := realGroup(g, obj)
	g.Expect(second.leader.UID).NotTo(Equal(first.leader.UID))
	g.Expect(second.workers[0].UID).NotTo(Equal(first.workers[0].UID))
	g.Eventually(func() []string { return serviceEndpoints(g, obj) }).WithTimeout(30 * time.Second).Should(ConsistOf(second.leader.Status.PodIP))
	// While it waited, status named the member that held the group.
	g.Expect(waits).To(ContainElement(MatchRegexp(`pod `+obj.GroupSetName()+`-0(-1)?[ ,]`)), "Ready's messages while the group waited: %q", waits)
}

// realGroup is the model's one group, its leader and worker running on the
// two real nodes.
func realGroup(g *WithT, obj *servingv1.AIInference) group {
	var gr group
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
			client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		gr = group{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			switch p.Labels[servingv1.LabelRole] {
			case servingv1.RoleLeader:
				gr.leader = p
			case servingv1.RoleWorker:
				gr.workers = append(gr.workers, p)
			}
		}
		g.Expect(gr.leader.Name).To(Equal(obj.GroupSetName() + "-0"))
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
