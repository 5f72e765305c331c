package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
)

// Replicas that span nodes, with the real LeaderWorkerSet controller (started
// with the suite, before its operator) and the real scheduler placing the
// groups on simulated 8-GPU nodes in two racks.

// multiNodeProduct is a GPU product only this test's nodes have.
const multiNodeProduct = "NVIDIA-H200"

// rackLabel is the topology domain of the test's nodes.
const rackLabel = "example.com/rack"

// groupTimeout bounds a wait for groups: the LeaderWorkerSet controller makes
// a group's pods in two steps (one group was 60 s to Ready in a loaded
// fresh-clone CI run, 3 s alone).
const groupTimeout = 3 * readyTimeout

func TestAReplicaOverTwoNodesIsPlacedRestartedAndScaledAsOneGroup(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns, nodes := newNamespaceWithNodes(t)
	// Four racks of two nodes: the scheduler alone, placing each worker
	// beside its leader on any free node, would split most groups.
	racks := []string{"a", "b", "c", "d"}
	for _, rack := range racks {
		g.Expect(nodes.add(localcluster.NodePool{Name: "mn-rack-" + rack, Count: 2, GPUProduct: multiNodeProduct, GPUCount: 8,
			CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti"), Labels: map[string]string{rackLabel: rack}})).To(Succeed())
	}

	obj := inference(ns, "big", 8, multiNodeProduct)
	obj.Spec.GPU.Nodes, obj.Spec.GPU.TopologyKey = 2, rackLabel
	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, groupTimeout, beReady(1))
	t.Logf("one replica over two nodes Ready in %.1f s", time.Since(begin).Seconds())
	expectGroups(g, obj, 1)
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.Name}, &appsv1.Deployment{})).To(
		Satisfy(apierrors.IsNotFound), "a model that spans nodes has no Deployment")

	// Scale in groups, one at a time (groups made at once may take one
	// rack's nodes between their leaders: docs/multinode.md): each group
	// takes a rack of its own.
	for replicas := int32(2); replicas <= 4; replicas++ {
		update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To(replicas) })
		waitFor(t, g, obj, groupTimeout, beReady(replicas))
	}
	groups := expectGroups(g, obj, 4)
	var held []string
	for _, gr := range groups {
		held = append(held, gr.rack)
	}
	g.Expect(held).To(ConsistOf(racks), "each group holds one rack")

	// Traffic goes to the leaders only.
	g.Eventually(func(g Gomega) {
		list := &discoveryv1.EndpointSliceList{}
		g.Expect(k8s.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: obj.Name})).To(Succeed())
		var ips []string
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				ips = append(ips, e.Addresses...)
			}
		}
		var leaders []string
		for _, gr := range groups {
			leaders = append(leaders, gr.leader.Status.PodIP)
		}
		g.Expect(ips).To(ConsistOf(leaders))
	}).WithTimeout(30 * time.Second).Should(Succeed())

	// A lost worker takes its whole group down and back: the leader is
	// replaced too, and the group serves again.
	lost := groups[0]
	killed := time.Now()
	g.Expect(k8s.Delete(ctx, &lost.workers[0])).To(Succeed())
	g.Eventually(func(g Gomega) {
		leader := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&lost.leader), leader)
		if err == nil {
			g.Expect(leader.UID).NotTo(Equal(lost.leader.UID), "the group's leader was recreated with it")
		}
	}).WithTimeout(readyTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	waitFor(t, g, obj, groupTimeout, beReady(4))
	t.Logf("a worker deleted -> its group recreated and the model Ready with 4 groups again in %.1f s", time.Since(killed).Seconds())
	expectGroups(g, obj, 4)

	// A fifth group has no room (eight nodes, two per group): status says
	// which member waits and why.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](5) })
	waitFor(t, g, obj, groupTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonUnschedulable), ready.Message)
		g.Expect(ready.Message).To(ContainSubstring(obj.GroupSetName()+"-4"), "names the group's pod that waits")
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(4)), "the four groups keep serving")
		t.Logf("the fifth group: %s: %s", ready.Reason, ready.Message)
	})
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](4) })
	waitFor(t, g, obj, groupTimeout, beReady(4))
}

