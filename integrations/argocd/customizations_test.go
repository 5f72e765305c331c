package argocd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The test files, in the form Argo CD's util/lua tests read them.
type healthTests struct {
	Tests []struct {
		InputPath    string       `json:"inputPath"`
		HealthStatus healthStatus `json:"healthStatus"`
	} `json:"tests"`
}

type actionTests struct {
	DiscoveryTests []struct {
		InputPath string           `json:"inputPath"`
		Result    []resourceAction `json:"result"`
	} `json:"discoveryTests"`
	ActionTests []struct {
		Action             string `json:"action"`
		InputPath          string `json:"inputPath"`
		ExpectedOutputPath string `json:"expectedOutputPath"`
	} `json:"actionTests"`
}

// scripts are a health check and actions, from the customization directory
// (as Argo CD runs them built in) or from the argocd-cm snippet.
type scripts struct {
	health string
	// healthOpenLibs: built-in health checks run with the standard libraries,
	// argocd-cm's without (useOpenLibs unset).
	healthOpenLibs bool
	discovery      string
	actions        map[string]string
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(mustRead(t, path)), into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// builtIn are the scripts of the customization directory.
func builtIn(t *testing.T) scripts {
	s := scripts{health: mustRead(t, filepath.Join(CustomizationDir, "health.lua")), healthOpenLibs: true,
		discovery: mustRead(t, filepath.Join(CustomizationDir, "actions", "discovery.lua")), actions: map[string]string{}}
	dirs, _ := filepath.Glob(filepath.Join(CustomizationDir, "actions", "*", "action.lua"))
	for _, d := range dirs {
		s.actions[filepath.Base(filepath.Dir(d))] = mustRead(t, d)
	}
	return s
}

// fromSnippet are the scripts as Argo CD reads them from argocd-cm.
func fromSnippet(t *testing.T, path string) scripts {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	readYAML(t, path, &cm)
	var actions struct {
		Discovery   string `json:"discovery.lua"`
		Definitions []struct {
			Name      string `json:"name"`
			ActionLua string `json:"action.lua"`
		} `json:"definitions"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data[ActionsKey]), &actions); err != nil {
		t.Fatalf("%s: %s: %v", path, ActionsKey, err)
	}
	s := scripts{health: cm.Data[HealthKey], discovery: actions.Discovery, actions: map[string]string{}}
	for _, d := range actions.Definitions {
		s.actions[d.Name] = d.ActionLua
	}
	if s.health == "" || s.discovery == "" || len(s.actions) == 0 {
		t.Fatalf("%s lacks a health check, a discovery or actions", path)
	}
	return s
}

func loadObject(t *testing.T, path string) map[string]any {
	t.Helper()
	obj := map[string]any{}
	readYAML(t, path, &obj)
	if obj["kind"] != "AIInference" {
		t.Fatalf("%s is not an AIInference", path)
	}
	return obj
}

func eachScripts(t *testing.T, run func(t *testing.T, s scripts)) {
	t.Run("built-in", func(t *testing.T) { run(t, builtIn(t)) })
	t.Run("argocd-cm", func(t *testing.T) { run(t, fromSnippet(t, "argocd-cm.yaml")) })
}

// TestHealth runs every case of health_test.yaml, with the script as Argo CD
// runs it built in (standard libraries open) and from argocd-cm (sandbox).
func TestHealth(t *testing.T) {
	var tests healthTests
	readYAML(t, filepath.Join(CustomizationDir, "health_test.yaml"), &tests)
	if len(tests.Tests) == 0 {
		t.Fatal("health_test.yaml has no tests")
	}
	eachScripts(t, func(t *testing.T, s scripts) {
		for _, tc := range tests.Tests {
			t.Run(tc.InputPath, func(t *testing.T) {
				got, err := health(loadObject(t, filepath.Join(CustomizationDir, tc.InputPath)), s.health, s.healthOpenLibs)
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.HealthStatus {
					t.Errorf("health\n got %+v\nwant %+v", got, tc.HealthStatus)
				}
			})
		}
	})
}

// TestHealthWithoutStatus: an object with no status at all (created under a
// CRD from before status.observedGeneration's default of -1, which the
// captures cannot give) is Progressing, as a new one is.
func TestHealthWithoutStatus(t *testing.T) {
	eachScripts(t, func(t *testing.T, s scripts) {
		obj := loadObject(t, filepath.Join(CustomizationDir, "testdata", "progressing_notObserved.yaml"))
		delete(obj, "status")
		got, err := health(obj, s.health, s.healthOpenLibs)
		if err != nil {
			t.Fatal(err)
		}
		want := healthStatus{Status: "Progressing", Message: "Waiting for the operator to observe the AIInference"}
		if got != want {
			t.Errorf("health\n got %+v\nwant %+v", got, want)
		}
	})
}

// TestEveryStateIsTested: each captured object has a health case, and every
// health Argo CD knows but Missing (Argo CD's own, for an absent object) is met.
func TestEveryStateIsTested(t *testing.T) {
	var tests healthTests
	readYAML(t, filepath.Join(CustomizationDir, "health_test.yaml"), &tests)
	tested, statuses := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		tested[tc.InputPath] = true
		statuses[tc.HealthStatus.Status] = true
	}
	files, _ := filepath.Glob(filepath.Join(CustomizationDir, "testdata", "*.yaml"))
	for _, f := range files {
		if rel := "testdata/" + filepath.Base(f); !tested[rel] {
			t.Errorf("%s has no case in health_test.yaml", rel)
		}
	}
	for _, s := range []string{"Healthy", "Progressing", "Degraded", "Suspended"} {
		if !statuses[s] {
			t.Errorf("no case of health %s", s)
		}
	}
}

// TestActionDiscovery runs every discovery case of action_test.yaml: the
// actions offered must be exactly those listed (Argo CD's own test only
// checks that each offered one is listed).
func TestActionDiscovery(t *testing.T) {
	var tests actionTests
	dir := filepath.Join(CustomizationDir, "actions")
	readYAML(t, filepath.Join(dir, "action_test.yaml"), &tests)
	eachScripts(t, func(t *testing.T, s scripts) {
		for _, tc := range tests.DiscoveryTests {
			t.Run(tc.InputPath, func(t *testing.T) {
				got, err := discover(loadObject(t, filepath.Join(dir, tc.InputPath)), s.discovery)
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]resourceAction{}
				for _, a := range tc.Result {
					want[a.Name] = a
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("actions\n got %+v\nwant %+v", sorted(got), sorted(want))
				}
				for name := range got {
					if s.actions[name] == "" {
						t.Errorf("discovery offers %s, which has no action.lua", name)
					}
				}
			})
		}
	})
}

func sorted(m map[string]resourceAction) []resourceAction {
	var l []resourceAction
	for _, a := range m {
		l = append(l, a)
	}
	sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
	return l
}

// stampedAnnotations take a new value per use; actions write the time.
var stampedAnnotations = []string{servingv1.AnnotationPromote, servingv1.AnnotationAbort, servingv1.AnnotationRequestedAt}

// Placeholder is what a stamped annotation written now reads as in testdata.
const Placeholder = "0001-01-01T00:00:00Z"

var utcStamp = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)

// normalize replaces the time an action stamped (a value it changed from the
// input's) with Placeholder, when it is a UTC RFC 3339 time; anything else
// stays and fails the comparison.
func normalize(obj, input map[string]any) {
	annotations, _ := annotationsOf(obj).(map[string]any)
	before, _ := annotationsOf(input).(map[string]any)
	for _, k := range stampedAnnotations {
		if v, ok := annotations[k].(string); ok && v != before[k] && utcStamp.MatchString(v) {
			annotations[k] = Placeholder
		}
	}
}

// TestActions runs every action case of action_test.yaml in the sandbox, and
// checks that the merge patch Argo CD would send touches only annotations.
func TestActions(t *testing.T) {
	var tests actionTests
	dir := filepath.Join(CustomizationDir, "actions")
	readYAML(t, filepath.Join(dir, "action_test.yaml"), &tests)
	if len(tests.ActionTests) == 0 {
		t.Fatal("action_test.yaml has no action tests")
	}
	eachScripts(t, func(t *testing.T, s scripts) {
		for _, tc := range tests.ActionTests {
			t.Run(tc.Action+"/"+tc.InputPath, func(t *testing.T) {
				in := loadObject(t, filepath.Join(dir, tc.InputPath))
				got, err := act(loadObject(t, filepath.Join(dir, tc.InputPath)), s.actions[tc.Action])
				if err != nil {
					t.Fatal(err)
				}
				expectOnlyAnnotationsChange(t, in, got)
				normalize(got, in)
				want := loadObject(t, filepath.Join(dir, tc.ExpectedOutputPath))
				if !reflect.DeepEqual(roundTrip(t, got), roundTrip(t, want)) {
					t.Errorf("%s wrote annotations %v, want %v", tc.Action, annotationsOf(got), annotationsOf(want))
				}
			})
		}
	})
}

// expectOnlyAnnotationsChange computes the merge patch from the live object to
// the action's, as Argo CD's API server does before sending it.
func expectOnlyAnnotationsChange(t *testing.T, live, changed map[string]any) {
	t.Helper()
	a, _ := json.Marshal(live)
	b, _ := json.Marshal(changed)
	patch, err := jsonpatch.CreateMergePatch(a, b)
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatal(err)
	}
	meta, _ := p["metadata"].(map[string]any)
	if _, ok := meta["annotations"]; len(p) != 1 || len(meta) != 1 || !ok {
		t.Errorf("the action changes more than metadata.annotations; Argo CD would send the merge patch %s", patch)
	}
}

func roundTrip(t *testing.T, obj map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func annotationsOf(obj map[string]any) any {
	meta, _ := obj["metadata"].(map[string]any)
	return meta["annotations"]
}

// TestSandbox: the runtime is Argo CD's sandbox, so a script that would fail
// there fails here: no string library, no global os, os only through require.
func TestSandbox(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"name": "x"}}
	for _, tc := range []struct {
		name, script string
		ok           bool
	}{
		{"os through require", `local os = require("os"); return {t = os.date("!%Y-%m-%dT%H:%M:%SZ")}`, true},
		{"global os", `return {t = os.date("!%Y")}`, false},
		{"string library", `return {t = string.format("%d", 1)}`, false},
		{"os.execute", `local os = require("os"); os.execute("true"); return {}`, false},
		{"io", `io.write("x"); return {}`, false},
		{"endless loop", `while true do end`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runLua(obj, tc.script, false)
			if (err == nil) != tc.ok {
				t.Errorf("ran: %v (%s), want it to run: %v", err, out, tc.ok)
			}
		})
	}
	out, err := runLua(obj, `local os = require("os"); return {t = os.date("!%Y-%m-%dT%H:%M:%SZ")}`, false)
	if err != nil || !utcStamp.MatchString(strings.Trim(strings.TrimPrefix(string(out), `{"t":`), `"}`)) {
		t.Errorf("os.date gave %s, %v; want a UTC RFC 3339 time", out, err)
	}
}

// TestSnippetIsFresh: the argocd-cm snippet, in integrations/argocd and in the
// chart, is what `make argocd-cm` makes of the scripts now.
func TestSnippetIsFresh(t *testing.T) {
	want, err := Snippet(CustomizationDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"argocd-cm.yaml", filepath.Join("..", "..", "charts", "aiinference-operator", "files", "argocd-cm.yaml")} {
		if got := mustRead(t, path); got != string(want) {
			t.Errorf("%s is stale: run make argocd-cm", path)
		}
	}
	// The scripts come back out of the YAML byte for byte.
	s, b := fromSnippet(t, "argocd-cm.yaml"), builtIn(t)
	if s.health != b.health || s.discovery != b.discovery || !reflect.DeepEqual(s.actions, b.actions) {
		t.Error("the snippet's scripts differ from the files")
	}
}
