package activator

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/ingresspolicy"
)

// KubeResolver reads the models and their serving pods from the operator's
// cache, and the clients from the API server.
type KubeResolver struct {
	Reader  client.Reader
	Clients ingresspolicy.Lookup
}

// Admit lets a client in when the model may go to zero and its network policy
// lets the client reach the pods.
func (k KubeResolver) Admit(ctx context.Context, key types.NamespacedName, ip net.IP) (bool, string, error) {
	return k.check(ctx, key, ip, true)
}

// Readmit lets a held request go on when the model's network policy lets the
// client reach the pods now.
func (k KubeResolver) Readmit(ctx context.Context, key types.NamespacedName, ip net.IP) (bool, string, error) {
	return k.check(ctx, key, ip, false)
}

// check tells whether the model's network policy lets the client reach its
// pods; toZero: and the model may go to zero.
func (k KubeResolver) check(ctx context.Context, key types.NamespacedName, ip net.IP, toZero bool) (bool, string, error) {
	obj := &servingv1.AIInference{}
	if err := k.Reader.Get(ctx, key, obj); apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("%s is gone", key), nil
	} else if err != nil {
		return false, "", err
	}
	if a := obj.Spec.Autoscaling; toZero && (a == nil || a.Min() > 0) {
		return false, fmt.Sprintf("%s does not go to zero: the activator holds none of its requests", key), nil
	}
	if np := obj.Spec.NetworkPolicy; np == nil || !np.Enabled {
		return true, "", nil
	}
	c, err := k.Clients.Client(ctx, ip)
	if err != nil {
		return false, "", err
	}
	if !ingresspolicy.Admits(obj, c) {
		return false, fmt.Sprintf("the network policy of %s (spec.networkPolicy.from) does not let %s reach its pods", key, ip), nil
	}
	return true, "", nil
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
