package reasons

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// reasonConstants are the string constants named Reason* in a Go file.
func reasonConstants(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range spec.Names {
			if strings.HasPrefix(name.Name, "Reason") && i < len(spec.Values) {
				if lit, ok := spec.Values[i].(*ast.BasicLit); ok {
					v, _ := strconv.Unquote(lit.Value)
					values = append(values, v)
				}
			}
		}
		return true
	})
	return values
}

// TestEveryReasonIsExplainedAndDocumented: each reason of api/v1 and of the
// loader is in the table (what it means, what to do, its event type, whether its
// cause is watched, its hint) and has a row in docs/failure-reasons.md.
func TestEveryReasonIsExplainedAndDocumented(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "failure-reasons.md"))
	if err != nil {
		t.Fatal(err)
	}
	apiFiles, err := filepath.Glob(filepath.Join(root, "api", "v1", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, f := range append(apiFiles, filepath.Join(root, "internal", "loadspec", "loadspec.go")) {
		if !strings.HasSuffix(f, "_test.go") {
			all = append(all, reasonConstants(t, f)...)
		}
	}
	if len(all) < 30 {
		t.Fatalf("found only %d reasons", len(all))
	}
	for _, r := range append(all, "OOMKilled") {
		e, ok := byReason[r]
		if !ok {
			t.Errorf("reason %s has no explanation", r)
			continue
		}
		if e.Meaning == "" || (e.Warning && e.Fix == "") {
			t.Errorf("reason %s: explanation lacks its meaning or fix: %+v", r, e)
		}
		if !strings.Contains(string(doc), "| `"+r+"` |") {
			t.Errorf("docs/failure-reasons.md has no row for %s", r)
		}
	}
	if e := Explain("LoaderExit3"); e.Fix == "" {
		t.Error("an unknown loader exit gets no fix")
	}
}

// TestDocMatchesTable: the doc's table is the one this package generates, so the
// plugin and the docs say the same.
func TestDocMatchesTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "failure-reasons.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), MarkdownTable()) {
		t.Errorf("docs/failure-reasons.md's table differs from reasons.MarkdownTable(); regenerate it with go run ./internal/reasons/gen")
	}
}
