package aiinference

import (
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

func hfInference() *servingv1.AIInference {
	obj := sampleInference()
	obj.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{
		Repository: "Qwen/Qwen2.5-0.5B-Instruct", Exclude: []string{},
		TokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"},
	}}
	return obj
}

func ociInference(mode servingv1.OCIMode) *servingv1.AIInference {
	obj := sampleInference()
	obj.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "registry.example:5000/models/qwen:v1", Mode: mode}}
	obj.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
	return obj
}

func TestHuggingFaceLoaderConfig(t *testing.T) {
	g := NewWithT(t)
	obj := hfInference()
	cfg := loaderConfig(obj)
	g.Expect(cfg.Source).To(Equal("hf://Qwen/Qwen2.5-0.5B-Instruct@main"))
	g.Expect(cfg.HuggingFace.Include).To(Equal(loadspec.DefaultHuggingFaceInclude))
	// An explicit empty exclude list excludes nothing, and says so in the file.
	g.Expect(cfg.HuggingFace.Exclude).To(BeEmpty())
	raw, _ := json.Marshal(cfg.HuggingFace)
	g.Expect(string(raw)).To(ContainSubstring(`"exclude":[]`))
	loader := loaderContainer(obj, Options{})
	g.Expect(loader.Env).To(ContainElement(HaveField("Name", loadspec.EnvHFToken)))

	// Nothing resolved yet: no resolved.json. Once a load reported its commit
	// for this source, the ConfigMap pins the later loads to it.
	cm, err := desiredConfigMap(obj, "{}", loadspec.Budget{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.Data).NotTo(HaveKey(loadspec.ResolvedFileName))
	commit := "0123456789abcdef0123456789abcdef01234567"
	pods := []podView{{Name: "a", Current: true, LoaderDone: true, LoaderSummary: &loadspec.Summary{Resolved: commit}}}
	obj.Status.Source = sourceStatus(obj, "", pods)
	g.Expect(obj.Status.Source).To(Equal(&servingv1.SourceStatus{For: cfg.Source, Revision: commit}))
	cm, err = desiredConfigMap(obj, "{}", loadspec.Budget{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cm.Data[loadspec.ResolvedFileName]).To(ContainSubstring(commit))

	// A later pod reporting another commit does not change the record.
	pods = append(pods, podView{Name: "b", Current: true, LoaderDone: true, LoaderSummary: &loadspec.Summary{Resolved: "fedcba9876543210fedcba9876543210fedcba98"}})
	g.Expect(sourceStatus(obj, "", pods).Revision).To(Equal(commit))
	// Another revision is another source: resolved again.
	obj.Spec.Model.Source.HuggingFace.Revision = "v2"
	g.Expect(sourceStatus(obj, "", nil).Revision).To(BeEmpty())
	g.Expect(resolvedSource(obj)).To(BeNil())
}

func TestOCIModes(t *testing.T) {
	eng, _ := engine.For(servingv1.EngineVLLM)
	for _, tc := range []struct {
		name         string
		mode         servingv1.OCIMode
		cache        *servingv1.CacheSpec
		imageVolumes bool
		want         servingv1.OCIMode
	}{
		{"auto where the cluster serves image volumes", servingv1.OCIModeAuto, nil, true, servingv1.OCIModeImageVolume},
		{"auto where it does not", "", nil, false, servingv1.OCIModeLoader},
		{"auto with a cache", servingv1.OCIModeAuto, &servingv1.CacheSpec{Type: servingv1.CacheNode}, true, servingv1.OCIModeLoader},
		{"loader asked for", servingv1.OCIModeLoader, nil, true, servingv1.OCIModeLoader},
		{"image volume asked for", servingv1.OCIModeImageVolume, nil, false, servingv1.OCIModeImageVolume},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			obj := ociInference(tc.mode)
			obj.Spec.Cache = tc.cache
			opts := Options{ImageVolumes: tc.imageVolumes, LoaderImage: "loader"}
			g.Expect(ociMode(obj, opts)).To(Equal(tc.want))
			pod := podTemplate(obj, eng, opts).Spec
			hasLoader := len(pod.InitContainers) > 0 && pod.InitContainers[0].Name == servingv1.LoaderContainerName
			cache := pod.Volumes[0]
			if tc.want == servingv1.OCIModeImageVolume {
				g.Expect(hasLoader).To(BeFalse(), "no loader runs for an image volume")
				g.Expect(cache.Image).To(Equal(&corev1.ImageVolumeSource{Reference: obj.Spec.Model.Source.OCI.Reference, PullPolicy: corev1.PullIfNotPresent}))
				g.Expect(pod.Containers[0].Args).To(ContainElement(cacheMountPath))
				return
			}
			g.Expect(hasLoader).To(BeTrue())
			g.Expect(cache.Image).To(BeNil())
			g.Expect(loaderConfig(obj).Source).To(Equal("oci://registry.example:5000/models/qwen:v1"))
			// The loader reads the pull Secret's docker config.
			g.Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", "regcred")))
			g.Expect(pod.InitContainers[0].VolumeMounts).To(ContainElement(HaveField("MountPath", loadspec.PullSecretsMountDir+"/regcred")))
		})
	}
}

func TestImageVolumePodIsLoadedOnceTheEngineRuns(t *testing.T) {
	g := NewWithT(t)
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: servingv1.EngineContainerName}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: servingv1.EngineContainerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			VolumeMounts: []corev1.VolumeMountStatus{{Name: cacheVolume, VolumeStatus: &corev1.VolumeStatus{
				Image: &corev1.ImageVolumeStatus{ImageRef: "registry.example:5000/models/qwen@sha256:" + sha64}}}},
		}}},
	}
	v := observePod(pod, "")
	g.Expect(v.LoaderDone).To(BeTrue())
	g.Expect(v.ImageVolumeDigest).To(Equal("sha256:" + sha64))
	obj := ociInference(servingv1.OCIModeImageVolume)
	v.Current = true
	g.Expect(sourceStatus(obj, servingv1.OCIModeImageVolume, []podView{v})).To(Equal(&servingv1.SourceStatus{
		For: "oci://registry.example:5000/models/qwen:v1", Mode: servingv1.OCIModeImageVolume, Digest: "sha256:" + sha64}))
}

const sha64 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
