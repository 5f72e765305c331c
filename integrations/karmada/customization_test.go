package karmada

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/integrations/captured"
)

// The objects captured from the operator (CAPTURE=1 in integrations/argocd).

// templateGenerationAnnotation is what Karmada stamps on a member's object:
// the generation of the resource template it was made from.
const templateGenerationAnnotation = "resourcetemplate.karmada.io/generation"

// customization mirrors Karmada's config/v1alpha1 ResourceInterpreterCustomization
// for the fields it has, so that a strict decode refuses a misspelt one.
type customization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Target struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		} `json:"target"`
		Customizations struct {
			Retention                *luaScript `json:"retention,omitempty"`
			ReplicaResource          *luaScript `json:"replicaResource,omitempty"`
			ComponentResource        *luaScript `json:"componentResource,omitempty"`
			ReplicaRevision          *luaScript `json:"replicaRevision,omitempty"`
			StatusReflection         *luaScript `json:"statusReflection,omitempty"`
			StatusAggregation        *luaScript `json:"statusAggregation,omitempty"`
			HealthInterpretation     *luaScript `json:"healthInterpretation,omitempty"`
			DependencyInterpretation *luaScript `json:"dependencyInterpretation,omitempty"`
		} `json:"customizations"`
	} `json:"spec"`
}

type luaScript struct {
	LuaScript string `json:"luaScript"`
}

func loadCustomization(t *testing.T) customization {
	t.Helper()
	b, err := os.ReadFile("resourceinterpretercustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c customization
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("resourceinterpretercustomization.yaml: %v", err)
	}
	return c
}

// scripts are the five scripts, by the function each defines.
func scripts(t *testing.T) map[string]string {
	t.Helper()
	c := loadCustomization(t).Spec.Customizations
	s := map[string]string{}
	for fn, l := range map[string]*luaScript{"GetReplicas": c.ReplicaResource, "ReviseReplica": c.ReplicaRevision,
		"ReflectStatus": c.StatusReflection, "AggregateStatus": c.StatusAggregation, "InterpretHealth": c.HealthInterpretation} {
		if l == nil || l.LuaScript == "" {
			t.Fatalf("no script defines %s", fn)
		}
		s[fn] = l.LuaScript
	}
	return s
}

