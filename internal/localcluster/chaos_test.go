package localcluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

func TestInitContainerFailureApply(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{"app": "x"},
		Annotations: map[string]string{InitContainerFailureReasonAnnotation: "Old", "keep": "me"},
	}}
	InitContainerFailure{Container: "loader", ExitCode: 20, Message: "download failed: 403 Forbidden", Delay: 2 * time.Second}.Apply(pod)

	if got := pod.Labels[InitContainerFailureLabel]; got != "true" {
		t.Errorf("label = %q, want true", got)
	}
	if pod.Labels["app"] != "x" || pod.Annotations["keep"] != "me" {
		t.Errorf("other labels or annotations lost: %v %v", pod.Labels, pod.Annotations)
	}
	want := map[string]string{
		InitContainerFailureContainerAnnotation: "loader",
		InitContainerFailureExitCodeAnnotation:  "20",
		InitContainerFailureMessageAnnotation:   `"download failed: 403 Forbidden"`,
		InitContainerFailureDelayAnnotation:     "2s",
		"keep":                                  "me",
	}
	if len(pod.Annotations) != len(want) {
		t.Errorf("annotations = %v, want %v", pod.Annotations, want)
	}
	for k, v := range want {
		if pod.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, pod.Annotations[k], v)
		}
	}

	ClearInitContainerFailure(pod)
	if _, ok := pod.Labels[InitContainerFailureLabel]; ok {
		t.Error("label still set after ClearInitContainerFailure")
	}
	if len(pod.Annotations) != 1 || pod.Annotations["keep"] != "me" {
		t.Errorf("annotations after ClearInitContainerFailure = %v, want only keep", pod.Annotations)
	}
}

// kwok puts the reason and message annotations into its status template as they
// are ("message: {{ $failureMessage }}"); the quoted value must read back as the
// original text.
func TestInitContainerFailureMessageSurvivesKwokTemplate(t *testing.T) {
	for _, msg := range []string{"plain", "download failed: 403", "#hash and 'quotes' \"double\"", "tab\there", "ünïcode"} {
		a := InitContainerFailure{Message: msg, Reason: "Error: x"}.Annotations()
		rendered := "message: " + a[InitContainerFailureMessageAnnotation] + "\nreason: " + a[InitContainerFailureReasonAnnotation] + "\n"
		var got struct{ Message, Reason string }
		if err := yaml.Unmarshal([]byte(rendered), &got); err != nil {
			t.Fatalf("%q: rendered status does not parse: %v\n%s", msg, err, rendered)
		}
		if got.Message != msg || got.Reason != "Error: x" {
			t.Errorf("round trip of %q gave message %q reason %q", msg, got.Message, got.Reason)
		}
	}
}

func TestInitContainerFailureOnPodTemplate(t *testing.T) {
	tmpl := corev1.PodTemplateSpec{}
	InitContainerFailure{ExitCode: 10}.Apply(&tmpl.ObjectMeta)
	if tmpl.Labels[InitContainerFailureLabel] != "true" || tmpl.Annotations[InitContainerFailureExitCodeAnnotation] != "10" {
		t.Errorf("template meta = %+v", tmpl.ObjectMeta)
	}
	if _, ok := tmpl.Annotations[InitContainerFailureContainerAnnotation]; ok {
		t.Error("container annotation set although no container was chosen")
	}
}

func TestWriteStageConfig(t *testing.T) {
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	stageDir, err := KwokStageDir(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stages.yaml")
	if err := WriteStageConfig(stageDir, path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var stage struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(strings.TrimPrefix(doc, "---\n")), &stage); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, doc)
		}
		if stage.Kind != "Stage" {
			t.Errorf("kind = %q, want Stage in\n%s", stage.Kind, doc)
		}
		names = append(names, stage.Metadata.Name)
	}
	for _, want := range []string{"node-initialize", "node-heartbeat-with-lease", "pod-create", "pod-init-container-running",
		"pod-init-container-completed", "pod-ready", "pod-delete", InitContainerFailureLabel[:strings.Index(InitContainerFailureLabel, ".")]} {
		if !slices.Contains(names, want) {
			t.Errorf("stage %s missing; have %v", want, names)
		}
	}
}
