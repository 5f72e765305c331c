package webhook_test

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
)

// invalidCase is an object admission must refuse, and what the refusal must say:
// the field, what is wrong and how to fix it.
type invalidCase struct {
	name string
	obj  client.Object
	want []string
	// schema: refused by the CRD's schema (CEL), not by the validating webhook.
	schema bool
}

func validV1(mutate func(*servingv1.AIInference)) *servingv1.AIInference {
	size := resource.MustParse("16Gi")
	obj := &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Name: "llama"},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name:   "llama-3.1-8b-instruct",
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "llama-3.1-8b/"}},
				Size:   &size,
			},
			Engine: servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:    servingv1.GPUSpec{Count: 1, Products: []string{"NVIDIA-L4"}},
		},
	}
	if mutate != nil {
		mutate(obj)
	}
	return obj
}

func validV1Alpha1(mutate func(*servingv1alpha1.AIInference)) *servingv1alpha1.AIInference {
	obj := &servingv1alpha1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Name: "llama"},
		Spec: servingv1alpha1.AIInferenceSpec{
			ModelName:  "llama-3.1-8b-instruct",
			ModelURI:   "s3://models/llama-3.1-8b/",
			Engine:     "vLLM",
			GPUs:       1,
			GPUProduct: "NVIDIA-L4",
		},
	}
	if mutate != nil {
		mutate(obj)
	}
	return obj
}

func withArgs(engine servingv1.EngineType, args ...string) *servingv1.AIInference {
	return validV1(func(o *servingv1.AIInference) { o.Spec.Engine.Type, o.Spec.Engine.Args = engine, args })
}

func withTolerations(ts ...corev1.Toleration) *servingv1.AIInference {
	return validV1(func(o *servingv1.AIInference) { o.Spec.Tolerations = ts })
}

var gpuToleration = corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

func withAdapters(mutate func(*servingv1.AIInference), names ...string) *servingv1.AIInference {
	return validV1(func(o *servingv1.AIInference) {
		for _, n := range names {
			o.Spec.Adapters = append(o.Spec.Adapters, servingv1.AdapterSpec{Name: n,
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "adapters", Prefix: n + "/"}}})
		}
		if mutate != nil {
			mutate(o)
		}
	})
}

// overNodes spreads the valid object's replicas over nodes of 8 H100s.
// onOllama is a valid object moved to engine.type Ollama on CPU, then mutated.
func onOllama(mutate func(*servingv1.AIInference)) *servingv1.AIInference {
	return validV1(func(o *servingv1.AIInference) {
		o.Spec.Engine.Type, o.Spec.GPU = servingv1.EngineOllama, servingv1.GPUSpec{}
		mutate(o)
	})
}

func overNodes(nodes int32, mutate func(*servingv1.AIInference)) *servingv1.AIInference {
	return validV1(func(o *servingv1.AIInference) {
		o.Spec.GPU = servingv1.GPUSpec{Count: 8, Products: []string{"NVIDIA-H100-80GB-HBM3"}, Nodes: nodes}
		if mutate != nil {
			mutate(o)
		}
	})
}