// A group is placed all or nothing (the operator's PodGroups and pod webhook,
// the scheduler's GangScheduling plugin): with three free nodes and groups of
// two, the second group waits whole, its leader holding no node, so the third
// node stays free for a model that fits it; a fourth node lets the group in,
// whole; and the PodGroup of a group scaled away goes with it.
func TestAGroupIsPlacedWholeOrNotAtAll(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns, nodes := newNamespaceWithNodes(t)
	const product = "NVIDIA-GH200" // only this test's nodes
	pool := func(name string, count int) localcluster.NodePool {
		return localcluster.NodePool{Name: name, Count: count, GPUProduct: product, GPUCount: 8,
			CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti")}
	}
	g.Expect(nodes.add(pool("gang", 3))).To(Succeed())

	obj := inference(ns, "gang", 8, product)
	obj.Spec.GPU.Nodes, obj.Spec.Replicas = 2, ptr.To[int32](2)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, groupTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(1)))
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonUnschedulable), ready.Message)
		g.Expect(ready.Message).To(ContainSubstring(obj.GroupSetName()+"-1"), "names a pod of the group that waits")
		t.Logf("the second group: %s: %s", ready.Reason, ready.Message)
	})
	podGroup := func(g Gomega, i int) *schedulingv1beta1.PodGroup {
		pg := &schedulingv1beta1.PodGroup{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("%s-%d", obj.GroupSetName(), i)}, pg)).To(Succeed())
		g.Expect(pg.Spec.SchedulingPolicy.Gang).NotTo(BeNil())
		return pg
	}
	for i := range 2 {
		g.Expect(podGroup(g, i).Spec.SchedulingPolicy.Gang.MinCount).To(Equal(int32(2)))
	}
	// A gang lowered by hand, which would let a recreated group's leader take
	// a node alone, is put back (on the placed group's PodGroup: on the
	// waiting one's the scheduler may act on it first). A PodGroup deleted by
	// hand stays while its group's pods exist (the API server's
	// PodGroupProtection finalizer).
	lowered := podGroup(g, 0)
	lowered.Spec.SchedulingPolicy.Gang.MinCount = 1
	g.Expect(k8s.Update(ctx, lowered)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(podGroup(g, 0).Spec.SchedulingPolicy.Gang.MinCount).To(Equal(int32(2)))
	}).WithTimeout(readyTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	// The waiting group's pods name their PodGroup, and none of them holds a
	// node, for as long as it waits.
	waiting := func(g Gomega) []corev1.Pod {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{
			servingv1.LabelInference: obj.Name, lwsv1.GroupIndexLabelKey: "1"})).To(Succeed())
		return pods.Items
	}
	g.Consistently(func(g Gomega) {
		pods := waiting(g)
		g.Expect(pods).To(HaveLen(2), "the second group's leader and worker exist")
		for _, p := range pods {
			g.Expect(p.Spec.NodeName).To(BeEmpty(), "pod %s of the group that cannot be placed whole holds a node", p.Name)
			g.Expect(p.Spec.SchedulingGroup).NotTo(BeNil(), "pod %s", p.Name)
			g.Expect(p.Spec.SchedulingGroup.PodGroupName).To(Equal(ptr.To(obj.GroupSetName()+"-1")), "pod %s", p.Name)
		}
	}).WithTimeout(5 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	// The third node's GPUs are free: a model of one 8-GPU node runs there.
	small := inference(ns, "small", 8, product)
	g.Expect(k8s.Create(ctx, small)).To(Succeed())
	waitFor(t, g, small, readyTimeout, beReady(1))

	// With room for it, the group is placed, whole.
	added := time.Now()
	g.Expect(nodes.add(pool("gang-more", 2))).To(Succeed())
	waitFor(t, g, obj, groupTimeout, beReady(2))
	t.Logf("two nodes added -> the waiting group placed whole and the model Ready with 2 groups in %.1f s", time.Since(added).Seconds())
	g.Expect(k8s.Delete(ctx, small)).To(Succeed())

	// Scaled to one group, the second group's PodGroup goes once its pods do.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](1) })
	waitFor(t, g, obj, groupTimeout, beReady(1))
	g.Eventually(func(g Gomega) {
		list := &schedulingv1beta1.PodGroupList{}
		g.Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var names []string
		for _, pg := range list.Items {
			names = append(names, pg.Name)
		}
		g.Expect(names).To(ConsistOf(obj.GroupSetName() + "-0"))
	}).WithTimeout(readyTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())

	// A rollout replaces the group, placed whole. (LeaderWorkerSet v0.7
	// replaced this one group in place, with no extra group beside it: the
	// rollout also completed with the PodGroups of groups past the desired
	// count left out, which TestEveryGroupWithPodsHasAPodGroup covers.)
	update(g, obj, func(o *servingv1.AIInference) {
		o.Spec.Engine.Env = append(o.Spec.Engine.Env, corev1.EnvVar{Name: "ROLLOUT", Value: "2"})
	})
	waitFor(t, g, obj, groupTimeout, beReady(1))
	leader := expectGroups(g, obj, 1)[0].leader
	for _, c := range leader.Spec.Containers {
		if c.Name == servingv1.EngineContainerName {
			g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "ROLLOUT", Value: "2"}), "the group that serves runs the new spec")
		}
	}
}

// group is one replica's pods.
type group struct {
	leader  corev1.Pod
	workers []corev1.Pod
	rack    string
}

