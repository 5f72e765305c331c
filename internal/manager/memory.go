package manager

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// defaultGCPercent is the operator's GOGC unless the environment sets one: the
// heap grows by half its live size between collections, not by all of it (Go's
// default, 100). The heap at its peak is most of the operator's RSS: at 1,000
// objects about 48 MB live, so 96 MB at GOGC=100 and 72 MB here; the
// collections it adds cost little CPU next to the decoding of watch events.
const defaultGCPercent = 50

// memoryLimitShare is the share of the container's memory limit the operator
// gives the Go runtime as its soft limit (GOMEMLIMIT) unless the environment
// sets one: near the limit the garbage collector works harder rather than let
// the kernel kill the pod (a restart with many objects lists them all at once).
const memoryLimitShare = 0.9

// cgroupMemoryLimitFiles hold the container's memory limit: cgroup v2, then v1.
var cgroupMemoryLimitFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// SetMemoryDefaults applies the operator's garbage collector settings where the
// environment sets none (GOGC, GOMEMLIMIT) and says what it set, for the log.
func SetMemoryDefaults() string {
	var set []string
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
		set = append(set, fmt.Sprintf("GOGC=%d", defaultGCPercent))
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		if limit, ok := containerMemoryLimit(); ok {
			soft := int64(float64(limit) * memoryLimitShare)
			debug.SetMemoryLimit(soft)
			set = append(set, fmt.Sprintf("GOMEMLIMIT=%dMiB (%.0f%% of the container's %dMiB)", soft>>20, memoryLimitShare*100, limit>>20))
		}
	}
	return strings.Join(set, ", ")
}

// containerMemoryLimit is the memory limit of the process's cgroup, if it has one.
func containerMemoryLimit() (int64, bool) {
	for _, path := range cgroupMemoryLimitFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		return parseMemoryLimit(string(data))
	}
	return 0, false
}

// parseMemoryLimit reads a cgroup memory limit: "max" (v2) or a huge number (v1,
// about 2^63 rounded to pages) mean none.
func parseMemoryLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" || s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= math.MaxInt64/2 {
		return 0, false
	}
	return n, true
}

// lastAppliedAnnotation is where `kubectl apply` keeps the whole object it
// applied: as large as the object's spec, and nothing of the operator reads it.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// stripForCache is the transform of every cached object: it drops what the
// operator never reads, managedFields (the largest part of an object) and
// kubectl's last applied configuration. The operator writes the AIInference
// status with a merge patch computed between two copies of the cached object,
// and children with server-side apply from the desired state, so what the cache
// lacks is never written back.
func stripForCache(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		if annotations := m.GetAnnotations(); annotations[lastAppliedAnnotation] != "" {
			delete(annotations, lastAppliedAnnotation)
			m.SetAnnotations(annotations)
		}
	}
	if d, ok := obj.(*appsv1.Deployment); ok {
		// The pod spec is most of a Deployment and the operator reads it only to
		// find edits by hand, which the Deployment's generation tells (see
		// aiinference's verifiedGenerations); the template's metadata stays.
		d.Spec.Template.Spec = corev1.PodSpec{}
	}
	return obj, nil
}

// modelSliceOnly is the transform of the cached EndpointSlices. Those the
// EndpointSlice controller makes for the models' Services (they carry the
// Service's labels, so the cache holds them: one or more per model) are read
// only to count a canary track's ready endpoints and to map a change to its
// model, so of them the cache keeps the labels that select and map them and
// each endpoint's address and conditions. The operator's own slices (the
// activator's and the router's) stay whole: their spec-hash annotation decides
// whether to apply them again.
func modelSliceOnly(obj any) (any, error) {
	obj, err := stripForCache(obj)
	if err != nil {
		return obj, err
	}
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || slice.Labels[discoveryv1.LabelManagedBy] == servingv1.ManagedByValue {
		return obj, nil
	}
	kept := map[string]string{}
	for _, key := range []string{discoveryv1.LabelServiceName, servingv1.LabelInference, servingv1.LabelManagedBy} {
		if v, ok := slice.Labels[key]; ok {
			kept[key] = v
		}
	}
	slice.Labels, slice.Annotations, slice.OwnerReferences, slice.GenerateName = kept, nil, nil, ""
	for i, e := range slice.Endpoints {
		slice.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions}
	}
	slice.Ports = nil
	return slice, nil
}
