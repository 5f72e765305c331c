package manager

import (
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
)

func TestParseMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"536870912\n", 512 << 20, true},    // v2 and v1: bytes
		{"max\n", 0, false},                 // v2: none
		{"9223372036854771712\n", 0, false}, // v1: none (2^63 rounded down to a page)
		{"", 0, false},
		{"garbage", 0, false},
	} {
		got, ok := parseMemoryLimit(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("parseMemoryLimit(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestStripForCache(t *testing.T) {
	fields := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Name: "chat", ManagedFields: fields, Annotations: map[string]string{
		lastAppliedAnnotation:                `{"apiVersion":"serving.aiinference.io/v1","kind":"AIInference"}`,
		"serving.aiinference.io/requestedAt": "2026-12-03T08:00:00Z",
	}}}
	got, err := stripForCache(obj)
	if err != nil {
		t.Fatal(err)
	}
	o := got.(*servingv1.AIInference)
	if o.ManagedFields != nil {
		t.Errorf("managedFields kept: %v", o.ManagedFields)
	}
	if _, ok := o.Annotations[lastAppliedAnnotation]; ok {
		t.Errorf("kubectl's last applied configuration kept")
	}
	if o.Annotations["serving.aiinference.io/requestedAt"] == "" {
		t.Errorf("another annotation dropped: %v", o.Annotations)
	}

	// An object without annotations gets none.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "chat-loader", ManagedFields: fields}}
	if got, err = stripForCache(cm); err != nil || got.(*corev1.ConfigMap).Annotations != nil || got.(*corev1.ConfigMap).ManagedFields != nil {
		t.Errorf("stripForCache(ConfigMap) = %+v, %v", got, err)
	}

	// A Deployment keeps its template's metadata and loses its pod spec.
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "chat"}, Spec: appsv1.DeploymentSpec{
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"serving.aiinference.io/template-hash": "abc"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}}}}}
	got, err = stripForCache(d)
	if kept := got.(*appsv1.Deployment).Spec.Template; err != nil || len(kept.Spec.Containers) != 0 || kept.Annotations["serving.aiinference.io/template-hash"] != "abc" {
		t.Errorf("stripForCache(Deployment) template = %+v, %v", kept, err)
	}
}

func TestModelSliceOnly(t *testing.T) {
	endpoint := discoveryv1.Endpoint{Addresses: []string{"10.0.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		NodeName: ptr.To("gpu-0"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "team", Name: "chat-7d9f-abcde"}}
	labels := map[string]string{discoveryv1.LabelServiceName: "chat-stable", servingv1.LabelInference: "chat",
		servingv1.LabelManagedBy: servingv1.ManagedByValue, "app.kubernetes.io/name": "aiinference",
		discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	kubeMade := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "chat-stable-x1", GenerateName: "chat-stable-",
		Labels: labels, Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-06T21:00:00Z"},
		OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "chat-stable"}}},
		Endpoints: []discoveryv1.Endpoint{endpoint}, Ports: []discoveryv1.EndpointPort{{Port: ptr.To[int32](8000)}}}
	got, err := modelSliceOnly(kubeMade)
	if err != nil {
		t.Fatal(err)
	}
	slice := got.(*discoveryv1.EndpointSlice)
	want := []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}
	if !reflect.DeepEqual(slice.Endpoints, want) || slice.Annotations != nil || slice.OwnerReferences != nil || slice.Ports != nil || len(slice.Labels) != 3 ||
		slice.Labels[discoveryv1.LabelServiceName] != "chat-stable" || slice.Labels[servingv1.LabelInference] != "chat" {
		t.Errorf("a Kubernetes-made slice kept %+v", slice)
	}

	// The operator's own slices keep their spec hash and ports.
	own := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "chat-activator",
		Labels:      map[string]string{discoveryv1.LabelManagedBy: servingv1.ManagedByValue, discoveryv1.LabelServiceName: "chat"},
		Annotations: map[string]string{servingv1.AnnotationSpecHash: "abc"}},
		Endpoints: []discoveryv1.Endpoint{endpoint}, Ports: []discoveryv1.EndpointPort{{Port: ptr.To[int32](8095)}}}
	got, _ = modelSliceOnly(own.DeepCopy())
	if !reflect.DeepEqual(got, own) {
		t.Errorf("the operator's slice changed: %+v", got)
	}
}
