package aiinference

import (
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/nodecachespec"
)

func sampleInference() *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "chat", Generation: 1},
		Spec: servingv1.AIInferenceSpec{
			Model:  servingv1.ModelSpec{Name: "llama-3.1-8b", Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "llama/"}}},
			Engine: servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:    servingv1.GPUSpec{Count: 1, Products: []string{"NVIDIA-L4"}},
		},
	}
}

func TestResolvedCache(t *testing.T) {
	tests := []struct {
		name string
		size string
		user *servingv1.CacheSpec
		want servingv1.CacheType
	}{
		{"no size hint means disk", "", nil, servingv1.CacheDisk},
		{"small model goes to memory", "1500Mi", nil, servingv1.CacheMemory},
		{"2Gi is still small", "2Gi", nil, servingv1.CacheMemory},
		{"large model goes to disk", "16Gi", nil, servingv1.CacheDisk},
		{"user choice wins", "1Gi", &servingv1.CacheSpec{Type: servingv1.CacheDisk}, servingv1.CacheDisk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := sampleInference()
			if tt.size != "" {
				obj.Spec.Model.Size = ptr.To(resource.MustParse(tt.size))
			}
			obj.Spec.Cache = tt.user
			if got := resolvedCache(obj).Type; got != tt.want {
				t.Errorf("resolvedCache = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestProgressDeadlineLeavesRoomForEveryAttempt(t *testing.T) {
	obj := sampleInference()
	obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 30 * time.Minute}
	obj.Spec.Loading.MaxRetries = ptr.To[int32](3)
	obj.Spec.Loading.Backoff = &metav1.Duration{Duration: 30 * time.Second}
	// 4 attempts and a warm-up of 30m, back-offs of 30s, 1m and 2m, 5m for scheduling.
	want := int32((5*30*time.Minute + 30*time.Second + time.Minute + 2*time.Minute + 5*time.Minute).Seconds())
	if got := progressDeadline(obj); got != want {
		t.Errorf("progressDeadline = %ds, want %ds", got, want)
	}
}

func TestDeploymentPerEngine(t *testing.T) {
	for _, tt := range []struct {
		engine    servingv1.EngineType
		port      int32
		readiness string
		tpArg     string
		// metrics is the port named "metrics" (Prometheus); 0: /metrics is on http.
		metrics int32
	}{
		{servingv1.EngineVLLM, 8000, "/health", "--tensor-parallel-size", 0},
		{servingv1.EngineTGI, 8080, "/health", "--num-shard", 0},
		{servingv1.EngineTriton, 8000, "/v2/health/ready", "", 8002},
	} {
		t.Run(string(tt.engine), func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Engine.Type = tt.engine
			obj.Spec.Engine.Args = []string{"--max-model-len", "8192"}
			obj.Spec.GPU.Count = 4
			obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 5 * time.Minute}
			eng, err := engine.For(tt.engine)
			g.Expect(err).NotTo(HaveOccurred())
			d := desiredDeployment(obj, eng, Options{LoaderImage: "loader:1"}, "cfg")
			c := d.Spec.Template.Spec.Containers[0]
			g.Expect(c.Ports[0].ContainerPort).To(Equal(tt.port))
			if tt.metrics != 0 {
				g.Expect(c.Ports).To(ContainElement(And(HaveField("Name", "metrics"), HaveField("ContainerPort", tt.metrics))))
			} else {
				g.Expect(c.Ports).To(HaveLen(1))
			}
			g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal(tt.readiness))
			g.Expect(c.StartupProbe.PeriodSeconds).To(Equal(int32(2)))
			g.Expect(c.StartupProbe.FailureThreshold).To(Equal(int32(150)), "5m timeout / 2s period")
			g.Expect(c.Args[len(c.Args)-2:]).To(Equal([]string{"--max-model-len", "8192"}), "user args come last")
			if tt.tpArg != "" {
				i := slices.Index(c.Args, tt.tpArg)
				g.Expect(i).To(BeNumerically(">=", 0))
				g.Expect(c.Args[i+1]).To(Equal("4"))
			}
			g.Expect(c.Resources.Limits[servingv1.GPUResource]).To(BeComparableTo(resource.MustParse("4")))
			g.Expect(c.VolumeMounts).To(ContainElement(HaveField("MountPath", "/dev/shm")), "tensor parallelism needs shared memory")
			g.Expect(*d.Spec.Strategy.RollingUpdate.MaxUnavailable).To(HaveField("IntVal", int32(0)))
		})
	}
}

