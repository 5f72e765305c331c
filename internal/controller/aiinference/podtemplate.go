package aiinference

import (
	"fmt"
	"maps"
	"math"
	"path"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/warmup"
)

// Names of the pod's volumes and mounts, and probe timings.
const (
	cacheVolume        = "model-cache"
	configVolume       = "loader-config"
	sourceVolume       = "model-source"
	shmVolume          = "dshm"
	engineHomeVolume   = "engine-home"
	tmpVolume          = "tmp"
	engineHome         = "/home/engine"
	cacheMountPath     = "/models"
	sourceMountPath    = "/mnt/model-source"
	probePeriodSeconds = 10
	// startupPeriodSeconds is the startup probe's period.
	startupPeriodSeconds = 2
	// preStopSleepSeconds is how long a stopping engine keeps serving.
	preStopSleepSeconds = 5
)

const (
	// smallModelMaxSize is the largest model put in an in-memory cache when the user
	// did not choose a cache.
	smallModelMaxSize = 2 << 30
)

// loaderUID is the non-root user the loader runs as (the distroless "nonroot" user).
const loaderUID = 65532

// resolvedCache is the cache the pods use: the user's, or one chosen from the model size.
func resolvedCache(obj *servingv1.AIInference) servingv1.CacheSpec {
	if obj.Spec.Cache != nil {
		return *obj.Spec.Cache
	}
	size := obj.Spec.Model.Size
	if size != nil && size.Value() <= smallModelMaxSize {
		return servingv1.CacheSpec{Type: servingv1.CacheMemory}
	}
	return servingv1.CacheSpec{Type: servingv1.CacheDisk}
}

// emptyDirLimit is the size limit of an emptyDir cache: the user's, or the model size
// plus 10% headroom; nil when nothing is known.
func emptyDirLimit(obj *servingv1.AIInference, cache servingv1.CacheSpec) *resource.Quantity {
	if cache.SizeLimit != nil {
		return cache.SizeLimit
	}
	if size := obj.Spec.Model.Size; size != nil {
		return resource.NewQuantity(size.Value()+size.Value()/10, resource.BinarySI)
	}
	return nil
}

var unsafePathChars = regexp.MustCompile(`[^A-Za-z0-9._@-]+`)

// modelPath is where the complete model sits in the pod. It names the model and
// revision so that a shared PVC cache can hold several models side by side; a
// node cache volume is one model's copy, whose root the node's cache checks.
func modelPath(obj *servingv1.AIInference) string {
	if resolvedCache(obj).Type == servingv1.CacheNode {
		return cacheMountPath
	}
	dir := obj.Spec.Model.Name
	if rev := obj.Spec.Model.Revision; rev != "" {
		dir += "@" + rev
	}
	return path.Join(cacheMountPath, unsafePathChars.ReplaceAllString(dir, "_"))
}

// enginePorts are the engine's HTTP port and, for an engine that serves its
// metrics elsewhere, a port named "metrics" that a PodMonitor can scrape.
func enginePorts(http int32, eng engine.Engine) []corev1.ContainerPort {
	ports := []corev1.ContainerPort{{Name: "http", ContainerPort: http, Protocol: corev1.ProtocolTCP}}
	if p := eng.MetricsPort(); p != 0 {
		ports = append(ports, corev1.ContainerPort{Name: "metrics", ContainerPort: p, Protocol: corev1.ProtocolTCP})
	}
	return ports
}

func enginePort(obj *servingv1.AIInference, eng engine.Engine) int32 {
	if obj.Spec.Engine.Port != 0 {
		return obj.Spec.Engine.Port
	}
	return eng.DefaultPort()
}

