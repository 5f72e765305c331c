// Package captured reads the AIInference objects captured from the operator in
// each state (integrations/argocd/.../testdata, written by `make
// gitops-capture`) that the Argo CD, Flux, Karmada and OCM tests run against.
package captured

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Dir is the folder of the captured objects.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "argocd", "resource_customizations", "serving.aiinference.io", "AIInference", "testdata")
}

// Object reads a captured object as a dynamic client reads one from a
// cluster (integers are int64).
func Object(t testing.TB, name string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return u
}

// Names are the captured objects' file names.
func Names(t testing.TB) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(Dir(), "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no captured objects")
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	sort.Strings(names)
	return names
}
