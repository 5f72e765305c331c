package testutil

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// S3SecretName is the Secret of S3 credentials that Inference names.
const S3SecretName = "s3-creds"

// S3Secret is a Secret of S3 credentials (an access key ID and a secret key).
func S3Secret(ns, name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"},
	}
}

// Inference is an AIInference of one replica that serves llama-3.1-8b (16Gi)
// with vLLM on gpus GPUs of the products given, loading it from an S3 bucket
// with the credentials in the Secret S3SecretName.
func Inference(ns, name string, gpus int32, products ...string) *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name: "llama-3.1-8b",
				Size: ptr.To(resource.MustParse("16Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{
					Bucket: "models", Prefix: "llama-3.1-8b/", Endpoint: "http://minio.storage:9000", PathStyle: true,
					CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: S3SecretName},
				}},
			},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: gpus, Products: products},
			Replicas: ptr.To[int32](1),
		},
	}
}