// typed is the object as the operator's types read it.
func typed(t *testing.T, u *unstructured.Unstructured) *servingv1.AIInference {
	t.Helper()
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	o := &servingv1.AIInference{}
	if err := json.Unmarshal(b, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestCustomizationTargetsAIInference(t *testing.T) {
	c := loadCustomization(t)
	if c.APIVersion != "config.karmada.io/v1alpha1" || c.Kind != "ResourceInterpreterCustomization" {
		t.Errorf("%s %s, want config.karmada.io/v1alpha1 ResourceInterpreterCustomization", c.APIVersion, c.Kind)
	}
	if want := servingv1.GroupVersion.String(); c.Spec.Target.APIVersion != want || c.Spec.Target.Kind != "AIInference" {
		t.Errorf("target %s %s, want %s AIInference", c.Spec.Target.APIVersion, c.Spec.Target.Kind, want)
	}
	for fn, script := range scripts(t) {
		if !strings.Contains(script, "function "+fn+"(") {
			t.Errorf("the script for %s does not define it", fn)
		}
	}
}

// TestGetReplicas: the replicas of each captured object, and what each
// replica needs: its GPUs, a node with one of its GPU products, the GPU
// taint's toleration; and, on a variant, the engine's requests, the node
// selector and the user's tolerations; no requirement on CPU with none.
func TestGetReplicas(t *testing.T) {
	script := scripts(t)["GetReplicas"]
	gpuToleration := corev1.Toleration{Key: string(servingv1.GPUResource), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	for _, name := range captured.Names(t) {
		t.Run(name, func(t *testing.T) {
			obj := captured.Object(t, name)
			o := typed(t, obj)
			replicas, req, err := getReplicas(script, obj)
			if err != nil {
				t.Fatal(err)
			}
			if replicas != o.DesiredReplicas() {
				t.Errorf("replicas %d, want %d", replicas, o.DesiredReplicas())
			}
			want := &replicaRequirements{
				ResourceRequest: corev1.ResourceList{servingv1.GPUResource: *resource.NewQuantity(int64(o.Spec.GPU.Count), resource.DecimalSI)},
				NodeClaim: &nodeClaim{Tolerations: []corev1.Toleration{gpuToleration},
					HardNodeAffinity: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: servingv1.GPUProductLabel, Operator: corev1.NodeSelectorOpIn, Values: o.Spec.GPU.Products}}}}}},
			}
			if !equality.Semantic.DeepEqual(req, want) {
				t.Errorf("requirements\n got %s\nwant %s", jsonOf(t, req), jsonOf(t, want))
			}
		})
	}

	t.Run("requests, node selector and tolerations", func(t *testing.T) {
		obj := captured.Object(t, "healthy_ready.yaml")
		spec := obj.Object["spec"].(map[string]any)
		spec["replicas"] = int64(4)
		spec["gpu"] = map[string]any{"count": int64(2)}
		spec["resources"] = map[string]any{"requests": map[string]any{"cpu": "4", "memory": "32Gi"}, "limits": map[string]any{"memory": "64Gi"}}
		spec["nodeSelector"] = map[string]any{"pool": "inference"}
		spec["tolerations"] = []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}}
		replicas, req, err := getReplicas(script, obj)
		if err != nil {
			t.Fatal(err)
		}
		want := &replicaRequirements{
			ResourceRequest: corev1.ResourceList{servingv1.GPUResource: resource.MustParse("2"),
				corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("32Gi")},
			NodeClaim: &nodeClaim{NodeSelector: map[string]string{"pool": "inference"}, Tolerations: []corev1.Toleration{gpuToleration,
				{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "ml", Effect: corev1.TaintEffectNoSchedule}}},
		}
		if replicas != 4 || !equality.Semantic.DeepEqual(req, want) {
			t.Errorf("%d replicas, requirements\n got %s\nwant 4, %s", replicas, jsonOf(t, req), jsonOf(t, want))
		}
	})

	t.Run("on CPU, nothing asked", func(t *testing.T) {
		obj := captured.Object(t, "healthy_ready.yaml")
		spec := obj.Object["spec"].(map[string]any)
		delete(spec, "replicas")
		spec["gpu"] = map[string]any{}
		spec["resources"] = map[string]any{}
		replicas, req, err := getReplicas(script, obj)
		if err != nil {
			t.Fatal(err)
		}
		if replicas != servingv1.DefaultReplicas || req != nil {
			t.Errorf("%d replicas, requirements %s; want %d and none", replicas, jsonOf(t, req), servingv1.DefaultReplicas)
		}
	})
}

// TestReviseReplica: a member's share changes spec.replicas and nothing
// else, empty maps (spec.resources, a canary's pause step) included.
func TestReviseReplica(t *testing.T) {
	script := scripts(t)["ReviseReplica"]
	for _, name := range captured.Names(t) {
		t.Run(name, func(t *testing.T) {
			obj := captured.Object(t, name)
			got, err := reviseReplica(script, obj.DeepCopy(), 3)
			if err != nil {
				t.Fatal(err)
			}
			want := obj.DeepCopy()
			if err := unstructured.SetNestedField(want.Object, int64(3), "spec", "replicas"); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Object, want.Object) {
				t.Errorf("revised\n got %s\nwant %s", jsonOf(t, got.Object["spec"]), jsonOf(t, want.Object["spec"]))
			}
		})
	}
}

// reflectedKeys are all ReflectStatus may copy.
var reflectedKeys = []string{"observedGeneration", "replicas", "readyReplicas", "updatedReplicas", "phase", "reason",
	"endpoint", "servingRevision", "conditions", "generation", "resourceTemplateGeneration"}

