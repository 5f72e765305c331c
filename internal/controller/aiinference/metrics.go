package aiinference

import (
	"bufio"
	"cmp"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/reasons"
)

// The operator's own metrics, served beside controller-runtime's on the manager's
// metrics endpoint. They come from the status each reconcile computes, never from
// polling pods. Labels are bounded: namespace and name of the AIInference, plus a
// phase (6 values) or a reason (the words of api/v1/conditions.go and the loader's
// reasons); never a pod name. An object's series are removed when it is deleted.
// docs/metrics.md lists them.
//
// Each object's figures are kept in one small struct (objectMemory) and written
// out as series only when Prometheus scrapes (WriteObjectMetrics), as
// kube-state-metrics does: a client_golang vector child per series cost about 9 KB per object, most
// of the operator's memory per object at 1,000 objects.
var (
	loadDurationBuckets = bucketBounds{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200}
	timeToReadyBuckets  = bucketBounds{5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400}
	// The bounds as a scrape writes them in the le label, made once.
	loadDurationLe, timeToReadyLe = loadDurationBuckets.leValues(), timeToReadyBuckets.leValues()
)

// objectFamilies are the per-object metrics, in the order a scrape writes them.
var objectFamilies = []*objectFamily{
	{name: "aiinference_phase", kind: "gauge",
		help: "1 for the AIInference's current phase (Pending, Loading, Ready, Degraded, Failed, Canary), 0 for the others.",
		series: func(e *exposition, mem *objectMemory) {
			for _, p := range phases {
				e.sample("", labelValue{name: "phase", value: string(p)}, boolValue(p == mem.phase))
			}
		}},
	{name: "aiinference_phase_transition_timestamp_seconds", kind: "gauge",
		help:   "Unix time at which the AIInference entered its current phase.",
		series: one(func(mem *objectMemory) float64 { return float64(mem.phaseSince.Unix()) })},
	{name: "aiinference_ready_reason", kind: "gauge",
		help: "1 for the reason of the AIInference's Ready condition (one series per object).",
		series: func(e *exposition, mem *objectMemory) {
			if mem.readyReason != "" {
				e.sample("", labelValue{name: "reason", value: mem.readyReason}, 1)
			}
		}},
	{name: "aiinference_replicas_desired", kind: "gauge",
		help:   "Replicas the AIInference's spec asks for.",
		series: one(func(mem *objectMemory) float64 { return float64(mem.desired) })},
	{name: "aiinference_replicas_ready", kind: "gauge",
		help:   "Ready replicas of the AIInference, of the current spec or an earlier one (they serve traffic).",
		series: one(func(mem *objectMemory) float64 { return float64(mem.ready) })},
	// A replica that spans nodes is a group of pods, counted once: ready when its
	// leader serves and every worker runs.
	{name: "aiinference_replica_nodes", kind: "gauge",
		help:   "Nodes one replica of the AIInference spans (spec.gpu.nodes): above 1, each replica counted here is a group of that many pods, a leader and workers.",
		series: one(func(mem *objectMemory) float64 { return float64(mem.nodesPerReplica) })},
	{name: "aiinference_replicas_updated", kind: "gauge",
		help:   "Replicas of the AIInference that run its current spec.",
		series: one(func(mem *objectMemory) float64 { return float64(mem.updated) })},
	{name: "aiinference_loading_timeout_seconds", kind: "gauge",
		help:   "The AIInference's loading.timeout: the bound on each stage of a load attempt.",
		series: one(func(mem *objectMemory) float64 { return mem.loadingTimeout.Seconds() })},
	{name: "aiinference_model_load_duration_seconds", kind: "histogram",
		help:   "Duration of completed model loads, from the loader's report (status.lastLoad).",
		series: histogramOf(func(mem *objectMemory) *histogram { return mem.loadDuration }, &loadDurationLe)},
	{name: "aiinference_model_load_bytes", kind: "gauge",
		help:   "Size of the model in the last completed load (status.lastLoad.bytes).",
		series: oneOnceLoaded(func(load *loadFigures) float64 { return float64(load.bytes) })},
	{name: "aiinference_model_load_fetched_bytes", kind: "gauge",
		help:   "Bytes the last completed load downloaded (0 on a cache hit).",
		series: oneOnceLoaded(func(load *loadFigures) float64 { return float64(load.fetched) })},
	{name: "aiinference_model_load_throughput_bytes_per_second", kind: "gauge",
		help: "Throughput of the last completed load: bytes downloaded over its duration.",
		series: func(e *exposition, mem *objectMemory) {
			if sec := mem.lastLoad.duration.Seconds(); mem.hasLoad && sec > 0 {
				e.sample("", labelValue{}, float64(mem.lastLoad.fetched)/sec)
			}
		}},
	{name: "aiinference_time_to_ready_seconds", kind: "histogram",
		help:   "Time from a spec change (or creation) to Ready for that spec.",
		series: histogramOf(func(mem *objectMemory) *histogram { return mem.timeToReady }, &timeToReadyLe)},
	{name: "aiinference_load_retries_total", kind: "counter",
		help:   "Failed model loads counted against loading.maxRetries (increases of status.loadRetries).",
		series: oneOnceCounted(func(mem *objectMemory) float64 { return mem.loadRetriesTotal })},
	{name: "aiinference_failures_total", kind: "counter",
		help:   "Failures by reason: each time Ready enters a reason that needs a person (the Warning events), and each failed load by the loader's reason.",
		series: byLabel("reason", false, func(mem *objectMemory) map[string]float64 { return mem.failuresTotal })},
	// The alert AIInferenceCanaryRolledBack watches this one.
	{name: "aiinference_canary_rollbacks_total", kind: "counter",
		help:   "Canary rollouts of the AIInference rolled back (a failed analysis, the canary's loads stopped, or aborted by hand).",
		series: oneOnceCounted(func(mem *objectMemory) float64 { return mem.canaryRollbacksTotal })},
	// decision is one of the words of status.rollout.history (13 values).
	{name: "aiinference_rollout_decisions_total", kind: "counter",
		help:   "Decisions of the AIInference's canary rollouts (CanaryStarted, StepStarted, AnalysisPassed, Promoted, RolledBack, ...).",
		series: byLabel("decision", true, func(mem *objectMemory) map[string]float64 { return mem.decisionsTotal })},
	// The autoscaler's families: only objects with spec.autoscaling have series.
	{name: "aiinference_autoscaler_min_replicas", kind: "gauge",
		help:   "The AIInference's autoscaling.minReplicas.",
		series: oneIfAutoscaled(func(mem *objectMemory) float64 { return float64(mem.autoscaleMin) })},
	{name: "aiinference_autoscaler_max_replicas", kind: "gauge",
		help:   "The AIInference's autoscaling.maxReplicas; aiinference_replicas_desired is the count the autoscaler set.",
		series: oneIfAutoscaled(func(mem *objectMemory) float64 { return float64(mem.autoscaleMax) })},
	{name: "aiinference_autoscaler_scaling_active", kind: "gauge",
		help:   "1 while the autoscaler reads the signals of every serving replica, 0 while it holds the count (ScalingActive False).",
		series: oneIfAutoscaled(func(mem *objectMemory) float64 { return boolValue(mem.scalingActive) })},
	{name: "aiinference_autoscaler_signal_per_replica", kind: "gauge",
		help:   "The autoscaler's last reading of each signal (QueueDepth, KVCacheUtilization in percent, RunningRequests), mean per serving replica.",
		series: byLabel("signal", false, func(mem *objectMemory) map[string]float64 { return mem.signalPerReplica })},
	{name: "aiinference_autoscaler_signal_target", kind: "gauge",
		help:   "The target per replica of each signal the AIInference scales on.",
		series: byLabel("signal", false, func(mem *objectMemory) map[string]float64 { return mem.signalTarget })},
	// The adapters' families: one series per adapter of spec.adapters (at most 64).
	{name: "aiinference_adapter_serving_replicas", kind: "gauge",
		help:   "Ready replicas whose engine serves the LoRA adapter (status.adapters[].servingReplicas).",
		series: byLabel("adapter", true, func(mem *objectMemory) map[string]float64 { return mem.adapterServing })},
	{name: "aiinference_adapter_failures_total", kind: "counter",
		help:   "Failures to fetch or load the LoRA adapter on a replica (each new status.adapters[].lastFailure).",
		series: byLabel("adapter", true, func(mem *objectMemory) map[string]float64 { return mem.adapterFailures })},
}

