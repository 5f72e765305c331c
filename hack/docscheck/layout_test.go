package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// layoutSection is README.md's "Layout" section.
func layoutSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "\n## Layout\n")
	if start < 0 {
		t.Fatal("README.md has no Layout section")
	}
	section := readme[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	return section
}

// names says whether the layout names path, as `path` or `path/`.
func names(layout, path string) bool {
	return strings.Contains(layout, "`"+path+"`") || strings.Contains(layout, "`"+path+"/`")
}

// TestReadmeLayoutNamesEveryPackage: README's Layout names every Go package of
// the repository and every file of the controller package, so that a reader
// finds each where the layout says. (hack/tools/ holds the pinned tool modules,
// named as a whole.)
func TestReadmeLayoutNamesEveryPackage(t *testing.T) {
	layout := layoutSection(t)
	packages := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || rel == "hack/tools" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && rel != filepath.Base(rel) {
			packages[filepath.ToSlash(filepath.Dir(rel))] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(packages) < 30 {
		t.Fatalf("found only %d packages", len(packages))
	}
	for pkg := range packages {
		if !names(layout, pkg) {
			t.Errorf("README.md's Layout does not name the package %s/", pkg)
		}
	}
	controllerDir := filepath.Join(root, "internal", "controller", "aiinference")
	files, err := filepath.Glob(filepath.Join(controllerDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if name := filepath.Base(f); !strings.HasSuffix(name, "_test.go") && !strings.Contains(layout, "`"+name+"`") {
			t.Errorf("README.md's Layout does not name the controller's file %s", name)
		}
	}
}
