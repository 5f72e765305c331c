package aiinference

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

func multiNodeInference() *servingv1.AIInference {
	obj := sampleInference()
	obj.Spec.GPU = servingv1.GPUSpec{Count: 8, Products: []string{"NVIDIA-H100-80GB-HBM3"}, Nodes: 2, TopologyKey: "example.com/rack"}
	return obj
}

func desiredGroups(t *testing.T, obj *servingv1.AIInference) *lwsv1.LeaderWorkerSet {
	t.Helper()
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		t.Fatal(err)
	}
	d, err := DesiredDeployment(obj, Options{LoaderImage: "loader:test"})
	if err != nil {
		t.Fatal(err)
	}
	lws, err := desiredLeaderWorkerSet(obj, eng, d)
	if err != nil {
		t.Fatal(err)
	}
	return lws
}

// A replica over two 8-GPU nodes is a group of two pods: the leader runs
// vLLM's server over a Ray cluster the worker joins, tensor parallel over a
// node's GPUs and pipeline parallel over the nodes, as vLLM's docs run it
// under LeaderWorkerSet; the worker loads the model too, and has no port,
// probe or warm-up gate.
func TestAReplicaOverTwoNodesIsOneGroup(t *testing.T) {
	g := NewWithT(t)
	obj := multiNodeInference()
	lws := desiredGroups(t, obj)
	g.Expect(lws.Name).To(Equal("chat-group"))
	g.Expect(*lws.Spec.LeaderWorkerTemplate.Size).To(Equal(int32(2)))
	g.Expect(lws.Spec.LeaderWorkerTemplate.RestartPolicy).To(Equal(lwsv1.RecreateGroupOnPodRestart))
	g.Expect(lws.Spec.StartupPolicy).To(Equal(lwsv1.LeaderCreatedStartupPolicy), "the leader is ready only once its workers joined")

	leader := lws.Spec.LeaderWorkerTemplate.LeaderTemplate
	worker := lws.Spec.LeaderWorkerTemplate.WorkerTemplate
	g.Expect(leader.Labels).To(HaveKeyWithValue(servingv1.LabelRole, servingv1.RoleLeader))
	g.Expect(worker.Labels).To(HaveKeyWithValue(servingv1.LabelRole, servingv1.RoleWorker))
	g.Expect(leader.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(worker.Annotations[servingv1.AnnotationTemplateHash]),
		"one template hash tells current pods of either role")

	le := engineOf(&leader.Spec)
	g.Expect(le.Command).To(HaveExactElements("/bin/bash", "-c", ContainSubstring(`multi-node-serving.sh leader --ray_cluster_size="$LWS_GROUP_SIZE" && exec python3 -m vllm.entrypoints.openai.api_server "$@"`), "vllm-leader"))
	g.Expect(le.Args).To(ContainElements("--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray"))
	g.Expect(le.ReadinessProbe).NotTo(BeNil())
	g.Expect(le.Resources.Limits.Name(servingv1.GPUResource, "").Value()).To(Equal(int64(8)))
	g.Expect(leader.Spec.InitContainers).To(ContainElement(HaveField("Name", servingv1.WarmupContainerName)))

	we := engineOf(&worker.Spec)
	g.Expect(we.Command).To(HaveExactElements("/bin/bash", "-c", ContainSubstring(`multi-node-serving.sh worker --ray_address="$LWS_LEADER_ADDRESS"`)))
	g.Expect(we.Args).To(BeEmpty())
	g.Expect(we.Ports).To(BeEmpty())
	g.Expect([]*corev1.Probe{we.StartupProbe, we.ReadinessProbe, we.LivenessProbe}).To(HaveEach(BeNil()))
	g.Expect(we.Resources.Limits.Name(servingv1.GPUResource, "").Value()).To(Equal(int64(8)))
	g.Expect(worker.Spec.InitContainers).To(HaveLen(1))
	g.Expect(worker.Spec.InitContainers[0].Name).To(Equal(servingv1.LoaderContainerName), "every member loads the model")
	for _, spec := range []corev1.PodSpec{leader.Spec, worker.Spec} {
		g.Expect(spec.Volumes).To(ContainElement(HaveField("Name", shmVolume)), "Ray's object store")
	}
}

