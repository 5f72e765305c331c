package aiinference

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Options are the operator-wide settings that shape children.
type Options struct {
	// LoaderImage is the model loader's image.
	LoaderImage string
	// PrometheusURL is the Prometheus that canary analyses query, unless an
	// object names its own.
	PrometheusURL string
	// AutoscaleInterval is how often the autoscaler reads the signals; 0:
	// DefaultAutoscaleInterval.
	AutoscaleInterval time.Duration
	// OperatorNamespace is where the operator's pods run, which the models'
	// NetworkPolicies let in; "" when it runs outside the cluster.
	OperatorNamespace string
	// ImageVolumes tells that the cluster serves image volumes (Kubernetes
	// v1.35 and later): an oci source in mode Auto is then mounted as one.
	ImageVolumes bool
}

// selectorLabels select the pods of one AIInference.
func selectorLabels(obj *servingv1.AIInference) map[string]string {
	return map[string]string{
		servingv1.LabelName:      "aiinference",
		servingv1.LabelInstance:  obj.Name,
		servingv1.LabelInference: obj.Name,
	}
}

// childLabels go on every child: the selector labels plus the managed-by mark.
func childLabels(obj *servingv1.AIInference) map[string]string {
	labels := selectorLabels(obj)
	labels[servingv1.LabelManagedBy] = servingv1.ManagedByValue
	return labels
}

func childMeta(obj *servingv1.AIInference, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: obj.Namespace, Labels: childLabels(obj)}
}

// Child names are deterministic so a restarted operator finds what it made.
func configMapName(obj *servingv1.AIInference) string { return obj.Name + "-loader" }

func canaryName(obj *servingv1.AIInference) string { return obj.Name + "-canary" }

func canaryConfigMapName(obj *servingv1.AIInference) string {
	return obj.Name + "-canary-loader"
}

func cachePVCName(obj *servingv1.AIInference) string { return obj.Name + "-model-cache" }

// hashOf is a short, stable hash of values encoded as JSON.
func hashOf(values ...any) string {
	h := sha256.New()
	for _, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			// Only plain API structs are hashed; they always encode.
			panic(fmt.Sprintf("hashing %T: %v", v, err))
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
