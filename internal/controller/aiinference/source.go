package aiinference

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// ociMode is how an oci source reaches the pods ("" for other sources): the
// spec's mode, or for Auto an image volume where the cluster serves them and
// no cache asks for a loader.
func ociMode(obj *servingv1.AIInference, opts Options) servingv1.OCIMode {
	src := obj.Spec.Model.Source.OCI
	if src == nil {
		return ""
	}
	switch src.Mode {
	case servingv1.OCIModeLoader, servingv1.OCIModeImageVolume:
		return src.Mode
	}
	if opts.ImageVolumes && obj.Spec.Cache == nil {
		return servingv1.OCIModeImageVolume
	}
	return servingv1.OCIModeLoader
}

// imageVolume tells whether the model is mounted as an image volume: no
// loader runs, and the engine reads the image's root.
func imageVolume(obj *servingv1.AIInference, opts Options) bool {
	return ociMode(obj, opts) == servingv1.OCIModeImageVolume
}

// hfSourceURL is the loader's source for a Hugging Face repository.
func hfSourceURL(hf *servingv1.HuggingFaceSource) string {
	rev := hf.Revision
	if rev == "" {
		rev = "main"
	}
	return "hf://" + hf.Repository + "@" + rev
}

// hfOptions are the loader's Hub settings, with the default patterns written
// out, so that the configuration says what is fetched.
func hfOptions(hf *servingv1.HuggingFaceSource) *loadspec.HuggingFaceOptions {
	o := &loadspec.HuggingFaceOptions{Endpoint: hf.Endpoint, Include: hf.Include, Exclude: hf.Exclude}
	if len(o.Include) == 0 {
		o.Include = loadspec.DefaultHuggingFaceInclude
	}
	if o.Exclude == nil {
		o.Exclude = loadspec.DefaultHuggingFaceExclude
	}
	return o
}

// resolvedSource is what the source resolved to in this object's loads, for
// the loader configuration: once a load has resolved a revision or a tag,
// every later loader loads the same. nil while nothing is resolved.
func resolvedSource(obj *servingv1.AIInference) *loadspec.Resolved {
	st := obj.Status.Source
	source := loaderConfig(obj).Source
	if st == nil || st.For != source {
		return nil
	}
	if rev := st.Revision + st.Digest; rev != "" && st.Mode != servingv1.OCIModeImageVolume {
		return &loadspec.Resolved{Source: source, Revision: rev}
	}
	return nil
}

// resolvedFile is the ConfigMap's resolved.json, or "" when nothing is resolved.
func resolvedFile(obj *servingv1.AIInference) (string, error) {
	r := resolvedSource(obj)
	if r == nil {
		return "", nil
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding the resolved source: %w", err)
	}
	return string(b), nil
}

// sourceStatus is status.source: the record of what the source resolved to,
// kept while the source is the same, else the resolution the newest load of
// the current spec reported (a loader's summary, or the kubelet's digest of
// an image volume).
func sourceStatus(obj *servingv1.AIInference, mode servingv1.OCIMode, pods []podView) *servingv1.SourceStatus {
	src := obj.Spec.Model.Source
	if src.HuggingFace == nil && src.OCI == nil {
		return nil
	}
	st := &servingv1.SourceStatus{For: loaderConfig(obj).Source, Mode: mode}
	if old := obj.Status.Source; old != nil && old.For == st.For && old.Mode == st.Mode && old.Revision+old.Digest != "" {
		st.Revision, st.Digest = old.Revision, old.Digest
		return st
	}
	if ref := src.OCI; ref != nil {
		if _, digest, ok := strings.Cut(ref.Reference, "@"); ok {
			st.Digest = digest
			return st
		}
	}
	var first *podView
	for i := range pods {
		p := &pods[i]
		if !p.Current {
			continue
		}
		resolved := p.ImageVolumeDigest
		if p.LoaderDone && p.LoaderSummary != nil && p.LoaderSummary.Resolved != "" {
			resolved = p.LoaderSummary.Resolved
		}
		if resolved != "" && (first == nil || p.LoaderFinished.Before(first.LoaderFinished)) {
			first = p
			if src.HuggingFace != nil {
				st.Revision, st.Digest = resolved, ""
			} else {
				st.Revision, st.Digest = "", resolved
			}
		}
	}
	return st
}

// imageVolumeDigest reads the digest the kubelet reports for the engine's
// image volume (the ImageVolumeWithDigest feature), "" when it reports none.
func imageVolumeDigest(cs corev1.ContainerStatus) string {
	for _, m := range cs.VolumeMounts {
		if m.Name != cacheVolume || m.VolumeStatus == nil || m.VolumeStatus.Image == nil {
			continue
		}
		ref := m.VolumeStatus.Image.ImageRef
		if i := strings.LastIndex(ref, "@"); i >= 0 {
			return ref[i+1:]
		}
		if strings.HasPrefix(ref, "sha256:") {
			return ref
		}
	}
	return ""
}

// imageVolumeSource is the engine's model, from the registry by the node's
// runtime: kept on the node once pulled.
func imageVolumeSource(obj *servingv1.AIInference) *corev1.ImageVolumeSource {
	return &corev1.ImageVolumeSource{Reference: obj.Spec.Model.Source.OCI.Reference, PullPolicy: corev1.PullIfNotPresent}
}

// engineModelPath is where the engine reads the model: the image's root for
// an image volume, else where the loader writes it.
func engineModelPath(obj *servingv1.AIInference, opts Options) string {
	if imageVolume(obj, opts) {
		return cacheMountPath
	}
	return modelPath(obj)
}

// pullSecretVolume names the volume of an image pull Secret in the loader.
func pullSecretVolume(secret string) string {
	return "pull-" + hashOf(secret)[:12]
}
