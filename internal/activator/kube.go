package activator

import (
	"context"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// KubeResolver routes requests by the models' Services and finds their serving
// pods, from the operator's cache.
type KubeResolver struct {
	Reader client.Reader
}

// Route takes the host a client called: the Service's name (name,
// name.namespace, name.namespace.svc[.cluster.local]) or its ClusterIP.
func (k KubeResolver) Route(ctx context.Context, hostport string) (types.NamespacedName, bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	services := &corev1.ServiceList{}
	if err := k.Reader.List(ctx, services, client.HasLabels{servingv1.LabelInference}); err != nil {
		return types.NamespacedName{}, false
	}
	name, namespace, _ := strings.Cut(host, ".")
	namespace, _, _ = strings.Cut(namespace, ".")
	var found []types.NamespacedName
	for _, svc := range services.Items {
		key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Labels[servingv1.LabelInference]}
		switch {
		case net.ParseIP(host) != nil:
			if svc.Spec.ClusterIP == host {
				return key, true
			}
		case svc.Name == name && (namespace == "" || svc.Namespace == namespace):
			found = append(found, key)
		}
	}
	// A bare name is the model's only when one namespace has it.
	if len(found) == 1 {
		return found[0], true
	}
	return types.NamespacedName{}, false
}

// Backend is a serving pod of the model, at the Service's port (the engine's).
func (k KubeResolver) Backend(ctx context.Context, key types.NamespacedName) (string, error) {
	svc := &corev1.Service{}
	if err := k.Reader.Get(ctx, key, svc); err != nil || len(svc.Spec.Ports) == 0 {
		return "", client.IgnoreNotFound(err)
	}
	pods := &corev1.PodList{}
	if err := k.Reader.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{servingv1.LabelInference: key.Name}); err != nil {
		return "", err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" && servingv1.PodServes(p) {
			return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), nil
		}
	}
	return "", nil
}