func podTemplate(obj *servingv1.AIInference, eng engine.Engine, opts Options) corev1.PodTemplateSpec {
	spec := obj.Spec
	tolerations := append([]corev1.Toleration(nil), spec.Tolerations...)
	if spec.GPU.Count > 0 {
		tolerations = append([]corev1.Toleration{{
			Key: string(servingv1.GPUResource), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		}}, tolerations...)
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: podMetadata(obj),
		Spec: corev1.PodSpec{
			ServiceAccountName: spec.ServiceAccountName,
			ImagePullSecrets:   spec.ImagePullSecrets,
			NodeSelector:       spec.NodeSelector,
			Tolerations:        tolerations,
			Affinity:           withGroupTopology(withNodeCachePreference(gpuAffinity(spec.GPU), obj), obj),
			SecurityContext: &corev1.PodSecurityContext{
				FSGroup:             ptr.To[int64](loaderUID),
				FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
				SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: initContainers(obj, eng, opts),
			Containers:     []corev1.Container{engineContainer(obj, eng, opts)},
			Volumes:        volumes(obj, opts),
		},
	}
}

// sharesMemory is true when the engine's processes exchange tensors through
// /dev/shm: several GPUs, or Ray's object store on a group's nodes.
func sharesMemory(obj *servingv1.AIInference) bool {
	return obj.Spec.GPU.Count > 1 || obj.SpansNodes()
}

// podMetadata is the user's pod labels and annotations under the operator's labels.
func podMetadata(obj *servingv1.AIInference) metav1.ObjectMeta {
	meta := metav1.ObjectMeta{Labels: map[string]string{}}
	if user := obj.Spec.PodMetadata; user != nil {
		maps.Copy(meta.Labels, user.Labels)
		if len(user.Annotations) > 0 {
			meta.Annotations = maps.Clone(user.Annotations)
		}
	}
	maps.Copy(meta.Labels, childLabels(obj))
	meta.Labels[servingv1.LabelTrack] = servingv1.TrackStable
	return meta
}

// gpuAffinity requires a node with one of the accepted products and prefers them in
// the order given, so the first product is used while it has room.
func gpuAffinity(gpu servingv1.GPUSpec) *corev1.Affinity {
	if gpu.Count == 0 || len(gpu.Products) == 0 {
		return nil
	}
	var preferred []corev1.PreferredSchedulingTerm
	for i, product := range gpu.Products {
		preferred = append(preferred, corev1.PreferredSchedulingTerm{
			Weight: int32(max(100-10*i, 1)),
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: servingv1.GPUProductLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{product},
			}}},
		})
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: servingv1.GPUProductLabel, Operator: corev1.NodeSelectorOpIn, Values: gpu.Products,
			}}}},
		},
		PreferredDuringSchedulingIgnoredDuringExecution: preferred,
	}}
}

// restrictedSecurityContext passes the Pod Security "restricted" profile.
func restrictedSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                ptr.To[int64](loaderUID),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func loaderContainer(obj *servingv1.AIInference, opts Options) corev1.Container {
	mounts := []corev1.VolumeMount{
		{Name: cacheVolume, MountPath: cacheMountPath},
		{Name: configVolume, MountPath: loadspec.ConfigMountDir, ReadOnly: true},
	}
	if obj.Spec.Model.Source.PVC != nil {
		mounts = append(mounts, corev1.VolumeMount{Name: sourceVolume, MountPath: sourceMountPath, ReadOnly: true})
	}
	if obj.Spec.Model.Source.OCI != nil {
		for _, s := range obj.Spec.ImagePullSecrets {
			mounts = append(mounts, corev1.VolumeMount{Name: pullSecretVolume(s.Name), MountPath: path.Join(loadspec.PullSecretsMountDir, s.Name), ReadOnly: true})
		}
	}
	return corev1.Container{
		Name:  servingv1.LoaderContainerName,
		Image: opts.LoaderImage,
		Args: []string{"--config", path.Join(loadspec.ConfigMountDir, loadspec.ConfigFileName),
			fmt.Sprintf("--progress-address=:%d", loadspec.ProgressPort)},
		// The progress endpoint (JSON and metrics) while it loads: kubectl aii status
		// reads it through the pod proxy, a PodMonitor can scrape it.
		Ports:           []corev1.ContainerPort{{Name: loadspec.ProgressPortName, ContainerPort: loadspec.ProgressPort, Protocol: corev1.ProtocolTCP}},
		Env:             loaderEnv(obj),
		VolumeMounts:    mounts,
		SecurityContext: restrictedSecurityContext(),
		Resources: corev1.ResourceRequirements{
			// A core for hashing every byte it verifies; its buffers are bounded well under 256Mi.
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: loaderMemoryLimit(obj)},
		},
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
}

