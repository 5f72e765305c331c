/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	"encoding/json"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/conversion"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Conversion between v1alpha1 and the hub v1 is lossless both ways. Whatever one
// version cannot express is kept in an annotation of the other that only the
// conversion reads and writes, and that it removes on the way back:
//
//   - AnnotationV1Fields, on a v1alpha1 object: the v1 fields v1alpha1 has no place
//     for (the structured model source, the GPU preference list beyond its first
//     entry, sub-second durations, env, port, cache, the warm-up gate, ...).
//     Converting back to v1 restores each one unless the v1alpha1 object was
//     edited so that it no longer agrees with it (e.g. gpuProduct changed: the
//     new product wins).
//   - AnnotationV1Alpha1Fields, on a v1 object: the v1alpha1 model location when v1
//     cannot rebuild it exactly (e.g. an s3Endpoint next to an http:// URI, which
//     admission refuses but conversion must still not lose).
const (
	AnnotationV1Fields       = "conversion.serving.aiinference.io/v1-fields"
	AnnotationV1Alpha1Fields = "conversion.serving.aiinference.io/v1alpha1-fields"
)

// HTTPTokenKey is the key of the bearer token in a v1alpha1 credentialsSecret.
const HTTPTokenKey = "token"

var _ conversion.Convertible = &AIInference{}

// v1Fields is what v1 holds that v1alpha1 cannot express. Each field is set only
// when converting to v1alpha1 would lose it.
type v1Fields struct {
	Source           *servingv1.ModelSource        `json:"source,omitempty"`
	Revision         string                        `json:"revision,omitempty"`
	SHA256Manifest   string                        `json:"sha256Manifest,omitempty"`
	Env              []corev1.EnvVar               `json:"env,omitempty"`
	Port             int32                         `json:"port,omitempty"`
	Products         []string                      `json:"products,omitempty"`
	Nodes            int32                         `json:"nodes,omitempty"`
	TopologyKey      string                        `json:"topologyKey,omitempty"`
	Cache            *servingv1.CacheSpec          `json:"cache,omitempty"`
	Timeout          *metav1.Duration              `json:"timeout,omitempty"`
	Backoff          *metav1.Duration              `json:"backoff,omitempty"`
	ServiceAccount   string                        `json:"serviceAccountName,omitempty"`
	PodMetadata      *servingv1.PodMetadata        `json:"podMetadata,omitempty"`
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	EngineSecurity   *corev1.SecurityContext       `json:"engineSecurityContext,omitempty"`
	Warmup           *servingv1.WarmupSpec         `json:"warmup,omitempty"`
	Ollama           *servingv1.OllamaSpec         `json:"ollama,omitempty"`
	Rollout          *servingv1.RolloutSpec        `json:"rollout,omitempty"`
	Autoscaling      *servingv1.AutoscalingSpec    `json:"autoscaling,omitempty"`
	NetworkPolicy    *servingv1.NetworkPolicySpec  `json:"networkPolicy,omitempty"`
	Routing          *servingv1.RoutingSpec        `json:"routing,omitempty"`
	Adapters         []servingv1.AdapterSpec       `json:"adapters,omitempty"`
	Status           *v1StatusFields               `json:"status,omitempty"`
}

// v1StatusFields is the v1 status that v1alpha1 has no place for.
type v1StatusFields struct {
	Ready       string                       `json:"ready,omitempty"`
	GPU         string                       `json:"gpu,omitempty"`
	ModelLoaded bool                         `json:"modelLoaded,omitempty"`
	LoadRetries int32                        `json:"loadRetries,omitempty"`
	LastLoad    *servingv1.LoadReport        `json:"lastLoad,omitempty"`
	LastFailure *servingv1.LoadFailure       `json:"lastFailure,omitempty"`
	Updated     int32                        `json:"updatedReplicas,omitempty"`
	LoadBudget  *servingv1.LoadBudget        `json:"loadBudget,omitempty"`
	RequestedAt string                       `json:"lastHandledRequestedAt,omitempty"`
	Rollout     *servingv1.RolloutStatus     `json:"rollout,omitempty"`
	Autoscaling *servingv1.AutoscalingStatus `json:"autoscaling,omitempty"`
	ModelCache  *servingv1.ModelCacheStatus  `json:"modelCache,omitempty"`
	Source      *servingv1.SourceStatus      `json:"source,omitempty"`
	Adapters    []servingv1.AdapterStatus    `json:"adapters,omitempty"`
	Reason      string                       `json:"reason,omitempty"`
	Endpoint    string                       `json:"endpoint,omitempty"`
	Serving     string                       `json:"servingRevision,omitempty"`
}

