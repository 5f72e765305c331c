package aiinference

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/test/testutil"
)

// TestMissingSecretIsToldByTheKubelet: the operator reads no Secret; a pod of
// the current spec whose loader the kubelet cannot configure says a credentials
// Secret or key is missing, in the kubelet's own words (makeEnvironmentVariables
// of k8s.io/kubernetes v1.37.2, pkg/kubelet/kubelet_pods.go, and its Secret
// manager's NotFound error). The status names the spec's field, as when the
// operator read the Secret itself; any other configuration error is a
// PodStartFailed.
func TestMissingSecretIsToldByTheKubelet(t *testing.T) {
	const (
		s3NotFound = `Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef does not exist in namespace ml; create it with the keys [AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY]`
		s3NoSecret = `Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef has no key "AWS_SECRET_ACCESS_KEY"; add it, or name the key that holds it`
	)
	s3 := func(o *servingv1.AIInference) {
		o.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "s3-creds"}
	}
	tests := []struct {
		name    string
		spec    func(*servingv1.AIInference)
		message string // the kubelet's, on the loader waiting with CreateContainerConfigError
		earlier bool   // the pod is of an earlier spec
		reason  string
		ready   string // the Ready condition's message; empty: not checked
	}{
		{name: "Secret not found", spec: s3, message: `secret "s3-creds" not found`,
			reason: servingv1.ReasonSecretNotFound, ready: s3NotFound},
		{name: "Secret not found, read from the API server", spec: s3, message: `secrets "s3-creds" not found`,
			reason: servingv1.ReasonSecretNotFound, ready: s3NotFound},
		{name: "key missing", spec: s3, message: "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ml/s3-creds",
			reason: servingv1.ReasonSecretKeyMissing, ready: s3NoSecret},
		{
			name: "a key the spec names missing",
			spec: func(o *servingv1.AIInference) {
				o.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "s3-creds", AccessKeyIDKey: "id", SecretAccessKeyKey: "secret"}
			},
			message: "couldn't find key id in Secret ml/s3-creds",
			reason:  servingv1.ReasonSecretKeyMissing,
			ready:   `Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef has no key "id"; add it, or name the key that holds it`,
		},
		{
			name: "a bearer token's Secret not found",
			spec: func(o *servingv1.AIInference) {
				o.Spec.Model.Source = servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "https://models.example/llama/",
					BearerTokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}
			},
			message: `secret "hf" not found`,
			reason:  servingv1.ReasonSecretNotFound,
			ready:   `Secret "hf" named in spec.model.source.http.bearerTokenSecretRef does not exist in namespace ml; create it with the keys [token]`,
		},
		{
			name: "a bearer token's key missing",
			spec: func(o *servingv1.AIInference) {
				o.Spec.Model.Source = servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "https://models.example/llama/",
					BearerTokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}
			},
			message: "couldn't find key token in Secret ml/hf",
			reason:  servingv1.ReasonSecretKeyMissing,
			ready:   `Secret "hf" named in spec.model.source.http.bearerTokenSecretRef has no key "token"; add it, or name the key that holds it`,
		},
		// Not the spec's credentials: the kubelet's words are passed on as they are.
		{name: "another Secret (engine.env) not found", spec: s3, message: `secret "engine-env" not found`, reason: servingv1.ReasonPodStartFailed},
		{name: "a key of another Secret whose name begins alike", spec: s3, message: "couldn't find key AWS_SECRET_ACCESS_KEY in Secret ml/s3-creds-old", reason: servingv1.ReasonPodStartFailed},
		{name: "a key the spec does not name", spec: s3, message: "couldn't find key HF_TOKEN in Secret ml/s3-creds", reason: servingv1.ReasonPodStartFailed},
		{name: "a ConfigMap not found", spec: s3, message: `configmap "chat-loader" not found`, reason: servingv1.ReasonPodStartFailed},
		{name: "no credentials in the spec", message: `secret "s3-creds" not found`, reason: servingv1.ReasonPodStartFailed},
		{name: "a pod of an earlier spec", spec: s3, message: `secret "s3-creds" not found`, earlier: true, reason: servingv1.ReasonProgressing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			if tt.spec != nil {
				tt.spec(obj)
			}
			hash := "current"
			if tt.earlier {
				hash = "earlier"
			}
			pod := corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "chat-7d9f-x", Annotations: map[string]string{servingv1.AnnotationTemplateHash: hash}},
				Spec:       corev1.PodSpec{NodeName: "node-1"},
				Status: corev1.PodStatus{
					InitContainerStatuses: []corev1.ContainerStatus{
						{Name: servingv1.LoaderContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: tt.message}}},
						{Name: servingv1.WarmupContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}},
					},
					ContainerStatuses: []corev1.ContainerStatus{
						{Name: servingv1.EngineContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}},
					},
				},
			}
			d := deploymentWith(1, 0, 1)
			d.Spec.Template.Annotations = map[string]string{servingv1.AnnotationTemplateHash: "current"}
			obs := observation{deployment: d, podsSeen: true, pods: observePods([]corev1.Pod{pod}, "current")}

			st := computeStatus(obj, obs, loadAssessment{}, now)
			obj.Status = st
			g.Expect(testutil.KstatusViolations(obj)).To(BeEmpty())
			ready := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
			g.Expect(ready.Reason).To(Equal(tt.reason), ready.Message)
			stalled := meta.FindStatusCondition(st.Conditions, servingv1.ConditionStalled)
			switch tt.reason {
			case servingv1.ReasonSecretNotFound, servingv1.ReasonSecretKeyMissing:
				g.Expect(ready.Message).To(Equal(tt.ready))
				g.Expect(st.Phase).To(Equal(servingv1.PhasePending), "the loader cannot start")
				g.Expect(stalled).NotTo(BeNil(), "a person must act: Stalled")
				g.Expect(stalled.Reason).To(Equal(tt.reason))
				g.Expect(reasons.Explain(tt.reason).Warning).To(BeTrue(), "a Warning event")
			case servingv1.ReasonPodStartFailed:
				g.Expect(ready.Message).To(ContainSubstring("container model-loader: CreateContainerConfigError: " + tt.message))
				g.Expect(stalled).To(BeNil())
			}
		})
	}
}