func invalidCases() []invalidCase {
	return []invalidCase{
		// v1: replicas that span nodes.
		{name: "nodes on TGI", schema: true, obj: overNodes(2, func(o *servingv1.AIInference) { o.Spec.Engine.Type = servingv1.EngineTGI }),
			want: []string{"gpu.nodes above 1", "only vLLM can serve", "use engine.type vLLM"}},
		{name: "nodes on CPU", schema: true, obj: overNodes(2, func(o *servingv1.AIInference) { o.Spec.GPU.Count, o.Spec.GPU.Products = 0, nil }),
			want: []string{"set gpu.count, the GPUs on each node, to at least 1"}},
		{name: "topologyKey on one node", schema: true, obj: overNodes(1, func(o *servingv1.AIInference) { o.Spec.GPU.TopologyKey = "example.com/rack" }),
			want: []string{"gpu.topologyKey", "needs gpu.nodes of 2 or more"}},
		{name: "topologyKey not a label key", schema: true, obj: overNodes(2, func(o *servingv1.AIInference) { o.Spec.GPU.TopologyKey = "a rack" }),
			want: []string{"spec.gpu.topologyKey"}},
		{name: "canary over nodes", schema: true, obj: overNodes(2, func(o *servingv1.AIInference) {
			o.Spec.Replicas = ptr.To[int32](2)
			o.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
				Replicas: 1, Steps: []servingv1.CanaryStep{{Weight: 10, Pause: &servingv1.PauseStep{}}}}}
		}), want: []string{"Canary is not available for replicas that span nodes", "use the Rolling strategy"}},
		{name: "adapters over nodes", schema: true, obj: withAdapters(func(o *servingv1.AIInference) {
			o.Spec.GPU = servingv1.GPUSpec{Count: 8, Products: []string{"NVIDIA-H100-80GB-HBM3"}, Nodes: 2}
		}, "sql"), want: []string{"spec.adapters is not available for replicas that span nodes"}},
		{name: "16 H100s on one node", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.GPU = servingv1.GPUSpec{Count: 16, Products: []string{"NVIDIA-H100-80GB-HBM3"}}
		}), want: []string{"spec.gpu.count", "no node of NVIDIA-H100-80GB-HBM3 holds 16 GPUs (at most 8 each)", "set spec.gpu.count to 8 and spec.gpu.nodes to 2"}},
		{name: "12 H100s per node", obj: overNodes(2, func(o *servingv1.AIInference) { o.Spec.GPU.Count = 12 }),
			want: []string{"holds 12 GPUs", "set spec.gpu.count to 8 and spec.gpu.nodes to 3"}},
		{name: "vLLM --pipeline-parallel-size", obj: withArgs(servingv1.EngineVLLM, "--pipeline-parallel-size", "2"),
			want: []string{`"--pipeline-parallel-size" is set by the operator`, "set spec.gpu.nodes"}},
		// v1: LoRA adapters.
		{name: "adapter named twice", schema: true, obj: withAdapters(nil, "sql", "chat", "sql"),
			want: []string{"spec.adapters", "names an adapter twice", "give each adapter its own name"}},
		{name: "adapter named after the model", schema: true, obj: withAdapters(nil, "llama-3.1-8b-instruct"),
			want: []string{"after the base model", "give the adapter another name"}},
		{name: "adapters on Triton", schema: true, obj: withAdapters(func(o *servingv1.AIInference) { o.Spec.Engine.Type = servingv1.EngineTriton }, "sql"),
			want: []string{"Triton cannot serve LoRA adapters", "engine.type vLLM", "TGI"}},
		{name: "adapter with another Secret", obj: withAdapters(func(o *servingv1.AIInference) {
			o.Spec.Adapters[0].Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "other"}
		}, "sql"),
			want: []string{"spec.adapters[0].source", "may only name the model's credentials Secret", "or none"}},
		{name: "adapter on another claim", schema: true, obj: withAdapters(func(o *servingv1.AIInference) {
			o.Spec.Adapters[0].Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "adapters"}}
		}, "sql"),
			want: []string{"must be on the model's claim", "spec.model.source.pvc.claimName"}},
		{name: "adapter name with a slash", schema: true, obj: withAdapters(nil, "team/sql"),
			want: []string{"adapters[].name must be letters, digits"}},
		{name: "more adapters than --max-loras", obj: withAdapters(func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-loras", "2"} }, "a", "b", "c"),
			want: []string{"spec.adapters", "lists 3 adapters", "--max-loras 2", "raise --max-loras to at least 3"}},
		{name: "more adapters than --max-cpu-loras", obj: withAdapters(func(o *servingv1.AIInference) {
			o.Spec.Engine.Args = []string{"--max-loras=4", "--max-cpu-loras=2"}
		}, "a", "b", "c"),
			want: []string{"--max-cpu-loras 2", "the adapters vLLM holds at once"}},
		// v1: engine arguments the operator sets.
		{name: "vLLM --port", obj: withArgs(servingv1.EngineVLLM, "--port=9000"),
			want: []string{"spec.engine.args[0]", `"--port" is set by the operator for vLLM`, "set spec.engine.port instead"}},
		{name: "vLLM --model", obj: withArgs(servingv1.EngineVLLM, "--max-model-len", "8192", "--model", "/data/llama"),
			want: []string{"spec.engine.args[2]", `"--model" is set by the operator`, "spec.model.source", "remove the argument"}},
		{name: "vLLM --tensor-parallel-size", obj: withArgs(servingv1.EngineVLLM, "--tensor-parallel-size", "4"),
			want: []string{"spec.engine.args[0]", "shards the model over spec.gpu.count GPUs", "set spec.gpu.count"}},
		{name: "vLLM -tp", obj: withArgs(servingv1.EngineVLLM, "-tp=2"),
			want: []string{`"-tp" is set by the operator`, "set spec.gpu.count"}},
		{name: "vLLM --served-model-name", obj: withArgs(servingv1.EngineVLLM, "--served-model-name", "llama"),
			want: []string{`"--served-model-name"`, "set spec.model.name instead"}},
		{name: "TGI --num-shard", obj: withArgs(servingv1.EngineTGI, "--num-shard", "2"),
			want: []string{`"--num-shard" is set by the operator for TGI`, "set spec.gpu.count"}},
		{name: "TGI --model-id", obj: withArgs(servingv1.EngineTGI, "--model-id=meta-llama/Llama-3.1-8B"),
			want: []string{`"--model-id"`, "spec.model.source"}},
		{name: "TGI -p", obj: withArgs(servingv1.EngineTGI, "-p", "80"),
			want: []string{`"-p" is set by the operator for TGI`, "spec.engine.port"}},
		{name: "TGI --hostname", obj: withArgs(servingv1.EngineTGI, "--hostname", "127.0.0.1"),
			want: []string{`"--hostname" is set by the operator for TGI`, "listen on every address of the pod"}},
		{name: "TGI port 9000 is its Prometheus port", obj: validV1(func(o *servingv1.AIInference) { o.Spec.Engine.Type, o.Spec.Engine.Port = servingv1.EngineTGI, 9000 }),
			want: []string{"spec.engine.port", "TGI opens port 9000 itself", "choose another port"}},
		{name: "Triton port 8001 is its gRPC port", obj: validV1(func(o *servingv1.AIInference) { o.Spec.Engine.Type, o.Spec.Engine.Port = servingv1.EngineTriton, 8001 }),
			want: []string{"spec.engine.port", "Triton opens port 8001 itself", "e.g. the default 8000"}},
		{name: "Triton --http-port", obj: withArgs(servingv1.EngineTriton, "--http-port=8001"),
			want: []string{`"--http-port" is set by the operator for Triton`, "spec.engine.port"}},
		{name: "Triton --model-repository", obj: withArgs(servingv1.EngineTriton, "--model-repository=/models"),
			want: []string{`"--model-repository"`, "spec.model.source"}},

		// v1: environment and GPUs the operator and the device plugin own.
		{name: "env NVIDIA_VISIBLE_DEVICES", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Engine.Env = []corev1.EnvVar{{Name: "HF_HOME", Value: "/tmp"}, {Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		}), want: []string{"spec.engine.env[1].name", "NVIDIA_VISIBLE_DEVICES must not be set", "remove it"}},
		{name: "env CUDA_VISIBLE_DEVICES", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Engine.Env = []corev1.EnvVar{{Name: "CUDA_VISIBLE_DEVICES", Value: "0,1"}}
		}), want: []string{"spec.engine.env[0].name", "CUDA_VISIBLE_DEVICES", "set gpu.count instead"}},
		{name: "GPU limit in resources", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}
		}), want: []string{"spec.resources.limits[nvidia.com/gpu]", "remove nvidia.com/gpu and set spec.gpu.count"}},
		{name: "GPU request in resources", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}), want: []string{"spec.resources.requests[nvidia.com/gpu]", "set spec.gpu.count"}},
		{name: "request above limit", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
			o.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
		}), want: []string{"spec.resources.requests[cpu]", "above the limit 2", "lower the request or raise the limit"}},

		// v1: scheduling.
		{name: "node selector on the GPU product", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": "NVIDIA-L4"}
		}), want: []string{"spec.nodeSelector[nvidia.com/gpu.product]", "move the product there", "spec.gpu.products"}},
		{name: "node selector key", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.NodeSelector = map[string]string{"pool name": "gpu"}
		}), want: []string{"spec.nodeSelector[pool name]", "not a valid label key"}},
		{name: "node selector value", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.NodeSelector = map[string]string{"pool": "gpu pool!"}
		}), want: []string{"spec.nodeSelector[pool]", "not a valid label value"}},
		{name: "duplicated toleration", obj: withTolerations(gpuToleration, corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpExists}, gpuToleration),
			want: []string{"spec.tolerations[2]", "same toleration as spec.tolerations[0]", "remove one of them"}},
		{name: "toleration Exists with a value", obj: withTolerations(corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpExists, Value: "true"}),
			want: []string{"spec.tolerations[0].value", "operator Exists matches any value", "remove the value or use operator Equal"}},
		{name: "tolerationSeconds without NoExecute", obj: withTolerations(corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](60)}),
			want: []string{"spec.tolerations[0].tolerationSeconds", "only applies to effect NoExecute"}},
		{name: "toleration effect", obj: withTolerations(corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpExists, Effect: "Sometimes"}),
			want: []string{"spec.tolerations[0].effect", `Unsupported value: "Sometimes"`, `"NoSchedule"`}},
		{name: "toleration without key nor Exists", obj: withTolerations(corev1.Toleration{Operator: corev1.TolerationOpEqual, Value: "x"}),
			want: []string{"spec.tolerations[0].operator", "without a key", "set operator: Exists or a key"}},

		// v1: names of other objects.
		{name: "S3 credentials Secret name", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "S3_Creds"}
		}), want: []string{"spec.model.source.s3.credentialsSecretRef.name", "not a valid Secret name", "lowercase"}},
		{name: "HTTP token Secret name", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Model.Source = servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "https://models.example.test/llama.gguf",
				BearerTokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "Token"}, Key: "token"}}}
		}), want: []string{"spec.model.source.http.bearerTokenSecretRef.name", "not a valid Secret name"}},
		{name: "service account name", obj: validV1(func(o *servingv1.AIInference) { o.Spec.ServiceAccountName = "Model_Runner" }),
			want: []string{"spec.serviceAccountName", "not a valid ServiceAccount name"}},
		{name: "image pull Secret name", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}, {Name: "Registry Creds"}}
		}), want: []string{"spec.imagePullSecrets[1].name", "not a valid Secret name"}},

		// v1: the cache must hold the model; pod labels must not take the operator's.
		{name: "cache smaller than the model", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk, SizeLimit: ptr.To(resource.MustParse("8Gi"))}
		}), want: []string{"spec.cache.sizeLimit", "smaller than the model (spec.model.size is 16Gi)", "raise it to at least 16Gi"}},
		{name: "cache claim smaller than the model", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{Size: ptr.To(resource.MustParse("10Gi"))}}
		}), want: []string{"spec.cache.pvc.size", "ask for at least 16Gi"}},
		{name: "pod label the operator selects by", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.PodMetadata = &servingv1.PodMetadata{Labels: map[string]string{"app.kubernetes.io/instance": "mine"}}
		}), want: []string{"spec.podMetadata.labels[app.kubernetes.io/instance]", "selects its pods by", "use another key"}},
		{name: "pod label value", obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.PodMetadata = &servingv1.PodMetadata{Labels: map[string]string{"team": "ml infra"}}
		}), want: []string{"spec.podMetadata.labels[team]", "not a valid label value"}},

		// v1alpha1: the same rules, named as v1alpha1 names the fields.
		{name: "v1alpha1 engineArgs --port", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.EngineArgs = []string{"--port", "9000"} }),
			want: []string{"spec.engineArgs[0]", `"--port" is set by the operator for vLLM`, "the operator uses the engine's default port; remove it"}},
		{name: "v1alpha1 TGI --num-shard", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) {
			o.Spec.Engine, o.Spec.EngineArgs = "TGI", []string{"--num-shard=2"}
		}), want: []string{"spec.engineArgs[0]", "set spec.gpus and remove the argument"}},
		{name: "v1alpha1 S3 bucket in the URI", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.ModelURI = "s3://My_Models/llama/" }),
			want: []string{"spec.modelURI", "S3 bucket name must be 3 to 63 lower-case letters", "e.g. s3://models/llama-3.1-8b/"}},
		{name: "v1alpha1 PVC path leaving the volume", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.ModelURI = "pvc://weights/models/../../etc" }),
			want: []string{"spec.modelURI", "must not contain '..'"}},
		{name: "v1alpha1 PVC claim name", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.ModelURI = "pvc://Weights/llama" }),
			want: []string{"spec.modelURI", "not a valid PersistentVolumeClaim name"}},
		{name: "v1alpha1 credentials Secret name", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.CredentialsSecret = "s3.creds_" }),
			want: []string{"spec.credentialsSecret", "not a valid Secret name"}},
		{name: "v1alpha1 S3 endpoint", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.S3Endpoint = "minio.storage:9000" }),
			want: []string{"spec.s3Endpoint", "must be an http:// or https:// URL, e.g. http://minio.storage:9000"}},
		{name: "v1alpha1 node selector on the GPU product", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) {
			o.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": "NVIDIA-L4"}
		}), want: []string{"spec.nodeSelector[nvidia.com/gpu.product]", "from spec.gpuProduct"}},
		{name: "v1alpha1 GPU limit in resources", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) {
			o.Spec.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}), want: []string{"spec.resources.limits[nvidia.com/gpu]", "set spec.gpus"}},
		{name: "v1alpha1 duplicated toleration", obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) {
			o.Spec.Tolerations = []corev1.Toleration{gpuToleration, gpuToleration}
		}), want: []string{"spec.tolerations[1]", "same toleration as spec.tolerations[0]"}},

		// v1: engine.type Ollama, on CPU.
		{name: "Ollama on GPUs", schema: true, obj: onOllama(func(o *servingv1.AIInference) { o.Spec.GPU.Count = 1 }),
			want: []string{"engine.type Ollama runs llama.cpp on CPU", "set gpu.count to 0", "spec.resources"}},
		{name: "adapters on Ollama", schema: true, obj: withAdapters(func(o *servingv1.AIInference) {
			o.Spec.Engine.Type, o.Spec.GPU = servingv1.EngineOllama, servingv1.GPUSpec{}
		}, "sql"),
			want: []string{"Ollama cannot load LoRA adapters", "remove spec.adapters", "engine.type vLLM"}},
		{name: "autoscaling Ollama", schema: true, obj: onOllama(func(o *servingv1.AIInference) {
			o.Spec.Autoscaling = &servingv1.AutoscalingSpec{MaxReplicas: 3}
		}), want: []string{"Ollama exports none", "remove spec.autoscaling"}},
		{name: "Ollama arguments", schema: true, obj: onOllama(func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--verbose"} }),
			want: []string{"Ollama's server takes no arguments", "engine.ollama", "engine.env"}},
		{name: "engine.ollama on vLLM", schema: true, obj: validV1(func(o *servingv1.AIInference) {
			o.Spec.Engine.Ollama = &servingv1.OllamaSpec{Parallel: 2}
		}), want: []string{"engine.ollama configures Ollama only"}},
		{name: "Ollama name with a space", obj: onOllama(func(o *servingv1.AIInference) { o.Spec.Model.Name = "tiny chat" }),
			want: []string{"spec.model.name", "not a name Ollama accepts", "[[host/]namespace/]model[:tag]"}},
		{name: "Ollama with 100 slots", schema: true, obj: onOllama(func(o *servingv1.AIInference) {
			o.Spec.Engine.Ollama = &servingv1.OllamaSpec{Parallel: 100}
		}), want: []string{"spec.engine.ollama.parallel", "less than or equal to 64"}},

		// v1alpha1: refused by the CRD schema before any webhook.
		{name: "v1alpha1 URI scheme", schema: true, obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.ModelURI = "ftp://models/llama" }),
			want: []string{"spec.modelURI", "modelURI must be s3://BUCKET/PREFIX, pvc://CLAIM/PATH or an http(s):// URL"}},
		{name: "v1alpha1 GPU product without GPUs", schema: true, obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.GPUs = 0 }),
			want: []string{"gpuProduct names the GPU to run on, which needs gpus of at least 1"}},
		{name: "v1alpha1 credentials for a PVC", schema: true, obj: validV1Alpha1(func(o *servingv1alpha1.AIInference) {
			o.Spec.ModelURI, o.Spec.CredentialsSecret = "pvc://weights/llama", "creds"
		}), want: []string{"credentialsSecret does not apply to a pvc:// modelURI", "remove it"}},
	}
}