// oneIfAutoscaled is a family of one series per object with spec.autoscaling.
func oneIfAutoscaled(value func(*objectMemory) float64) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) {
		if mem.autoscaleMax > 0 {
			e.sample("", labelValue{}, value(mem))
		}
	}
}

// one is a family of one series per object, valued by value.
func one(value func(*objectMemory) float64) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) { e.sample("", labelValue{}, value(mem)) }
}

// oneOnceCounted is a counter's family whose series an object has once it has
// counted something.
func oneOnceCounted(value func(*objectMemory) float64) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) {
		if v := value(mem); v > 0 {
			e.sample("", labelValue{}, v)
		}
	}
}

// oneOnceLoaded is a family whose series an object has once a load completed.
func oneOnceLoaded(value func(*loadFigures) float64) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) {
		if mem.hasLoad {
			e.sample("", labelValue{}, value(&mem.lastLoad))
		}
	}
}

// histogramOf is a histogram's family, whose series an object has once it has
// observed something; le are the bounds as the le label writes them.
func histogramOf(h func(*objectMemory) *histogram, le *[len(bucketBounds{})]string) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) {
		if h := h(mem); h != nil {
			e.histogram(h, le)
		}
	}
}

// byLabel is a family of a series per key of counts, the key in label (first:
// written before namespace and name, as a name sorting before theirs is).
func byLabel(label string, first bool, counts func(*objectMemory) map[string]float64) func(*exposition, *objectMemory) {
	return func(e *exposition, mem *objectMemory) {
		m := counts(mem)
		for _, key := range e.sortedKeys(m) {
			e.sample("", labelValue{name: label, value: key, first: first}, m[key])
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var phases = [...]servingv1.Phase{servingv1.PhasePending, servingv1.PhaseLoading, servingv1.PhaseReady, servingv1.PhaseDegraded, servingv1.PhaseFailed, servingv1.PhaseCanary}

var metricsState = &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}

// statusMetrics turns status changes into metrics. Besides the figures status
// holds, it remembers per object when its phase last changed and when it first
// saw each generation, which status does not hold, and what it has counted.
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
	lastLoad    loadFigures
	hasLoad     bool

	desired, ready, updated int32
	nodesPerReplica         int32
	loadingTimeout          time.Duration

	// The autoscaler's bounds (autoscaleMax 0: no spec.autoscaling), whether it
	// reads its signals, and its last readings.
	autoscaleMin, autoscaleMax     int32
	scalingActive                  bool
	signalPerReplica, signalTarget map[string]float64 // by signal; nil until read

	loadRetriesTotal, canaryRollbacksTotal float64
	failuresTotal, decisionsTotal          map[string]float64 // by reason, by decision; nil until counted
	// adapterServing is each adapter's serving replicas; adapterFailures
	// counts each adapter's failures, and adapterFailureSeen is the last
	// failure counted of each.
	adapterServing, adapterFailures map[string]float64
	adapterFailureSeen              map[string]servingv1.AdapterFailure
	loadDuration, timeToReady       *histogram // nil until observed
}

// loadFigures is what the metrics take of status.lastLoad.
type loadFigures struct {
	pod            string
	duration       time.Duration
	bytes, fetched int64
}

// record sets obj's metrics from the status this pass computed; before is the
// status the pass started from. Counts are of changes from what was last
// recorded: a pass that started from a cached status older than the one the
// previous pass wrote computes the same change again, and is not a new change.
func (m *statusMetrics) record(obj *servingv1.AIInference, before, after *servingv1.AIInferenceStatus, now time.Time) {
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
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
		mem.readyCounted = before.ReadyFor(obj.Generation) != nil
		mem.loadRetries = before.LoadRetries
		if l := before.LastLoad; l != nil {
			mem.lastLoad, mem.hasLoad = figuresOf(l), true
		}
		if c := meta.FindStatusCondition(before.Conditions, servingv1.ConditionReady); c != nil {
			mem.readyReason = c.Reason
		}
		for _, a := range before.Adapters {
			if a.LastFailure != nil {
				mem.adapterFailureSeen = setFailure(mem.adapterFailureSeen, a.Name, *a.LastFailure)
			}
		}
		m.objects[key] = mem
	}
	if mem.phase != after.Phase {
		mem.phase, mem.phaseSince = after.Phase, now
	}
	if mem.generation != obj.Generation {
		mem.generation, mem.genSince, mem.readyCounted = obj.Generation, now, false
	}
	if !mem.readyCounted && after.ReadyFor(obj.Generation) != nil {
		mem.readyCounted = true
		if !mem.genSince.IsZero() {
			mem.timeToReady = mem.timeToReady.observe(&timeToReadyBuckets, now.Sub(mem.genSince).Seconds())
		}
	}
	if c := meta.FindStatusCondition(after.Conditions, servingv1.ConditionReady); c != nil && mem.readyReason != c.Reason {
		if reasons.Explain(c.Reason).Warning && mem.readyReason != "" {
			mem.failuresTotal = add(mem.failuresTotal, c.Reason, 1)
		}
		mem.readyReason = c.Reason
	}
	mem.desired, mem.ready, mem.updated = obj.DesiredReplicas(), after.ReadyReplicas, after.UpdatedReplicas
	mem.nodesPerReplica = obj.NodesPerReplica()
	mem.autoscaleMin, mem.autoscaleMax, mem.scalingActive = 0, 0, false
	if a := obj.Spec.Autoscaling; a != nil {
		mem.autoscaleMin, mem.autoscaleMax = a.Min(), a.MaxReplicas
		mem.scalingActive = meta.IsStatusConditionTrue(after.Conditions, servingv1.ConditionScalingActive)
	} else {
		mem.signalPerReplica, mem.signalTarget = nil, nil
	}
	mem.loadingTimeout = obj.LoadTimeout()
	mem.adapterServing = nil
	for _, a := range after.Adapters {
		mem.adapterServing = add(mem.adapterServing, a.Name, float64(a.ServingReplicas))
		if f := a.LastFailure; f != nil && mem.adapterFailureSeen[a.Name] != *f {
			mem.adapterFailures = add(mem.adapterFailures, a.Name, 1)
			mem.adapterFailureSeen = setFailure(mem.adapterFailureSeen, a.Name, *f)
		}
	}

	n := after.LoadRetries - mem.loadRetries
	mem.loadRetries = after.LoadRetries // a new spec or a retry request starts again from 0
	if n > 0 {
		mem.loadRetriesTotal += float64(n)
		if f := after.LastFailure; f != nil {
			mem.failuresTotal = add(mem.failuresTotal, f.Reason, float64(n))
		}
	}
	if l := after.LastLoad; l != nil {
		load := figuresOf(l)
		if !mem.hasLoad || load.pod != mem.lastLoad.pod || load.duration != mem.lastLoad.duration || load.bytes != mem.lastLoad.bytes {
			mem.loadDuration = mem.loadDuration.observe(&loadDurationBuckets, l.Duration.Seconds())
		}
		mem.lastLoad, mem.hasLoad = load, true
	}
}

