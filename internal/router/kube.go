package router

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

// LabelOpenAIAddress on a Service, "true", makes it its namespace's one
// OpenAI address: the `model` in the body picks the AIInference.
const LabelOpenAIAddress = "serving.aiinference.io/openai"

// Field indexes of the router's cache.
const (
	podIPField     = "status.podIP"
	clusterIPField = "spec.clusterIP"
)

// IndexFields adds the indexes KubeDirectory looks clients and Services up by.
func IndexFields(ctx context.Context, c cache.Cache) error {
	if err := c.IndexField(ctx, &corev1.Pod{}, podIPField, func(o client.Object) []string {
		p := o.(*corev1.Pod)
		if p.Status.PodIP == "" || p.Spec.HostNetwork {
			return nil // a host-network pod shares its node's address: it names no one
		}
		return []string{p.Status.PodIP}
	}); err != nil {
		return err
	}
	return c.IndexField(ctx, &corev1.Service{}, clusterIPField, func(o client.Object) []string {
		s := o.(*corev1.Service)
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			return nil
		}
		return []string{s.Spec.ClusterIP}
	})
}

// KubeDirectory reads models, Services and pods from a cache indexed by
// IndexFields.
type KubeDirectory struct {
	Reader client.Reader
}

// Target implements Directory.
func (k KubeDirectory) Target(ctx context.Context, hostport string, clientAddr netip.Addr) (Target, bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	svc := &corev1.Service{}
	if ip, err := netip.ParseAddr(host); err == nil {
		services := &corev1.ServiceList{}
		if err := k.Reader.List(ctx, services, client.MatchingFields{clusterIPField: ip.String()}); err != nil || len(services.Items) != 1 {
			return Target{}, false
		}
		svc = &services.Items[0]
	} else {
		name, rest, _ := strings.Cut(host, ".")
		namespace, _, _ := strings.Cut(rest, ".")
		if namespace == "" {
			// A bare name is a Service of the caller's own namespace, as DNS resolves it.
			namespace = k.namespaceOf(ctx, clientAddr)
		}
		if name == "" || namespace == "" {
			return Target{}, false
		}
		if err := k.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, svc); err != nil {
			return Target{}, false
		}
	}
	if model := svc.Labels[servingv1.LabelInference]; model != "" {
		track := svc.Spec.Selector[servingv1.LabelTrack]
		if track == "" {
			track = svc.Labels[servingv1.LabelTrack]
		}
		if svc.Name == model {
			track = "" // the model's own Service: the router applies the split
		}
		return Target{Namespace: svc.Namespace, Model: model, Track: track}, true
	}
	if svc.Labels[LabelOpenAIAddress] == "true" {
		return Target{Namespace: svc.Namespace}, true
	}
	return Target{}, false
}

// ClientNamespace implements Directory.
func (k KubeDirectory) ClientNamespace(ctx context.Context, addr netip.Addr) string {
	return k.namespaceOf(ctx, addr)
}

// namespaceOf is the namespace of the pod at addr; "" when no pod has it.
func (k KubeDirectory) namespaceOf(ctx context.Context, addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	pods := &corev1.PodList{}
	if err := k.Reader.List(ctx, pods, client.MatchingFields{podIPField: addr.String()}); err != nil {
		return ""
	}
	namespace := ""
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // its address may be another pod's now
		}
		if namespace != "" && p.Namespace != namespace {
			return "" // two live pods claim the address: trust neither
		}
		namespace = p.Namespace
	}
	return namespace
}

// Model implements Directory.
func (k KubeDirectory) Model(ctx context.Context, key types.NamespacedName) (*servingv1.AIInference, error) {
	obj := &servingv1.AIInference{}
	if err := k.Reader.Get(ctx, key, obj); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return obj, nil
}

// Models implements Directory.
func (k KubeDirectory) Models(ctx context.Context, namespace string) ([]servingv1.AIInference, error) {
	list := &servingv1.AIInferenceList{}
	if err := k.Reader.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Endpoints implements Directory: the model's pods that serve, at the engine
// container's port named "http".
func (k KubeDirectory) Endpoints(ctx context.Context, obj *servingv1.AIInference) ([]Endpoint, error) {
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		return nil, err
	}
	pods := &corev1.PodList{}
	if err := k.Reader.List(ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name}); err != nil {
		return nil, err
	}
	var out []Endpoint
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" || !servingv1.PodServes(p) {
			continue
		}
		port := enginePort(p)
		if port == 0 {
			continue
		}
		metricsPort := port
		if mp := eng.MetricsPort(); mp != 0 {
			metricsPort = mp
		}
		out = append(out, Endpoint{
			Name:       p.Name,
			Addr:       net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port))),
			MetricsURL: "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(metricsPort))) + "/metrics",
			Track:      p.Labels[servingv1.LabelTrack],
		})
	}
	return out, nil
}

// enginePort is the engine container's port named "http"; 0 when it has none.
func enginePort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		if c.Name != servingv1.EngineContainerName {
			continue
		}
		for _, port := range c.Ports {
			if port.Name == "http" {
				return port.ContainerPort
			}
		}
	}
	return 0
}

// TrimPod keeps what the router reads of a pod (labels, the engine's ports,
// host networking, phase, IP, container readiness), so a cache of every pod
// of the cluster stays small.
func TrimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	trimmed := &corev1.Pod{}
	trimmed.ObjectMeta = p.ObjectMeta
	trimmed.ManagedFields, trimmed.Annotations, trimmed.OwnerReferences = nil, nil, nil
	trimmed.Spec.HostNetwork = p.Spec.HostNetwork
	for _, c := range p.Spec.Containers {
		if c.Name == servingv1.EngineContainerName {
			trimmed.Spec.Containers = []corev1.Container{{Name: c.Name, Ports: c.Ports}}
		}
	}
	trimmed.Status.Phase, trimmed.Status.PodIP = p.Status.Phase, p.Status.PodIP
	for _, cs := range p.Status.ContainerStatuses {
		trimmed.Status.ContainerStatuses = append(trimmed.Status.ContainerStatuses, corev1.ContainerStatus{Name: cs.Name, Ready: cs.Ready})
	}
	for _, cs := range p.Status.InitContainerStatuses {
		trimmed.Status.InitContainerStatuses = append(trimmed.Status.InitContainerStatuses, corev1.ContainerStatus{Name: cs.Name, Ready: cs.Ready})
	}
	return trimmed, nil
}
