package aiinference

import (
	"maps"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The operator's own metrics, served beside controller-runtime's on the manager's
// metrics endpoint. They come from the status each reconcile computes, never from
// polling pods. Labels are bounded: namespace and name of the AIInference, plus a
// phase (6 values) or a reason (the words of api/v1/conditions.go and the loader's
// reasons); never a pod name. An object's series are removed when it is deleted.
// docs/metrics.md lists them.
//
// Each object's figures are kept in one small struct (objectMemory) and turned
// into series only when Prometheus scrapes (objectCollector), as kube-state-metrics
// does: a client_golang vector child per series cost about 9 KB per object, most
// of the operator's memory per object at 1,000 objects.
var (
	objectLabels = []string{"namespace", "name"}

	phaseDesc = prometheus.NewDesc("aiinference_phase",
		"1 for the AIInference's current phase (Pending, Loading, Ready, Degraded, Failed, Canary), 0 for the others.",
		append(objectLabels, "phase"), nil)
	phaseSinceDesc = prometheus.NewDesc("aiinference_phase_transition_timestamp_seconds",
		"Unix time at which the AIInference entered its current phase.", objectLabels, nil)
	readyReasonDesc = prometheus.NewDesc("aiinference_ready_reason",
		"1 for the reason of the AIInference's Ready condition (one series per object).", append(objectLabels, "reason"), nil)
	desiredDesc = prometheus.NewDesc("aiinference_replicas_desired",
		"Replicas the AIInference's spec asks for.", objectLabels, nil)
	readyDesc = prometheus.NewDesc("aiinference_replicas_ready",
		"Ready replicas of the AIInference, of the current spec or an earlier one (they serve traffic).", objectLabels, nil)
	updatedDesc = prometheus.NewDesc("aiinference_replicas_updated",
		"Replicas of the AIInference that run its current spec.", objectLabels, nil)
	loadingTimeoutDesc = prometheus.NewDesc("aiinference_loading_timeout_seconds",
		"The AIInference's loading.timeout: the bound on each stage of a load attempt.", objectLabels, nil)
	loadDurationDesc = prometheus.NewDesc("aiinference_model_load_duration_seconds",
		"Duration of completed model loads, from the loader's report (status.lastLoad).", objectLabels, nil)
	loadBytesDesc = prometheus.NewDesc("aiinference_model_load_bytes",
		"Size of the model in the last completed load (status.lastLoad.bytes).", objectLabels, nil)
	loadFetchedDesc = prometheus.NewDesc("aiinference_model_load_fetched_bytes",
		"Bytes the last completed load downloaded (0 on a cache hit).", objectLabels, nil)
	loadThroughputDesc = prometheus.NewDesc("aiinference_model_load_throughput_bytes_per_second",
		"Throughput of the last completed load: bytes downloaded over its duration.", objectLabels, nil)
	timeToReadyDesc = prometheus.NewDesc("aiinference_time_to_ready_seconds",
		"Time from a spec change (or creation) to Ready for that spec.", objectLabels, nil)
	loadRetriesDesc = prometheus.NewDesc("aiinference_load_retries_total",
		"Failed model loads counted against loading.maxRetries (increases of status.loadRetries).", objectLabels, nil)
	failuresDesc = prometheus.NewDesc("aiinference_failures_total",
		"Failures by reason: each time Ready enters a reason that needs a person (the Warning events), and each failed load by the loader's reason.",
		append(objectLabels, "reason"), nil)
	// canaryRollbacksDesc counts rollbacks, by analysis, failed loads or by hand;
	// the alert AIInferenceCanaryRolledBack watches it.
	canaryRollbacksDesc = prometheus.NewDesc("aiinference_canary_rollbacks_total",
		"Canary rollouts of the AIInference rolled back (a failed analysis, the canary's loads stopped, or aborted by hand).", objectLabels, nil)
	// rolloutDecisionsDesc counts the decisions of canary rollouts; decision is one
	// of the words of status.rollout.history (13 values).
	rolloutDecisionsDesc = prometheus.NewDesc("aiinference_rollout_decisions_total",
		"Decisions of the AIInference's canary rollouts (CanaryStarted, StepStarted, AnalysisPassed, Promoted, RolledBack, ...).",
		append(objectLabels, "decision"), nil)

	objectDescs = []*prometheus.Desc{phaseDesc, phaseSinceDesc, readyReasonDesc, desiredDesc, readyDesc, updatedDesc,
		loadingTimeoutDesc, loadDurationDesc, loadBytesDesc, loadFetchedDesc, loadThroughputDesc, timeToReadyDesc,
		loadRetriesDesc, failuresDesc, canaryRollbacksDesc, rolloutDecisionsDesc}

	loadDurationBuckets = bucketBounds{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200}
	timeToReadyBuckets  = bucketBounds{5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400}
)

var phases = [...]servingv1.Phase{servingv1.PhasePending, servingv1.PhaseLoading, servingv1.PhaseReady, servingv1.PhaseDegraded, servingv1.PhaseFailed, servingv1.PhaseCanary}

var metricsState = &statusMetrics{objects: map[types.NamespacedName]*objectMemory{}}

func init() {
	ctrlmetrics.Registry.MustRegister(objectCollector{metricsState})
}

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
	loadingTimeout          time.Duration

	loadRetriesTotal, canaryRollbacksTotal float64
	failuresTotal, decisionsTotal          map[string]float64 // by reason, by decision; nil until counted
	loadDuration, timeToReady              *histogram         // nil until observed
}

