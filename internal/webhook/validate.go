package webhook

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/ollamastore"
)

// Validation of what the CRD's schema and CEL rules cannot express: knowledge of
// the engines' command lines, of what the operator and the GPU device plugin set
// themselves, and of Kubernetes' own rules for names, labels and tolerations that
// would otherwise only fail later, when the operator creates the pods.
//
// Both versions are checked by the same code on the v1 form of the object; paths
// says where each field is in the version the user wrote, so every message names
// the field as the user knows it.

// paths locates the fields in one served version.
type paths struct {
	version                                  string
	modelName, modelSize                     *field.Path
	s3Bucket, s3Endpoint, s3Secret           *field.Path
	pvcClaim, pvcPath, httpURL, httpSecret   *field.Path
	engineType, engineArgs, engineEnv        *field.Path
	enginePort                               *field.Path
	portHint, sourceHint                     string
	gpuCount, gpuProducts                    *field.Path
	resources, nodeSelector, tolerations     *field.Path
	cacheSizeLimit, cachePVCSize, cacheClaim *field.Path
	serviceAccountName, imagePullSecrets     *field.Path
	podLabels, podAnnotations                *field.Path
}

var spec = field.NewPath("spec")

var v1Paths = paths{
	version:            "v1",
	modelName:          spec.Child("model", "name"),
	modelSize:          spec.Child("model", "size"),
	s3Bucket:           spec.Child("model", "source", "s3", "bucket"),
	s3Endpoint:         spec.Child("model", "source", "s3", "endpoint"),
	s3Secret:           spec.Child("model", "source", "s3", "credentialsSecretRef", "name"),
	pvcClaim:           spec.Child("model", "source", "pvc", "claimName"),
	pvcPath:            spec.Child("model", "source", "pvc", "path"),
	httpURL:            spec.Child("model", "source", "http", "url"),
	httpSecret:         spec.Child("model", "source", "http", "bearerTokenSecretRef", "name"),
	engineType:         spec.Child("engine", "type"),
	engineArgs:         spec.Child("engine", "args"),
	engineEnv:          spec.Child("engine", "env"),
	enginePort:         spec.Child("engine", "port"),
	portHint:           "set spec.engine.port instead",
	sourceHint:         "choose the model with spec.model.source",
	gpuCount:           spec.Child("gpu", "count"),
	gpuProducts:        spec.Child("gpu", "products"),
	resources:          spec.Child("resources"),
	nodeSelector:       spec.Child("nodeSelector"),
	tolerations:        spec.Child("tolerations"),
	cacheSizeLimit:     spec.Child("cache", "sizeLimit"),
	cachePVCSize:       spec.Child("cache", "pvc", "size"),
	cacheClaim:         spec.Child("cache", "pvc", "claimName"),
	serviceAccountName: spec.Child("serviceAccountName"),
	imagePullSecrets:   spec.Child("imagePullSecrets"),
	podLabels:          spec.Child("podMetadata", "labels"),
	podAnnotations:     spec.Child("podMetadata", "annotations"),
}

// v1alpha1Paths: the fields v1alpha1 cannot express keep their v1 path (they can
// only come from v1, through the conversion annotation).
var v1alpha1Paths = func() paths {
	p := v1Paths
	p.version = "v1alpha1"
	uri := spec.Child("modelURI")
	p.modelName = spec.Child("modelName")
	p.modelSize = spec.Child("modelSize")
	p.s3Bucket, p.pvcClaim, p.pvcPath, p.httpURL = uri, uri, uri, uri
	p.s3Endpoint = spec.Child("s3Endpoint")
	p.s3Secret, p.httpSecret = spec.Child("credentialsSecret"), spec.Child("credentialsSecret")
	p.engineType = spec.Child("engine")
	p.engineArgs = spec.Child("engineArgs")
	p.portHint = "the operator uses the engine's default port; remove it"
	p.sourceHint = "choose the model with spec.modelURI"
	p.gpuCount = spec.Child("gpus")
	p.gpuProducts = spec.Child("gpuProduct")
	return p
}()

// ownedFlag is an engine argument the operator sets itself, and what to do instead.
type ownedFlag struct {
	flag string
	fix  func(p paths) string
}

