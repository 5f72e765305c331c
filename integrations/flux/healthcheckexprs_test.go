package flux

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/aiinference/operator/integrations/captured"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The objects captured from the operator (CAPTURE=1 in integrations/argocd).

// kstatus's results, as Flux names them.
const (
	current    = "Current"
	inProgress = "InProgress"
	failed     = "Failed"
	// unknown: an expression could not be evaluated; Flux reports the error
	// and keeps waiting, until the Kustomization's timeout.
	unknown = "Unknown"
)

type healthCheckExprs struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Current    string `json:"current"`
	InProgress string `json:"inProgress"`
	Failed     string `json:"failed"`
}

func exampleExprs(t *testing.T) healthCheckExprs {
	t.Helper()
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Spec struct {
			HealthCheckExprs []healthCheckExprs `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	for _, e := range k.Spec.HealthCheckExprs {
		if e.APIVersion == "serving.aiinference.io/v1" && e.Kind == "AIInference" {
			return e
		}
	}
	t.Fatal("kustomization.yaml has no healthCheckExprs for serving.aiinference.io/v1 AIInference")
	return healthCheckExprs{}
}

// program parses an expression in the environment Flux gives them: parsed,
// not compiled (no declared variables: the object's top-level fields are the
// variables), with these options and extensions.
func program(t *testing.T, expr string) cel.Program {
	t.Helper()
	env, err := cel.NewEnv(
		cel.HomogeneousAggregateLiterals(),
		cel.EagerlyValidateDeclarations(true),
		cel.DefaultUTCTimeZone(true),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Sets(),
		ext.Encoders(),
	)
	if err != nil {
		t.Fatal(err)
	}
	ast, issues := env.Parse(expr)
	if issues != nil && issues.Err() != nil {
		t.Fatalf("parsing %q: %v", expr, issues.Err())
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.InterruptCheckFrequency(100))
	if err != nil {
		t.Fatal(err)
	}
	return prg
}

// evaluate is Flux's StatusEvaluator: an object whose status.observedGeneration
// differs from metadata.generation is in progress; then inProgress, failed
// and current in turn, the first true deciding; none true is in progress.
func evaluate(t *testing.T, e healthCheckExprs, obj map[string]any) (string, error) {
	u := &unstructured.Unstructured{Object: obj}
	if observed, ok, err := unstructured.NestedInt64(obj, "status", "observedGeneration"); err != nil {
		return "", err
	} else if ok && observed != u.GetGeneration() {
		return inProgress, nil
	}
	for _, step := range []struct{ expr, status string }{{e.InProgress, inProgress}, {e.Failed, failed}, {e.Current, current}} {
		if step.expr == "" {
			continue
		}
		val, _, err := program(t, step.expr).ContextEval(context.Background(), obj)
		if err != nil {
			return unknown, fmt.Errorf("failed to evaluate the CEL expression '%s': %w", step.expr, err)
		}
		b, ok := val.(types.Bool)
		if !ok {
			return unknown, fmt.Errorf("failed to evaluate CEL expression as boolean: '%s'", step.expr)
		}
		if b {
			return step.status, nil
		}
	}
	return inProgress, nil
}

// TestHealthCheckExprs evaluates the example against every captured state.
func TestHealthCheckExprs(t *testing.T) {
	e := exampleExprs(t)
	want := map[string]string{
		"progressing_notObserved.yaml":      inProgress, // status.observedGeneration -1
		"progressing_loading.yaml":          inProgress,
		"healthy_ready.yaml":                current,
		"progressing_generationBehind.yaml": inProgress, // Ready=True, but of generation 1
		"degraded_pvcNotFound.yaml":         failed,
		"degraded_loadFailed.yaml":          failed,
		"suspended_pauseStep.yaml":          inProgress,
		"progressing_canaryStep.yaml":       inProgress,
		"suspended_pausedByHand.yaml":       inProgress,
		"suspended_inconclusive.yaml":       inProgress, // Stalled, but waiting for promote or abort
		"degraded_rolledBack.yaml":          failed,
	}
	files := captured.Names(t)
	if len(files) != len(want) {
		t.Errorf("%d captured objects, %d expectations: give every captured state one", len(files), len(want))
	}
	for name, status := range want {
		t.Run(name, func(t *testing.T) {
			got, err := evaluate(t, e, captured.Object(t, name).Object)
			if got != status {
				t.Errorf("%s (error: %v), want %s", got, err, status)
			}
			if got == unknown {
				t.Logf("as Flux reports it: %v", err)
			}
		})
	}
}

// TestNewObjectIsNeverCurrent: an object the operator has not seen is never
// Current. The CRD defaults status.observedGeneration to -1, as Flux's own
// kinds do, so Flux's generation check holds a new object InProgress before
// any expression runs. Under a CRD from before that default a new object had
// no status at all, and the expressions cannot be evaluated on it (CEL cannot
// test a missing top-level field: has(status) is not allowed), which Flux
// reports as an error and counts as not ready until its timeout.
func TestNewObjectIsNeverCurrent(t *testing.T) {
	e := exampleExprs(t)
	obj := captured.Object(t, "progressing_notObserved.yaml").Object
	if observed, ok, _ := unstructured.NestedInt64(obj, "status", "observedGeneration"); !ok || observed != -1 {
		t.Fatalf("the captured new object reads status.observedGeneration %d (set: %v); want -1, the CRD's default", observed, ok)
	}
	if got, err := evaluate(t, e, obj); got != inProgress || err != nil {
		t.Errorf("status.observedGeneration -1: %s, %v; want InProgress", got, err)
	}
	delete(obj, "status")
	got, err := evaluate(t, e, obj)
	if got == current || err == nil || !strings.Contains(err.Error(), "no such attribute") {
		t.Errorf("no status: %s, %v; want an evaluation error (Flux waits)", got, err)
	}
}

// TestDocsShowTheExample: docs/gitops.md shows the expressions tested here.
func TestDocsShowTheExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/gitops.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(example), "  healthCheckExprs:")
	if start < 0 || !strings.Contains(string(doc), string(example)[start:]) {
		t.Error("docs/gitops.md does not show kustomization.yaml's healthCheckExprs as they are")
	}
}

// TestCurrentNeedsReadyTrue: the operator never leaves Ready False without
// Reconciling or Stalled (kstatus), so no captured object reaches current's
// test of Ready's status; this one is the captured Ready object with Ready
// turned False in memory, and must not be Current.
func TestCurrentNeedsReadyTrue(t *testing.T) {
	obj := captured.Object(t, "healthy_ready.yaml").Object
	conditions, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conditions {
		if c := c.(map[string]any); c["type"] == "Ready" {
			c["status"] = "False"
		}
	}
	if err := unstructured.SetNestedSlice(obj, conditions, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if got, err := evaluate(t, exampleExprs(t), obj); got != inProgress {
		t.Errorf("Ready=False: %s, %v; want InProgress", got, err)
	}
}
