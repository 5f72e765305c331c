/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AIInferenceSpec is the model server a user asks for.
// +kubebuilder:validation:XValidation:rule="!has(self.rollout) || !has(self.rollout.canary) || self.replicas - self.rollout.canary.replicas + (has(self.rollout.canary.maxSurge) ? self.rollout.canary.maxSurge : 1) >= 1",message="a canary must leave at least one stable replica serving: replicas - rollout.canary.replicas + rollout.canary.maxSurge must be at least 1; raise replicas or maxSurge, or lower rollout.canary.replicas"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'TGI' || !has(self.rollout) || !has(self.rollout.canary) || self.rollout.canary.steps.all(s, !has(s.analysis) || s.analysis.checks.all(c, !has(c.metric) || c.metric != 'TimeToFirstToken'))",message="TGI exports no time-to-first-token metric: use metric EndToEndLatency or InterTokenLatency, or a query over tgi_request_queue_duration and tgi_batch_inference_duration, instead of TimeToFirstToken"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Triton' || !has(self.rollout) || !has(self.rollout.canary) || self.rollout.canary.steps.all(s, !has(s.analysis) || s.analysis.checks.all(c, !has(c.metric) || c.metric != 'InterTokenLatency'))",message="Triton exports no inter-token latency metric: use metric TimeToFirstToken or EndToEndLatency, or a query over your backend's own metrics, instead of InterTokenLatency"
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || self.cache.type != 'Memory' || !has(self.model.size) || quantity(string(self.model.size)).compareTo(quantity('64Gi')) <= 0",message="cache.type Memory keeps the weights in RAM and is only for models up to 64Gi; use cache.type Disk or PVC for a model of this size"
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || self.cache.type != 'Node' || !has(self.model.source.pvc)",message="cache.type Node keeps a copy of a downloaded model on each node; a model.source.pvc is read in place and has nothing to copy: use cache.type Disk, or an s3, http, huggingface or oci source"
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || !has(self.model.source.oci) || !has(self.model.source.oci.mode) || self.model.source.oci.mode != 'ImageVolume'",message="model.source.oci.mode ImageVolume mounts the artifact from the node's container runtime, which keeps its own copy: no loader runs and spec.cache has nothing to hold; remove spec.cache, or set oci.mode Loader to load into the cache"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || !has(self.rollout) || self.rollout.strategy != 'Canary'",message="autoscaling and rollout.strategy Canary cannot be combined yet: the canary's share is sized from a fixed replica count; use the Rolling strategy with autoscaling, or remove autoscaling"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || self.engine.type == 'vLLM' || !has(self.autoscaling.targets.kvCacheUtilization)",message="autoscaling.targets.kvCacheUtilization needs vLLM's vllm:kv_cache_usage_perc; TGI and Triton export no KV-cache utilisation: use queueDepth (or runningRequests with TGI)"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || self.engine.type != 'Triton' || !has(self.autoscaling.targets.runningRequests)",message="autoscaling.targets.runningRequests: Triton exports no gauge of running requests: use queueDepth (nv_inference_pending_request_count)"
// +kubebuilder:validation:XValidation:rule="!has(self.adapters) || self.adapters.all(a, a.name != self.model.name)",message="spec.adapters names an adapter after the base model (spec.model.name): requests choose between them by name, so give the adapter another name"
// +kubebuilder:validation:XValidation:rule="!has(self.adapters) || self.adapters.all(a, !has(a.source.pvc) || (has(self.model.source.pvc) && a.source.pvc.claimName == self.model.source.pvc.claimName))",message="an adapter's pvc source must be on the model's claim (spec.model.source.pvc.claimName), the one volume of sources the pods mount; put the adapter on that claim, or in an s3 or http source"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Triton' || !has(self.adapters) || size(self.adapters) == 0",message="Triton cannot serve LoRA adapters at run time (its vLLM backend reads them only from its model repository): remove spec.adapters, or serve the model with engine.type vLLM (adapters loaded without restart) or TGI (adapters at start)"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || self.engine.type != 'Triton' || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas >= 1",message="autoscaling.minReplicas 0 needs to know when the model is idle, and Triton exports no gauge of running requests: set minReplicas to 1 or more for Triton"
// +kubebuilder:validation:XValidation:rule="!has(self.gpu) || !has(self.gpu.nodes) || self.gpu.nodes <= 1 || self.engine.type == 'vLLM'",message="gpu.nodes above 1 spreads one replica over several nodes, which only vLLM can serve (its pipeline parallelism over Ray); TGI and Triton serve a model from one node: use engine.type vLLM, or gpu.nodes 1 with a GPU product that holds the model on one node"
// +kubebuilder:validation:XValidation:rule="!has(self.gpu) || !has(self.gpu.nodes) || self.gpu.nodes <= 1 || !has(self.rollout) || self.rollout.strategy != 'Canary'",message="rollout.strategy Canary is not available for replicas that span nodes (gpu.nodes above 1) yet: use the Rolling strategy, which replaces whole groups one at a time"
// +kubebuilder:validation:XValidation:rule="!has(self.gpu) || !has(self.gpu.nodes) || self.gpu.nodes <= 1 || !has(self.adapters) || size(self.adapters) == 0",message="spec.adapters is not available for replicas that span nodes (gpu.nodes above 1) yet: the adapter agent loads into one engine process, not a group; remove spec.adapters or serve the model on one node"
// +kubebuilder:validation:XValidation:rule="!has(self.routing) || !self.routing.enabled || self.engine.type != 'Triton'",message="routing.enabled needs an OpenAI API (the router reads the model and the prompt from /v1/completions and /v1/chat/completions bodies), which Triton does not serve: use vLLM or TGI, or leave routing off"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Ollama' || !has(self.gpu) || !has(self.gpu.count) || self.gpu.count == 0",message="engine.type Ollama runs llama.cpp on CPU (its image is built without GPU support, and it does not shard a model over GPUs): set gpu.count to 0 and give the pods CPU and memory in spec.resources"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Ollama' || !has(self.adapters) || size(self.adapters) == 0",message="Ollama cannot load LoRA adapters at run time (it takes an adapter only into a model built with it): remove spec.adapters, or serve the model with engine.type vLLM"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Ollama' || !has(self.autoscaling)",message="autoscaling reads the engine's load from its /metrics, and Ollama exports none: remove spec.autoscaling and set spec.replicas"
// +kubebuilder:validation:XValidation:rule="self.engine.type != 'Ollama' || !has(self.rollout) || !has(self.rollout.canary) || self.rollout.canary.steps.all(s, !has(s.analysis))",message="canary analysis reads the engine's metrics, and Ollama exports none: remove rollout.canary.steps[].analysis (the steps still shift traffic and wait their pause)"
type AIInferenceSpec struct {
	// Model says which model to serve and where its weights are.
	Model ModelSpec `json:"model"`

	// Engine is the model server that runs the model.
	Engine EngineSpec `json:"engine"`

	// GPU is how many GPUs each replica gets and which GPU products are acceptable.
	// +optional
	GPU GPUSpec `json:"gpu,omitempty"`

	// Replicas is the number of model server pods.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Cache is where the weights live inside the pod. When unset, the operator picks an
	// in-memory emptyDir for small models (model.size up to 2Gi) and a disk emptyDir otherwise.
	// +optional
	Cache *CacheSpec `json:"cache,omitempty"`

	// Loading bounds how long loading may take and how often a failed load is retried.
	// +optional
	Loading LoadingSpec `json:"loading,omitempty"`

	// Resources are the engine container's requests and limits besides GPUs
	// (the GPU limit comes from gpu.count).
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// NodeSelector further restricts the nodes the pods may run on.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations are added to the GPU toleration the operator always sets.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// ServiceAccountName is the service account the pods run as.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// PodMetadata are labels and annotations added to the pods (e.g. for a service
	// mesh or cost reporting). The operator's own selector labels take precedence.
	// +optional
	PodMetadata *PodMetadata `json:"podMetadata,omitempty"`

	// ImagePullSecrets are used to pull the engine and loader images.
	// +optional
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// Rollout says how a change of the spec reaches the replicas: Rolling (the
	// default) or Canary.
	// +optional
	Rollout *RolloutSpec `json:"rollout,omitempty"`

	// Autoscaling lets the operator set the replica count from the engine's
	// load signals, between its minReplicas and maxReplicas; spec.replicas is
	// then only the count to start from.
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`

	// Adapters are LoRA adapters served on top of the base model, each under
	// its own name. vLLM loads and unloads them in the running replicas
	// without a restart; TGI takes them at start, so a change of adapters is a
	// rolling update. Triton cannot serve them.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, b.name == a.name))",message="spec.adapters names an adapter twice: give each adapter its own name, which is what requests ask for"
	// +listType=atomic
	// +optional
	Adapters []AdapterSpec `json:"adapters,omitempty"`

	// NetworkPolicy, when enabled, limits who may call the model's engine and
	// where its pods may connect: DNS and the model's store, for the loader.
	// +optional
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// Routing, when enabled, sends the model's requests through the
	// operator's router, which picks the replica by prompt prefix and load
	// instead of round robin. Off by default (see routing.enabled).
	// +optional
	Routing *RoutingSpec `json:"routing,omitempty"`
}

// PodMetadata are extra labels and annotations for the pods.
type PodMetadata struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ModelSpec names the model and its single source.
type ModelSpec struct {
	// Name is the model's name, shown in `kubectl get` and passed to the engine as the
	// served model name (e.g. "llama-3.1-8b-instruct").
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Revision is an optional version label for display (e.g. a commit or "v2").
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Revision string `json:"revision,omitempty"`

	// Source is where the weights are downloaded from. Exactly one of its fields is set.
	Source ModelSource `json:"source"`

	// Size is the approximate size of the weights. It sizes the cache and picks its
	// medium when cache is unset.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// SHA256Manifest optionally names a file in the source, in `sha256sum` format,
	// that every downloaded file is checked against.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	SHA256Manifest string `json:"sha256Manifest,omitempty"`
}

// ModelSource is exactly one place to fetch the weights from.
// +kubebuilder:validation:XValidation:rule="(has(self.s3) ? 1 : 0) + (has(self.pvc) ? 1 : 0) + (has(self.http) ? 1 : 0) + (has(self.huggingface) ? 1 : 0) + (has(self.oci) ? 1 : 0) == 1",message="model.source must set exactly one of s3, pvc, http, huggingface or oci"
type ModelSource struct {
	// S3 is an S3 bucket and key prefix (AWS S3, MinIO or any S3-compatible store).
	// +optional
	S3 *S3Source `json:"s3,omitempty"`

	// PVC is a path inside an existing PersistentVolumeClaim that holds the weights.
	// +optional
	PVC *PVCSource `json:"pvc,omitempty"`

	// HTTP is a URL the weights are downloaded from.
	// +optional
	HTTP *HTTPSource `json:"http,omitempty"`

	// HuggingFace is a model repository on the Hugging Face Hub.
	// +optional
	HuggingFace *HuggingFaceSource `json:"huggingface,omitempty"`

	// OCI is a model stored as an OCI artifact or image in a registry.
	// +optional
	OCI *OCISource `json:"oci,omitempty"`
}

// S3Source is a prefix in an S3-compatible bucket.
type S3Source struct {
	// Bucket is the bucket name.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9][a-z0-9.-]*[a-z0-9]$')",message="s3.bucket must be a valid bucket name: lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit"
	Bucket string `json:"bucket"`

	// Prefix is the key prefix under which the model's files are (e.g. "models/llama-3.1-8b/").
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Prefix string `json:"prefix,omitempty"`

	// Endpoint is the URL of an S3-compatible store such as MinIO. Empty means AWS S3.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="s3.endpoint must be an http:// or https:// URL, e.g. http://minio.storage:9000"
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// Region is the bucket's region.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Region string `json:"region,omitempty"`

	// PathStyle selects path-style addressing, which most S3-compatible stores need.
	// +optional
	PathStyle bool `json:"pathStyle,omitempty"`

	// CredentialsSecretRef names a Secret in the same namespace holding the access key.
	// Without it the loader uses the standard AWS credential chain (e.g. IRSA).
	// +optional
	CredentialsSecretRef *S3CredentialsSecretRef `json:"credentialsSecretRef,omitempty"`
}

// S3CredentialsSecretRef names a Secret and the keys in it that hold S3 credentials.
type S3CredentialsSecretRef struct {
	// Name is the Secret's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// AccessKeyIDKey is the Secret key holding the access key ID.
	// +kubebuilder:default=AWS_ACCESS_KEY_ID
	// +optional
	AccessKeyIDKey string `json:"accessKeyIDKey,omitempty"`

	// SecretAccessKeyKey is the Secret key holding the secret access key.
	// +kubebuilder:default=AWS_SECRET_ACCESS_KEY
	// +optional
	SecretAccessKeyKey string `json:"secretAccessKeyKey,omitempty"`
}

// PVCSource is a folder inside an existing PersistentVolumeClaim.
type PVCSource struct {
	// ClaimName is the PersistentVolumeClaim's name, in the same namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClaimName string `json:"claimName"`

	// Path is the folder inside the volume that holds the model, relative to its root.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.split('/').exists(p, p == '..')",message="pvc.path must be relative to the volume root and must not contain '..', e.g. models/llama-3.1-8b"
	// +optional
	Path string `json:"path,omitempty"`
}

// HTTPSource is a URL to download the model from.
type HTTPSource struct {
	// URL is the http:// or https:// address of the model file.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="http.url must be an http:// or https:// URL"
	URL string `json:"url"`

	// BearerTokenSecretRef optionally names a Secret key whose value is sent as a
	// bearer token.
	// +optional
	BearerTokenSecretRef *corev1.SecretKeySelector `json:"bearerTokenSecretRef,omitempty"`
}

// EngineType names a supported model server.
// +kubebuilder:validation:Enum=vLLM;TGI;Triton;Ollama
type EngineType string

// Supported engines.
const (
	EngineVLLM   EngineType = "vLLM"
	EngineTGI    EngineType = "TGI"
	EngineTriton EngineType = "Triton"
	// EngineOllama is Ollama (llama.cpp) on CPU, serving one GGUF file.
	EngineOllama EngineType = "Ollama"
)

// EngineSpec is the model server and how it is started.
// +kubebuilder:validation:XValidation:rule="self.type != 'Triton' || !has(self.warmup) || !has(self.warmup.enabled) || !self.warmup.enabled",message="engine.warmup is not available for Triton, which serves no completions API; warm the models with model_warmup in their config.pbtxt, which Triton's readiness waits for, and remove engine.warmup.enabled"
// +kubebuilder:validation:XValidation:rule="!has(self.port) || self.port != 8099",message="engine.port 8099 is the warm-up gate's readiness port in the pod; choose another port"
// +kubebuilder:validation:XValidation:rule="!has(self.ollama) || self.type == 'Ollama'",message="engine.ollama configures Ollama only: remove it, or set engine.type Ollama"
// +kubebuilder:validation:XValidation:rule="self.type != 'Ollama' || !has(self.args) || size(self.args) == 0",message="Ollama's server takes no arguments: set its parallel slots and context in engine.ollama, and other OLLAMA_* settings in engine.env; remove engine.args"
type EngineSpec struct {
	// Type is the model server: vLLM, TGI, Triton, or Ollama (llama.cpp on
	// CPU, serving one GGUF file).
	Type EngineType `json:"type"`

	// Ollama configures engine.type Ollama.
	// +optional
	Ollama *OllamaSpec `json:"ollama,omitempty"`

	// Image overrides the engine's default image.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.contains(' ')",message="engine.image must be an image reference without spaces, e.g. vllm/vllm-openai:v0.11.0"
	// +optional
	Image string `json:"image,omitempty"`

	// Args are added after the arguments the operator sets (model path, port, parallelism).
	// +kubebuilder:validation:MaxItems=128
	// +listType=atomic
	// +optional
	Args []string `json:"args,omitempty"`

	// Env is added to the engine container's environment.
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Port is the HTTP port the engine listens on. Defaults to the engine's usual port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// SecurityContext replaces the engine container's security context. By default the
	// engine runs as a non-root user (UID 65532) with every capability dropped, no
	// privilege escalation and the RuntimeDefault seccomp profile, which passes the
	// Pod Security "restricted" profile; HOME and the caches point at a writable
	// volume. Set this only for an image that cannot run so (for example one that
	// must run as root): pods that do not meet "restricted" are refused in
	// namespaces that enforce it.
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`

	// Warmup is the warm-up gate: a replica counts as ready (and receives Service
	// traffic) only once the engine has answered one real completion of at most
	// one token for the served model, which its health endpoint alone does not
	// prove. A small sidecar container (warmup) sends it to the engine inside the
	// pod, retrying with back-off while the engine starts, for up to
	// loading.timeout; then it exits with a message the status reports
	// (WarmupFailed) and the kubelet runs it again. Once a completion succeeds it
	// sends nothing more. On by default for vLLM (POST /v1/completions) and TGI
	// (POST /generate); Triton has no completions API and warms its models itself
	// (model_warmup in config.pbtxt).
	// +optional
	Warmup *WarmupSpec `json:"warmup,omitempty"`
}

