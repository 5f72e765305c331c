package aiinference

import (
	"bytes"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	projtestutil "github.com/aiinference/operator/test/testutil"
)

func readyCond(status metav1.ConditionStatus, reason string, gen int64, at time.Time) metav1.Condition {
	return metav1.Condition{Type: servingv1.ConditionReady, Status: status, Reason: reason, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(at)}
}

// TestStatusMetrics walks one object from creation through a failed load and a
// completed one to Ready, then deletes it.
func TestStatusMetrics(t *testing.T) {
	g := NewWithT(t)
	created := now.Add(-3 * time.Minute)
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "metrics-ns", Name: "llm", Generation: 1, CreationTimestamp: metav1.NewTime(created)}}
	obj.Spec.Replicas = ptr.To[int32](2)
	m := &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}

	pending := servingv1.AIInferenceStatus{Phase: servingv1.PhasePending, Conditions: []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonProgressing, 1, created)}}
	m.record(obj, &servingv1.AIInferenceStatus{}, &pending, created)

	loading := *pending.DeepCopy()
	loading.Phase = servingv1.PhaseLoading
	loading.LoadRetries = 1
	loading.LastFailure = &servingv1.LoadFailure{Reason: "TransientError", Pod: "llm-abc"}
	loading.Conditions = []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonRetryingLoad, 1, now.Add(-time.Minute))}
	m.record(obj, &pending, &loading, now.Add(-time.Minute))
	// The next pass starts from a cache that has not seen that write yet: the same
	// change is not counted twice.
	m.record(obj, &pending, &loading, now.Add(-time.Minute))

	ready := *loading.DeepCopy()
	ready.Phase, ready.ReadyReplicas, ready.UpdatedReplicas = servingv1.PhaseReady, 2, 2
	ready.LastLoad = &servingv1.LoadReport{Pod: "llm-def", Bytes: 4e9, BytesFetched: 4e9, Duration: metav1.Duration{Duration: 40 * time.Second}}
	ready.Conditions = []metav1.Condition{readyCond(metav1.ConditionTrue, servingv1.ReasonReady, 1, now)}
	m.record(obj, &loading, &ready, now)
	m.record(obj, &ready, &ready, now.Add(time.Minute)) // an unchanged pass counts nothing again

	text := scrape(t, m)
	for _, series := range []string{
		`aiinference_phase{name="llm",namespace="metrics-ns",phase="Ready"} 1`,
		`aiinference_phase{name="llm",namespace="metrics-ns",phase="Loading"} 0`,
		`aiinference_phase_transition_timestamp_seconds{name="llm",namespace="metrics-ns"} ` + strconv.FormatFloat(float64(now.Unix()), 'g', -1, 64),
		`aiinference_replicas_ready{name="llm",namespace="metrics-ns"} 2`,
		`aiinference_replicas_desired{name="llm",namespace="metrics-ns"} 2`,
		`aiinference_replica_nodes{name="llm",namespace="metrics-ns"} 1`,
		`aiinference_load_retries_total{name="llm",namespace="metrics-ns"} 1`,
		`aiinference_failures_total{name="llm",namespace="metrics-ns",reason="TransientError"} 1`,
		`aiinference_failures_total{name="llm",namespace="metrics-ns",reason="RetryingLoad"} 1`,
		`aiinference_model_load_throughput_bytes_per_second{name="llm",namespace="metrics-ns"} 1e+08`,
		`aiinference_ready_reason{name="llm",namespace="metrics-ns",reason="Ready"} 1`,
	} {
		g.Expect(text).To(ContainSubstring(series + "\n"))
	}
	g.Expect(strings.Count(text, `aiinference_ready_reason{name="llm"`)).To(Equal(1), "one reason series per object")

	t.Logf("the operator's own series in one scrape:\n%s", text)
	g.Expect(text).To(ContainSubstring(`aiinference_model_load_duration_seconds_count{name="llm",namespace="metrics-ns"} 1`))
	g.Expect(text).To(ContainSubstring(`aiinference_model_load_duration_seconds_sum{name="llm",namespace="metrics-ns"} 40`))
	for le, count := range map[string]int{"30": 0, "60": 1, "7200": 1, "+Inf": 1} { // cumulative
		g.Expect(text).To(ContainSubstring(`aiinference_model_load_duration_seconds_bucket{name="llm",namespace="metrics-ns",le="%s"} %d`+"\n", le, count))
	}
	g.Expect(text).To(ContainSubstring(`aiinference_time_to_ready_seconds_sum{name="llm",namespace="metrics-ns"} 180`), "from creation to Ready")
	g.Expect(text).NotTo(ContainSubstring("llm-def"), "no pod names in labels")

	// A spec change: time to Ready counts from the pass that first saw it.
	obj.Generation = 2
	rolling := *ready.DeepCopy()
	rolling.Conditions = []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonLoading, 2, now.Add(time.Minute))}
	m.record(obj, &ready, &rolling, now.Add(time.Minute))
	ready2 := *ready.DeepCopy()
	ready2.Conditions = []metav1.Condition{readyCond(metav1.ConditionTrue, servingv1.ReasonReady, 2, now.Add(3*time.Minute))}
	m.record(obj, &rolling, &ready2, now.Add(3*time.Minute))
	g.Expect(scrape(t, m)).To(ContainSubstring(`aiinference_time_to_ready_seconds_sum{name="llm",namespace="metrics-ns"} 300`))

	m.forget(types.NamespacedName{Namespace: "metrics-ns", Name: "llm"})
	g.Expect(scrape(t, m)).NotTo(ContainSubstring(`namespace="metrics-ns"`), "a deleted object's series are gone")
}