// modelLocation is how v1alpha1 says where the model is.
type modelLocation struct {
	URI               string `json:"modelURI,omitempty"`
	S3Endpoint        string `json:"s3Endpoint,omitempty"`
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// ConvertTo converts this v1alpha1 object to the hub version v1.
func (src *AIInference) ConvertTo(dstRaw conversion.Hub) error {
	dst := dstRaw.(*servingv1.AIInference)
	dst.ObjectMeta = *src.ObjectMeta.DeepCopy()
	saved, err := popAnnotation[v1Fields](&dst.ObjectMeta, AnnotationV1Fields, false)
	if err != nil {
		return err
	}
	// A v1alpha1 object never carries the other direction's annotation legitimately.
	_, _ = popAnnotation[modelLocation](&dst.ObjectMeta, AnnotationV1Alpha1Fields, true)
	if saved == nil {
		saved = &v1Fields{}
	}
	s := src.Spec

	loc := modelLocation{URI: s.ModelURI, S3Endpoint: s.S3Endpoint, CredentialsSecret: s.CredentialsSecret}
	source := sourceFromLocation(loc)
	if saved.Source != nil && locationOf(*saved.Source) == loc {
		source = *saved.Source.DeepCopy()
	}
	if locationOf(source) != loc {
		if err := setAnnotation(&dst.ObjectMeta, AnnotationV1Alpha1Fields, loc); err != nil {
			return err
		}
	}

	products := productsFrom(s.GPUProduct)
	if saved.Products != nil && firstProduct(saved.Products) == s.GPUProduct {
		products = append([]string(nil), saved.Products...)
	}

	dst.Spec = servingv1.AIInferenceSpec{
		Model: servingv1.ModelSpec{
			Name:           s.ModelName,
			Revision:       saved.Revision,
			Source:         source,
			Size:           copyQuantity(s.ModelSize),
			SHA256Manifest: saved.SHA256Manifest,
		},
		Engine: servingv1.EngineSpec{
			Type:  servingv1.EngineType(s.Engine),
			Image: s.EngineImage,
			Args:  append([]string(nil), s.EngineArgs...),
			Env:   copyEnv(saved.Env),
			Port:  saved.Port,
		},
		GPU:      servingv1.GPUSpec{Count: s.GPUs, Products: products, Nodes: saved.Nodes, TopologyKey: saved.TopologyKey},
		Replicas: copyPtr(s.Replicas),
		Cache:    saved.Cache.DeepCopy(),
		Loading: servingv1.LoadingSpec{
			Timeout:    durationFrom(s.LoadTimeoutSeconds, saved.Timeout),
			MaxRetries: copyPtr(s.MaxRetries),
			Backoff:    durationFrom(s.RetryBackoffSeconds, saved.Backoff),
		},
		Resources:          *s.Resources.DeepCopy(),
		NodeSelector:       copyMap(s.NodeSelector),
		Tolerations:        copyTolerations(s.Tolerations),
		ServiceAccountName: saved.ServiceAccount,
		PodMetadata:        saved.PodMetadata.DeepCopy(),
		ImagePullSecrets:   append([]corev1.LocalObjectReference(nil), saved.ImagePullSecrets...),
	}
	dst.Spec.Engine.SecurityContext = saved.EngineSecurity.DeepCopy()
	dst.Spec.Engine.Warmup = saved.Warmup.DeepCopy()
	dst.Spec.Engine.Ollama = saved.Ollama.DeepCopy()
	dst.Spec.Rollout = saved.Rollout.DeepCopy()
	dst.Spec.Autoscaling = saved.Autoscaling.DeepCopy()
	dst.Spec.NetworkPolicy = saved.NetworkPolicy.DeepCopy()
	dst.Spec.Routing = saved.Routing.DeepCopy()
	dst.Spec.Adapters = copyAdapters(saved.Adapters)
	if len(dst.Spec.ImagePullSecrets) == 0 {
		dst.Spec.ImagePullSecrets = nil
	}

	st := src.Status
	dst.Status = servingv1.AIInferenceStatus{
		ObservedGeneration: st.ObservedGeneration,
		Phase:              servingv1.Phase(st.Phase),
		Replicas:           st.Replicas,
		ReadyReplicas:      st.ReadyReplicas,
		Selector:           st.Selector,
		Conditions:         copyConditions(st.Conditions),
	}
	if ss := saved.Status; ss != nil {
		dst.Status.Ready = ss.Ready
		dst.Status.GPU = ss.GPU
		dst.Status.ModelLoaded = ss.ModelLoaded
		dst.Status.LoadRetries = ss.LoadRetries
		dst.Status.LastLoad = ss.LastLoad.DeepCopy()
		dst.Status.LastFailure = ss.LastFailure.DeepCopy()
		dst.Status.UpdatedReplicas = ss.Updated
		dst.Status.LoadBudget = ss.LoadBudget.DeepCopy()
		dst.Status.LastHandledRequestedAt = ss.RequestedAt
		dst.Status.Rollout = ss.Rollout.DeepCopy()
		dst.Status.Autoscaling = ss.Autoscaling.DeepCopy()
		dst.Status.ModelCache = ss.ModelCache.DeepCopy()
		dst.Status.Source = ss.Source.DeepCopy()
		dst.Status.Adapters = copyAdapterStatuses(ss.Adapters)
		dst.Status.Reason, dst.Status.Endpoint, dst.Status.ServingRevision = ss.Reason, ss.Endpoint, ss.Serving
	}
	return nil
}

// ConvertFrom converts the hub version v1 to this v1alpha1 object.
func (dst *AIInference) ConvertFrom(srcRaw conversion.Hub) error {
	src := srcRaw.(*servingv1.AIInference)
	meta := *src.ObjectMeta.DeepCopy()
	savedLoc, err := popAnnotation[modelLocation](&meta, AnnotationV1Alpha1Fields, false)
	if err != nil {
		return err
	}
	// A v1 object never carries the other direction's annotation legitimately.
	_, _ = popAnnotation[v1Fields](&meta, AnnotationV1Fields, true)
	dst.ObjectMeta = meta
	s := src.Spec

	loc := locationOf(s.Model.Source)
	if savedLoc != nil && equality.Semantic.DeepEqual(sourceFromLocation(*savedLoc), s.Model.Source) {
		loc = *savedLoc
	}
	lost := v1Fields{
		Revision:         s.Model.Revision,
		SHA256Manifest:   s.Model.SHA256Manifest,
		Env:              copyEnv(s.Engine.Env),
		Port:             s.Engine.Port,
		Cache:            s.Cache.DeepCopy(),
		ServiceAccount:   s.ServiceAccountName,
		PodMetadata:      s.PodMetadata.DeepCopy(),
		ImagePullSecrets: append([]corev1.LocalObjectReference(nil), s.ImagePullSecrets...),
		EngineSecurity:   s.Engine.SecurityContext.DeepCopy(),
		Warmup:           s.Engine.Warmup.DeepCopy(),
		Ollama:           s.Engine.Ollama.DeepCopy(),
		Rollout:          s.Rollout.DeepCopy(),
		Autoscaling:      s.Autoscaling.DeepCopy(),
		NetworkPolicy:    s.NetworkPolicy.DeepCopy(),
		Routing:          s.Routing.DeepCopy(),
		Adapters:         copyAdapters(s.Adapters),
		Nodes:            s.GPU.Nodes,
		TopologyKey:      s.GPU.TopologyKey,
	}
	if !equality.Semantic.DeepEqual(sourceFromLocation(loc), s.Model.Source) {
		lost.Source = s.Model.Source.DeepCopy()
	}
	product := firstProduct(s.GPU.Products)
	if !equality.Semantic.DeepEqual(productsFrom(product), s.GPU.Products) {
		lost.Products = append([]string{}, s.GPU.Products...)
	}
	timeout, backoff := secondsOf(s.Loading.Timeout), secondsOf(s.Loading.Backoff)
	if !equality.Semantic.DeepEqual(durationFrom(timeout, nil), s.Loading.Timeout) {
		lost.Timeout = s.Loading.Timeout.DeepCopy()
	}
	if !equality.Semantic.DeepEqual(durationFrom(backoff, nil), s.Loading.Backoff) {
		lost.Backoff = s.Loading.Backoff.DeepCopy()
	}

	dst.Spec = AIInferenceSpec{
		ModelName:           s.Model.Name,
		ModelURI:            loc.URI,
		S3Endpoint:          loc.S3Endpoint,
		CredentialsSecret:   loc.CredentialsSecret,
		ModelSize:           copyQuantity(s.Model.Size),
		Engine:              EngineType(s.Engine.Type),
		EngineImage:         s.Engine.Image,
		EngineArgs:          append([]string(nil), s.Engine.Args...),
		GPUs:                s.GPU.Count,
		GPUProduct:          product,
		Replicas:            copyPtr(s.Replicas),
		LoadTimeoutSeconds:  timeout,
		MaxRetries:          copyPtr(s.Loading.MaxRetries),
		RetryBackoffSeconds: backoff,
		Resources:           *s.Resources.DeepCopy(),
		NodeSelector:        copyMap(s.NodeSelector),
		Tolerations:         copyTolerations(s.Tolerations),
	}

	st := src.Status
	dst.Status = AIInferenceStatus{
		ObservedGeneration: st.ObservedGeneration,
		Phase:              string(st.Phase),
		Replicas:           st.Replicas,
		ReadyReplicas:      st.ReadyReplicas,
		Selector:           st.Selector,
		Conditions:         copyConditions(st.Conditions),
	}
	statusLost := v1StatusFields{
		Ready: st.Ready, GPU: st.GPU, ModelLoaded: st.ModelLoaded, LoadRetries: st.LoadRetries,
		LastLoad: st.LastLoad.DeepCopy(), LastFailure: st.LastFailure.DeepCopy(),
		Updated: st.UpdatedReplicas, LoadBudget: st.LoadBudget.DeepCopy(), RequestedAt: st.LastHandledRequestedAt,
		Rollout: st.Rollout.DeepCopy(), Autoscaling: st.Autoscaling.DeepCopy(), ModelCache: st.ModelCache.DeepCopy(),
		Source: st.Source.DeepCopy(), Adapters: copyAdapterStatuses(st.Adapters),
		Reason: st.Reason, Endpoint: st.Endpoint, Serving: st.ServingRevision,
	}
	if !equality.Semantic.DeepEqual(statusLost, v1StatusFields{}) {
		lost.Status = &statusLost
	}
	if !equality.Semantic.DeepEqual(lost, v1Fields{}) {
		return setAnnotation(&dst.ObjectMeta, AnnotationV1Fields, lost)
	}
	return nil
}

// locationOf is how v1alpha1 writes a v1 model source. When several sources are
// set (which admission refuses), S3 wins over PVC over HTTP.
func locationOf(src servingv1.ModelSource) modelLocation {
	switch {
	case src.S3 != nil:
		loc := modelLocation{URI: "s3://" + src.S3.Bucket + "/" + src.S3.Prefix, S3Endpoint: src.S3.Endpoint}
		if ref := src.S3.CredentialsSecretRef; ref != nil {
			loc.CredentialsSecret = ref.Name
		}
		return loc
	case src.PVC != nil:
		return modelLocation{URI: "pvc://" + src.PVC.ClaimName + "/" + src.PVC.Path}
	case src.HTTP != nil:
		loc := modelLocation{URI: src.HTTP.URL}
		if ref := src.HTTP.BearerTokenSecretRef; ref != nil {
			loc.CredentialsSecret = ref.Name
		}
		return loc
	}
	return modelLocation{}
}

// sourceFromLocation is the v1 model source of a v1alpha1 location. A URI that is
// neither s3:// nor pvc:// is taken as an HTTP URL; admission refuses the ones
// that are not http(s)://.
func sourceFromLocation(loc modelLocation) servingv1.ModelSource {
	switch {
	case loc.URI == "":
		return servingv1.ModelSource{}
	case strings.HasPrefix(loc.URI, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(loc.URI, "s3://"), "/")
		s3 := &servingv1.S3Source{Bucket: bucket, Prefix: prefix, Endpoint: loc.S3Endpoint}
		if loc.CredentialsSecret != "" {
			// The keys v1 defaults to, so that a v1 object with the usual keys needs no annotation.
			s3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{
				Name: loc.CredentialsSecret, AccessKeyIDKey: "AWS_ACCESS_KEY_ID", SecretAccessKeyKey: "AWS_SECRET_ACCESS_KEY",
			}
		}
		return servingv1.ModelSource{S3: s3}
	case strings.HasPrefix(loc.URI, "pvc://"):
		claim, path, _ := strings.Cut(strings.TrimPrefix(loc.URI, "pvc://"), "/")
		return servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: claim, Path: path}}
	}
	h := &servingv1.HTTPSource{URL: loc.URI}
	if loc.CredentialsSecret != "" {
		h.BearerTokenSecretRef = &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: loc.CredentialsSecret},
			Key:                  HTTPTokenKey,
		}
	}
	return servingv1.ModelSource{HTTP: h}
}