// ownedFlags are the arguments each engine gets from the operator, with the
// aliases the engines accept for them. A test checks this list covers every flag
// the engine package emits.
var ownedFlags = map[servingv1.EngineType][]ownedFlag{
	servingv1.EngineVLLM: {
		{"--model", sourceFix},
		{"--served-model-name", func(p paths) string { return "set " + p.modelName.String() + " instead" }},
		{"--port", func(p paths) string { return p.portHint }},
		{"--tensor-parallel-size", tensorParallelFix},
		{"-tp", tensorParallelFix},
		{"--pipeline-parallel-size", pipelineParallelFix},
		{"-pp", pipelineParallelFix},
		{"--distributed-executor-backend", pipelineParallelFix},
	},
	servingv1.EngineTGI: {
		{"--model-id", sourceFix},
		{"--hostname", func(paths) string {
			return "the operator makes the engine listen on every address of the pod, which its probes, its Service and the warm-up gate need; remove the argument"
		}},
		{"--port", func(p paths) string { return p.portHint }},
		{"-p", func(p paths) string { return p.portHint }},
		{"--num-shard", tensorParallelFix},
	},
	servingv1.EngineTriton: {
		{"--model-repository", sourceFix},
		{"--model-store", sourceFix},
		{"--http-port", func(p paths) string { return p.portHint }},
	},
}

func sourceFix(p paths) string {
	return "the operator points the engine at the downloaded model; " + p.sourceHint + " and remove the argument"
}

func tensorParallelFix(p paths) string {
	return "the operator shards the model over " + p.gpuCount.String() + " GPUs; set " + p.gpuCount.String() + " and remove the argument"
}

func pipelineParallelFix(paths) string {
	return "the operator spreads a replica over spec.gpu.nodes nodes in pipeline parallel over Ray; set spec.gpu.nodes and remove the argument"
}

// gpusPerNode is the most GPUs one node of a product holds, for the products
// sold as a board of a fixed size (an HGX or DGX board, a GB200 tray); the
// others go in servers of many sizes and are not checked.
var gpusPerNode = map[string]int32{
	"NVIDIA-H100-80GB-HBM3": 8, "NVIDIA-H200": 8, "NVIDIA-B200": 8, "NVIDIA-GB200": 4,
	"NVIDIA-A100-SXM4-40GB": 16, "NVIDIA-A100-SXM4-80GB": 16, "Tesla-V100-SXM2-16GB": 16, "Tesla-V100-SXM2-32GB": 16,
}

// validateShape refuses a replica whose GPUs on one node no accepted product
// can hold, saying how to spread it over nodes instead.
func validateShape(gpu servingv1.GPUSpec, p paths) field.ErrorList {
	if gpu.Count == 0 || len(gpu.Products) == 0 {
		return nil
	}
	most := int32(0)
	for _, product := range gpu.Products {
		n, ok := gpusPerNode[product]
		if !ok {
			return nil // a product of no fixed size may hold it
		}
		most = max(most, n)
	}
	if gpu.Count <= most {
		return nil
	}
	nodes := max(gpu.Nodes, 1)
	total := gpu.Count * nodes
	fix := fmt.Sprintf("set %s to %d or fewer", p.gpuCount, most)
	if total%most == 0 {
		fix = fmt.Sprintf("for %d GPUs per replica, set %s to %d and spec.gpu.nodes to %d (engine.type vLLM)", total, p.gpuCount, most, total/most)
	}
	return field.ErrorList{field.Invalid(p.gpuCount, gpu.Count, fmt.Sprintf(
		"no node of %s holds %d GPUs (at most %d each): %s", strings.Join(gpu.Products, " or "), gpu.Count, most, fix))}
}

// ownedEnv are environment variables the engine container must not set.
var ownedEnv = map[string]string{
	"NVIDIA_VISIBLE_DEVICES": "the GPU device plugin sets it for the GPUs allocated from gpu.count; setting it can expose GPUs the pod was not given",
	"CUDA_VISIBLE_DEVICES":   "the GPU device plugin decides which GPUs the container sees; set gpu.count instead",
}

// KnownGPUProducts are nvidia.com/gpu.product values of common data-centre GPUs.
// Others are accepted with a warning, since a typo leaves the pods Pending forever.
var KnownGPUProducts = []string{
	"NVIDIA-A10", "NVIDIA-A10G", "NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-PCIE-80GB", "NVIDIA-A100-SXM4-40GB",
	"NVIDIA-A100-SXM4-80GB", "NVIDIA-A30", "NVIDIA-B200", "NVIDIA-GB200", "NVIDIA-H100-80GB-HBM3",
	"NVIDIA-H100-NVL", "NVIDIA-H100-PCIe", "NVIDIA-H200", "NVIDIA-H200-NVL", "NVIDIA-L4", "NVIDIA-L40",
	"NVIDIA-L40S", "NVIDIA-RTX-A6000", "Tesla-T4", "Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB",
}

