/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/randfill"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// roundTrips is how many random objects each fuzz test converts (at least 10,000);
// CONVERSION_FUZZ_ROUNDS raises it for a longer soak.
func roundTrips(t *testing.T) int {
	n := 10000
	if s := os.Getenv("CONVERSION_FUZZ_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < n {
			t.Fatalf("CONVERSION_FUZZ_ROUNDS=%q: want a number of at least %d", s, n)
		}
		n = v
	}
	return n
}

// filler fills objects at random, every field, with a few rules that match what the
// API server can hold: times at whole seconds (metav1.Time serialises so) and
// quantities in canonical form (from apimachinery's own fuzzer functions).
func filler(t *testing.T) *randfill.Filler {
	seed := time.Now().UnixNano()
	if s := os.Getenv("CONVERSION_FUZZ_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("CONVERSION_FUZZ_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("random seed %d (CONVERSION_FUZZ_SEED=%d repeats this run)", seed, seed)
	scheme := runtime.NewScheme()
	codecs := runtimeserializer.NewCodecFactory(scheme)
	funcs := fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, func(runtimeserializer.CodecFactory) []any {
		return []any{
			func(tm *metav1.Time, c randfill.Continue) {
				*tm = metav1.Unix(c.Int63n(4_000_000_000), 0)
			},
			func(tm *metav1.TypeMeta, c randfill.Continue) { *tm = metav1.TypeMeta{} },
			// Set only by decoding an unreadable stored object; never converted.
			func(o *servingv1.AIInference, c randfill.Continue) {
				c.FillNoCustom(o)
				o.UnreadableSpec = ""
			},
			// Model URIs in every shape v1alpha1 knows, with random parts, besides
			// the wholly random strings the filler makes by itself.
			func(s *AIInferenceSpec, c randfill.Continue) {
				c.FillNoCustom(s)
				part := func() string {
					if c.Intn(5) == 0 {
						return ""
					}
					return c.String(12)
				}
				switch c.Intn(7) {
				case 0:
					s.ModelURI = "s3://" + part() + "/" + part()
				case 1:
					s.ModelURI = "s3://" + part()
				case 2:
					s.ModelURI = "pvc://" + part() + "/" + part() + "/" + part()
				case 3:
					s.ModelURI = "pvc://" + part()
				case 4:
					s.ModelURI = "https://" + part() + "/" + part()
				case 5:
					s.ModelURI = ""
				}
				if c.Bool() {
					s.S3Endpoint = ""
				}
				if c.Bool() {
					s.CredentialsSecret = ""
				}
			},
			// Sources with exactly one member set, as admission allows, as often as
			// wholly random ones.
			func(src *servingv1.ModelSource, c randfill.Continue) {
				c.FillNoCustom(src)
				if c.Bool() {
					return
				}
				only := *src
				*src = servingv1.ModelSource{}
				switch c.Intn(5) {
				case 0:
					src.S3 = only.S3
				case 1:
					src.PVC = only.PVC
				case 2:
					src.HTTP = only.HTTP
				case 3:
					src.HuggingFace = only.HuggingFace
				default:
					src.OCI = only.OCI
				}
			},
		}
	})
	f := fuzzer.FuzzerFor(funcs, rand.NewSource(seed), codecs)
	return f.NilChance(0.2).NumElements(0, 3)
}

func TestRoundTripV1Alpha1ToV1ToV1Alpha1(t *testing.T) {
	f := filler(t)
	annotated := 0
	n := roundTrips(t)
	for i := range n {
		before := &AIInference{}
		f.Fill(before)
		hub := &servingv1.AIInference{}
		if err := before.DeepCopy().ConvertTo(hub); err != nil {
			t.Fatalf("object %d: v1alpha1 to v1: %v", i, err)
		}
		if _, ok := hub.Annotations[AnnotationV1Alpha1Fields]; ok {
			annotated++
		}
		after := &AIInference{}
		if err := after.ConvertFrom(hub.DeepCopy()); err != nil {
			t.Fatalf("object %d: v1 to v1alpha1: %v", i, err)
		}
		if !equality.Semantic.DeepEqual(before, after) {
			t.Fatalf("object %d changed in the round trip v1alpha1 -> v1 -> v1alpha1 (-before +after):\n%s", i, cmp.Diff(before, after))
		}
	}
	// Both paths ran: objects v1 holds exactly, and objects that needed the annotation.
	t.Logf("%d of %d objects needed the %s annotation on v1", annotated, n, AnnotationV1Alpha1Fields)
	if annotated == 0 || annotated == n {
		t.Errorf("%d of %d objects needed the annotation: the random objects do not cover both cases", annotated, n)
	}
}