func firstProduct(products []string) string {
	if len(products) == 0 {
		return ""
	}
	return products[0]
}

func productsFrom(product string) []string {
	if product == "" {
		return nil
	}
	return []string{product}
}

// secondsOf rounds a duration down to whole seconds, within int32.
func secondsOf(d *metav1.Duration) *int32 {
	if d == nil {
		return nil
	}
	s := int64(d.Duration / time.Second)
	s = min(max(s, -1<<31), 1<<31-1)
	v := int32(s)
	return &v
}

// durationFrom is the v1 duration of a number of seconds, or the exact duration
// saved from v1 when it still rounds to them.
func durationFrom(seconds *int32, saved *metav1.Duration) *metav1.Duration {
	if seconds == nil {
		return nil
	}
	if saved != nil && *secondsOf(saved) == *seconds {
		return saved.DeepCopy()
	}
	return &metav1.Duration{Duration: time.Duration(*seconds) * time.Second}
}

// popAnnotation removes an annotation and decodes it. With ignoreBad a value that
// does not decode is dropped; otherwise it is an error.
func popAnnotation[T any](meta *metav1.ObjectMeta, key string, ignoreBad bool) (*T, error) {
	raw, ok := meta.Annotations[key]
	if !ok {
		return nil, nil
	}
	annotations := make(map[string]string, len(meta.Annotations))
	for k, v := range meta.Annotations {
		if k != key {
			annotations[k] = v
		}
	}
	meta.Annotations = annotations
	if len(annotations) == 0 {
		meta.Annotations = nil
	}
	var v T
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		if ignoreBad {
			return nil, nil
		}
		return nil, &annotationError{key: key, err: err}
	}
	return &v, nil
}

func setAnnotation(meta *metav1.ObjectMeta, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return &annotationError{key: key, err: err}
	}
	annotations := make(map[string]string, len(meta.Annotations)+1)
	for k, v := range meta.Annotations {
		annotations[k] = v
	}
	annotations[key] = string(raw)
	meta.Annotations = annotations
	return nil
}

type annotationError struct {
	key string
	err error
}

func (e *annotationError) Error() string {
	return "annotation " + e.key + " is owned by the AIInference conversion and must not be edited: " + e.err.Error()
}

func (e *annotationError) Unwrap() error { return e.err }