// recordSignals keeps the autoscaler's last readings of an object it has seen.
func (m *statusMetrics) recordSignals(key types.NamespacedName, readings []servingv1.SignalReading) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mem := m.objects[key]
	if mem == nil {
		return
	}
	mem.signalPerReplica, mem.signalTarget = map[string]float64{}, map[string]float64{}
	for _, r := range readings {
		v, _ := strconv.ParseFloat(r.PerReplica, 64)
		mem.signalPerReplica[string(r.Signal)], mem.signalTarget[string(r.Signal)] = v, float64(r.Target)
	}
}

// countDecisions counts the rollout decisions a pass took, after record has seen
// the object.
func (m *statusMetrics) countDecisions(key types.NamespacedName, decisions []servingv1.RolloutDecision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mem := m.objects[key]
	if mem == nil {
		return
	}
	for _, d := range decisions {
		mem.decisionsTotal = add(mem.decisionsTotal, d.Decision, 1)
		if d.Decision == servingv1.DecisionRolledBack || d.Decision == servingv1.DecisionAborted {
			mem.canaryRollbacksTotal++
		}
	}
}

func figuresOf(l *servingv1.LoadReport) loadFigures {
	return loadFigures{pod: l.Pod, duration: l.Duration.Duration, bytes: l.Bytes, fetched: l.BytesFetched}
}

