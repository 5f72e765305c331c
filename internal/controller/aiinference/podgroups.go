package aiinference

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// A group is placed all or nothing where the cluster's scheduler does gang
// scheduling: Kubernetes 1.37 with the GenericWorkload feature gate, which
// serves scheduling.k8s.io/v1beta1 PodGroups and turns on the scheduler's
// GangScheduling plugin. Each group index has a PodGroup with a gang policy
// of the group's size, and each of the group's pods names it in
// spec.schedulingGroup as it is created (the operator's pod webhook, since
// LeaderWorkerSet makes every group's pods from one template). Without it
// the scheduler places a leader whose workers find no room, and the leader
// holds its node's GPUs for nothing.

var podGroupKind = schema.GroupKind{Group: schedulingv1beta1.GroupName, Kind: "PodGroup"}

// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=podgroups,verbs=get;list;watch;create;update;patch;delete

// podGroupIndices are the group indices that need a PodGroup: every desired
// group's, and every group's that has pods (a rollout's surge group, one
// past the desired count, and groups being removed), in order.
func podGroupIndices(replicas int32, pods []podView) []int {
	var indices []int
	for i := range int(replicas) {
		indices = append(indices, i)
	}
	for _, p := range pods {
		if i, err := strconv.Atoi(p.Group); err == nil && !slices.Contains(indices, i) {
			indices = append(indices, i)
		}
	}
	slices.Sort(indices)
	return indices
}

// desiredPodGroup is the gang of one group: all of its size pods placed at
// once, or none.
func desiredPodGroup(obj *servingv1.AIInference, index int) *schedulingv1beta1.PodGroup {
	return &schedulingv1beta1.PodGroup{
		TypeMeta:   metav1.TypeMeta{APIVersion: schedulingv1beta1.SchemeGroupVersion.String(), Kind: podGroupKind.Kind},
		ObjectMeta: childMeta(obj, servingv1.GroupPodGroupName(obj.GroupSetName(), strconv.Itoa(index))),
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: obj.NodesPerReplica()},
			},
		},
	}
}

// reconcilePodGroups applies the PodGroups of a model's groups before its
// LeaderWorkerSet makes their pods (a pod whose PodGroup is missing waits
// for it), and deletes those of groups that are neither desired nor have
// pods (all of them once the model no longer spans nodes and its groups
// are gone).
func (r *Reconciler) reconcilePodGroups(ctx context.Context, s *scope) error {
	var replicas int32
	if s.obj.SpansNodes() {
		replicas = ptr.Deref(s.deployment.Spec.Replicas, 0)
	}
	indices := podGroupIndices(replicas, s.obs.pods)
	var wanted []string
	for _, i := range indices {
		desired := desiredPodGroup(s.obj, i)
		wanted = append(wanted, desired.Name)
		if _, err := r.apply(ctx, s, desired, &schedulingv1beta1.PodGroup{}); err != nil {
			return err
		}
	}
	list := &schedulingv1beta1.PodGroupList{}
	if err := r.List(ctx, list, client.InNamespace(s.obj.Namespace), client.MatchingLabels(childLabels(s.obj))); err != nil {
		return fmt.Errorf("listing the PodGroups: %w", err)
	}
	for i := range list.Items {
		pg := &list.Items[i]
		if slices.Contains(wanted, pg.Name) {
			continue
		}
		stale := desiredPodGroup(s.obj, 0)
		stale.Name = pg.Name
		if err := r.deleteOwned(ctx, s, stale, &schedulingv1beta1.PodGroup{}); err != nil {
			return err
		}
	}
	return nil
}