// TestReflectStatus: each member's flat scalars and Ready condition as the
// operator wrote them, and the generations the aggregation compares.
func TestReflectStatus(t *testing.T) {
	script := scripts(t)["ReflectStatus"]
	for _, name := range captured.Names(t) {
		t.Run(name, func(t *testing.T) {
			obj := captured.Object(t, name)
			annotations := obj.GetAnnotations()
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[templateGenerationAnnotation] = "7"
			obj.SetAnnotations(annotations)
			got, err := reflectStatus(script, obj)
			if err != nil {
				t.Fatal(err)
			}
			status, _, _ := unstructured.NestedMap(obj.Object, "status")
			want := map[string]any{"generation": float64(obj.GetGeneration()), "resourceTemplateGeneration": float64(7)}
			for _, k := range []string{"observedGeneration", "replicas", "readyReplicas", "updatedReplicas", "phase", "reason", "endpoint", "servingRevision"} {
				if v, ok := status[k]; ok {
					want[k] = v
				}
			}
			conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
			for _, c := range conditions {
				if c.(map[string]any)["type"] == "Ready" {
					want["conditions"] = []any{c}
				}
			}
			if !reflect.DeepEqual(roundTrip(t, got), roundTrip(t, want)) {
				t.Errorf("reflected\n got %s\nwant %s", jsonOf(t, got), jsonOf(t, want))
			}
			for k := range got {
				if !slices.Contains(reflectedKeys, k) {
					t.Errorf("reflected %s, which a hub does not read", k)
				}
			}
		})
	}
	t.Run("no status", func(t *testing.T) {
		obj := captured.Object(t, "progressing_notObserved.yaml")
		delete(obj.Object, "status")
		got, err := reflectStatus(script, obj)
		if err != nil || len(got) != 0 {
			t.Errorf("reflected %v, %v; want {}", got, err)
		}
	})
}

// member is a captured object as a member cluster holds it: made from the
// template of templateGeneration, its status reflected as Karmada reflects it.
func member(t *testing.T, cluster, name string, templateGeneration int64) aggregatedStatusItem {
	t.Helper()
	obj := captured.Object(t, name)
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[templateGenerationAnnotation] = jsonOf(t, templateGeneration)
	obj.SetAnnotations(annotations)
	status, err := reflectStatus(scripts(t)["ReflectStatus"], obj)
	if err != nil {
		t.Fatal(err)
	}
	healthy, err := interpretHealth(scripts(t)["InterpretHealth"], obj)
	if err != nil {
		t.Fatal(err)
	}
	health := "Unhealthy"
	if healthy {
		health = "Healthy"
	}
	return aggregatedStatusItem{ClusterName: cluster, Status: json.RawMessage(jsonOf(t, status)), Applied: true, Health: health}
}