// loadFigures is what the metrics take of status.lastLoad.
type loadFigures struct {
	pod            string
	duration       time.Duration
	bytes, fetched int64
}

// record sets obj's metrics from the status this pass computed; before is the
// status the pass started from.
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
		mem.readyCounted = isReadyFor(before, obj.Generation)
		mem.loadRetries = before.LoadRetries
		if l := before.LastLoad; l != nil {
			mem.lastLoad, mem.hasLoad = figuresOf(l), true
		}
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
			mem.timeToReady = mem.timeToReady.observe(&timeToReadyBuckets, now.Sub(mem.genSince).Seconds())
		}
	}
	if c := meta.FindStatusCondition(after.Conditions, servingv1.ConditionReady); c != nil && mem.readyReason != c.Reason {
		if warningReasons[c.Reason] && mem.readyReason != "" {
			mem.failuresTotal = add(mem.failuresTotal, c.Reason, 1)
		}
		mem.readyReason = c.Reason
	}
	mem.desired, mem.ready, mem.updated = replicas(obj), after.ReadyReplicas, after.UpdatedReplicas
	mem.loadingTimeout = loadTimeout(obj)

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
		if d.Decision == decisionRolledBack || d.Decision == decisionAborted {
			mem.canaryRollbacksTotal++
		}
	}
}

func figuresOf(l *servingv1.LoadReport) loadFigures {
	return loadFigures{pod: l.Pod, duration: l.Duration.Duration, bytes: l.Bytes, fetched: l.BytesFetched}
}

// add adds v to counts[key], making the map on first use.
func add(counts map[string]float64, key string, v float64) map[string]float64 {
	if counts == nil {
		counts = map[string]float64{}
	}
	counts[key] += v
	return counts
}

// isReadyFor is true when status says the given generation is Ready.
func isReadyFor(st *servingv1.AIInferenceStatus, generation int64) bool {
	c := meta.FindStatusCondition(st.Conditions, servingv1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == generation
}

// forget removes a deleted object's series.
func (m *statusMetrics) forget(key types.NamespacedName) {
	m.mu.Lock()
	delete(m.objects, key)
	m.mu.Unlock()
}

// snapshot copies every object's figures, so that a scrape holds the lock only
// for the copy.
func (m *statusMetrics) snapshot() map[types.NamespacedName]objectMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[types.NamespacedName]objectMemory, len(m.objects))
	for key, mem := range m.objects {
		c := *mem
		c.failuresTotal, c.decisionsTotal = maps.Clone(mem.failuresTotal), maps.Clone(mem.decisionsTotal)
		if mem.loadDuration != nil {
			h := *mem.loadDuration
			c.loadDuration = &h
		}
		if mem.timeToReady != nil {
			h := *mem.timeToReady
			c.timeToReady = &h
		}
		out[key] = c
	}
	return out
}