// The members of one group go to different nodes, within one domain of
// gpu.topologyKey; the terms name the group by its label's key, so groups
// do not constrain one another.
func TestAGroupsMembersShareADomainOnDifferentNodes(t *testing.T) {
	g := NewWithT(t)
	for _, role := range []corev1.PodTemplateSpec{*desiredGroups(t, multiNodeInference()).Spec.LeaderWorkerTemplate.LeaderTemplate, desiredGroups(t, multiNodeInference()).Spec.LeaderWorkerTemplate.WorkerTemplate} {
		a := role.Spec.Affinity
		g.Expect(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(HaveExactElements(And(
			HaveField("TopologyKey", hostnameKey), HaveField("MatchLabelKeys", []string{lwsv1.GroupUniqueHashLabelKey}))))
		g.Expect(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(HaveExactElements(And(
			HaveField("TopologyKey", "example.com/rack"), HaveField("MatchLabelKeys", []string{lwsv1.GroupUniqueHashLabelKey}))))
		g.Expect(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(HaveExactElements(HaveField("PodAffinityTerm", And(
			HaveField("TopologyKey", "example.com/rack"), HaveField("MismatchLabelKeys", []string{lwsv1.GroupUniqueHashLabelKey})))),
			"a leader prefers a rack no other group uses")
		g.Expect(a.NodeAffinity).NotTo(BeNil(), "the GPU product still chooses the nodes")
	}

	single := sampleInference()
	d, err := DesiredDeployment(single, Options{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Spec.Template.Spec.Affinity.PodAntiAffinity).To(BeNil())
	g.Expect(engineOf(&d.Spec.Template.Spec).Args).NotTo(ContainElement("--pipeline-parallel-size"))
}

// A change of shape rolls the pods: the template hash follows gpu.nodes and
// gpu.topologyKey.
func TestTheShapeIsPartOfTheTemplateHash(t *testing.T) {
	g := NewWithT(t)
	hash := func(obj *servingv1.AIInference) string {
		return desiredGroups(t, obj).Spec.LeaderWorkerTemplate.LeaderTemplate.Annotations[servingv1.AnnotationTemplateHash]
	}
	base := multiNodeInference()
	threeNodes := multiNodeInference()
	threeNodes.Spec.GPU.Nodes = 3
	otherDomain := multiNodeInference()
	otherDomain.Spec.GPU.TopologyKey = "topology.kubernetes.io/zone"
	g.Expect(hash(base)).NotTo(Equal(hash(threeNodes)))
	g.Expect(hash(base)).NotTo(Equal(hash(otherDomain)))
}

// Status counts groups, and a group is ready only when its leader serves
// and every worker runs ready: the LeaderWorkerSet's own ready count (3
// here) counts a group whose worker is Pending.
func TestGroupsCountAsReplicas(t *testing.T) {
	g := NewWithT(t)
	lws := desiredGroups(t, multiNodeInference())
	lws.Generation = 4
	lws.Status = lwsv1.LeaderWorkerSetStatus{Replicas: 3, ReadyReplicas: 3, UpdatedReplicas: 3}
	leader := func(group string, serves bool) podView {
		return podView{Role: servingv1.RoleLeader, Group: group, Serves: serves, Ready: serves}
	}
	worker := func(group string, ready bool) podView {
		return podView{Role: servingv1.RoleWorker, Group: group, Ready: ready}
	}
	pods := []podView{
		leader("0", true), worker("0", true),
		leader("1", true), worker("1", false),
		leader("2", false), worker("2", true),
	}
	d := groupsAsDeployment(lws, pods)
	g.Expect(d.Status.Replicas).To(Equal(int32(3)))
	g.Expect(d.Status.ReadyReplicas).To(Equal(int32(1)))
	g.Expect(d.Status.AvailableReplicas).To(Equal(int32(1)))
	g.Expect(d.Status.UpdatedReplicas).To(Equal(int32(3)))
	g.Expect(d.Status.ObservedGeneration).To(Equal(int64(4)))
	g.Expect(podTemplateHash(d)).To(Equal(lws.Spec.LeaderWorkerTemplate.LeaderTemplate.Annotations[servingv1.AnnotationTemplateHash]))
}

// A group whose leader is being deleted is no replica, as a Deployment's
// terminating pod is none: the LeaderWorkerSet still counts it while the
// leader's preStop runs, and a scale to zero (the autoscaler's) is done
// before that, not Ready False until the group's pods are gone.
func TestAGroupGoingAwayIsNoReplica(t *testing.T) {
	g := NewWithT(t)
	obj := multiNodeInference()
	obj.Spec.Replicas = ptr.To[int32](0)
	lws := desiredGroups(t, obj)
	lws.Status = lwsv1.LeaderWorkerSetStatus{Replicas: 1, UpdatedReplicas: 1}
	deleted := metav1.NewTime(now)
	member := func(name, role string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, DeletionTimestamp: &deleted,
			Labels: map[string]string{servingv1.LabelRole: role, lwsv1.GroupIndexLabelKey: "0"}}}
	}
	pods := observePods([]corev1.Pod{member("llama-group-0", servingv1.RoleLeader), member("llama-group-0-1", servingv1.RoleWorker)},
		lws.Spec.LeaderWorkerTemplate.LeaderTemplate.Annotations[servingv1.AnnotationTemplateHash])
	d := groupsAsDeployment(lws, pods)
	g.Expect(d.Status.Replicas).To(BeZero())
	g.Expect(d.Status.UpdatedReplicas).To(BeZero())
	st := computeStatus(obj, observation{deployment: d, pods: pods, podsSeen: true}, loadAssessment{}, now)
	ready := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
	g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), "%s: %s", ready.Reason, ready.Message)
	g.Expect(ready.Reason).To(Equal(servingv1.ReasonScaledToZero))
	g.Expect(st.Replicas).To(BeZero())

	// Until its leader is being deleted, the group still counts.
	pods = []podView{{Role: servingv1.RoleLeader, Group: "0", Current: true}}
	g.Expect(groupsAsDeployment(lws, pods).Status.Replicas).To(Equal(int32(1)))
}