// OllamaSpec is how Ollama serves the model.
type OllamaSpec struct {
	// Parallel is how many requests a replica runs at once
	// (OLLAMA_NUM_PARALLEL): its slots, which share the compute and each
	// keep the KV cache of its last prompt, so a prompt that shares a prefix
	// with it skips that prefix's prefill. The router holds requests beyond
	// it in its fair queues. Defaults to 4.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Parallel int32 `json:"parallel,omitempty"`

	// ContextLength is each slot's context in tokens, prompt and answer
	// (OLLAMA_CONTEXT_LENGTH); the KV cache holds parallel times this.
	// Defaults to 4096.
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=131072
	// +optional
	ContextLength int32 `json:"contextLength,omitempty"`
}

// Ollama defaults.
const (
	DefaultOllamaParallel      = 4
	DefaultOllamaContextLength = 4096
)

// OllamaSettings is spec.engine.ollama with its defaults.
func (e EngineSpec) OllamaSettings() OllamaSpec {
	var s OllamaSpec
	if e.Ollama != nil {
		s = *e.Ollama
	}
	if s.Parallel == 0 {
		s.Parallel = DefaultOllamaParallel
	}
	if s.ContextLength == 0 {
		s.ContextLength = DefaultOllamaContextLength
	}
	return s
}