// objectCollector turns statusMetrics into series at scrape time.
type objectCollector struct{ m *statusMetrics }

func (c objectCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range objectDescs {
		ch <- d
	}
}

func (c objectCollector) Collect(ch chan<- prometheus.Metric) {
	s := newScrapeLabels()
	for key, mem := range c.m.snapshot() {
		series := s.objectSeries(key, &mem)
		for i := range series {
			ch <- &series[i]
		}
	}
}

// A scrape holds every series of every object at once: the registry gathers
// them all before it writes any. At 1,000 objects client_golang's const metrics
// allocated 17.4 MB in a gather and held 10.5 MB of it until the scrape was
// written, which the garbage collector's goal then grew by half again: label
// pairs made anew for each series, a map per histogram. Here an object's series
// share its label pairs and read their values in place from one block per
// object: 10.5 MB allocated, 7.3 MB held (BenchmarkScrapeObjectMetrics).

// scrapeLabels are the label pairs one scrape shares between objects: the
// phases, and the reasons and decisions it met. (A scrape may encode them as
// protobuf, which writes into the messages, so scrapes do not share them.)
type scrapeLabels struct {
	phases             [len(phases)]*dto.LabelPair
	reasons, decisions map[string]*dto.LabelPair // by value
}

func newScrapeLabels() *scrapeLabels {
	s := &scrapeLabels{reasons: map[string]*dto.LabelPair{}, decisions: map[string]*dto.LabelPair{}}
	for i, p := range phases {
		s.phases[i] = labelPair("phase", string(p))
	}
	return s
}

func labelPair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: &name, Value: &value}
}

// pair is the label pair name=value of pairs, made on first use.
func pair(pairs map[string]*dto.LabelPair, name, value string) *dto.LabelPair {
	p := pairs[value]
	if p == nil {
		p = labelPair(name, value)
		pairs[value] = p
	}
	return p
}

// objectMetric is one series of an object in a scrape. Its labels are sorted by
// name, as the exposition wants them.
type objectMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	kind   prometheus.ValueType // GaugeValue or CounterValue, unless hist is set
	value  float64
	hist   *histogramValues
}

func (m *objectMetric) Desc() *prometheus.Desc { return m.desc }

func (m *objectMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	switch {
	case m.hist != nil:
		out.Histogram = m.hist.dto()
	case m.kind == prometheus.CounterValue:
		out.Counter = &dto.Counter{Value: &m.value}
	default:
		out.Gauge = &dto.Gauge{Value: &m.value}
	}
	return nil
}

// histogramValues is a histogram as the exposition reads it: cumulative counts
// by upper bound (+Inf is the count).
type histogramValues struct {
	count      uint64
	sum        float64
	cumulative [len(bucketBounds{})]uint64
	buckets    [len(bucketBounds{})]dto.Bucket
	bucketPtrs [len(bucketBounds{})]*dto.Bucket
}

func (h *histogramValues) set(from *histogram, bounds *bucketBounds) {
	h.count, h.sum = from.count, from.sum
	var n uint64
	for i := range bounds {
		n += uint64(from.counts[i])
		h.cumulative[i] = n
		h.buckets[i] = dto.Bucket{CumulativeCount: &h.cumulative[i], UpperBound: &bounds[i]}
		h.bucketPtrs[i] = &h.buckets[i]
	}
}

func (h *histogramValues) dto() *dto.Histogram {
	return &dto.Histogram{SampleCount: &h.count, SampleSum: &h.sum, Bucket: h.bucketPtrs[:]}
}

// objectBlock is everything one object's series of a scrape point at.
type objectBlock struct {
	namespace, name           dto.LabelPair
	base                      [2]*dto.LabelPair // name, namespace
	withPhase                 [len(phases)][3]*dto.LabelPair
	loadDuration, timeToReady histogramValues
	metrics                   []objectMetric
}