// setFailure records the last adapter failure counted, making the map on first use.
func setFailure(seen map[string]servingv1.AdapterFailure, adapter string, f servingv1.AdapterFailure) map[string]servingv1.AdapterFailure {
	if seen == nil {
		seen = map[string]servingv1.AdapterFailure{}
	}
	seen[adapter] = f
	return seen
}

// add adds v to counts[key], making the map on first use.
func add(counts map[string]float64, key string, v float64) map[string]float64 {
	if counts == nil {
		counts = map[string]float64{}
	}
	counts[key] += v
	return counts
}

// forget removes a deleted object's series.
func (m *statusMetrics) forget(key types.NamespacedName) {
	m.mu.Lock()
	delete(m.objects, key)
	m.mu.Unlock()
}

// objectFigures is one object's figures as a scrape reads them.
type objectFigures struct {
	key types.NamespacedName
	objectMemory
}

// snapshot copies every object's figures, sorted by namespace and name, so that
// a scrape holds the lock only for the copy.
func (m *statusMetrics) snapshot() []objectFigures {
	m.mu.Lock()
	out := make([]objectFigures, 0, len(m.objects))
	for key, mem := range m.objects {
		c := objectFigures{key: key, objectMemory: *mem}
		c.failuresTotal, c.decisionsTotal = maps.Clone(mem.failuresTotal), maps.Clone(mem.decisionsTotal)
		c.signalPerReplica, c.signalTarget = maps.Clone(mem.signalPerReplica), maps.Clone(mem.signalTarget)
		c.adapterServing, c.adapterFailures, c.adapterFailureSeen = maps.Clone(mem.adapterServing), maps.Clone(mem.adapterFailures), nil
		if mem.loadDuration != nil {
			h := *mem.loadDuration
			c.loadDuration = &h
		}
		if mem.timeToReady != nil {
			h := *mem.timeToReady
			c.timeToReady = &h
		}
		out = append(out, c)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b objectFigures) int {
		return cmp.Or(cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
	})
	return out
}

