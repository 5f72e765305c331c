package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAPIReferenceIsCurrent: docs/api-reference.md is what the generator makes
// of the CRD in the tree, so a change of the types (make manifests) that is not
// followed by make api-docs fails here.
func TestAPIReferenceIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := renderFile(root, defaultCRD)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, defaultOut))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gotLines), len(wantLines)) {
			var g, w string
			if i < len(gotLines) {
				g = gotLines[i]
			}
			if i < len(wantLines) {
				w = wantLines[i]
			}
			if g != w {
				t.Fatalf("%s is stale (run make api-docs); first difference at line %d:\n  file:      %q\n  generated: %q", defaultOut, i+1, g, w)
			}
		}
	}
}

// TestRenderCoversTheSchema: every field of the v1 schema appears in the
// reference, and every CEL rule's message.
func TestRenderCoversTheSchema(t *testing.T) {
	doc, err := renderFile(filepath.Join("..", ".."), defaultCRD)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### v1 `.spec.model.source.s3`",
		"- **`bucket`** (string, required, 3 to 63 characters)",
		"- **`maxRetries`** (integer (int32), default `3`, 0 to 100)",
		"- **`type`** (string, required, one of `vLLM`, `TGI`, `Triton`, `Ollama`)",
		"“model.source must set exactly one of s3, pvc, http, huggingface or oci”",
		"A Kubernetes `core/v1 Toleration`",
		"(duration, e.g. `30s`, default `\"30m\"`)",
		"[`.spec.rollout.canary.steps[]`](#v1-specrolloutcanarysteps)",
		"### v1 `.spec.rollout.canary.steps[]`",
	} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}