func TestPodTemplateHashFollowsSpecAndConfig(t *testing.T) {
	eng, _ := engine.For(servingv1.EngineVLLM)
	obj := sampleInference()
	base := podTemplateHash(desiredDeployment(obj, eng, Options{}, "a"))
	if base != podTemplateHash(desiredDeployment(obj, eng, Options{}, "a")) {
		t.Fatal("hash is not stable")
	}
	if base == podTemplateHash(desiredDeployment(obj, eng, Options{}, "b")) {
		t.Error("a changed loader config does not change the template hash")
	}
	obj.Spec.Engine.Args = []string{"--enforce-eager"}
	if base == podTemplateHash(desiredDeployment(obj, eng, Options{}, "a")) {
		t.Error("changed engine args do not change the template hash")
	}
	scaled := sampleInference()
	scaled.Spec.Replicas = ptr.To[int32](5)
	if base != podTemplateHash(desiredDeployment(scaled, eng, Options{}, "a")) {
		t.Error("scaling changes the template hash, which would roll every pod")
	}
}

func TestCacheVolumes(t *testing.T) {
	tests := []struct {
		name      string
		cache     *servingv1.CacheSpec
		size      string
		wantClaim string
		wantMed   corev1.StorageMedium
		wantLimit string
	}{
		{"memory for a small model with headroom", nil, "1000Mi", "", corev1.StorageMediumMemory, "1100Mi"},
		{"disk with the user's limit", &servingv1.CacheSpec{Type: servingv1.CacheDisk, SizeLimit: ptr.To(resource.MustParse("50Gi"))}, "16Gi", "", corev1.StorageMediumDefault, "50Gi"},
		{"existing claim", &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{ClaimName: "shared-cache"}}, "", "shared-cache", "", ""},
		{"claim the operator makes", &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{Size: ptr.To(resource.MustParse("100Gi"))}}, "", "chat-model-cache", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Cache = tt.cache
			if tt.size != "" {
				obj.Spec.Model.Size = ptr.To(resource.MustParse(tt.size))
			}
			vol := volumes(obj, Options{})[0]
			if tt.wantClaim != "" {
				g.Expect(vol.PersistentVolumeClaim.ClaimName).To(Equal(tt.wantClaim))
				return
			}
			g.Expect(vol.EmptyDir.Medium).To(Equal(tt.wantMed))
			g.Expect(vol.EmptyDir.SizeLimit.Cmp(resource.MustParse(tt.wantLimit))).To(BeZero(), "size limit %s", vol.EmptyDir.SizeLimit)
		})
	}
	obj := sampleInference()
	obj.Spec.Cache = tests[3].cache
	pvc := desiredCachePVC(obj)
	if pvc == nil || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
		t.Errorf("desiredCachePVC = %+v, want a ReadWriteOnce claim", pvc)
	}
	if desiredCachePVC(sampleInference()) != nil {
		t.Error("a claim is made without the spec asking for one")
	}
}

func TestLoaderRunsRestricted(t *testing.T) {
	g := NewWithT(t)
	obj := sampleInference()
	obj.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "creds", AccessKeyIDKey: "id"}
	c := loaderContainer(obj, Options{LoaderImage: "loader:1"})
	sc := c.SecurityContext
	g.Expect(*sc.RunAsNonRoot).To(BeTrue())
	g.Expect(*sc.AllowPrivilegeEscalation).To(BeFalse())
	g.Expect(*sc.ReadOnlyRootFilesystem).To(BeTrue())
	g.Expect(sc.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
	g.Expect(sc.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(c.Env).To(HaveLen(2))
	g.Expect(c.Env[0].ValueFrom.SecretKeyRef.Key).To(Equal("id"))
	g.Expect(c.Env[1].ValueFrom.SecretKeyRef.Key).To(Equal("AWS_SECRET_ACCESS_KEY"))
}

func TestGPUAffinityPrefersInOrder(t *testing.T) {
	g := NewWithT(t)
	aff := gpuAffinity(servingv1.GPUSpec{Count: 8, Products: []string{"A", "B", "C"}})
	var weights []int32
	for _, p := range aff.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		weights = append(weights, p.Weight)
	}
	g.Expect(weights).To(Equal([]int32{100, 90, 80}))
	g.Expect(gpuAffinity(servingv1.GPUSpec{Count: 1})).To(BeNil(), "any GPU: no product affinity")
	g.Expect(gpuAffinity(servingv1.GPUSpec{})).To(BeNil())
}

