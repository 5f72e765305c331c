package integration

import (
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

func s3Adapter(name string) servingv1.AdapterSpec {
	return servingv1.AdapterSpec{Name: name, Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "adapters", Prefix: name + "/"}}}
}

// adapterSetOf is the adapter set in the object's loader ConfigMap.
func adapterSetOf(g Gomega, key client.ObjectKey) loadspec.AdapterSet {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-loader"}, cm)).To(Succeed())
	var set loadspec.AdapterSet
	g.Expect(json.Unmarshal([]byte(cm.Data[loadspec.AdaptersFileName]), &set)).To(Succeed())
	return set
}

// On vLLM the adapters are the agent's set in the loader ConfigMap: adding
// one changes the set and not the pod template; AdaptersReady says where they
// stand, and names a serving replica whose agent cannot be reached.
func TestAdaptersChangeTheSetNotThePods(t *testing.T) {
	t.Parallel()
	g, _, key := startInference(t, "adapters", func(o *servingv1.AIInference) {
		o.Spec.Adapters = []servingv1.AdapterSpec{s3Adapter("sql-lora")}
	})
	d := getDeployment(g, key)
	hash := d.Spec.Template.Annotations[servingv1.AnnotationTemplateHash]
	var agent *corev1.Container
	for i, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == servingv1.AdapterAgentContainerName {
			agent = &d.Spec.Template.Spec.InitContainers[i]
		}
	}
	g.Expect(agent).NotTo(BeNil(), "the pods run the adapter agent")
	g.Expect(adapterSetOf(g, key).Adapters).To(HaveLen(1))
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		c := condition(obj, servingv1.ConditionAdaptersReady)
		g.Expect(c.Reason).To(Equal(servingv1.ReasonAdaptersLoading))
		g.Expect(c.ObservedGeneration).To(Equal(obj.Generation))
		g.Expect(obj.Status.Adapters).To(HaveLen(1))
	})

	updateInference(g, key, func(o *servingv1.AIInference) {
		o.Spec.Adapters = append(o.Spec.Adapters, s3Adapter("chat-lora"))
	})
	g.Eventually(func(g Gomega) {
		g.Expect(adapterSetOf(g, key).Adapters).To(HaveLen(2))
	}).WithTimeout(waitTimeout).Should(Succeed())
	g.Expect(getDeployment(g, key).Spec.Template.Annotations[servingv1.AnnotationTemplateHash]).To(Equal(hash), "an added adapter must roll no pod")

	// A serving replica whose agent does not answer (nothing listens on the
	// agent's port at the pod's IP, 127.0.0.1).
	obj := &servingv1.AIInference{}
	g.Expect(k8s.Get(context.Background(), key, obj)).To(Succeed())
	pod := servingPod(t, g, obj, "adapters-0")
	setPodStatus(g, pod, func(s *corev1.PodStatus) {
		s.PodIP, s.PodIPs = "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}}
		s.InitContainerStatuses = append(s.InitContainerStatuses, corev1.ContainerStatus{Name: servingv1.AdapterAgentContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
	})
	setDeploymentStatus(g, key, 1, 1) // as the Deployment controller would
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		c := condition(obj, servingv1.ConditionAdaptersReady)
		g.Expect(c.Reason).To(Equal(servingv1.ReasonAdaptersUnreachable), c.Message)
		g.Expect(c.Message).To(ContainSubstring("adapters-0"))
		g.Expect(condition(obj, servingv1.ConditionAvailable).Status).To(Equal(metav1.ConditionTrue), "the base model serves")
	})

	// Without adapters the condition and status.adapters go.
	updateInference(g, key, func(o *servingv1.AIInference) { o.Spec.Adapters = nil })
	eventually(t, g, key, 2*waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.Adapters).To(BeNil())
		g.Expect(condition(obj, servingv1.ConditionAdaptersReady).Type).To(BeEmpty())
	})
}
