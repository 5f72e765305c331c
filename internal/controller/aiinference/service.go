package aiinference

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
)

// desiredService routes to the engine port of ready pods only: endpoints of pods
// whose readiness probe fails are left out, so the probe is the traffic gate.
func desiredService(obj *servingv1.AIInference, eng engine.Engine) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: childMeta(obj, obj.Name),
		Spec: corev1.ServiceSpec{
			Selector: servingSelector(obj),
			Ports: []corev1.ServicePort{{
				Name:       "http",
				Port:       enginePort(obj, eng),
				TargetPort: intstr.FromString("http"),
				Protocol:   corev1.ProtocolTCP,
			}},
			PublishNotReadyAddresses: false,
		},
	}
}

func (r *Reconciler) reconcileService(ctx context.Context, s *scope) error {
	svc := desiredService(s.obj, s.engine)
	if s.routed() {
		// Its EndpointSlice <name>-router leads to the router instead.
		svc.Spec.Selector = nil
	}
	res, err := r.apply(ctx, s, svc, &corev1.Service{})
	if err != nil || res == applyConflict {
		return err
	}
	s.mu.Lock()
	s.obs.endpoint = fmt.Sprintf("http://%s.%s.svc:%d", svc.Name, svc.Namespace, svc.Spec.Ports[0].Port)
	s.mu.Unlock()
	return nil
}