// objectSeries are the series of the object key whose figures are mem.
func (s *scrapeLabels) objectSeries(key types.NamespacedName, mem *objectMemory) []objectMetric {
	b := &objectBlock{}
	b.namespace = dto.LabelPair{Name: &objectLabels[0], Value: &key.Namespace}
	b.name = dto.LabelPair{Name: &objectLabels[1], Value: &key.Name}
	b.base = [2]*dto.LabelPair{&b.name, &b.namespace}
	base := b.base[:]
	// With one more label: sorted, "decision" goes first, "phase" and "reason" last.
	after := func(p *dto.LabelPair) []*dto.LabelPair { return []*dto.LabelPair{&b.name, &b.namespace, p} }
	before := func(p *dto.LabelPair) []*dto.LabelPair { return []*dto.LabelPair{p, &b.name, &b.namespace} }

	b.metrics = make([]objectMetric, 0, len(phases)+len(objectDescs)+len(mem.failuresTotal)+len(mem.decisionsTotal))
	gauge := func(desc *prometheus.Desc, v float64, labels []*dto.LabelPair) {
		b.metrics = append(b.metrics, objectMetric{desc: desc, labels: labels, kind: prometheus.GaugeValue, value: v})
	}
	counter := func(desc *prometheus.Desc, v float64, labels []*dto.LabelPair) {
		b.metrics = append(b.metrics, objectMetric{desc: desc, labels: labels, kind: prometheus.CounterValue, value: v})
	}
	for i, p := range phases {
		v := 0.0
		if p == mem.phase {
			v = 1
		}
		b.withPhase[i] = [3]*dto.LabelPair{&b.name, &b.namespace, s.phases[i]}
		gauge(phaseDesc, v, b.withPhase[i][:])
	}
	gauge(phaseSinceDesc, float64(mem.phaseSince.Unix()), base)
	if mem.readyReason != "" {
		gauge(readyReasonDesc, 1, after(pair(s.reasons, "reason", mem.readyReason)))
	}
	gauge(desiredDesc, float64(mem.desired), base)
	gauge(readyDesc, float64(mem.ready), base)
	gauge(updatedDesc, float64(mem.updated), base)
	gauge(loadingTimeoutDesc, mem.loadingTimeout.Seconds(), base)
	if mem.hasLoad {
		gauge(loadBytesDesc, float64(mem.lastLoad.bytes), base)
		gauge(loadFetchedDesc, float64(mem.lastLoad.fetched), base)
		if sec := mem.lastLoad.duration.Seconds(); sec > 0 {
			gauge(loadThroughputDesc, float64(mem.lastLoad.fetched)/sec, base)
		}
	}
	if mem.loadDuration != nil {
		b.loadDuration.set(mem.loadDuration, &loadDurationBuckets)
		b.metrics = append(b.metrics, objectMetric{desc: loadDurationDesc, labels: base, hist: &b.loadDuration})
	}
	if mem.timeToReady != nil {
		b.timeToReady.set(mem.timeToReady, &timeToReadyBuckets)
		b.metrics = append(b.metrics, objectMetric{desc: timeToReadyDesc, labels: base, hist: &b.timeToReady})
	}
	if mem.loadRetriesTotal > 0 {
		counter(loadRetriesDesc, mem.loadRetriesTotal, base)
	}
	for reason, v := range mem.failuresTotal {
		counter(failuresDesc, v, after(pair(s.reasons, "reason", reason)))
	}
	if mem.canaryRollbacksTotal > 0 {
		counter(canaryRollbacksDesc, mem.canaryRollbacksTotal, base)
	}
	for decision, v := range mem.decisionsTotal {
		counter(rolloutDecisionsDesc, v, before(pair(s.decisions, "decision", decision)))
	}
	return b.metrics
}

// bucketBounds are a histogram's upper bounds; +Inf is implied.
type bucketBounds [12]float64

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
	var names []string
	for _, d := range objectDescs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)