// WriteObjectMetrics writes every AIInference's series in Prometheus's text
// format (version 0.0.4), one family after another. The metrics endpoint writes
// them after the registry's families, as the scrape goes out
// (internal/manager/metrics.go): a registry gathers every series before it
// writes any, which at 1,000 objects held 7.3 MB for the length of a scrape and
// grew the garbage collector's goal by half of that again. Written this way, a
// scrape holds a copy of the objects' figures and a buffer
// (BenchmarkScrapeObjectMetrics).
func WriteObjectMetrics(w io.Writer) error { return metricsState.writeText(w) }

func (m *statusMetrics) writeText(w io.Writer) error {
	objects := m.snapshot()
	out := &exposition{w: bufio.NewWriterSize(w, 32<<10)}
	for _, f := range objectFamilies {
		out.family = f
		out.headerWritten = false
		for i := range objects {
			out.object = &objects[i]
			f.series(out, &objects[i].objectMemory)
		}
	}
	return out.w.Flush()
}

// objectFamily is one metric of every object: its name, help and type, and
// the series one object has (series writes them through the exposition).
type objectFamily struct {
	name, help, kind string // kind: gauge, counter or histogram
	series           func(e *exposition, mem *objectMemory)
}

// exposition writes the text format; its header for a family is written with
// the family's first series, so that a family no object has is left out, as
// client_golang's registry leaves it out.
type exposition struct {
	w             *bufio.Writer
	family        *objectFamily
	headerWritten bool
	object        *objectFigures
	num           []byte   // scratch for numbers
	keys          []string // scratch for sortedKeys
}