func TestRoundTripV1ToV1Alpha1ToV1(t *testing.T) {
	f := filler(t)
	annotated := 0
	n := roundTrips(t)
	for i := range n {
		before := &servingv1.AIInference{}
		f.Fill(before)
		expressible := i%4 == 0
		if expressible {
			keepOnlyWhatV1Alpha1Expresses(before)
		}
		spoke := &AIInference{}
		if err := spoke.ConvertFrom(before.DeepCopy()); err != nil {
			t.Fatalf("object %d: v1 to v1alpha1: %v", i, err)
		}
		if _, ok := spoke.Annotations[AnnotationV1Fields]; ok {
			annotated++
			if expressible {
				t.Fatalf("object %d: v1alpha1 can express it, yet it got the annotation %s", i, spoke.Annotations[AnnotationV1Fields])
			}
		}
		after := &servingv1.AIInference{}
		if err := spoke.DeepCopy().ConvertTo(after); err != nil {
			t.Fatalf("object %d: v1alpha1 to v1: %v", i, err)
		}
		if !equality.Semantic.DeepEqual(before, after) {
			t.Fatalf("object %d changed in the round trip v1 -> v1alpha1 -> v1 (-before +after):\n%s", i, cmp.Diff(before, after))
		}
	}
	t.Logf("%d of %d objects needed the %s annotation on v1alpha1", annotated, n, AnnotationV1Fields)
	if annotated == 0 || annotated == n {
		t.Errorf("%d of %d objects needed the annotation: the random objects do not cover both cases", annotated, n)
	}
}

// keepOnlyWhatV1Alpha1Expresses clears or rounds what v1alpha1 has no place for.
func keepOnlyWhatV1Alpha1Expresses(o *servingv1.AIInference) {
	s := &o.Spec
	s.Model.Revision, s.Model.SHA256Manifest = "", ""
	s.Model.Source = sourceFromLocation(locationOf(s.Model.Source))
	s.Engine.Env, s.Engine.Port, s.Engine.SecurityContext, s.Engine.Warmup, s.Engine.Ollama = nil, 0, nil, nil, nil
	s.GPU.Products = productsFrom(firstProduct(s.GPU.Products))
	s.GPU.Nodes, s.GPU.TopologyKey = 0, ""
	s.Cache, s.ServiceAccountName, s.PodMetadata, s.ImagePullSecrets, s.Rollout, s.Autoscaling = nil, "", nil, nil, nil, nil
	s.NetworkPolicy, s.Routing, s.Adapters = nil, nil, nil
	s.Loading.Timeout = durationFrom(secondsOf(s.Loading.Timeout), nil)
	s.Loading.Backoff = durationFrom(secondsOf(s.Loading.Backoff), nil)
	st := &o.Status
	st.Ready, st.GPU, st.ModelLoaded, st.LoadRetries, st.LastLoad, st.LastFailure = "", "", false, 0, nil, nil
	st.UpdatedReplicas, st.LoadBudget, st.LastHandledRequestedAt, st.Rollout, st.Autoscaling = 0, nil, "", nil, nil
	st.Reason, st.Endpoint, st.ServingRevision, st.ModelCache, st.Source, st.Adapters = "", "", "", nil, nil, nil
}

// The source of a conversion is never modified.
func TestConversionLeavesItsSourceAlone(t *testing.T) {
	f := filler(t)
	for range 500 {
		hub := &servingv1.AIInference{}
		f.Fill(hub)
		hubCopy := hub.DeepCopy()
		spoke := &AIInference{}
		if err := spoke.ConvertFrom(hub); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(hub, hubCopy) {
			t.Fatalf("ConvertFrom changed its source:\n%s", cmp.Diff(hubCopy, hub))
		}
		spokeCopy := spoke.DeepCopy()
		if err := spoke.ConvertTo(&servingv1.AIInference{}); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(spoke, spokeCopy) {
			t.Fatalf("ConvertTo changed its source:\n%s", cmp.Diff(spokeCopy, spoke))
		}
	}
}

func typicalV1() *servingv1.AIInference {
	size := resource.MustParse("16Gi")
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "team-a", Annotations: map[string]string{"owner": "team-a"}},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name: "llama-3.1-8b-instruct",
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{
					Bucket: "models", Prefix: "llama-3.1-8b/", Endpoint: "http://minio.storage:9000",
					CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: "s3", AccessKeyIDKey: "AWS_ACCESS_KEY_ID", SecretAccessKeyKey: "AWS_SECRET_ACCESS_KEY"},
				}},
				Size: &size,
			},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM, Args: []string{"--max-model-len=8192"}},
			GPU:      servingv1.GPUSpec{Count: 2, Products: []string{"NVIDIA-H100-80GB-HBM3"}},
			Replicas: ptr.To[int32](2),
			Loading: servingv1.LoadingSpec{
				Timeout: &metav1.Duration{Duration: 30 * time.Minute}, MaxRetries: ptr.To[int32](3),
				Backoff: &metav1.Duration{Duration: 30 * time.Second},
			},
		},
	}
}