// expectGroups checks that the model's running pods are n groups of a leader
// and one worker, on different nodes of one rack, and returns them in group
// order.
func expectGroups(g *WithT, obj *servingv1.AIInference, n int) []group {
	ctx := context.Background()
	var groups []group
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		byIndex := map[string]*group{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			index := p.Labels[lwsv1.GroupIndexLabelKey]
			g.Expect(index).NotTo(BeEmpty(), "pod %s has no group", p.Name)
			if byIndex[index] == nil {
				byIndex[index] = &group{}
			}
			switch p.Labels[servingv1.LabelRole] {
			case servingv1.RoleLeader:
				byIndex[index].leader = p
			case servingv1.RoleWorker:
				byIndex[index].workers = append(byIndex[index].workers, p)
			default:
				g.Expect(p.Labels).To(HaveKey(servingv1.LabelRole), "pod %s", p.Name)
			}
		}
		g.Expect(byIndex).To(HaveLen(n))
		groups = nil
		for i := range n {
			gr := byIndex[fmt.Sprint(i)]
			g.Expect(gr).NotTo(BeNil(), "group %d", i)
			g.Expect(gr.leader.Name).To(Equal(fmt.Sprintf("%s-%d", obj.GroupSetName(), i)))
			g.Expect(gr.workers).To(HaveLen(1))
			var nodes, racks []string
			for _, p := range append([]corev1.Pod{gr.leader}, gr.workers...) {
				g.Expect(p.Spec.NodeName).NotTo(BeEmpty(), "pod %s is not placed", p.Name)
				node := &corev1.Node{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, node)).To(Succeed())
				nodes, racks = append(nodes, node.Name), append(racks, node.Labels[rackLabel])
			}
			g.Expect(slices.Compact(slices.Sorted(slices.Values(nodes)))).To(HaveLen(2), "a group's members on different nodes")
			g.Expect(slices.Compact(racks)).To(HaveLen(1), "a group's members in one rack: %v", racks)
			gr.rack = racks[0]
			groups = append(groups, *gr)
		}
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	return groups
}

// The figures of docs/multinode.md (make bench-multinode): seconds from apply
// to every group Ready for N replicas over two nodes each, beside the same N
// replicas on one node each (the operator's and LeaderWorkerSet's overhead per
// group), on simulated nodes; and seconds from a worker deleted to its group
// serving again.
func TestBenchMultiNode(t *testing.T) {
	if os.Getenv("MULTINODE_BENCH") == "" {
		t.Skip("MULTINODE_BENCH=1 runs it (make bench-multinode)")
	}
	shared.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	const replicas = 8
	ns, nodes := newNamespaceWithNodes(t)
	for rack := range replicas {
		g.Expect(nodes.add(localcluster.NodePool{Name: fmt.Sprintf("bench-rack-%d", rack), Count: 2, GPUProduct: multiNodeProduct, GPUCount: 8,
			CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti"), Labels: map[string]string{rackLabel: fmt.Sprint(rack)}})).To(Succeed())
	}
	applyAndWait := func(obj *servingv1.AIInference) time.Duration {
		begin := time.Now()
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		waitFor(t, g, obj, 3*readyTimeout, beReady(replicas))
		return time.Since(begin)
	}
	remove := func(obj *servingv1.AIInference) {
		g.Expect(k8s.Delete(ctx, obj)).To(Succeed())
		g.Eventually(func(g Gomega) {
			pods := &corev1.PodList{}
			g.Expect(k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty())
		}).WithTimeout(3 * readyTimeout).Should(Succeed())
	}

	single := inference(ns, "single", 8, multiNodeProduct)
	single.Spec.Replicas = ptr.To[int32](replicas)
	singleReady := applyAndWait(single)
	remove(single)

	multi := inference(ns, "multi", 8, multiNodeProduct)
	multi.Spec.Replicas = ptr.To[int32](replicas)
	multi.Spec.GPU.Nodes, multi.Spec.GPU.TopologyKey = 2, rackLabel
	multiReady := applyAndWait(multi)
	groups := expectGroups(g, multi, replicas)
	killed := time.Now()
	g.Expect(k8s.Delete(ctx, &groups[0].workers[0])).To(Succeed())
	g.Eventually(func(g Gomega) {
		leader := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&groups[0].leader), leader)
		g.Expect(err == nil && leader.UID == groups[0].leader.UID).To(BeFalse(), "the group was recreated")
	}).WithTimeout(readyTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	waitFor(t, g, multi, readyTimeout, beReady(replicas))
	recovered := time.Since(killed)

	t.Logf("multinode figure: apply -> Ready, %d replicas of 8 GPUs on one node each (Deployment): %.1f s", replicas, singleReady.Seconds())
	t.Logf("multinode figure: apply -> Ready, %d replicas of 2x8 GPUs on two nodes each (LeaderWorkerSet groups, one rack each): %.1f s (%.2fx)",
		replicas, multiReady.Seconds(), multiReady.Seconds()/singleReady.Seconds())
	t.Logf("multinode figure: a worker deleted -> its group recreated and every group Ready again: %.1f s (simulated kubelets)", recovered.Seconds())
}