// operatorLabels are the pod labels the operator selects its pods by.
var operatorLabels = []string{servingv1.LabelName, servingv1.LabelInstance, servingv1.LabelManagedBy, servingv1.LabelInference}

var s3Bucket = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*[a-z0-9]$`)

// validate checks an AIInference in its v1 form and returns the problems, each
// saying what is wrong and how to fix it, and warnings for what is allowed but
// probably a mistake.
func validate(obj *servingv1.AIInference, p paths) (warnings []string, errs field.ErrorList) {
	s := obj.Spec
	errs = append(errs, validateSource(s.Model.Source, p)...)

	// Engine arguments the operator sets itself.
	if flags, ok := ownedFlags[s.Engine.Type]; ok {
		for i, arg := range s.Engine.Args {
			name, _, _ := strings.Cut(arg, "=")
			for _, f := range flags {
				if name == f.flag {
					errs = append(errs, field.Forbidden(p.engineArgs.Index(i), fmt.Sprintf(
						"%q is set by the operator for %s; %s", f.flag, s.Engine.Type, f.fix(p))))
				}
			}
		}
	}
	// Ports the engine opens besides its HTTP port.
	if eng, err := engine.For(s.Engine.Type); err == nil && slices.Contains(eng.ReservedPorts(), s.Engine.Port) {
		errs = append(errs, field.Invalid(p.enginePort, s.Engine.Port, fmt.Sprintf(
			"%s opens port %d itself besides its HTTP port (it opens %v); choose another port, e.g. the default %d",
			s.Engine.Type, s.Engine.Port, eng.ReservedPorts(), eng.DefaultPort())))
	}
	for i, env := range s.Engine.Env {
		if why, ok := ownedEnv[env.Name]; ok {
			errs = append(errs, field.Forbidden(p.engineEnv.Index(i).Child("name"), fmt.Sprintf(
				"%s must not be set: %s; remove it", env.Name, why)))
		}
	}

	// GPUs come from gpu.count and gpu.products only.
	for _, kind := range []string{"limits", "requests"} {
		list := s.Resources.Limits
		if kind == "requests" {
			list = s.Resources.Requests
		}
		if _, ok := list[servingv1.GPUResource]; ok {
			errs = append(errs, field.Forbidden(p.resources.Child(kind).Key(string(servingv1.GPUResource)), fmt.Sprintf(
				"the operator sets the GPU %s from %s; remove %s and set %s", kind, p.gpuCount, servingv1.GPUResource, p.gpuCount)))
		}
	}
	errs = append(errs, validateResources(s.Resources, p.resources)...)
	errs = append(errs, validateShape(s.GPU, p)...)
	if s.Engine.Type == servingv1.EngineOllama {
		if err := ollamastore.ValidateName(s.Model.Name); err != nil {
			errs = append(errs, field.Invalid(p.modelName, s.Model.Name, err.Error()+"; choose a name of that form"))
		}
	}
	for _, product := range s.GPU.Products {
		if !slices.Contains(KnownGPUProducts, product) {
			warnings = append(warnings, fmt.Sprintf(
				"%s: %q is not a GPU product the operator knows; the pods will only run on nodes labelled %s=%s, so check the spelling against `kubectl get nodes -L %s`",
				p.gpuProducts, product, servingv1.GPUProductLabel, product, servingv1.GPUProductLabel))
		}
	}

	// Scheduling.
	for _, key := range sortedKeys(s.NodeSelector) {
		path := p.nodeSelector.Key(key)
		if key == servingv1.GPUProductLabel {
			errs = append(errs, field.Forbidden(path, fmt.Sprintf(
				"the operator selects nodes by %s from %s; move the product there and remove this entry", key, p.gpuProducts)))
			continue
		}
		for _, msg := range validation.IsQualifiedName(key) {
			errs = append(errs, field.Invalid(path, key, "node selector key is not a valid label key: "+msg))
		}
		for _, msg := range validation.IsValidLabelValue(s.NodeSelector[key]) {
			errs = append(errs, field.Invalid(path, s.NodeSelector[key], "node selector value is not a valid label value: "+msg))
		}
	}
	errs = append(errs, validateTolerations(s.Tolerations, p.tolerations)...)

	// Names of other objects, which would otherwise fail only when pods are created.
	errs = append(errs, objectName(p.serviceAccountName, s.ServiceAccountName, "ServiceAccount")...)
	for i, ref := range s.ImagePullSecrets {
		errs = append(errs, objectName(p.imagePullSecrets.Index(i).Child("name"), ref.Name, "Secret")...)
	}

	// The cache must hold the model.
	if size := s.Model.Size; size != nil && s.Cache != nil {
		if lim := s.Cache.SizeLimit; lim != nil && lim.Cmp(*size) < 0 {
			errs = append(errs, field.Invalid(p.cacheSizeLimit, lim.String(), fmt.Sprintf(
				"the cache is smaller than the model (%s is %s); raise it to at least %s or remove it to let the operator size it", p.modelSize, size, size)))
		}
		if pvc := s.Cache.PVC; pvc != nil && pvc.Size != nil && pvc.Size.Cmp(*size) < 0 {
			errs = append(errs, field.Invalid(p.cachePVCSize, pvc.Size.String(), fmt.Sprintf(
				"the cache claim is smaller than the model (%s is %s); ask for at least %s", p.modelSize, size, size)))
		}
	}
	if s.Cache != nil && s.Cache.PVC != nil && s.Cache.PVC.ClaimName != "" {
		errs = append(errs, objectName(p.cacheClaim, s.Cache.PVC.ClaimName, "PersistentVolumeClaim")...)
	}

	errs = append(errs, validateAdapterLimit(s)...)
	for i, a := range s.Adapters {
		if a.Source.NamesCredentials() && !s.Model.Source.SameCredentials(a.Source) {
			errs = append(errs, field.Forbidden(spec.Child("adapters").Index(i).Child("source"),
				"an adapter's source may only name the model's credentials Secret and keys (the pods hold no other): name the model's, or none (the adapter is then fetched without credentials)"))
		}
	}

	// Pod labels and annotations.
	if pm := s.PodMetadata; pm != nil {
		for _, key := range sortedKeys(pm.Labels) {
			path := p.podLabels.Key(key)
			if slices.Contains(operatorLabels, key) {
				errs = append(errs, field.Forbidden(path, fmt.Sprintf("%s is one of the labels the operator selects its pods by; use another key", key)))
				continue
			}
			for _, msg := range validation.IsQualifiedName(key) {
				errs = append(errs, field.Invalid(path, key, "not a valid label key: "+msg))
			}
			for _, msg := range validation.IsValidLabelValue(pm.Labels[key]) {
				errs = append(errs, field.Invalid(path, pm.Labels[key], "not a valid label value: "+msg))
			}
		}
		for _, key := range sortedKeys(pm.Annotations) {
			for _, msg := range validation.IsQualifiedName(strings.ToLower(key)) {
				errs = append(errs, field.Invalid(p.podAnnotations.Key(key), key, "not a valid annotation key: "+msg))
			}
		}
	}
	return warnings, errs
}

// validateSource checks the model's source beyond the schema: for v1 the CRD's
// CEL rules already hold these, for v1alpha1 the URI is only checked for its shape.
func validateSource(src servingv1.ModelSource, p paths) field.ErrorList {
	var errs field.ErrorList
	switch {
	case src.S3 != nil:
		if b := src.S3.Bucket; len(b) < 3 || len(b) > 63 || !s3Bucket.MatchString(b) {
			errs = append(errs, field.Invalid(p.s3Bucket, b,
				"the S3 bucket name must be 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit, e.g. s3://models/llama-3.1-8b/"))
		}
		if ep := src.S3.Endpoint; ep != "" {
			if u, err := url.Parse(ep); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				errs = append(errs, field.Invalid(p.s3Endpoint, ep, "the S3 endpoint must be an http:// or https:// URL, e.g. http://minio.storage:9000"))
			}
		}
		if ref := src.S3.CredentialsSecretRef; ref != nil {
			errs = append(errs, objectName(p.s3Secret, ref.Name, "Secret")...)
		}
	case src.PVC != nil:
		errs = append(errs, objectName(p.pvcClaim, src.PVC.ClaimName, "PersistentVolumeClaim")...)
		if path := src.PVC.Path; strings.HasPrefix(path, "/") || slices.Contains(strings.Split(path, "/"), "..") {
			errs = append(errs, field.Invalid(p.pvcPath, path, "the path inside the claim must be relative to the volume root and must not contain '..', e.g. models/llama-3.1-8b"))
		}
	case src.HTTP != nil:
		if u, err := url.Parse(src.HTTP.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(p.httpURL, src.HTTP.URL, "the model URL must be an http:// or https:// URL with a host, e.g. https://models.example.com/llama.gguf"))
		}
		if ref := src.HTTP.BearerTokenSecretRef; ref != nil {
			errs = append(errs, objectName(p.httpSecret, ref.Name, "Secret")...)
		}
	}
	return errs
}

func validateResources(r corev1.ResourceRequirements, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, kind := range []string{"limits", "requests"} {
		list := r.Limits
		if kind == "requests" {
			list = r.Requests
		}
		for _, name := range sortedKeys(list) {
			if q := list[name]; q.Sign() < 0 {
				errs = append(errs, field.Invalid(path.Child(kind).Key(string(name)), q.String(), "must not be negative"))
			}
		}
	}
	for _, name := range sortedKeys(r.Requests) {
		req := r.Requests[name]
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, field.Invalid(path.Child("requests").Key(string(name)), req.String(), fmt.Sprintf(
				"the request is above the limit %s; lower the request or raise the limit", lim.String())))
		}
	}
	return errs
}

// validateTolerations applies the rules the API server applies to pods, and
// refuses duplicates.
func validateTolerations(ts []corev1.Toleration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[corev1.Toleration]int{}
	for i, t := range ts {
		p := path.Index(i)
		key := corev1.Toleration{Key: t.Key, Operator: t.Operator, Value: t.Value, Effect: t.Effect}
		if first, dup := seen[key]; dup {
			errs = append(errs, field.Invalid(p, t.Key, fmt.Sprintf("the same toleration as %s; remove one of them", path.Index(first))))
			continue
		}
		seen[key] = i
		if t.Key != "" {
			for _, msg := range validation.IsQualifiedName(t.Key) {
				errs = append(errs, field.Invalid(p.Child("key"), t.Key, "not a valid taint key: "+msg))
			}
		}
		switch t.Operator {
		case corev1.TolerationOpEqual, "":
			if t.Key == "" {
				errs = append(errs, field.Invalid(p.Child("operator"), t.Operator, "a toleration without a key matches every taint only with operator Exists; set operator: Exists or a key"))
			}
			for _, msg := range validation.IsValidLabelValue(t.Value) {
				errs = append(errs, field.Invalid(p.Child("value"), t.Value, "not a valid taint value: "+msg))
			}
		case corev1.TolerationOpExists:
			if t.Value != "" {
				errs = append(errs, field.Invalid(p.Child("value"), t.Value, "operator Exists matches any value; remove the value or use operator Equal"))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator, []string{string(corev1.TolerationOpEqual), string(corev1.TolerationOpExists)}))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, []string{
				string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute)}))
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			errs = append(errs, field.Invalid(p.Child("tolerationSeconds"), *t.TolerationSeconds, "tolerationSeconds only applies to effect NoExecute; set effect: NoExecute or remove tolerationSeconds"))
		}
	}
	return errs
}

// objectName checks the name of an object the pods refer to.
func objectName(path *field.Path, name, kind string) field.ErrorList {
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(path, name, fmt.Sprintf("not a valid %s name: %s", kind, msg)))
	}
	return errs
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// adapterLimitFlags are the engine arguments that bound how many adapters an
// engine holds, by engine. vLLM keeps --max-cpu-loras adapters in memory
// (vllm/config/lora.py: it defaults to --max-loras, itself 1 by default);
// more would be evicted and loaded from disk again on every turn.
var adapterLimitFlags = map[servingv1.EngineType][]string{
	servingv1.EngineVLLM: {"--max-cpu-loras", "--max-loras"},
}

// validateAdapterLimit refuses more adapters than the engine's arguments
// declare it can hold; nothing is checked where no limit is declared.
func validateAdapterLimit(s servingv1.AIInferenceSpec) field.ErrorList {
	if len(s.Adapters) == 0 {
		return nil
	}
	for _, flag := range adapterLimitFlags[s.Engine.Type] {
		limit, ok := argValue(s.Engine.Args, flag)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(limit)
		if err != nil || n < len(s.Adapters) {
			return field.ErrorList{field.Invalid(spec.Child("adapters"), len(s.Adapters), fmt.Sprintf(
				"spec.adapters lists %d adapters and spec.engine.args declares %s %s, the adapters %s holds at once: raise %s to at least %d, or remove adapters",
				len(s.Adapters), flag, limit, s.Engine.Type, flag, len(s.Adapters)))}
		}
		return nil // the first flag declared is the engine's limit
	}
	return nil
}

// argValue is the value of a flag in args, given as "--flag value" or "--flag=value".
func argValue(args []string, flag string) (string, bool) {
	for i, arg := range args {
		if v, ok := strings.CutPrefix(arg, flag+"="); ok {
			return v, true
		}
		if arg == flag && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}
