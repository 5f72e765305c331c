package router

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aiinference/operator/internal/autoscale"
)

// The router's metric names (see the package doc).
const (
	requestsMetric        = "aiinference_router_requests_total"
	picksMetric           = autoscale.RouterPicksMetric
	prefixBlocksMetric    = "aiinference_router_prefix_blocks_total"
	prefixHitBlocksMetric = "aiinference_router_prefix_hit_blocks_total"
	ttftMetric            = "aiinference_router_ttft_seconds"
	queueMetric           = "aiinference_router_queue_seconds"
	waitingMetric         = autoscale.RouterWaitingMetric
	inFlightMetric        = "aiinference_router_in_flight_requests"
	upstreamErrorsMetric  = "aiinference_router_upstream_errors_total"
	readyEndpointsMetric  = "aiinference_router_ready_endpoints"
)

// MetricNames are the names of the router's metrics, for docs and dashboards.
func MetricNames() []string {
	return []string{requestsMetric, picksMetric, prefixBlocksMetric, prefixHitBlocksMetric, ttftMetric,
		queueMetric, waitingMetric, inFlightMetric, upstreamErrorsMetric, readyEndpointsMetric}
}

// Upstream error kinds.
const (
	errorRefused = "refused" // the connection was refused or could not be made; retried elsewhere
	errorBroken  = "broken"  // the connection broke before any byte of an answer; retried elsewhere, once
	errorFailed  = "failed"  // the request failed after it was sent
)

// Metrics are the router's series, per model and replica. A model or replica
// has series only once the router has routed to it; a replica's are deleted
// when it stops serving.
type Metrics struct {
	requests        *prometheus.CounterVec
	picks           *prometheus.CounterVec
	prefixBlocks    *prometheus.CounterVec
	prefixHitBlocks *prometheus.CounterVec
	ttft            *prometheus.HistogramVec
	queue           *prometheus.HistogramVec
	waiting         *prometheus.GaugeVec
	inFlight        *prometheus.GaugeVec
	upstreamErrors  *prometheus.CounterVec
	readyEndpoints  *prometheus.GaugeVec
}

// NewMetrics registers the router's metrics with reg (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	model := []string{"namespace", "name"}
	endpoint := []string{"namespace", "name", "endpoint"}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: requestsMetric,
			Help: "Requests the router answered, by model, replica (empty when none was reached) and HTTP status."},
			append(endpoint, "code")),
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: picksMetric,
			Help: "Replicas picked, by why: prefix, adapter, hash, spill, session, load, retry."}, append(endpoint, "reason")),
		prefixBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefixBlocksMetric,
			Help: "Whole prompt blocks routed (--block-size bytes each)."}, model),
		prefixHitBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefixHitBlocksMetric,
			Help: "Prompt blocks routed to a replica this router sent them to before: the estimated prefix-cache hits."}, model),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: ttftMetric,
			Help:    "Time from the request's arrival to the first byte of the replica's answer body, as the router sees it.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60}}, endpoint),
		queue: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: queueMetric,
			Help:    "Time a request waited in the router for a serving replica before it was sent.",
			Buckets: []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300}}, model),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: waitingMetric,
			Help: "Requests waiting in the router for a serving replica of the model: traffic its engines have not seen yet."}, model),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: inFlightMetric,
			Help: "Requests this router has sent to a replica and not seen end."}, endpoint),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: upstreamErrorsMetric,
			Help: "Requests a replica did not answer: refused (tried again on another), broken before an answer (tried again on another, once) or failed."}, append(endpoint, "kind")),
		readyEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: readyEndpointsMetric,
			Help: "Serving replicas of the model the router can pick, at its last request."}, model),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.picks, m.prefixBlocks, m.prefixHitBlocks, m.ttft, m.queue, m.waiting,
			m.inFlight, m.upstreamErrors, m.readyEndpoints)
	}
	return m
}

func (m *Metrics) picked(key types.NamespacedName, p Pick, blocks int) {
	m.picks.WithLabelValues(key.Namespace, key.Name, p.Endpoint.Name, p.Reason).Inc()
	m.prefixBlocks.WithLabelValues(key.Namespace, key.Name).Add(float64(blocks))
	m.prefixHitBlocks.WithLabelValues(key.Namespace, key.Name).Add(float64(p.HitBlocks))
}

func (m *Metrics) answered(key types.NamespacedName, endpoint string, code int) {
	m.requests.WithLabelValues(key.Namespace, key.Name, endpoint, strconv.Itoa(code)).Inc()
}

// forgetEndpoint drops a replica's series once it no longer serves.
func (m *Metrics) forgetEndpoint(key types.NamespacedName, endpoint string) {
	labels := prometheus.Labels{"namespace": key.Namespace, "name": key.Name, "endpoint": endpoint}
	m.requests.DeletePartialMatch(labels)
	m.picks.DeletePartialMatch(labels)
	m.ttft.DeletePartialMatch(labels)
	m.inFlight.DeletePartialMatch(labels)
	m.upstreamErrors.DeletePartialMatch(labels)
}
