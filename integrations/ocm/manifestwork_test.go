package ocm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/jsonpath"
	workv1 "open-cluster-management.io/api/work/v1"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/integrations/captured"
)

// The objects captured from the operator (CAPTURE=1 in integrations/argocd).

// feedbackNames are the status fields a hub reads, each a scalar.
var feedbackNames = []string{"readyReplicas", "replicas", "phase", "reason", "endpoint", "servingRevision", "observedGeneration"}

// loadWork reads manifestwork.yaml into OCM's own types (open-cluster-management.io/api
// v1.3.0 work/v1), refusing a field they do not have.
func loadWork(t *testing.T) *workv1.ManifestWork {
	t.Helper()
	b, err := os.ReadFile("manifestwork.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w := &workv1.ManifestWork{}
	if err := yaml.UnmarshalStrict(b, w); err != nil {
		t.Fatalf("manifestwork.yaml: %v", err)
	}
	return w
}

// theConfig is the ManifestWork's configuration of its AIInference.
func theConfig(t *testing.T, w *workv1.ManifestWork) workv1.ManifestConfigOption {
	t.Helper()
	for _, c := range w.Spec.ManifestConfigs {
		if c.ResourceIdentifier.Group == servingv1.GroupVersion.Group && c.ResourceIdentifier.Resource == "aiinferences" {
			return c
		}
	}
	t.Fatal("manifestwork.yaml has no manifestConfigs entry for serving.aiinference.io aiinferences")
	return workv1.ManifestConfigOption{}
}

// jsonPaths are the paths of the ManifestWork's JSONPaths feedback rules.
func jsonPaths(t *testing.T, c workv1.ManifestConfigOption) []workv1.JsonPath {
	t.Helper()
	var paths []workv1.JsonPath
	for _, r := range c.FeedbackRules {
		if r.Type != workv1.JSONPathsType {
			t.Errorf("feedback rule of type %s: only JSONPaths are meant here", r.Type)
		}
		paths = append(paths, r.JsonPaths...)
	}
	return paths
}

// TestManifestWorkShape: the ManifestWork decodes into OCM's types, carries
// a valid AIInference, and configures that very object.
func TestManifestWorkShape(t *testing.T) {
	w := loadWork(t)
	if w.APIVersion != workv1.GroupVersion.String() || w.Kind != "ManifestWork" {
		t.Errorf("%s %s, want %s ManifestWork", w.APIVersion, w.Kind, workv1.GroupVersion)
	}
	var inference *servingv1.AIInference
	for i, m := range w.Spec.Workload.Manifests {
		var meta metav1.TypeMeta
		if err := json.Unmarshal(m.Raw, &meta); err != nil {
			t.Fatalf("manifest %d: %v", i, err)
		}
		if meta.APIVersion != servingv1.GroupVersion.String() || meta.Kind != "AIInference" {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(m.Raw))
		dec.DisallowUnknownFields()
		inference = &servingv1.AIInference{}
		if err := dec.Decode(inference); err != nil {
			t.Fatalf("the AIInference manifest: %v", err)
		}
	}
	if inference == nil {
		t.Fatal("no AIInference among the manifests")
	}
	c := theConfig(t, w)
	if id := c.ResourceIdentifier; id.Namespace != inference.Namespace || id.Name != inference.Name {
		t.Errorf("manifestConfigs names %s/%s, the manifest is %s/%s", id.Namespace, id.Name, inference.Namespace, inference.Name)
	}
	var names []string
	for _, p := range jsonPaths(t, c) {
		names = append(names, p.Name)
		if p.Version != "" && p.Version != servingv1.GroupVersion.Version {
			t.Errorf("%s: version %s", p.Name, p.Version)
		}
		if p.Path != ".status."+p.Name {
			t.Errorf("%s reads %s, want .status.%s (the name a hub reads is the field's)", p.Name, p.Path, p.Name)
		}
	}
	if !reflect.DeepEqual(names, feedbackNames) {
		t.Errorf("feedback values %v, want %v", names, feedbackNames)
	}
	if len(c.ConditionRules) == 0 {
		t.Error("no condition rule")
	}
	for _, r := range c.ConditionRules {
		if r.Type != workv1.CelConditionExpressionsType || r.Condition == "" || len(r.CelExpressions) == 0 {
			t.Errorf("condition rule %+v: want type CEL, a condition and expressions", r)
		}
		if r.Condition == workv1.ManifestComplete {
			t.Errorf("condition %s stops OCM updating the manifest once True", r.Condition)
		}
	}
}

// feedbackValue evaluates a JSONPaths rule's path as OCM's work agent does
// (ocm pkg/work/spoke/statusfeedback, getValueByJsonPath): client-go's
// jsonpath, missing keys allowed, the path in braces. It returns the values
// found, and an error where the agent would refuse the value: one that is
// not an integer, a string or a boolean.
func feedbackValue(path workv1.JsonPath, obj *unstructured.Unstructured) ([]any, error) {
	j := jsonpath.New(path.Name).AllowMissingKeys(true)
	if err := j.Parse(fmt.Sprintf("{%s}", path.Path)); err != nil {
		return nil, fmt.Errorf("failed to parse json path %s of %s with error: %w", path.Path, path.Name, err)
	}
	results, err := j.FindResults(obj.UnstructuredContent())
	if err != nil {
		return nil, err
	}
	var values []any
	for _, r := range results {
		for _, v := range r {
			values = append(values, v.Interface())
		}
	}
	for _, v := range values {
		switch v.(type) {
		case int64, string, bool:
		default:
			return values, fmt.Errorf("the type %T of the value for %s is not found", v, path.Name)
		}
	}
	return values, nil
}

// TestFeedbackJSONPaths: on every captured object each path yields one
// scalar of the type OCM reports where the operator wrote the field, and
// nothing (no value reported) where it did not; the Ready object has all.
func TestFeedbackJSONPaths(t *testing.T) {
	paths := jsonPaths(t, theConfig(t, loadWork(t)))
	for _, name := range captured.Names(t) {
		t.Run(name, func(t *testing.T) {
			obj := captured.Object(t, name)
			var absent []string
			for _, p := range paths {
				values, err := feedbackValue(p, obj)
				if err != nil {
					t.Errorf("%s: %v", p.Name, err)
					continue
				}
				want, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", p.Name)
				switch {
				case !found && len(values) == 0:
					absent = append(absent, p.Name)
				case !found || len(values) != 1 || values[0] != want:
					t.Errorf("%s: %v, want exactly one value, %v", p.Name, values, want)
				}
			}
			if name == "healthy_ready.yaml" && len(absent) > 0 {
				t.Errorf("a Ready object reports no %v", absent)
			}
			if len(absent) > 0 {
				t.Logf("not reported (not in the status): %v", absent)
			}
		})
	}
}

// perCallLimit is the cost limit OCM's agent gives one expression
// (k8s.io/apiserver's celconfig.PerCallLimit).
const perCallLimit = 1000000

// celEnv is the CEL environment OCM's work agent evaluates condition rules
// in (ocm pkg/work/spoke/conditions: the variable object, then
// open-cluster-management.io/sdk-go's BaseEnvOpts and ConditionsLib), less
// what needs k8s.io/apiserver (its lists, regex, URL, quantity, IP, CIDR,
// format and semver libraries) and the hasConditions function: an
// expression that compiles here uses none of them, and means the same there.
func celEnv(t *testing.T, vars ...cel.EnvOption) *cel.Env {
	t.Helper()
	env, err := cel.NewEnv(append(vars, cel.OptionalTypes(), ext.Strings())...)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// condition evaluates a CEL condition rule as OCM's agent does: each
// expression compiled with object a dyn, all true is True, a false one is
// False, an error is False with reason ConditionRuleExpressionError; then
// the message from messageExpression (object and result), else message.
func condition(t *testing.T, rule workv1.ConditionRule, obj *unstructured.Unstructured) metav1.Condition {
	t.Helper()
	c := metav1.Condition{Type: rule.Condition, Status: metav1.ConditionTrue, Reason: workv1.ConditionRuleEvaluated}
	env := celEnv(t, cel.Variable("object", cel.DynType))
	for _, expr := range rule.CelExpressions {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			return metav1.Condition{Type: rule.Condition, Status: metav1.ConditionFalse, Reason: workv1.ConditionRuleExpressionError, Message: iss.Err().Error()}
		}
		prg, err := env.Program(ast, cel.CostLimit(perCallLimit))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.ContextEval(context.Background(), map[string]any{"object": obj.Object})
		if err != nil {
			return metav1.Condition{Type: rule.Condition, Status: metav1.ConditionFalse, Reason: workv1.ConditionRuleExpressionError, Message: err.Error()}
		}
		b, ok := out.Value().(bool)
		if !ok {
			return metav1.Condition{Type: rule.Condition, Status: metav1.ConditionFalse, Reason: workv1.ConditionRuleExpressionError,
				Message: fmt.Sprintf("expected bool result, got %T", out.Value())}
		}
		if !b {
			c.Status = metav1.ConditionFalse
			break
		}
	}
	c.Message = rule.Message
	if rule.MessageExpression != "" {
		env := celEnv(t, cel.Variable("object", cel.DynType), cel.Variable("result", cel.BoolType))
		ast, iss := env.Compile(rule.MessageExpression)
		if iss.Err() != nil {
			t.Fatalf("messageExpression: %v", iss.Err())
		}
		prg, err := env.Program(ast, cel.CostLimit(perCallLimit))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.ContextEval(context.Background(), map[string]any{"object": obj.Object, "result": c.Status == metav1.ConditionTrue})
		if err != nil {
			t.Errorf("messageExpression on %s: %v", obj.GetName(), err)
			return c
		}
		s, ok := out.Value().(string)
		if !ok {
			t.Errorf("messageExpression gives %T, not a string", out.Value())
		}
		if s != "" {
			c.Message = s
		}
	}
	return c
}

func readyMessage(obj *unstructured.Unstructured) string {
	conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conditions {
		if c := c.(map[string]any); c["type"] == "Ready" {
			return c["message"].(string)
		}
	}
	return ""
}

// TestConditionRule: the manifest's Ready is True only for the object Ready
// for its generation; its message is the operator's, or says what the hub
// waits for.
func TestConditionRule(t *testing.T) {
	rules := theConfig(t, loadWork(t)).ConditionRules
	var ready *workv1.ConditionRule
	for i := range rules {
		if rules[i].Condition == "Ready" {
			ready = &rules[i]
		}
	}
	if ready == nil {
		t.Fatal("no condition rule for Ready")
	}
	trueFor := map[string]bool{"healthy_ready.yaml": true}
	waiting := map[string]string{
		"progressing_notObserved.yaml":      "Waiting for the operator to observe generation 1",
		"progressing_generationBehind.yaml": "Waiting for the operator to observe generation 2",
	}
	for _, name := range captured.Names(t) {
		t.Run(name, func(t *testing.T) {
			obj := captured.Object(t, name)
			got := condition(t, *ready, obj)
			wantStatus := metav1.ConditionFalse
			if trueFor[name] {
				wantStatus = metav1.ConditionTrue
			}
			wantMessage := readyMessage(obj)
			if m, ok := waiting[name]; ok {
				wantMessage = m
			}
			if got.Status != wantStatus || got.Reason != workv1.ConditionRuleEvaluated || got.Message != wantMessage {
				t.Errorf("Ready %s (%s) %q, want %s (%s) %q", got.Status, got.Reason, got.Message, wantStatus, workv1.ConditionRuleEvaluated, wantMessage)
			}
		})
	}
	t.Run("no status", func(t *testing.T) {
		obj := captured.Object(t, "healthy_ready.yaml")
		delete(obj.Object, "status")
		got := condition(t, *ready, obj)
		if got.Status != metav1.ConditionFalse || got.Reason != workv1.ConditionRuleEvaluated {
			t.Errorf("Ready %s (%s) %q, want False (%s)", got.Status, got.Reason, got.Message, workv1.ConditionRuleEvaluated)
		}
	})
}

// TestDocsShowTheManifestConfigs: docs/multicluster.md shows the rules tested here.
func TestDocsShowTheManifestConfigs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/multicluster.md")
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.ReadFile("manifestwork.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(work), "  manifestConfigs:")
	if start < 0 || !strings.Contains(string(doc), string(work)[start:]) {
		t.Error("docs/multicluster.md does not show manifestwork.yaml's manifestConfigs as they are")
	}
}