// loaderBufferLimit bounds the loader's own memory.
var loaderBufferLimit = resource.MustParse("512Mi")

// loaderMemoryLimit is the loader's memory limit: its buffers, plus an
// in-memory cache's size, since the kernel charges the files the loader writes
// to a memory-backed emptyDir to the loader's container (a 768Mi model in a
// Memory cache was OOM-killed at 512Mi on a real node).
func loaderMemoryLimit(obj *servingv1.AIInference) resource.Quantity {
	limit := loaderBufferLimit.DeepCopy()
	if cache := resolvedCache(obj); cache.Type == servingv1.CacheMemory {
		if size := emptyDirLimit(obj, cache); size != nil {
			limit.Add(*size)
		}
	}
	return limit
}

// initContainers are the loader, then the warm-up gate when it is on.
func initContainers(obj *servingv1.AIInference, eng engine.Engine, opts Options) []corev1.Container {
	var containers []corev1.Container
	if !imageVolume(obj, opts) {
		containers = append(containers, loaderContainer(obj, opts))
	}
	if runtimeAdapters(obj) {
		containers = append(containers, adapterAgentContainer(obj, eng, opts))
	}
	if api := warmupAPI(obj, eng); api != "" {
		containers = append(containers, warmupContainer(obj, eng, opts, api))
	}
	return containers
}

// warmupAPI is the API the warm-up gate asks the engine through, or "" when the
// gate is off: turned off in the spec, or an engine without a completions API
// (Triton, which admission refuses to turn it on for).
func warmupAPI(obj *servingv1.AIInference, eng engine.Engine) warmup.API {
	if w := obj.Spec.Engine.Warmup; w != nil && w.Enabled != nil && !*w.Enabled {
		return ""
	}
	return eng.WarmupAPI()
}

// warmupContainer is the warm-up gate: `model-loader warmup` from the loader's
// image, run as a native sidecar (an init container that restarts always), so the
// kubelet starts it once the loader is done and keeps it beside the engine. It
// has no startup probe, so the engine starts at once beside it; its readiness
// probe counts in the pod's readiness, which so waits for a real completion.
// After loading.timeout without one it exits with the reason in its termination
// message, and the kubelet runs it again.
func warmupContainer(obj *servingv1.AIInference, eng engine.Engine, opts Options, api warmup.API) corev1.Container {
	prompt := warmup.DefaultPrompt
	if w := obj.Spec.Engine.Warmup; w != nil && w.Prompt != "" {
		prompt = w.Prompt
	}
	return corev1.Container{
		Name:  servingv1.WarmupContainerName,
		Image: opts.LoaderImage,
		Args: []string{"warmup",
			"--api", string(api),
			"--engine-url", fmt.Sprintf("http://127.0.0.1:%d", enginePort(obj, eng)),
			"--model", obj.Spec.Model.Name,
			"--prompt", prompt,
			"--timeout", obj.LoadTimeout().String(),
			"--listen", fmt.Sprintf(":%d", warmup.Port),
		},
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:         []corev1.ContainerPort{{Name: servingv1.WarmupContainerName, ContainerPort: warmup.Port, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: warmup.ReadyPath, Port: intstr.FromString(servingv1.WarmupContainerName)}},
			PeriodSeconds: 2, TimeoutSeconds: 2, FailureThreshold: 3,
		},
		SecurityContext: restrictedSecurityContext(),
		Resources: corev1.ResourceRequirements{
			// One HTTP request at a time, then an idle readiness endpoint.
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// loaderEnv passes credentials from Secrets, never inline.
func loaderEnv(obj *servingv1.AIInference) []corev1.EnvVar {
	fromSecret := func(env, secret, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key,
		}}}
	}
	src := obj.Spec.Model.Source
	switch {
	case src.S3 != nil && src.S3.CredentialsSecretRef != nil:
		ref := src.S3.CredentialsSecretRef
		return []corev1.EnvVar{
			fromSecret(loadspec.EnvAccessKeyID, ref.Name, ref.AccessKeyID()),
			fromSecret(loadspec.EnvSecretAccessKey, ref.Name, ref.SecretAccessKey()),
		}
	case src.HTTP != nil && src.HTTP.BearerTokenSecretRef != nil:
		ref := src.HTTP.BearerTokenSecretRef
		return []corev1.EnvVar{fromSecret(loadspec.EnvHTTPBearerToken, ref.Name, ref.Key)}
	case src.HuggingFace != nil && src.HuggingFace.TokenSecretRef != nil:
		ref := src.HuggingFace.TokenSecretRef
		return []corev1.EnvVar{fromSecret(loadspec.EnvHFToken, ref.Name, ref.Key)}
	}
	return nil
}

