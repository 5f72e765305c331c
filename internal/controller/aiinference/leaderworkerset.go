package aiinference

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

// A replica that spans nodes (gpu.nodes above 1) is a LeaderWorkerSet group:
// the LeaderWorkerSet controller starts its pods together, one per node,
// recreates the whole group when one of them fails (an engine whose peer is
// gone hangs rather than exits), and rolls and scales whole groups. The
// leader runs the engine's server and the workers join it; every member
// loads the model first, as a single-node replica's pod does. The desired
// Deployment's pod template is the basis of both, so one template hash tells
// current pods from old ones whatever their role.

var leaderWorkerSetKind = schema.GroupKind{Group: lwsv1.GroupVersion.Group, Kind: "LeaderWorkerSet"}

// hostnameKey is the node label that tells nodes apart.
const hostnameKey = "kubernetes.io/hostname"

// withGroupTopology keeps the members of one group on different nodes, and
// within one domain of gpu.topologyKey when it is set. The terms match the
// pods of the same group by its label (matchLabelKeys takes the value from
// the pod being placed), so groups do not constrain each other.
func withGroupTopology(affinity *corev1.Affinity, obj *servingv1.AIInference) *corev1.Affinity {
	if !obj.SpansNodes() {
		return affinity
	}
	if affinity == nil {
		affinity = &corev1.Affinity{}
	}
	term := func(topologyKey string) corev1.PodAffinityTerm {
		return corev1.PodAffinityTerm{
			LabelSelector:  &metav1.LabelSelector{MatchLabels: selectorLabels(obj)},
			MatchLabelKeys: []string{lwsv1.GroupUniqueHashLabelKey},
			TopologyKey:    topologyKey,
		}
	}
	affinity.PodAntiAffinity = &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(hostnameKey)},
	}
	if key := obj.Spec.GPU.TopologyKey; key != "" {
		affinity.PodAffinity = &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(key)},
		}
		// Nothing places a group's pods together (no gang scheduling): the
		// leaders of groups made at once, placed before their workers, would
		// take one domain's nodes between them, leaving each worker no room
		// beside its leader (seen with four groups on four racks of two
		// nodes). A leader prefers a domain no other group uses.
		otherGroups := term(key)
		otherGroups.MatchLabelKeys, otherGroups.MismatchLabelKeys = nil, []string{lwsv1.GroupUniqueHashLabelKey}
		affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.WeightedPodAffinityTerm{
			{Weight: 100, PodAffinityTerm: otherGroups}}
	}
	return affinity
}

// desiredLeaderWorkerSet runs the desired Deployment's pods as groups of
// gpu.nodes pods: the leader's engine starts the engine's multi-node server,
// the workers' join it and have no port, probe or warm-up gate of their own.
func desiredLeaderWorkerSet(obj *servingv1.AIInference, eng engine.Engine, d *appsv1.Deployment) (*lwsv1.LeaderWorkerSet, error) {
	multi, ok := eng.(engine.MultiNode)
	if !ok {
		// Admission refuses it; an object stored before the rule is told so.
		return nil, fmt.Errorf("engine %s cannot spread a replica over nodes", obj.Spec.Engine.Type)
	}
	leader := d.Spec.Template.DeepCopy()
	leader.Labels[servingv1.LabelRole] = servingv1.RoleLeader
	engineOf(&leader.Spec).Command = multi.LeaderCommand()

	worker := d.Spec.Template.DeepCopy()
	worker.Labels[servingv1.LabelRole] = servingv1.RoleWorker
	var loader []corev1.Container
	for _, c := range worker.Spec.InitContainers {
		if c.Name == servingv1.LoaderContainerName {
			loader = append(loader, c)
		}
	}
	worker.Spec.InitContainers = loader
	c := engineOf(&worker.Spec)
	c.Command, c.Args, c.Ports = multi.WorkerCommand(), nil, nil
	c.StartupProbe, c.ReadinessProbe, c.LivenessProbe, c.Lifecycle = nil, nil, nil, nil

	return &lwsv1.LeaderWorkerSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: lwsv1.GroupVersion.String(), Kind: leaderWorkerSetKind.Kind},
		ObjectMeta: childMeta(obj, obj.GroupSetName()),
		Spec: lwsv1.LeaderWorkerSetSpec{
			Replicas: d.Spec.Replicas,
			LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{
				LeaderTemplate: leader,
				WorkerTemplate: *worker,
				Size:           ptr.To(obj.NodesPerReplica()),
				RestartPolicy:  lwsv1.RecreateGroupOnPodRestart,
			},
			// One extra group starts beside the old ones. Unlike the
			// Deployment's, the rollout cannot keep every old group until
			// then: LeaderWorkerSet v0.7 passes maxUnavailable to its
			// leaders' StatefulSet, which refuses 0 ("cannot be 0", seen
			// with the real controller), so one group may be replaced at a
			// time (docs/multinode.md).
			RolloutStrategy: lwsv1.RolloutStrategy{
				Type: lwsv1.RollingUpdateStrategyType,
				RollingUpdateConfiguration: &lwsv1.RollingUpdateConfiguration{
					MaxUnavailable: intstr.FromInt32(1),
					MaxSurge:       intstr.FromInt32(1),
				},
			},
			// The leader is ready only once its workers joined: they must not
			// wait for it.
			StartupPolicy: lwsv1.LeaderCreatedStartupPolicy,
		},
	}, nil
}