func TestModelPathIsSafe(t *testing.T) {
	obj := sampleInference()
	obj.Spec.Model.Name = "meta-llama/Llama 3.1"
	obj.Spec.Model.Revision = "main"
	if got := modelPath(obj); got != "/models/meta-llama_Llama_3.1@main" {
		t.Errorf("modelPath = %q", got)
	}
}

func TestPodMetadataCannotOverrideSelectorLabels(t *testing.T) {
	g := NewWithT(t)
	obj := sampleInference()
	obj.Spec.PodMetadata = &servingv1.PodMetadata{
		Labels:      map[string]string{"team": "search", servingv1.LabelInstance: "other"},
		Annotations: map[string]string{"sidecar.istio.io/inject": "false"},
	}
	eng, _ := engine.For(servingv1.EngineVLLM)
	tmpl := desiredDeployment(obj, eng, Options{}, "a").Spec.Template
	g.Expect(tmpl.Labels).To(HaveKeyWithValue("team", "search"))
	g.Expect(tmpl.Labels).To(HaveKeyWithValue(servingv1.LabelInstance, "chat"))
	g.Expect(tmpl.Annotations).To(HaveKeyWithValue("sidecar.istio.io/inject", "false"))
	g.Expect(tmpl.Annotations).To(HaveKey(servingv1.AnnotationTemplateHash))
}

func TestLoaderConfigFlushesOnlyLastingCaches(t *testing.T) {
	obj := sampleInference()
	if loaderConfig(obj).Fsync {
		t.Error("an emptyDir cache is flushed")
	}
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{ClaimName: "cache"}}
	if !loaderConfig(obj).Fsync {
		t.Error("a PVC cache is not flushed")
	}
}

func TestWarmupGate(t *testing.T) {
	for _, tt := range []struct {
		name    string
		engine  servingv1.EngineType
		warmup  *servingv1.WarmupSpec
		wantAPI string // "" : no gate
		prompt  string
	}{
		{name: "on by default for vLLM", engine: servingv1.EngineVLLM, wantAPI: "openai", prompt: "Hello"},
		{name: "on by default for TGI", engine: servingv1.EngineTGI, wantAPI: "tgi", prompt: "Hello"},
		{name: "off for Triton", engine: servingv1.EngineTriton},
		{name: "turned off", engine: servingv1.EngineVLLM, warmup: &servingv1.WarmupSpec{Enabled: ptr.To(false)}},
		{name: "turned on with a prompt", engine: servingv1.EngineVLLM, warmup: &servingv1.WarmupSpec{Enabled: ptr.To(true), Prompt: "Say hi"}, wantAPI: "openai", prompt: "Say hi"},
		{name: "a prompt alone keeps the default", engine: servingv1.EngineTGI, warmup: &servingv1.WarmupSpec{Prompt: "Bonjour"}, wantAPI: "tgi", prompt: "Bonjour"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := sampleInference()
			obj.Spec.Engine.Type, obj.Spec.Engine.Warmup = tt.engine, tt.warmup
			obj.Spec.Engine.Port = 9001
			obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 20 * time.Minute}
			eng, err := engine.For(tt.engine)
			g.Expect(err).NotTo(HaveOccurred())
			pod := desiredDeployment(obj, eng, Options{LoaderImage: "loader:1"}, "cfg").Spec.Template.Spec
			g.Expect(pod.InitContainers[0].Name).To(Equal(servingv1.LoaderContainerName), "the loader runs first")
			if tt.wantAPI == "" {
				g.Expect(pod.InitContainers).To(HaveLen(1))
				return
			}
			g.Expect(pod.InitContainers).To(HaveLen(2))
			c := pod.InitContainers[1]
			g.Expect(c.Name).To(Equal(servingv1.WarmupContainerName))
			g.Expect(c.Image).To(Equal("loader:1"), "the loader's image, no other")
			g.Expect(c.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)), "a native sidecar")
			g.Expect(c.Args).To(Equal([]string{"warmup", "--api", tt.wantAPI, "--engine-url", "http://127.0.0.1:9001",
				"--model", "llama-3.1-8b", "--prompt", tt.prompt, "--timeout", "20m0s", "--listen", ":8099"}))
			g.Expect(c.StartupProbe).To(BeNil(), "a startup probe would hold the engine back until the gate is ready")
			g.Expect(c.LivenessProbe).To(BeNil())
			g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/ready"))
			g.Expect(c.ReadinessProbe.HTTPGet.Port.StrVal).To(Equal(c.Ports[0].Name))
			g.Expect(c.Ports[0].ContainerPort).To(Equal(int32(8099)))
			g.Expect(c.SecurityContext).To(Equal(restrictedSecurityContext()), "the loader's security context")
			g.Expect(c.Resources.Requests.Cpu().MilliValue()).To(BeNumerically("<=", 10))
			g.Expect(c.Resources.Limits.Memory().Value()).To(BeNumerically("<=", 64<<20))
			g.Expect(c.TerminationMessagePolicy).To(Equal(corev1.TerminationMessageFallbackToLogsOnError))
		})
	}
}

