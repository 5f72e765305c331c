package aiinference

import (
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The operator's own metrics, served beside controller-runtime's on the manager's
// metrics endpoint. They are set from the status each reconcile computes, never by
// polling pods. Labels are bounded: namespace and name of the AIInference, plus a
// phase (5 values) or a reason (the words of api/v1/conditions.go and the loader's
// reasons); never a pod name. An object's series are removed when it is deleted.
// docs/metrics.md lists them.
var (
	phaseGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_phase",
		Help: "1 for the AIInference's current phase (Pending, Loading, Ready, Degraded, Failed, Canary), 0 for the others.",
	}, []string{"namespace", "name", "phase"})
	phaseSinceGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_phase_transition_timestamp_seconds",
		Help: "Unix time at which the AIInference entered its current phase.",
	}, []string{"namespace", "name"})
	readyReasonGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_ready_reason",
		Help: "1 for the reason of the AIInference's Ready condition (one series per object).",
	}, []string{"namespace", "name", "reason"})
	desiredGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_replicas_desired",
		Help: "Replicas the AIInference's spec asks for.",
	}, []string{"namespace", "name"})
	readyGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_replicas_ready",
		Help: "Ready replicas of the AIInference, of the current spec or an earlier one (they serve traffic).",
	}, []string{"namespace", "name"})
	updatedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_replicas_updated",
		Help: "Replicas of the AIInference that run its current spec.",
	}, []string{"namespace", "name"})
	loadingTimeoutGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_loading_timeout_seconds",
		Help: "The AIInference's loading.timeout: the bound on each stage of a load attempt.",
	}, []string{"namespace", "name"})
	loadDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "aiinference_model_load_duration_seconds",
		Help:    "Duration of completed model loads, from the loader's report (status.lastLoad).",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
	}, []string{"namespace", "name"})
	loadBytesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_model_load_bytes",
		Help: "Size of the model in the last completed load (status.lastLoad.bytes).",
	}, []string{"namespace", "name"})
	loadFetchedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_model_load_fetched_bytes",
		Help: "Bytes the last completed load downloaded (0 on a cache hit).",
	}, []string{"namespace", "name"})
	loadThroughputGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "aiinference_model_load_throughput_bytes_per_second",
		Help: "Throughput of the last completed load: bytes downloaded over its duration.",
	}, []string{"namespace", "name"})
	timeToReady = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "aiinference_time_to_ready_seconds",
		Help:    "Time from a spec change (or creation) to Ready for that spec.",
		Buckets: []float64{5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400},
	}, []string{"namespace", "name"})
	loadRetriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aiinference_load_retries_total",
		Help: "Failed model loads counted against loading.maxRetries (increases of status.loadRetries).",
	}, []string{"namespace", "name"})
	failuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aiinference_failures_total",
		Help: "Failures by reason: each time Ready enters a reason that needs a person (the Warning events), and each failed load by the loader's reason.",
	}, []string{"namespace", "name", "reason"})
	// canaryRollbacksTotal counts rollbacks, by analysis, failed loads or by
	// hand; the alert AIInferenceCanaryRolledBack watches it.
	canaryRollbacksTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aiinference_canary_rollbacks_total",
		Help: "Canary rollouts of the AIInference rolled back (a failed analysis, the canary's loads stopped, or aborted by hand).",
	}, []string{"namespace", "name"})
	// rolloutDecisions counts the decisions of canary rollouts; decision is one of
	// the words of status.rollout.history (13 values).
	rolloutDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aiinference_rollout_decisions_total",
		Help: "Decisions of the AIInference's canary rollouts (CanaryStarted, StepStarted, AnalysisPassed, Promoted, RolledBack, ...).",
	}, []string{"namespace", "name", "decision"})

	objectVecs = []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{
		phaseGauge, phaseSinceGauge, readyReasonGauge, desiredGauge, readyGauge, updatedGauge, loadingTimeoutGauge,
		loadDuration, loadBytesGauge, loadFetchedGauge, loadThroughputGauge, timeToReady, loadRetriesTotal, failuresTotal,
		canaryRollbacksTotal, rolloutDecisions,
	}
)

// collectors are the operator's own metrics.
var collectors = []prometheus.Collector{phaseGauge, phaseSinceGauge, readyReasonGauge, desiredGauge, readyGauge, updatedGauge,
	loadingTimeoutGauge, loadDuration, loadBytesGauge, loadFetchedGauge, loadThroughputGauge, timeToReady,
	loadRetriesTotal, failuresTotal, canaryRollbacksTotal, rolloutDecisions}

func init() {
	ctrlmetrics.Registry.MustRegister(collectors...)
}

var phases = []servingv1.Phase{servingv1.PhasePending, servingv1.PhaseLoading, servingv1.PhaseReady, servingv1.PhaseDegraded, servingv1.PhaseFailed, servingv1.PhaseCanary}

// statusMetrics turns status changes into metrics. It remembers, per object, when
// its phase last changed and when it first saw each generation, which status
// does not hold.
type statusMetrics struct {
	mu      sync.Mutex
	objects map[types.NamespacedName]*objectMemory
}