// engineOf is the engine container of a pod spec.
func engineOf(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == servingv1.EngineContainerName {
			return &spec.Containers[i]
		}
	}
	panic("the pod template has no engine container") // podTemplate always makes one
}

// reconcileLeaderWorkerSet applies the groups of a model that spans nodes.
// The Deployment of its single-node form, if any, serves until the groups
// do, and the reverse (see retireOtherForm).
func (r *Reconciler) reconcileLeaderWorkerSet(ctx context.Context, s *scope) error {
	desired, err := desiredLeaderWorkerSet(s.obj, s.engine, s.deployment)
	if err != nil {
		return err
	}
	existing := &lwsv1.LeaderWorkerSet{}
	res, err := r.apply(ctx, s, desired, existing)
	if err != nil {
		return err
	}
	if res == applyUnchanged || res == applyUpdated {
		s.obs.deployment = groupsAsDeployment(existing, s.obs.pods)
	}
	return r.retireOtherForm(ctx, s)
}

// retireOtherForm deletes the Deployment of a model that now spans nodes, or
// the LeaderWorkerSet of one that no longer does, once the current form
// serves every desired replica, so a change of shape never leaves the model
// without a serving replica.
func (r *Reconciler) retireOtherForm(ctx context.Context, s *scope) error {
	var other client.Object = &lwsv1.LeaderWorkerSet{TypeMeta: metav1.TypeMeta{APIVersion: lwsv1.GroupVersion.String(), Kind: leaderWorkerSetKind.Kind},
		ObjectMeta: childMeta(s.obj, s.obj.GroupSetName())}
	existing := client.Object(&lwsv1.LeaderWorkerSet{})
	if s.obj.SpansNodes() {
		other, existing = s.deployment, &appsv1.Deployment{}
	} else if !r.served(leaderWorkerSetKind) {
		return nil
	}
	if d := s.obs.deployment; d == nil || d.Status.ReadyReplicas < s.obj.DesiredReplicas() {
		return nil
	}
	return r.deleteOwned(ctx, s, other, existing)
}

// groupsAsDeployment is a LeaderWorkerSet's progress in a Deployment's terms,
// counted in groups, which is how status counts a multi-node model's
// replicas. The leader's template stands for the pods' (both carry its
// template hash). The LeaderWorkerSet controller reports no observed
// generation: its counts are taken as of the current spec, and observeRollout
// also counts the serving leaders of the current template before it calls a
// rollout done. Its ready count is not taken either: v0.7 counts a group
// ready once its workers exist, placed or not (StatefulsetReady), which would
// call a model Ready with a worker Pending; a group is ready here when its
// leader serves and every worker runs ready (readyGroups).
//
// Nor are its counts of groups taken past the leaders that are not being
// deleted (observePods skips those): v0.7 counts a group until its leader's
// pod is gone (its leaders' StatefulSet counts terminating pods), which
// takes the engine's preStop sleep and more. A Deployment's ReplicaSet
// counts no terminating pod, so a group going away (a scale down, to zero
// by the autoscaler) would otherwise keep a multi-node model Ready False
// (RollingOut, "replicas past the desired N are being removed") where a single-node
// model is done at once (seen: 6 s at each scale to zero on the real nodes).
func groupsAsDeployment(lws *lwsv1.LeaderWorkerSet, pods []podView) *appsv1.Deployment {
	ready := readyGroups(pods, ptr.Deref(lws.Spec.LeaderWorkerTemplate.Size, 1))
	var leaders int32
	for _, p := range pods {
		if p.Role == servingv1.RoleLeader {
			leaders++
		}
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: lws.Name, Namespace: lws.Namespace, Generation: lws.Generation,
			OwnerReferences: lws.OwnerReferences, Annotations: lws.Annotations},
		Spec: appsv1.DeploymentSpec{Replicas: lws.Spec.Replicas},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: lws.Generation,
			Replicas:           min(lws.Status.Replicas, leaders),
			UpdatedReplicas:    min(lws.Status.UpdatedReplicas, leaders),
			ReadyReplicas:      ready,
			AvailableReplicas:  ready,
		},
	}
	if t := lws.Spec.LeaderWorkerTemplate.LeaderTemplate; t != nil {
		d.Spec.Template = *t.DeepCopy()
	}
	return d
}

// readyGroups counts the groups of size pods whose leader serves and whose
// workers all run ready.
func readyGroups(pods []podView, size int32) int32 {
	type members struct {
		leaderServes bool
		readyWorkers int32
	}
	groups := map[string]*members{}
	for _, p := range pods {
		if p.Group == "" {
			continue
		}
		m := groups[p.Group]
		if m == nil {
			m = &members{}
			groups[p.Group] = m
		}
		switch {
		case p.Role == servingv1.RoleLeader && p.Serves:
			m.leaderServes = true
		case p.Role == servingv1.RoleWorker && p.Ready:
			m.readyWorkers++
		}
	}
	var ready int32
	for _, m := range groups {
		if m.leaderServes && m.readyWorkers >= size-1 {
			ready++
		}
	}
	return ready
}