// wholeCPUs is the engine's CPU limit in whole CPUs, at least 1 (its
// request when it has no limit); 0 when it has neither.
func wholeCPUs(r corev1.ResourceRequirements) int32 {
	q, ok := r.Limits[corev1.ResourceCPU]
	if !ok {
		if q, ok = r.Requests[corev1.ResourceCPU]; !ok {
			return 0
		}
	}
	return int32(max(q.MilliValue()/1000, 1))
}

func engineContainer(obj *servingv1.AIInference, eng engine.Engine, opts Options) corev1.Container {
	spec := obj.Spec
	port := enginePort(obj, eng)
	image := spec.Engine.Image
	if image == "" {
		image = eng.DefaultImage()
	}
	params := engine.Params{
		ModelPath:      engineModelPath(obj, opts),
		ServedName:     spec.Model.Name,
		Port:           port,
		TensorParallel: max(spec.GPU.Count, 1),
		Nodes:          obj.NodesPerReplica(),
		Adapters:       engineAdapters(obj),
		Ollama:         spec.Engine.OllamaSettings(),
		CPUs:           wholeCPUs(spec.Resources),
	}
	args := append(eng.Args(params), spec.Engine.Args...)

	resources := *spec.Resources.DeepCopy()
	if spec.GPU.Count > 0 {
		gpus := *resource.NewQuantity(int64(spec.GPU.Count), resource.DecimalSI)
		if resources.Limits == nil {
			resources.Limits = corev1.ResourceList{}
		}
		resources.Limits[servingv1.GPUResource] = gpus
		if resources.Requests != nil {
			resources.Requests[servingv1.GPUResource] = gpus
		}
	}

	mounts := []corev1.VolumeMount{
		{Name: cacheVolume, MountPath: cacheMountPath, ReadOnly: true},
		{Name: engineHomeVolume, MountPath: engineHome},
		{Name: tmpVolume, MountPath: "/tmp"},
	}
	if sharesMemory(obj) {
		mounts = append(mounts, corev1.VolumeMount{Name: shmVolume, MountPath: "/dev/shm"})
	}

	probe := func(path string, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
			PeriodSeconds:    probePeriodSeconds,
			TimeoutSeconds:   5,
			FailureThreshold: failures,
		}
	}
	readiness := probe(eng.ReadinessPath(), 3)
	readiness.PeriodSeconds = 5
	return corev1.Container{
		Name:    servingv1.EngineContainerName,
		Image:   image,
		Command: eng.Command(),
		Args:    args,
		Env:     engineEnv(eng.Env(params), spec.Engine.Env),
		Ports:   enginePorts(port, eng),
		// The startup probe gives the engine loading.timeout to warm up once the
		// loader is done; liveness only starts counting once it has succeeded.
		StartupProbe:             startupProbe(probe(eng.ReadinessPath(), startupFailureThreshold(obj.LoadTimeout()))),
		ReadinessProbe:           readiness,
		LivenessProbe:            probe(eng.LivenessPath(), 3),
		Resources:                resources,
		VolumeMounts:             mounts,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          engineSecurityContext(obj),
		// A pod being deleted leaves the Service's endpoints at once, but kube-proxy
		// on every node takes a moment to see it: the engine keeps serving
		// meanwhile, so that no request sent its way in that moment fails.
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: preStopSleepSeconds}}},
	}
}