type objectMemory struct {
	phase      servingv1.Phase
	phaseSince time.Time
	// generation is the spec generation last seen and since when; readyCounted is
	// true once its time to Ready was observed.
	generation   int64
	genSince     time.Time
	readyCounted bool
	// What was last counted: a pass may start from a cached status older than the
	// one the previous pass wrote, and must not count the same change twice.
	loadRetries int32
	readyReason string
	lastLoad    *servingv1.LoadReport
}

var metricsState = &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}

// record sets obj's metrics from the status this pass computed; before is the
// status the pass started from.
func (m *statusMetrics) record(obj *servingv1.AIInference, before, after *servingv1.AIInferenceStatus, now time.Time) {
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	ns, name := obj.Namespace, obj.Name
	m.mu.Lock()
	defer m.mu.Unlock()
	mem := m.objects[key]
	if mem == nil {
		// First sight since the operator started: take the times status gives.
		mem = &objectMemory{phase: after.Phase, phaseSince: now, generation: obj.Generation, genSince: now}
		if c := meta.FindStatusCondition(after.Conditions, servingv1.ConditionReady); c != nil && before.Phase == after.Phase {
			mem.phaseSince = c.LastTransitionTime.Time
		}
		if obj.Generation <= 1 {
			mem.genSince = obj.CreationTimestamp.Time
		}
		// A spec already Ready before this pass was counted by an earlier run.
		mem.readyCounted = isReadyFor(before, obj.Generation)
		mem.loadRetries, mem.lastLoad = before.LoadRetries, before.LastLoad
		if c := meta.FindStatusCondition(before.Conditions, servingv1.ConditionReady); c != nil {
			mem.readyReason = c.Reason
		}
		m.objects[key] = mem
	}
	if mem.phase != after.Phase {
		mem.phase, mem.phaseSince = after.Phase, now
	}
	if mem.generation != obj.Generation {
		mem.generation, mem.genSince, mem.readyCounted = obj.Generation, now, false
	}
	if !mem.readyCounted && isReadyFor(after, obj.Generation) {
		mem.readyCounted = true
		if !mem.genSince.IsZero() {
			timeToReady.WithLabelValues(ns, name).Observe(now.Sub(mem.genSince).Seconds())
		}
	}

	for _, p := range phases {
		v := 0.0
		if p == after.Phase {
			v = 1
		}
		phaseGauge.WithLabelValues(ns, name, string(p)).Set(v)
	}
	phaseSinceGauge.WithLabelValues(ns, name).Set(float64(mem.phaseSince.Unix()))
	if c := meta.FindStatusCondition(after.Conditions, servingv1.ConditionReady); c != nil {
		if mem.readyReason != c.Reason {
			readyReasonGauge.DeletePartialMatch(prometheus.Labels{"namespace": ns, "name": name})
			if warningReasons[c.Reason] && mem.readyReason != "" {
				failuresTotal.WithLabelValues(ns, name, c.Reason).Inc()
			}
			mem.readyReason = c.Reason
		}
		readyReasonGauge.WithLabelValues(ns, name, c.Reason).Set(1)
	}
	desiredGauge.WithLabelValues(ns, name).Set(float64(replicas(obj)))
	readyGauge.WithLabelValues(ns, name).Set(float64(after.ReadyReplicas))
	updatedGauge.WithLabelValues(ns, name).Set(float64(after.UpdatedReplicas))
	loadingTimeoutGauge.WithLabelValues(ns, name).Set(loadTimeout(obj).Seconds())

	n := after.LoadRetries - mem.loadRetries
	mem.loadRetries = after.LoadRetries // a new spec or a retry request starts again from 0
	if n > 0 {
		loadRetriesTotal.WithLabelValues(ns, name).Add(float64(n))
		if f := after.LastFailure; f != nil {
			failuresTotal.WithLabelValues(ns, name, f.Reason).Add(float64(n))
		}
	}
	if l := after.LastLoad; l != nil {
		loadBytesGauge.WithLabelValues(ns, name).Set(float64(l.Bytes))
		loadFetchedGauge.WithLabelValues(ns, name).Set(float64(l.BytesFetched))
		if s := l.Duration.Seconds(); s > 0 {
			loadThroughputGauge.WithLabelValues(ns, name).Set(float64(l.BytesFetched) / s)
		}
		if newLoad(mem.lastLoad, l) {
			loadDuration.WithLabelValues(ns, name).Observe(l.Duration.Seconds())
			mem.lastLoad = l.DeepCopy()
		}
	}
}

// newLoad is true when the status holds a load report it did not hold before.
func newLoad(before, after *servingv1.LoadReport) bool {
	return before == nil || before.Pod != after.Pod || before.Duration != after.Duration || before.Bytes != after.Bytes
}

// isReadyFor is true when status says the given generation is Ready.
func isReadyFor(st *servingv1.AIInferenceStatus, generation int64) bool {
	c := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == generation
}

// forget removes a deleted object's series and memory.
func (m *statusMetrics) forget(key types.NamespacedName) {
	m.mu.Lock()
	delete(m.objects, key)
	m.mu.Unlock()
	for _, v := range objectVecs {
		v.DeletePartialMatch(prometheus.Labels{"namespace": key.Namespace, "name": key.Name})
	}
}

// MetricNames are the names of the operator's own metrics (histograms without
// their _bucket, _sum and _count series).
func MetricNames() []string {
	ch := make(chan *prometheus.Desc, 64)
	for _, c := range collectors {
		c.Describe(ch)
	}
	close(ch)
	var names []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)
