package localcluster

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var lwsRequire = regexp.MustCompile(`(?m)^\s*(?:require\s+)?sigs\.k8s\.io/lws (v\S+)`)

// The controller hack/tools/lws builds and the CRD and types the repository
// uses come from one sigs.k8s.io/lws version: a CRD of another version could
// lack a field the controller reads, or the reverse.
func TestTheLeaderWorkerSetControllerMatchesItsCRD(t *testing.T) {
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	version := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := lwsRequire.FindSubmatch(data)
		if m == nil {
			t.Fatalf("%s requires no sigs.k8s.io/lws", path)
		}
		return string(m[1])
	}
	repo, tool := version(filepath.Join(root, "go.mod")), version(filepath.Join(root, "hack", "tools", "lws", "go.mod"))
	if repo != tool {
		t.Errorf("go.mod requires sigs.k8s.io/lws %s and hack/tools/lws builds %s: make them one version", repo, tool)
	}
}
