/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AIInferenceSpec is the model server a user asks for, in the first (flat) design:
// the model is one URI, the GPU one product, the time limits whole seconds.
// +kubebuilder:validation:XValidation:rule="!has(self.s3Endpoint) || self.modelURI.startsWith('s3://')",message="s3Endpoint only applies to an s3:// modelURI; remove it or use an s3:// URI"
// +kubebuilder:validation:XValidation:rule="!has(self.credentialsSecret) || !self.modelURI.startsWith('pvc://')",message="credentialsSecret does not apply to a pvc:// modelURI (the volume needs no credentials); remove it"
// +kubebuilder:validation:XValidation:rule="!has(self.gpuProduct) || (has(self.gpus) && self.gpus > 0)",message="gpuProduct names the GPU to run on, which needs gpus of at least 1"
type AIInferenceSpec struct {
	// ModelName is the model's name, passed to the engine as the served model name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ModelName string `json:"modelName"`

	// ModelURI is where the weights are: s3://BUCKET/PREFIX, pvc://CLAIM/PATH, or an
	// http:// or https:// URL.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(s3|pvc)://[^/]+(/.*)?$') || (isURL(self) && (self.startsWith('http://') || self.startsWith('https://')))",message="modelURI must be s3://BUCKET/PREFIX, pvc://CLAIM/PATH or an http(s):// URL, e.g. s3://models/llama-3.1-8b/"
	ModelURI string `json:"modelURI"`

	// S3Endpoint is the URL of an S3-compatible store for an s3:// modelURI. Empty means AWS S3.
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	S3Endpoint string `json:"s3Endpoint,omitempty"`

	// CredentialsSecret names a Secret in the same namespace: for s3:// it holds
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, for http(s):// the bearer token under "token".
	// +kubebuilder:validation:MaxLength=253
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// ModelSize is the approximate size of the weights.
	// +optional
	ModelSize *resource.Quantity `json:"modelSize,omitempty"`

	// Engine is the model server: vLLM, TGI or Triton.
	Engine EngineType `json:"engine"`

	// EngineImage overrides the engine's default image.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	EngineImage string `json:"engineImage,omitempty"`

	// EngineArgs are added after the arguments the operator sets.
	// +kubebuilder:validation:MaxItems=128
	// +listType=atomic
	// +optional
	EngineArgs []string `json:"engineArgs,omitempty"`

	// GPUs is the number of GPUs per replica. 0 runs on CPU.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	// +optional
	GPUs int32 `json:"gpus,omitempty"`

	// GPUProduct is the one acceptable value of the nvidia.com/gpu.product node label
	// (e.g. NVIDIA-A100-SXM4-80GB). Empty accepts any GPU.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	GPUProduct string `json:"gpuProduct,omitempty"`

	// Replicas is the number of model server pods.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// LoadTimeoutSeconds is how long one attempt may take to load the model and warm
	// the engine up.
	// +kubebuilder:default=1800
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=86400
	// +optional
	LoadTimeoutSeconds *int32 `json:"loadTimeoutSeconds,omitempty"`

	// MaxRetries is how many times a failed load is retried.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxRetries *int32 `json:"maxRetries,omitempty"`

	// RetryBackoffSeconds is the wait before the first retry; it doubles for each further retry.
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	RetryBackoffSeconds *int32 `json:"retryBackoffSeconds,omitempty"`

	// Resources are the engine container's requests and limits besides GPUs.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// NodeSelector further restricts the nodes the pods may run on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations are added to the GPU toleration the operator always sets.
	// +listType=atomic
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// EngineType names a supported model server.
// +kubebuilder:validation:Enum=vLLM;TGI;Triton
type EngineType string

// AIInferenceStatus is what the operator observed.
type AIInferenceStatus struct {
	// ObservedGeneration is the generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase summarises the state: Pending, Loading, Ready or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`

	// Replicas is the number of pods that exist for this object.
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas is the number of pods whose engine is ready to serve.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// Selector is the label selector of the pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Conditions: Ready, Reconciling, Stalled, ModelLoaded and Available.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AIInference runs one model on a model server. This is the first design of the
// API, still served and converted to and from v1; write new manifests against v1.
// Names that no child could take are refused at creation, as in v1 (api/v1/names.go).
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name cannot be used: the model's Service takes this name, and a Service name is lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (no dots: write qwen2-5-7b for qwen2.5-7b)",optionalOldSelf=true
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || self.metadata.name.size() <= 63",message="metadata.name has more than 63 characters, which cannot fit: the model's Service and the label on every pod take this name",optionalOldSelf=true
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=aii,categories=ai
// Served only where the conversion webhook runs (config/webhook, the chart's
// webhook.enabled): without it a v1alpha1 object would be stored unconverted.
// +kubebuilder:unservedversion
// +kubebuilder:deprecatedversion:warning="serving.aiinference.io/v1alpha1 AIInference is deprecated; use serving.aiinference.io/v1 (see docs/api-versions.md)"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.modelName`
// +kubebuilder:printcolumn:name="Engine",type=string,JSONPath=`.spec.engine`
// +kubebuilder:printcolumn:name="GPU",type=string,JSONPath=`.spec.gpuProduct`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AIInference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AIInferenceSpec   `json:"spec"`
	Status AIInferenceStatus `json:"status,omitempty"`
}

// AIInferenceList is a list of AIInference.
// +kubebuilder:object:root=true
type AIInferenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AIInference `json:"items"`
}

func init() {
	SchemeBuilder.Register(&AIInference{}, &AIInferenceList{})
}