// scrape is the text exposition of m's series, after checking that Prometheus's
// parser reads it.
func scrape(t *testing.T, m *statusMetrics) string {
	t.Helper()
	var buf bytes.Buffer
	if err := m.writeText(&buf); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := parser.TextToMetricFamilies(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, buf.String())
	}
	return buf.String()
}

// TestMetricNamesPassPromtool runs `promtool check metrics` (Prometheus's naming
// and help-text lint) on a scrape of every operator metric.
func TestMetricNamesPassPromtool(t *testing.T) {
	promtool := projtestutil.NeedPromtool(t)
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "lint-ns", Name: "llm", Generation: 1, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))}}
	m := &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}
	st := servingv1.AIInferenceStatus{Phase: servingv1.PhaseReady, LoadRetries: 1, LastFailure: &servingv1.LoadFailure{Reason: "TransientError"},
		LastLoad:   &servingv1.LoadReport{Bytes: 1, BytesFetched: 1, Duration: metav1.Duration{Duration: time.Second}},
		Conditions: []metav1.Condition{readyCond(metav1.ConditionTrue, servingv1.ReasonReady, 1, now)}}
	m.record(obj, &servingv1.AIInferenceStatus{Conditions: []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonLoadFailed, 1, now)}}, &st, now)
	m.countDecisions(types.NamespacedName{Namespace: "lint-ns", Name: "llm"}, []servingv1.RolloutDecision{{Decision: servingv1.DecisionRolledBack}})
	defer m.forget(types.NamespacedName{Namespace: "lint-ns", Name: "llm"})

	text := scrape(t, m)
	t.Logf("the operator's own series in one scrape:\n%s", text)
	for _, name := range []string{"aiinference_phase", "aiinference_model_load_duration_seconds_bucket", "aiinference_time_to_ready_seconds_bucket",
		"aiinference_failures_total", "aiinference_load_retries_total", "aiinference_canary_rollbacks_total", "aiinference_model_load_throughput_bytes_per_second"} {
		if !strings.Contains(text, name+"{") {
			t.Errorf("scrape lacks %s", name)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// BenchmarkScrapeObjectMetrics is one scrape of the per-object series of 1000
// objects, each with a load, both histograms and a failure: its B/op is what a
// scrape makes the operator's heap carry for a moment.
func BenchmarkScrapeObjectMetrics(b *testing.B) {
	m := &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}
	for i := range 1000 {
		obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-ns", Name: "llm-" + strconv.Itoa(i), Generation: 1, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))}}
		loading := servingv1.AIInferenceStatus{Phase: servingv1.PhaseLoading, LoadRetries: 1, LastFailure: &servingv1.LoadFailure{Reason: "TransientError"},
			Conditions: []metav1.Condition{readyCond(metav1.ConditionFalse, servingv1.ReasonRetryingLoad, 1, now)}}
		m.record(obj, &servingv1.AIInferenceStatus{}, &loading, now)
		ready := servingv1.AIInferenceStatus{Phase: servingv1.PhaseReady, LoadRetries: 1, LastFailure: loading.LastFailure,
			LastLoad:   &servingv1.LoadReport{Bytes: 4e9, BytesFetched: 4e9, Duration: metav1.Duration{Duration: 40 * time.Second}},
			Conditions: []metav1.Condition{readyCond(metav1.ConditionTrue, servingv1.ReasonReady, 1, now)}}
		m.record(obj, &loading, &ready, now)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := m.writeText(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
