package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// GroupPodPath is where the pod webhook of multi-node replicas is served.
const GroupPodPath = "/mutate-v1-pod-group"

// A multi-node replica's group is placed all or nothing when each of its pods
// names the group's PodGroup (which the controller makes) as it is created:
// spec.schedulingGroup cannot be set later, and LeaderWorkerSet makes every
// group's pods from one template. The webhook sees only the pods of the
// operator's groups (objectSelector: a role label); it runs again after
// LeaderWorkerSet's own pod webhook, which labels a leader with its group.
// +kubebuilder:webhook:path=/mutate-v1-pod-group,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=group.pods.serving.aiinference.io,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded,patch=`{"objectSelector":{"matchExpressions":[{"key":"serving.aiinference.io/role","operator":"In","values":["leader","worker"]},{"key":"serving.aiinference.io/inference","operator":"Exists"}]}}`

// GroupPods sets a group's pod's spec.schedulingGroup to its group's PodGroup.
type GroupPods struct {
	Decoder admission.Decoder
	// ServesPodGroups says whether the cluster serves PodGroups: where it does
	// not, the controller makes none, and a pod naming one is left as it is.
	ServesPodGroups func() bool
}

// Handle answers one pod's admission.
func (h GroupPods) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Spec.SchedulingGroup != nil || !h.ServesPodGroups() {
		return admission.Allowed("")
	}
	name, err := groupPodGroup(pod)
	if err != nil {
		return admission.Denied(err.Error())
	}
	pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &name}
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// groupPodGroup is the PodGroup of a group's pod, from the labels its
// LeaderWorkerSet gives it: the group index on a worker; on a leader, before
// LeaderWorkerSet's webhook adds that, its StatefulSet's pod index, which
// is the same number.
func groupPodGroup(pod *corev1.Pod) (string, error) {
	set := pod.Labels[lwsv1.SetNameLabelKey]
	index := pod.Labels[lwsv1.GroupIndexLabelKey]
	if index == "" && pod.Labels[servingv1.LabelRole] == servingv1.RoleLeader {
		index = pod.Labels[appsv1.PodIndexLabel]
	}
	if set == "" || index == "" {
		return "", fmt.Errorf("pod %s has the role label %s=%s but not the labels of a LeaderWorkerSet group (%s and %s), so its group's PodGroup is unknown; only the operator's LeaderWorkerSets make pods with that label",
			pod.Name, servingv1.LabelRole, pod.Labels[servingv1.LabelRole], lwsv1.SetNameLabelKey, lwsv1.GroupIndexLabelKey)
	}
	return servingv1.GroupPodGroupName(set, index), nil
}