// TestAggregateStatus: the template's status on the Karmada control plane
// from its members'. The template is a new object (status.observedGeneration
// -1), of generation 1.
func TestAggregateStatus(t *testing.T) {
	script := scripts(t)["AggregateStatus"]
	type want struct {
		replicas, ready, updated int64
		phase, reason            string
		readyStatus              string
		messagePrefix            string
		observedGeneration       int64
		servingRevision          string
		endpoint                 string
	}
	for _, tc := range []struct {
		name    string
		members []aggregatedStatusItem
		want    want
	}{{
		name:    "ready in both",
		members: []aggregatedStatusItem{member(t, "east", "healthy_ready.yaml", 1), member(t, "west", "healthy_ready.yaml", 1)},
		want: want{replicas: 2, ready: 2, updated: 2, phase: "Ready", reason: "Ready", readyStatus: "True",
			messagePrefix: "2 of 2 replicas are ready in 2 member clusters", observedGeneration: 1,
			servingRevision: "166e01da0d1630c9", endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name:    "one loading",
		members: []aggregatedStatusItem{member(t, "east", "healthy_ready.yaml", 1), member(t, "west", "progressing_loading.yaml", 1)},
		want: want{replicas: 1, ready: 1, updated: 1, phase: "Loading", reason: "Loading", readyStatus: "False",
			messagePrefix: "west: 0 of 1 replicas run the current spec", observedGeneration: 1, endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name:    "one failed, one loading: the worst",
		members: []aggregatedStatusItem{member(t, "east", "progressing_loading.yaml", 1), member(t, "west", "degraded_loadFailed.yaml", 1), member(t, "north", "healthy_ready.yaml", 1)},
		want: want{replicas: 1, ready: 1, updated: 1, phase: "Failed", reason: "LoadFailed", readyStatus: "False",
			messagePrefix: "west: Loads stopped", observedGeneration: 1, endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name:    "a canary paused in one",
		members: []aggregatedStatusItem{member(t, "east", "healthy_ready.yaml", 1), member(t, "west", "suspended_pauseStep.yaml", 1)},
		want: want{replicas: 3, ready: 3, updated: 2, phase: "Canary", reason: "CanaryPaused", readyStatus: "False",
			messagePrefix: "west: Canary revision", observedGeneration: 1, endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name:    "one not yet observed by its operator",
		members: []aggregatedStatusItem{member(t, "east", "healthy_ready.yaml", 1), member(t, "west", "progressing_notObserved.yaml", 1)},
		want: want{replicas: 1, ready: 1, updated: 1, phase: "Pending", reason: "NotObserved", readyStatus: "False",
			messagePrefix: "west: waiting for the operator", observedGeneration: -1, endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name:    "one still made from an earlier template",
		members: []aggregatedStatusItem{member(t, "east", "healthy_ready.yaml", 1), member(t, "west", "healthy_ready.yaml", 0)},
		want: want{replicas: 2, ready: 2, updated: 2, phase: "Pending", reason: "NotObserved", readyStatus: "False",
			messagePrefix: "west: waiting for the operator", observedGeneration: -1,
			servingRevision: "166e01da0d1630c9", endpoint: "http://llama-chat.models.svc:8000"},
	}, {
		name: "not propagated",
		want: want{phase: "Pending", reason: "NotPropagated", readyStatus: "False", messagePrefix: "No member cluster", observedGeneration: -1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			template := captured.Object(t, "progressing_notObserved.yaml")
			got, err := aggregateStatus(script, template.DeepCopy(), tc.members)
			if err != nil {
				t.Fatal(err)
			}
			// Karmada converts AggregateStatus's result without references,
			// so the empty maps of the spec (spec.resources: {}) are dropped
			// from it; it writes only the status subresource, so that is
			// harmless. Anything else changed outside status is not.
			for _, part := range []string{"apiVersion", "kind", "metadata", "spec"} {
				if !reflect.DeepEqual(withoutEmpty(roundTrip(t, got.Object[part])), withoutEmpty(roundTrip(t, template.Object[part]))) {
					t.Errorf("AggregateStatus changed %s", part)
				}
			}
			st := aggregatedStatus(t, got)
			ready := readyCondition(st)
			if ready == nil {
				t.Fatalf("no Ready condition in %s", jsonOf(t, st))
			}
			g := want{replicas: int64(st.Replicas), ready: int64(st.ReadyReplicas), updated: int64(st.UpdatedReplicas), phase: string(st.Phase),
				reason: st.Reason, readyStatus: string(ready.Status), observedGeneration: st.ObservedGeneration,
				servingRevision: st.ServingRevision, endpoint: st.Endpoint}
			if strings.HasPrefix(ready.Message, tc.want.messagePrefix) {
				g.messagePrefix = tc.want.messagePrefix
			}
			if g != tc.want {
				t.Errorf("aggregated\n got %+v\nwant %+v\n(message %q)", g, tc.want, ready.Message)
			}
			if ready.Reason != st.Reason {
				t.Errorf("status.reason %s, Ready's %s", st.Reason, ready.Reason)
			}
		})
	}
}

// aggregatedStatus reads the status AggregateStatus wrote as the CRD and the
// operator's types take it: no field they do not know, conditions valid for
// metav1.Condition (Karmada writes it to the template's status subresource).
func aggregatedStatus(t *testing.T, u *unstructured.Unstructured) servingv1.AIInferenceStatus {
	t.Helper()
	b, err := json.Marshal(u.Object["status"])
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var st servingv1.AIInferenceStatus
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("aggregated status %s: %v", b, err)
	}
	if errs := metav1validation.ValidateConditions(st.Conditions, field.NewPath("status", "conditions")); len(errs) > 0 {
		t.Errorf("aggregated conditions: %v", errs.ToAggregate())
	}
	return st
}

func readyCondition(st servingv1.AIInferenceStatus) *struct {
	Status, Reason, Message string
} {
	for _, c := range st.Conditions {
		if c.Type == servingv1.ConditionReady {
			return &struct{ Status, Reason, Message string }{string(c.Status), c.Reason, c.Message}
		}
	}
	return nil
}

// TestInterpretHealth: healthy when Ready is True for the current
// generation, or while a canary runs and the stable pods serve.
func TestInterpretHealth(t *testing.T) {
	script := scripts(t)["InterpretHealth"]
	want := map[string]bool{
		"healthy_ready.yaml":                true,
		"progressing_notObserved.yaml":      false,
		"progressing_loading.yaml":          false,
		"progressing_generationBehind.yaml": false, // Ready True, of generation 1
		"degraded_pvcNotFound.yaml":         false,
		"degraded_loadFailed.yaml":          false,
		"degraded_rolledBack.yaml":          false, // the stable pods serve, but the new spec does not run
		"suspended_pauseStep.yaml":          true,  // a canary, the stable pods serving
		"progressing_canaryStep.yaml":       true,
		"suspended_pausedByHand.yaml":       true,
		"suspended_inconclusive.yaml":       true,
	}
	names := captured.Names(t)
	if len(names) != len(want) {
		t.Errorf("%d captured objects, %d expectations: give every captured state one", len(names), len(want))
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			got, err := interpretHealth(script, captured.Object(t, name))
			if err != nil {
				t.Fatal(err)
			}
			if w, ok := want[name]; !ok || got != w {
				t.Errorf("healthy %v, want %v (listed: %v)", got, w, ok)
			}
		})
	}
	t.Run("no status", func(t *testing.T) {
		obj := captured.Object(t, "healthy_ready.yaml")
		delete(obj.Object, "status")
		if got, err := interpretHealth(script, obj); got || err != nil {
			t.Errorf("healthy %v, %v; want false", got, err)
		}
	})
}

// TestSandbox: the stand-in refuses what Karmada's VM refuses, and the
// scripts need nothing it leaves out.
func TestSandbox(t *testing.T) {
	for name, script := range map[string]string{
		"a disabled base function": `function F() return setmetatable({}, {}) end`,
		"os":                       `function F() return os.time() end`,
		"io":                       `function F() return io.open("/etc/passwd") end`,
		"require from a file":      `function F() return require("strict") end`,
		"a script past a second":   `function F() while true do end end`,
	} {
		if _, err := runScript(script, "F", 1); err == nil {
			t.Errorf("%s: ran; Karmada's VM refuses it", name)
		}
	}
	if _, err := runScript(`function F() return string.upper(tostring(math.floor(1.5))) .. table.concat({"a"}) end`, "F", 1); err != nil {
		t.Errorf("string, math and table are open in Karmada's VM: %v", err)
	}
	for fn, script := range scripts(t) {
		for _, word := range []string{"require(", "require \"", "os.", "kube."} {
			if strings.Contains(script, word) {
				t.Errorf("%s uses %s, which this stand-in does not provide", fn, word)
			}
		}
	}
	if _, err := runScript(`function F() return nil end`, "G", 1); !errorContains(err, "not found function") {
		t.Errorf("calling a function the script lacks: %v", err)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withoutEmpty is v less its empty maps and lists.
func withoutEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, item := range x {
			item = withoutEmpty(item)
			if m, ok := item.(map[string]any); ok && len(m) == 0 {
				continue
			}
			if l, ok := item.([]any); ok && len(l) == 0 {
				continue
			}
			out[k] = item
		}
		return out
	case []any:
		out := make([]any, 0, len(x))
		for _, item := range x {
			out = append(out, withoutEmpty(item))
		}
		return out
	}
	return v
}

// roundTrip makes numbers comparable: through JSON, all are float64.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	var out any
	if err := json.Unmarshal([]byte(jsonOf(t, v)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}