// An object that v1alpha1 can express whole converts without the annotation.
func TestExpressibleObjectNeedsNoAnnotation(t *testing.T) {
	spoke := &AIInference{}
	if err := spoke.ConvertFrom(typicalV1()); err != nil {
		t.Fatal(err)
	}
	want := AIInferenceSpec{
		ModelName: "llama-3.1-8b-instruct", ModelURI: "s3://models/llama-3.1-8b/", S3Endpoint: "http://minio.storage:9000",
		CredentialsSecret: "s3", ModelSize: ptr.To(resource.MustParse("16Gi")), Engine: "vLLM",
		EngineArgs: []string{"--max-model-len=8192"}, GPUs: 2, GPUProduct: "NVIDIA-H100-80GB-HBM3", Replicas: ptr.To[int32](2),
		LoadTimeoutSeconds: ptr.To[int32](1800), MaxRetries: ptr.To[int32](3), RetryBackoffSeconds: ptr.To[int32](30),
	}
	if !equality.Semantic.DeepEqual(spoke.Spec, want) {
		t.Errorf("v1alpha1 spec (-want +got):\n%s", cmp.Diff(want, spoke.Spec))
	}
	if diff := cmp.Diff(map[string]string{"owner": "team-a"}, spoke.Annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
}

// What v1alpha1 cannot express rides in the annotation, and an edit made in
// v1alpha1 wins over the saved value it contradicts.
func TestEditsInV1Alpha1WinOverSavedFields(t *testing.T) {
	hub := typicalV1()
	hub.Spec.GPU.Products = []string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}
	hub.Spec.Loading.Timeout = &metav1.Duration{Duration: 90*time.Second + 500*time.Millisecond}
	hub.Spec.Model.Source.S3.Region = "eu-west-1"
	hub.Spec.Engine.Port = 9000

	spoke := &AIInference{}
	if err := spoke.ConvertFrom(hub); err != nil {
		t.Fatal(err)
	}
	if _, ok := spoke.Annotations[AnnotationV1Fields]; !ok {
		t.Fatalf("no %s annotation on %v", AnnotationV1Fields, spoke.Annotations)
	}
	if spoke.Spec.GPUProduct != "NVIDIA-H100-80GB-HBM3" || *spoke.Spec.LoadTimeoutSeconds != 90 {
		t.Fatalf("gpuProduct %q, loadTimeoutSeconds %d", spoke.Spec.GPUProduct, *spoke.Spec.LoadTimeoutSeconds)
	}

	// A v1alpha1 user changes the GPU, the timeout and the bucket.
	spoke.Spec.GPUProduct = "NVIDIA-L4"
	spoke.Spec.LoadTimeoutSeconds = ptr.To[int32](600)
	spoke.Spec.ModelURI = "s3://other/llama/"
	back := &servingv1.AIInference{}
	if err := spoke.ConvertTo(back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"NVIDIA-L4"}, back.Spec.GPU.Products); diff != "" {
		t.Errorf("products (-want +got):\n%s", diff)
	}
	if back.Spec.Loading.Timeout.Duration != 10*time.Minute {
		t.Errorf("timeout %v, want 10m", back.Spec.Loading.Timeout.Duration)
	}
	if s3 := back.Spec.Model.Source.S3; s3.Bucket != "other" || s3.Prefix != "llama/" || s3.Region != "" {
		t.Errorf("source %+v: want bucket other, prefix llama/, the saved region dropped with the old bucket", s3)
	}
	// Fields v1alpha1 has no say in come back as they were.
	if back.Spec.Engine.Port != 9000 {
		t.Errorf("engine port %d, want 9000", back.Spec.Engine.Port)
	}
	if _, ok := back.Annotations[AnnotationV1Fields]; ok {
		t.Errorf("the conversion annotation was left on the v1 object: %v", back.Annotations)
	}
}

func TestURIsOfEverySource(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want servingv1.ModelSource
	}{
		{"s3://models/llama/", servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "llama/"}}},
		{"pvc://weights/llama", servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "weights", Path: "llama"}}},
		{"https://example.test/m.gguf", servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "https://example.test/m.gguf"}}},
	} {
		spoke := &AIInference{Spec: AIInferenceSpec{ModelURI: tc.uri}}
		hub := &servingv1.AIInference{}
		if err := spoke.ConvertTo(hub); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, hub.Spec.Model.Source); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.uri, diff)
		}
		if len(hub.Annotations) != 0 {
			t.Errorf("%s: unexpected annotations %v", tc.uri, hub.Annotations)
		}
	}
}

func TestEditedAnnotationIsAnError(t *testing.T) {
	spoke := &AIInference{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationV1Fields: "{not json"}}}
	if err := spoke.ConvertTo(&servingv1.AIInference{}); err == nil {
		t.Fatal("a corrupted conversion annotation converted without an error")
	}
}