// engineSecurityContext is the user's, or one that passes Pod Security
// "restricted". Engines write to their home and caches, so the root file system
// stays writable; those paths are volumes (see engineEnv).
func engineSecurityContext(obj *servingv1.AIInference) *corev1.SecurityContext {
	if sc := obj.Spec.Engine.SecurityContext; sc != nil {
		return sc.DeepCopy()
	}
	sc := restrictedSecurityContext()
	sc.ReadOnlyRootFilesystem = nil
	return sc
}

// engineEnv points HOME and the caches of the engines' libraries (Hugging Face,
// torch, Triton kernels) at a writable volume, and names the user, which Python's
// getpass needs when the UID has no passwd entry. The user's variables win.
func engineEnv(engineDefaults, user []corev1.EnvVar) []corev1.EnvVar {
	defaults := append([]corev1.EnvVar{
		{Name: "HOME", Value: engineHome},
		{Name: "USER", Value: "engine"},
		{Name: "XDG_CACHE_HOME", Value: engineHome + "/.cache"},
		{Name: "HF_HOME", Value: engineHome + "/.cache/huggingface"},
	}, engineDefaults...)
	set := map[string]bool{}
	for _, e := range user {
		set[e.Name] = true
	}
	var env []corev1.EnvVar
	for _, e := range defaults {
		if !set[e.Name] {
			env = append(env, e)
		}
	}
	return append(env, user...)
}

// startupProbe asks often: a health GET is cheap, and the sooner a warm engine
// is seen, the sooner the replica serves.
func startupProbe(p *corev1.Probe) *corev1.Probe {
	p.PeriodSeconds = startupPeriodSeconds
	return p
}

// startupFailureThreshold turns the loading timeout into startup probe failures.
func startupFailureThreshold(timeout time.Duration) int32 {
	return int32(max(math.Ceil(timeout.Seconds()/startupPeriodSeconds), 1))
}

func volumes(obj *servingv1.AIInference, opts Options) []corev1.Volume {
	cache := resolvedCache(obj)
	var cacheSource corev1.VolumeSource
	switch cache.Type {
	case servingv1.CacheMemory:
		cacheSource.EmptyDir = &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: emptyDirLimit(obj, cache)}
	case servingv1.CachePVC:
		claim := cache.PVC.ClaimName
		if claim == "" {
			claim = obj.CachePVCName()
		}
		cacheSource.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}
	case servingv1.CacheNode:
		cacheSource.CSI = nodeCacheVolume(obj)
	default:
		cacheSource.EmptyDir = &corev1.EmptyDirVolumeSource{SizeLimit: emptyDirLimit(obj, cache)}
	}
	if imageVolume(obj, opts) {
		cacheSource = corev1.VolumeSource{Image: imageVolumeSource(obj)}
	}
	vols := []corev1.Volume{
		{Name: cacheVolume, VolumeSource: cacheSource},
		{Name: configVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: obj.LoaderConfigMapName()},
		}}},
	}
	// The engine's home and /tmp: writable for a non-root engine, gone with the pod.
	vols = append(vols,
		corev1.Volume{Name: engineHomeVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	if src := obj.Spec.Model.Source.PVC; src != nil {
		vols = append(vols, corev1.Volume{Name: sourceVolume, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: src.ClaimName, ReadOnly: true},
		}})
	}
	if obj.Spec.Model.Source.OCI != nil && !imageVolume(obj, opts) {
		// The loader authenticates to the registry with the pods' pull Secrets.
		for _, s := range obj.Spec.ImagePullSecrets {
			vols = append(vols, corev1.Volume{Name: pullSecretVolume(s.Name), VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: s.Name, Items: []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: corev1.DockerConfigJsonKey}}},
			}})
		}
	}
	if sharesMemory(obj) {
		// Tensor parallelism exchanges data through shared memory; the default 64Mi is too small.
		vols = append(vols, corev1.Volume{Name: shmVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory},
		}})
	}
	return vols
}