// sample writes one series of the current object: name (the family's, or one of
// a histogram's _bucket, _sum and _count), an optional label written before or
// after the object's two (the labels stay sorted by name) and the value.
func (e *exposition) sample(suffix string, label labelValue, v float64) {
	if !e.headerWritten {
		e.headerWritten = true
		e.w.WriteString("# HELP " + e.family.name + " ")
		writeEscaped(e.w, e.family.help, false)
		e.w.WriteString("\n# TYPE " + e.family.name + " " + e.family.kind + "\n")
	}
	e.w.WriteString(e.family.name)
	e.w.WriteString(suffix)
	e.w.WriteByte('{')
	if label.first {
		e.label(label.name, label.value)
		e.w.WriteByte(',')
	}
	e.label("name", e.object.key.Name)
	e.w.WriteByte(',')
	e.label("namespace", e.object.key.Namespace)
	if label.name != "" && !label.first {
		e.w.WriteByte(',')
		e.label(label.name, label.value)
	}
	e.w.WriteString("} ")
	e.num = appendFloat(e.num[:0], v)
	e.w.Write(e.num)
	e.w.WriteByte('\n')
}

func (e *exposition) label(name, value string) {
	e.w.WriteString(name)
	e.w.WriteString(`="`)
	writeEscaped(e.w, value, true)
	e.w.WriteByte('"')
}

// histogram writes h's cumulative buckets, its sum and its count; le are its
// bounds as the le label writes them.
func (e *exposition) histogram(h *histogram, le *[len(bucketBounds{})]string) {
	var n uint64
	for i, upper := range le {
		n += uint64(h.counts[i])
		e.sample("_bucket", labelValue{name: "le", value: upper}, float64(n))
	}
	e.sample("_bucket", labelValue{name: "le", value: "+Inf"}, float64(h.count))
	e.sample("_sum", labelValue{}, h.sum)
	e.sample("_count", labelValue{}, float64(h.count))
}

// labelValue is a series' label besides namespace and name; first puts it before
// them (a name that sorts before "name").
type labelValue struct {
	name, value string
	first       bool
}

// appendFloat formats v as the text format does.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// writeEscaped writes s with the text format's escapes: a backslash and a line
// break always, a double quote in label values.
func writeEscaped(w *bufio.Writer, s string, quote bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			w.WriteString(`\\`)
		case c == '\n':
			w.WriteString(`\n`)
		case c == '"' && quote:
			w.WriteString(`\"`)
		default:
			w.WriteByte(c)
		}
	}
}

// sortedKeys are m's keys in order, so that a scrape's series are too. They are
// good until the next call.
func (e *exposition) sortedKeys(m map[string]float64) []string {
	e.keys = e.keys[:0]
	for k := range m {
		e.keys = append(e.keys, k)
	}
	slices.Sort(e.keys)
	return e.keys
}

// bucketBounds are a histogram's upper bounds; +Inf is implied.
type bucketBounds [12]float64

func (b *bucketBounds) leValues() [len(bucketBounds{})]string {
	var le [len(bucketBounds{})]string
	for i, upper := range b {
		le[i] = string(appendFloat(nil, upper))
	}
	return le
}

// histogram is one object's histogram: a few observations in its life, so a count
// per bucket rather than client_golang's histogram (about 1 KB each).
type histogram struct {
	counts [len(bucketBounds{})]uint32 // observations per bucket, not cumulative
	count  uint64
	sum    float64
}

// observe adds v to h, making h on first use.
func (h *histogram) observe(bounds *bucketBounds, v float64) *histogram {
	if h == nil {
		h = &histogram{}
	}
	for i, upper := range bounds {
		if v <= upper {
			h.counts[i]++
			break
		}
	}
	h.count++
	h.sum += v
	return h
}

// MetricNames are the names of the operator's own metrics (histograms without
// their _bucket, _sum and _count series).
func MetricNames() []string {
	names := make([]string, len(objectFamilies))
	for i, f := range objectFamilies {
		names[i] = f.name
	}
	return names
}