// WarmupSpec configures the warm-up gate.
type WarmupSpec struct {
	// Enabled turns the gate on or off. Defaults to true for vLLM and TGI; it
	// cannot be turned on for Triton.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// Prompt is the text of the warm-up completion. Defaults to "Hello".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Prompt string `json:"prompt,omitempty"`
}

// GPUSpec is the GPUs of one replica.
// +kubebuilder:validation:XValidation:rule="self.count > 0 || !has(self.products) || size(self.products) == 0",message="gpu.products lists acceptable GPU products, which needs gpu.count of at least 1"
// +kubebuilder:validation:XValidation:rule="!has(self.nodes) || self.nodes <= 1 || (has(self.count) && self.count >= 1)",message="gpu.nodes spreads one replica over several nodes' GPUs: set gpu.count, the GPUs on each node, to at least 1"
// +kubebuilder:validation:XValidation:rule="!has(self.topologyKey) || (has(self.nodes) && self.nodes > 1)",message="gpu.topologyKey holds the nodes of one replica in one domain, which needs gpu.nodes of 2 or more; remove gpu.topologyKey or raise gpu.nodes"
type GPUSpec struct {
	// Count is the number of GPUs per replica, or with Nodes above 1 the GPUs
	// on each of its nodes; the engine's tensor parallelism follows it. 0 runs
	// on CPU.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	// +optional
	Count int32 `json:"count,omitempty"`

	// Products are the acceptable values of the nvidia.com/gpu.product node label, most
	// preferred first (e.g. NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB). Empty accepts any GPU.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Products []string `json:"products,omitempty"`

	// Nodes is how many nodes one replica spans, each with Count GPUs, for a
	// model too big for one node: the replica runs as a group of pods (a
	// LeaderWorkerSet group, which needs the LeaderWorkerSet controller), one
	// per node, started, restarted and replaced as one; the engine splits the
	// model's layers over the nodes (vLLM's pipeline parallelism) and each
	// node's share over its GPUs (tensor parallelism). Only vLLM spans nodes.
	// 1 (the default) is one pod per replica.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Nodes int32 `json:"nodes,omitempty"`

	// TopologyKey holds every node of one replica within one domain of this
	// node label (a rack, a block, an NVLink domain: e.g.
	// topology.kubernetes.io/zone or a label of your own); the pods of a
	// replica that spans domains talk over the slowest links. Only with Nodes
	// of 2 or more.
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +optional
	TopologyKey string `json:"topologyKey,omitempty"`
}

