package localcluster

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestFailureTimingIsTheKubelets(t *testing.T) {
	for _, tc := range []struct {
		scale   float64
		backOff string
		runFor  time.Duration
	}{
		{1, "[10s 20s 40s 1m20s 2m40s 5m0s]", time.Second},
		{0.1, "[1s 2s 4s 8s 16s 30s]", 100 * time.Millisecond},
		{0.05, "[500ms 1s 2s 4s 8s 15s]", 50 * time.Millisecond},
		{1e-12, "[0s]", 0},
	} {
		got := newFailureTiming(tc.scale)
		if s := fmt.Sprint(got.backOff); s != tc.backOff {
			t.Errorf("scale %g: back-off %s, want %s", tc.scale, s, tc.backOff)
		}
		if got.defaultRunFor != tc.runFor || got.exitShown != tc.runFor {
			t.Errorf("scale %g: default run %s and exit shown for %s, want %s", tc.scale, got.defaultRunFor, got.exitShown, tc.runFor)
		}
	}
}

// writeStages writes the stage configuration with scale and returns its
// stages by name, and kwok's pod/general stages as kwok ships them.
func writeStages(t *testing.T, scale float64) (map[string]*kwokStage, map[string]*kwokStage) {
	t.Helper()
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	stageDir, err := KwokStageDir(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stages.yaml")
	if err := WriteStageConfig(stageDir, path, scale); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	written := map[string]*kwokStage{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var stage kwokStage
		// Not strict: kwok's node stages use fields this package does not model.
		if err := yaml.Unmarshal([]byte(strings.TrimPrefix(doc, "---\n")), &stage); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, doc)
		}
		if stage.Kind != "Stage" || stage.APIVersion != "kwok.x-k8s.io/v1alpha1" {
			t.Errorf("kind %s/%s, want kwok.x-k8s.io/v1alpha1/Stage in\n%s", stage.APIVersion, stage.Kind, doc)
		}
		if written[stage.Metadata.Name] != nil {
			t.Errorf("stage %s written twice", stage.Metadata.Name)
		}
		written[stage.Metadata.Name] = &stage
	}
	files, err := kustomizationResources(stageDir, podStageSet)
	if err != nil {
		t.Fatal(err)
	}
	kwoks := map[string]*kwokStage{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var stage kwokStage
		if err := yaml.UnmarshalStrict(data, &stage); err != nil {
			t.Fatal(err)
		}
		kwoks[stage.Metadata.Name] = &stage
	}
	return written, kwoks
}

func TestWriteStageConfig(t *testing.T) {
	written, kwoks := writeStages(t, 0.1)
	var names []string
	for name := range written {
		names = append(names, name)
	}
	for _, want := range []string{"node-initialize", "node-heartbeat-with-lease",
		"pod-create", "pod-init-container-running", "pod-init-container-completed", "pod-ready", "pod-complete", "pod-delete",
		"init-container-failure-start", "init-container-failure-exit", "init-container-failure-back-off", "init-container-failure-restart",
		"container-crash-loop-start", "container-crash-loop-exit", "container-crash-loop-back-off", "container-crash-loop-restart",
		"config-error"} {
		if !slices.Contains(names, want) {
			t.Errorf("stage %s missing; have %v", want, names)
		}
	}
	// kwok's chaos stages would fail a Deployment's pod for good.
	for _, name := range names {
		if strings.Contains(name, "failed") {
			t.Errorf("stage %s is there", name)
		}
	}

	for name, kwok := range kwoks {
		got := written[name]
		wantTemplate := kwok.Spec.Next.StatusTemplate
		if edit, ok := sidecarStages[name]; ok {
			wantTemplate = strings.Replace(wantTemplate, edit.replace, edit.with, 1)
		}
		if got.Spec.Next.StatusTemplate != wantTemplate {
			t.Errorf("stage %s: status template\n%s\nwant\n%s", name, got.Spec.Next.StatusTemplate, wantTemplate)
		}
		for _, ms := range []struct {
			what      string
			kwok, got *int64
		}{
			{"duration", kwok.Spec.Delay.DurationMilliseconds, got.Spec.Delay.DurationMilliseconds},
			{"jitter", kwok.Spec.Delay.JitterDurationMilliseconds, got.Spec.Delay.JitterDurationMilliseconds},
		} {
			if (ms.kwok == nil) != (ms.got == nil) || ms.kwok != nil && *ms.got != *ms.kwok/10 {
				t.Errorf("stage %s: %s %v ms, want a tenth of kwok's %v ms", name, ms.what, ms.got, ms.kwok)
			}
		}
		// Only the delay a pod's annotation sets stays as it is.
		if d := got.Spec.Delay.DurationFrom; d == nil || d.ExpressionFrom != kwok.Spec.Delay.DurationFrom.ExpressionFrom {
			t.Errorf("stage %s: delay from %+v, want kwok's %+v", name, d, kwok.Spec.Delay.DurationFrom)
		}
		if name == "pod-delete" && !strings.HasSuffix(got.Spec.Delay.JitterDurationFrom.ExpressionFrom, ".metadata.deletionTimestamp | fromdateiso8601 | untilNow((. - now) * 0.1 + now)") {
			t.Errorf("pod-delete jitter from %s, want a tenth of the time to the deletion timestamp", got.Spec.Delay.JitterDurationFrom.ExpressionFrom)
		}

		leavesAlone := slices.ContainsFunc(got.Spec.Selector.MatchExpressions, func(e matchExpression) bool {
			return e.Key == labelKey(replacedPodStages[name]) && e.Operator == "NotIn" && slices.Equal(e.Values, []string{"true"})
		})
		waitsForInit := name == "pod-init-container-completed" // see sidecarStages
		if _, replaced := replacedPodStages[name]; leavesAlone != replaced || len(got.Spec.Selector.MatchExpressions) != len(kwok.Spec.Selector.MatchExpressions)+btoi(replaced)+btoi(waitsForInit)+len(configGates[name]) {
			t.Errorf("stage %s: selector %+v, want kwok's %+v and (%v) the failure label excluded", name, got.Spec.Selector, kwok.Spec.Selector, replaced)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestWriteStageConfigWantsAPositiveScale(t *testing.T) {
	for _, scale := range []float64{-1, math.NaN()} {
		if err := WriteStageConfig(t.TempDir(), filepath.Join(t.TempDir(), "stages.yaml"), scale); err == nil || !strings.Contains(err.Error(), "positive") {
			t.Errorf("scale %g: %v, want an error", scale, err)
		}
	}
	// Zero is the real kubelet's pace.
	written, kwoks := writeStages(t, 0)
	if got, want := *written["pod-create"].Spec.Delay.JitterDurationMilliseconds, *kwoks["pod-create"].Spec.Delay.JitterDurationMilliseconds; got != want {
		t.Errorf("scale 0: pod-create jitter %d ms, want kwok's %d", got, want)
	}
}