func TestWarmupSettingsRollThePods(t *testing.T) {
	eng, _ := engine.For(servingv1.EngineVLLM)
	obj := sampleInference()
	base := podTemplateHash(desiredDeployment(obj, eng, Options{}, "a"))
	obj.Spec.Engine.Warmup = &servingv1.WarmupSpec{Prompt: "Hi"}
	if base == podTemplateHash(desiredDeployment(obj, eng, Options{}, "a")) {
		t.Error("a changed warm-up prompt does not change the template hash")
	}
	obj.Spec.Engine.Warmup = &servingv1.WarmupSpec{Enabled: ptr.To(true)}
	if base != podTemplateHash(desiredDeployment(obj, eng, Options{}, "a")) {
		t.Error("enabled: true, the default, changes the template hash")
	}
}

// The files the loader writes to a memory-backed cache count against its
// memory limit, which grows by the cache's size.
func TestLoaderMemoryLimitCountsAMemoryCache(t *testing.T) {
	g := NewWithT(t)
	obj := sampleInference()
	obj.Spec.Model.Size = ptr.To(resource.MustParse("1Gi"))
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheMemory}
	limit := loaderMemoryLimit(obj)
	want := resource.MustParse("512Mi")
	want.Add(*emptyDirLimit(obj, resolvedCache(obj)))
	g.Expect(limit.Cmp(want)).To(BeZero(), "limit %s, want %s", limit.String(), want.String())
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk}
	disk := loaderMemoryLimit(obj)
	g.Expect(disk.String()).To(Equal("512Mi"))
}

func TestNodeCacheVolumeAndPreference(t *testing.T) {
	obj := sampleInference()
	obj.Spec.Model.Source.S3.Endpoint = "http://store.storage:9000"
	obj.Spec.Model.Size = ptr.To(resource.MustParse("2Gi"))
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	eng, _ := engine.For(obj.Spec.Engine.Type)
	pod := podTemplate(obj, eng, Options{}).Spec
	csi := pod.Volumes[0].CSI
	if pod.Volumes[0].Name != cacheVolume || csi == nil || csi.Driver != nodecachespec.DriverName ||
		csi.VolumeAttributes[nodecachespec.AttrSource] != "s3://models/llama/" || csi.VolumeAttributes[nodecachespec.AttrEndpoint] != "http://store.storage:9000" ||
		csi.VolumeAttributes[nodecachespec.AttrSizeBytes] != "2147483648" || (csi.ReadOnly != nil && *csi.ReadOnly) {
		t.Fatalf("cache volume %+v, want the node cache's inline volume, writable, with the source, endpoint and size", pod.Volumes[0])
	}
	for _, c := range pod.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == cacheVolume && !m.ReadOnly {
				t.Errorf("container %s mounts the node's copy writable", c.Name)
			}
		}
	}
	preferred := pod.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	last := preferred[len(preferred)-1]
	want := nodecachespec.NodeLabel(nodecachespec.Key("ml", "s3://models/llama/", "http://store.storage:9000"))
	if last.Weight != nodeCacheWeight || last.Preference.MatchExpressions[0].Key != want || last.Preference.MatchExpressions[0].Operator != corev1.NodeSelectorOpExists {
		t.Errorf("preference %+v, want nodes labelled %s", last, want)
	}
	if pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != servingv1.GPUProductLabel {
		t.Error("the node cache changed what is required")
	}
	if !loaderConfig(obj).Fsync {
		t.Error("a copy that outlives the pod is not flushed")
	}
	// The copy is the volume's root, where the node's cache looks for its
	// complete marker: one copy per source, whatever the model is named.
	if got := loaderConfig(obj).Dest; got != cacheMountPath {
		t.Errorf("the loader writes to %s, want the volume's root %s", got, cacheMountPath)
	}
	// Another namespace's pods never share (or write) this copy.
	other := obj.DeepCopy()
	other.Namespace = "other"
	if nodeCacheKey(other) == nodeCacheKey(obj) {
		t.Error("two namespaces share a copy")
	}
}