// CacheType is where the weights are kept in the pod.
// +kubebuilder:validation:Enum=Memory;Disk;PVC;Node
type CacheType string

// Cache types.
const (
	// CacheMemory is an in-memory emptyDir: fastest, counts against memory, only for small models.
	CacheMemory CacheType = "Memory"
	// CacheDisk is an emptyDir on the node's disk.
	CacheDisk CacheType = "Disk"
	// CachePVC is a PersistentVolumeClaim, which survives pod restarts.
	CachePVC CacheType = "PVC"
	// CacheNode is the node's model cache (installed with the chart's
	// modelCache values): the pods of a model on one node share one copy on the
	// node's disk, downloaded once and kept, verified, after the pods are gone,
	// within the node's budget. Scheduling prefers nodes that hold a copy.
	CacheNode CacheType = "Node"
)

// CacheSpec is where the weights are kept in the pod.
// +kubebuilder:validation:XValidation:rule="self.type == 'PVC' ? has(self.pvc) : !has(self.pvc)",message="cache.pvc is required when cache.type is PVC and not allowed otherwise"
type CacheSpec struct {
	// Type is Memory, Disk or PVC.
	Type CacheType `json:"type"`

	// SizeLimit bounds an emptyDir cache. Defaults to the model size plus headroom.
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`

	// PVC is the claim for cache type PVC: an existing claim, or a size (and storage
	// class) for the operator to create one.
	// +optional
	PVC *CachePVCSpec `json:"pvc,omitempty"`
}

// CachePVCSpec is an existing claim, or the size of one for the operator to create.
// +kubebuilder:validation:XValidation:rule="has(self.claimName) != has(self.size)",message="cache.pvc must set either claimName (an existing claim) or size (a claim the operator creates), not both"
type CachePVCSpec struct {
	// ClaimName is an existing PersistentVolumeClaim to use.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ClaimName string `json:"claimName,omitempty"`

	// Size of the claim the operator creates.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName of the claim the operator creates. Empty means the cluster default.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// AccessModes of the claim the operator creates. Defaults to ReadWriteOnce.
	// +listType=atomic
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
}

// LoadingSpec bounds model loading.
type LoadingSpec struct {
	// Timeout bounds each stage of one attempt: the download (the loader stops
	// itself when it runs out), and then the engine's warm-up until its health
	// endpoint answers (the startup probe's budget) and, with engine.warmup, until
	// it has answered its first completion. A replica may so take up to twice
	// this long to become ready; the Deployment's progress deadline allows for
	// both.
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="loading.timeout must be a duration between 10s and 24h, e.g. 30m"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// MaxRetries is how many failed loads are retried before loads stop. Every failed
	// attempt counts, whether the kubelet restarted the loader in place or the pod
	// was replaced; a change of the pod template, a retry request (the annotation
	// serving.aiinference.io/requestedAt) or ten minutes of Ready give a fresh budget.
	// A scale change does not.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxRetries *int32 `json:"maxRetries,omitempty"`

	// Backoff is the wait before the first retry; it doubles for each further retry,
	// up to ten minutes.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="loading.backoff must be a duration between 1s and 1h, e.g. 30s"
	// +optional
	Backoff *metav1.Duration `json:"backoff,omitempty"`
}

// Phase is a one-word summary of where the AIInference is.
// +kubebuilder:validation:Enum=Pending;Loading;Ready;Degraded;Failed;Canary
type Phase string

// Phases.
const (
	// PhasePending: no replica is scheduled yet, or a reference is missing.
	PhasePending Phase = "Pending"
	// PhaseLoading: pods are downloading the model or the engine is warming up.
	PhaseLoading Phase = "Loading"
	// PhaseReady: the desired number of replicas serve traffic.
	PhaseReady Phase = "Ready"
	// PhaseDegraded: replicas serve, but the object cannot reach its spec: the other
	// replicas' loads failed permanently or beyond the retry bound (until a person
	// acts), or a write to the API server fails (retried with back-off).
	PhaseDegraded Phase = "Degraded"
	// PhaseFailed: loading failed permanently or beyond the retry bound, and no
	// replica serves.
	PhaseFailed Phase = "Failed"
	// PhaseCanary: a canary of the current spec takes its share of the traffic
	// (rollout.strategy Canary) while the stable replicas serve the rest.
	PhaseCanary Phase = "Canary"
)

// AnnotationRequestedAt asks the operator to reconcile now, as Flux's
// reconcile.fluxcd.io/requestedAt does: set it to a new value (for example
// `date +%s`). When loads had stopped (Failed or Degraded), the request also
// grants a fresh retry budget and replaces the pods whose loads failed.
const AnnotationRequestedAt = "serving.aiinference.io/requestedAt"

// AIInferenceStatus is what the operator observed.
type AIInferenceStatus struct {
	// ObservedGeneration is the generation this status was computed for; -1
	// until the operator has seen the object, so that kstatus, Flux and Argo
	// CD read a new object as in progress, as Flux's own kinds do.
	// +kubebuilder:default=-1
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase summarises the state of the current spec: Pending, Loading, Ready,
	// Degraded, Failed, or Canary while a canary of it takes a share of the
	// traffic. During a rollout it describes the new replicas, while the
	// Available condition says whether earlier ones still serve.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Replicas is the number of pods that exist for this object.
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas is the number of pods whose engine is ready to serve, whichever
	// spec they run.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// UpdatedReplicas is the number of pods that run the current spec.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// Ready is ready/desired replicas, for display.
	// +optional
	Ready string `json:"ready,omitempty"`

	// Reason is the Ready condition's reason, as a flat field for tools that
	// read scalars only (Open Cluster Management's status feedback).
	// +optional
	Reason string `json:"reason,omitempty"`

	// Endpoint is the in-cluster URL of the model's Service, e.g.
	// http://llm.ml.svc:8000.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// ServingRevision is the revision (pod template hash) of the spec that the
	// ready replicas serve: the current spec once one of its replicas serves,
	// the stable one during a canary rollout.
	// +optional
	ServingRevision string `json:"servingRevision,omitempty"`

	// GPU describes the GPUs in use, for display (e.g. "2x NVIDIA-A100-SXM4-80GB").
	// +optional
	GPU string `json:"gpu,omitempty"`

	// Selector is the label selector of the pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// ModelLoaded is true once at least one replica has the complete, verified model.
	// +optional
	ModelLoaded bool `json:"modelLoaded"`

	// LoadRetries is how many failed loads were counted against loading.maxRetries
	// in the current budget (see loading.maxRetries for what refills it).
	// +optional
	LoadRetries int32 `json:"loadRetries"`

	// LoadBudget is the operator's record of what LoadRetries counted.
	// +optional
	LoadBudget *LoadBudget `json:"loadBudget,omitempty"`

	// LastHandledRequestedAt is the last value of the serving.aiinference.io/requestedAt
	// annotation the operator acted on.
	// +optional
	LastHandledRequestedAt string `json:"lastHandledRequestedAt,omitempty"`

	// LastLoad is the loader's report of the last successful load.
	// +optional
	LastLoad *LoadReport `json:"lastLoad,omitempty"`

	// LastFailure is the last failure observed on a replica of the current spec: a
	// failed load, or a pod that cannot be scheduled, cannot start or crash-loops.
	// It stays after the replica recovers, as a record.
	// +optional
	LastFailure *LoadFailure `json:"lastFailure,omitempty"`

	// Rollout is the state of a canary rollout (rollout.strategy Canary).
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`

	// Autoscaling is the autoscaler's view (spec.autoscaling).
	// +optional
	Autoscaling *AutoscalingStatus `json:"autoscaling,omitempty"`

	// Source is what the model's source resolved to: the Hugging Face commit,
	// the OCI digest, and how an OCI model reaches the pods.
	// +optional
	Source *SourceStatus `json:"source,omitempty"`

	// ModelCache is where the nodes' model cache holds copies of the model
	// (cache.type Node). Left out when the operator cannot read the nodes'
	// reports (--watch-namespaces).
	// +optional
	ModelCache *ModelCacheStatus `json:"modelCache,omitempty"`

	// Adapters is each adapter of spec.adapters: the replicas that serve it
	// and its last failure.
	// +listType=map
	// +listMapKey=name
	// +optional
	Adapters []AdapterStatus `json:"adapters,omitempty"`

	// Conditions: Ready (always), Reconciling and Stalled (kstatus, only when True),
	// ModelLoaded and Available, and AdaptersReady with spec.adapters.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LoadReport is the model loader's summary of a load.
type LoadReport struct {
	// Pod that did the load.
	Pod   string `json:"pod"`
	Files int    `json:"files"`
	// Bytes is the model's size; BytesFetched what the load downloaded (0 on a cache hit).
	Bytes        int64 `json:"bytes"`
	BytesFetched int64 `json:"bytesFetched"`
	// Duration is how long the load took.
	Duration metav1.Duration `json:"duration"`
	// Throughput is the download rate, e.g. "812.4 MB/s".
	Throughput string `json:"throughput,omitempty"`
	// Verified is true when every file was checked against the store's checksum.
	Verified bool `json:"verified"`
	// Checks counts the files by how they were verified: crc64nvme, crc32c, crc32,
	// sha256, sha1 (a store checksum or the sha256 manifest), md5 (an ETag),
	// multipartETag, or size (nothing more was known).
	// +optional
	Checks   map[string]int32 `json:"checks,omitempty"`
	CacheHit bool             `json:"cacheHit,omitempty"`
}

// LoadBudget records the failed loads counted against loading.maxRetries.
type LoadBudget struct {
	// Epoch names the budget: the pod template and the last retry request. A new
	// epoch starts a new budget.
	Epoch string `json:"epoch"`
	// CountedByPod is how many failed loader runs of each existing pod are counted,
	// so that a restart in place is counted once.
	// +optional
	CountedByPod map[string]int32 `json:"countedByPod,omitempty"`
	// Halted is the reason loads stopped in this epoch (LoadFailed or
	// RetriesExhausted); empty while loads may go on.
	// +optional
	Halted string `json:"halted,omitempty"`
}

// LoadFailure is a failure of a replica: a failed load, or a pod that cannot run.
type LoadFailure struct {
	// Reason is a stable PascalCase word, e.g. ChecksumMismatch or Unschedulable.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Pod whose load failed.
	Pod string `json:"pod,omitempty"`
	// ExitCode of the loader, when it ran.
	ExitCode int32 `json:"exitCode,omitempty"`
	// Retryable tells whether another attempt may succeed.
	Retryable bool `json:"retryable"`
	// Retried is true when another attempt follows this failure.
	// +optional
	Retried bool `json:"retried,omitempty"`
	// Time the failure was observed.
	Time metav1.Time `json:"time"`
}

// AIInference runs one model on a model server, with its weights pre-loaded into
// each pod, and reports whether it is ready to serve.
// Names that no child could take are refused at creation (names never change, so
// the rules skip updates: an object admitted before them still gets its status).
// api/v1/names.go's NameProblem says the same, and a test keeps the two in step.
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name cannot be used: the model's Service takes this name, and a Service name is lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (no dots: write qwen2-5-7b for qwen2.5-7b)",optionalOldSelf=true
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || self.metadata.name.size() <= 63",message="metadata.name has more than 63 characters, which cannot fit: the model's Service and the label on every pod take this name",optionalOldSelf=true
// +kubebuilder:validation:XValidation:rule="!has(self.spec.gpu) || !has(self.spec.gpu.nodes) || self.spec.gpu.nodes <= 1 || self.metadata.name.size() <= 41",message="metadata.name has more than 41 characters, too many for gpu.nodes above 1: the LeaderWorkerSet <name>-group and its StatefulSets <name>-group-<replica> take this name; use a shorter name"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.rollout) || !has(self.spec.rollout.canary) || !has(self.spec.rollout.canary.traffic) || self.metadata.name.size() <= 56 || (oldSelf.hasValue() && has(oldSelf.value().spec.rollout) && has(oldSelf.value().spec.rollout.canary) && has(oldSelf.value().spec.rollout.canary.traffic))",message="metadata.name has more than 56 characters, too many for rollout.canary.traffic: the Services <name>-stable and <name>-canary take this name; use the replica-count split (no traffic) or a shorter name",optionalOldSelf=true
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=aii,categories=ai
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model.name`
// +kubebuilder:printcolumn:name="Engine",type=string,JSONPath=`.spec.engine.type`
// +kubebuilder:printcolumn:name="GPU",type=string,JSONPath=`.status.gpu`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AIInference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AIInferenceSpec `json:"spec"`
	// +kubebuilder:default={"observedGeneration":-1}
	Status AIInferenceStatus `json:"status,omitempty"`

	// UnreadableSpec is set by UnmarshalJSON when the spec could not be read
	// (see DecodeError); never stored. Exported for equality.Semantic.
	UnreadableSpec string `json:"-"`
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
