package aiinference

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// nodeCacheWeight is the scheduler's preference for a node that holds a
// complete copy of the model: as much as for the first GPU product, so a node
// of the second product with the copy wins over one of the first without
// (a download of minutes costs more than the product order says).
const nodeCacheWeight = 100

// +kubebuilder:rbac:groups=storage.k8s.io,resources=csidrivers,verbs=get

// checkNodeCacheInstalled finds the node cache's CSIDriver. Without it the
// kubelet cannot mount a pod's cache volume and the pods wait in
// ContainerCreating with nothing in their status to say why, so no pod is
// made. An operator that may not read CSIDrivers (namespace mode) cannot tell,
// and goes on.
func (r *Reconciler) checkNodeCacheInstalled(ctx context.Context) (*problem, error) {
	err := r.APIReader.Get(ctx, client.ObjectKey{Name: nodecachespec.DriverName}, &storagev1.CSIDriver{})
	switch {
	case err == nil:
		return nil, nil
	case apierrors.IsNotFound(err):
		return &problem{servingv1.ReasonModelCacheNotInstalled, fmt.Sprintf(
			"spec.cache.type Node needs the node-local model cache, and the cluster has no CSIDriver %s: install it (the chart's modelCache.enabled=true) or choose another cache type", nodecachespec.DriverName)}, nil
	case apierrors.IsForbidden(err):
		logf.FromContext(ctx).V(1).Info("Cannot check that the node cache is installed", "error", err.Error())
		return nil, nil
	}
	return nil, fmt.Errorf("reading CSIDriver %s: %w", nodecachespec.DriverName, err)
}

// nodeCacheKey is the key of the model's copies on the nodes (see nodecachespec.Key).
func nodeCacheKey(obj *servingv1.AIInference) string {
	source, endpoint := nodeCacheSource(obj)
	return nodecachespec.Key(obj.Namespace, source, endpoint)
}

func nodeCacheSource(obj *servingv1.AIInference) (source, endpoint string) {
	config := loaderConfig(obj)
	switch {
	case config.S3 != nil:
		endpoint = config.S3.Endpoint
	case config.HuggingFace != nil:
		// A mirror may hold other bytes under the same name.
		endpoint = config.HuggingFace.Endpoint
	}
	return config.Source, endpoint
}

// nodeCacheVolume is the pod's cache volume from the node's model cache: the
// node plugin mounts the node's copy of this model there, which the loader
// writes and the engine reads.
func nodeCacheVolume(obj *servingv1.AIInference) *corev1.CSIVolumeSource {
	source, endpoint := nodeCacheSource(obj)
	attrs := map[string]string{nodecachespec.AttrSource: source}
	if endpoint != "" {
		attrs[nodecachespec.AttrEndpoint] = endpoint
	}
	if size := obj.Spec.Model.Size; size != nil {
		attrs[nodecachespec.AttrSizeBytes] = strconv.FormatInt(size.Value(), 10)
	}
	return &corev1.CSIVolumeSource{Driver: nodecachespec.DriverName, VolumeAttributes: attrs}
}

// withNodeCachePreference adds, for a model on the node cache, the preference
// for nodes that hold a complete copy: preferred, never required, so a model
// still starts where no copy is.
func withNodeCachePreference(affinity *corev1.Affinity, obj *servingv1.AIInference) *corev1.Affinity {
	if resolvedCache(obj).Type != servingv1.CacheNode {
		return affinity
	}
	if affinity == nil {
		affinity = &corev1.Affinity{}
	}
	if affinity.NodeAffinity == nil {
		affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
		corev1.PreferredSchedulingTerm{Weight: nodeCacheWeight, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: nodecachespec.NodeLabel(nodeCacheKey(obj)), Operator: corev1.NodeSelectorOpExists}},
		}})
	return affinity
}