// Traffic goes to leaders only (a worker serves nothing), and with
// spec.networkPolicy the members of a group reach each other on any port.
func TestOnlyLeadersServeAndMembersTalk(t *testing.T) {
	g := NewWithT(t)
	obj := multiNodeInference()
	eng, err := engine.For(obj.Spec.Engine.Type)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(desiredService(obj, eng).Spec.Selector).To(HaveKeyWithValue(servingv1.LabelRole, servingv1.RoleLeader))
	g.Expect(desiredService(sampleInference(), eng).Spec.Selector).NotTo(HaveKey(servingv1.LabelRole))

	obj.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true}
	ingress, egress := desiredNetworkPolicies(obj, eng, "aiinference-system")
	members := HaveField("PodSelector.MatchLabels", selectorLabels(obj))
	g.Expect(ingress.Spec.Ingress).To(ContainElement(And(HaveField("From", HaveExactElements(members)), HaveField("Ports", BeEmpty()))))
	g.Expect(egress.Spec.Egress).To(ContainElement(And(HaveField("To", HaveExactElements(members)), HaveField("Ports", BeEmpty()))))

	single := sampleInference()
	single.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{Enabled: true}
	ingress, egress = desiredNetworkPolicies(single, eng, "aiinference-system")
	g.Expect(ingress.Spec.Ingress).NotTo(ContainElement(HaveField("From", HaveExactElements(members))))
	g.Expect(egress.Spec.Egress).NotTo(ContainElement(HaveField("To", HaveExactElements(members))))
}

// While a group waits, status names the member that holds it: the worker
// still loading, not its leader, whose engine waits for that worker.
func TestStatusNamesTheWorkerItsLeaderWaitsFor(t *testing.T) {
	g := NewWithT(t)
	obj := multiNodeInference()
	leader := podView{Name: "llama-group-0", Role: servingv1.RoleLeader, Group: "0", Current: true, Scheduled: true, LoaderDone: true}
	worker := podView{Name: "llama-group-0-1", Role: servingv1.RoleWorker, Group: "0", Current: true, Scheduled: true, LoaderStarted: now}
	for _, tc := range []struct {
		name           string
		pods           []podView
		reason, member string
	}{
		{"the worker loads", []podView{leader, worker}, servingv1.ReasonLoading, "pod llama-group-0-1, a worker its group's leader waits for, is loading"},
		{"the worker has loaded: the leader's engine starts", []podView{leader, func() podView { w := worker; w.LoaderDone = true; return w }()},
			servingv1.ReasonEngineStarting, "pod llama-group-0 and the engine is starting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := computeStatus(obj, observation{deployment: deploymentWith(1, 0, 1), pods: tc.pods, podsSeen: true}, loadAssessment{}, now)
			ready := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
			g.Expect(ready.Reason).To(Equal(tc.reason))
			g.Expect(ready.Message).To(ContainSubstring(tc.member))
		})
	}
}
