package router

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
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
	refusedMetric         = "aiinference_router_refused_requests_total"
	shedMetric            = "aiinference_router_shed_requests_total"
	ejectedMetric         = "aiinference_router_ejected_endpoints"
	ejectionsMetric       = "aiinference_router_ejections_total"
)

// MetricNames are the names of the router's metrics, for docs and dashboards.
func MetricNames() []string {
	return []string{requestsMetric, picksMetric, prefixBlocksMetric, prefixHitBlocksMetric, ttftMetric,
		queueMetric, waitingMetric, inFlightMetric, upstreamErrorsMetric, readyEndpointsMetric,
		refusedMetric, shedMetric, ejectedMetric, ejectionsMetric}
}

// Upstream error kinds.
const (
	errorRefused = "refused" // the connection was refused or could not be made; retried elsewhere
	errorBroken  = "broken"  // the connection broke before any byte of an answer; retried elsewhere, once
	errorFailed  = "failed"  // the request failed after it was sent
	// server_error: a 5xx answer, held back and tried again on another
	// replica (passed on, when no retry is left, it counts in requests only).
	errorServerError = "server_error"
	// silent: a streamed answer's headers did not come within
	// --stream-header-timeout; tried again on another replica when it may be.
	errorSilent = "silent"
)

// Why a request was refused for a bound of the router (refused_requests_total).
const (
	reasonRequests = "requests" // the requests in the router, in all, of the namespace or of the model
	reasonBodies   = "bodies"   // the request bodies or their bytes
)

// Why a request was shed (shed_requests_total).
const (
	shedSaturated = "saturated"  // Sheddable, while every replica is saturated
	shedQueueFull = "queue_full" // the model's queue was full of requests as urgent, from tenants with shorter queues
	shedForRoom   = "for_room"   // queued, then shed for a more urgent request or one of a shorter tenant queue
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
	refusedRequests *prometheus.CounterVec
	shedRequests    *prometheus.CounterVec
	ejectedNow      *prometheus.GaugeVec
	ejections       *prometheus.CounterVec
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
			Help: "Requests a replica did not answer: refused (tried again on another), broken before an answer, server_error (a 5xx held back), silent (no streamed headers in time; these three tried again on another within the retry budget) or failed."}, append(endpoint, "kind")),
		readyEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: readyEndpointsMetric,
			Help: "Serving replicas of the model the router can pick, at its last request."}, model),
		refusedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: refusedMetric,
			Help: "Requests answered 429 at once because the router, the namespace or the model held its share of requests (reason requests) or of request bodies (bodies). name is empty for a namespace's address before the body named the model."},
			append(model, "reason")),
		shedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: shedMetric,
			Help: "Requests answered 429 while every replica of the model was saturated: Sheddable ones at once (saturated), those finding the queue full (queue_full), and queued ones shed to make room (for_room)."},
			append(model, "priority", "reason")),
		ejectedNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ejectedMetric,
			Help: "1 while the replica is out of the picking for failing (passive outlier detection), until its trial request succeeds."}, endpoint),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ejectionsMetric,
			Help: "Times the replica was taken out of the picking for failing its answers in a row."}, endpoint),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.picks, m.prefixBlocks, m.prefixHitBlocks, m.ttft, m.queue, m.waiting,
			m.inFlight, m.upstreamErrors, m.readyEndpoints, m.refusedRequests, m.shedRequests, m.ejectedNow, m.ejections)
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

func (m *Metrics) refused(key types.NamespacedName, reason string) {
	m.refusedRequests.WithLabelValues(key.Namespace, key.Name, reason).Inc()
}

func (m *Metrics) shed(key types.NamespacedName, priority servingv1.RequestPriority, reason string) {
	m.shedRequests.WithLabelValues(key.Namespace, key.Name, string(priority), reason).Inc()
}

func (m *Metrics) ejected(key types.NamespacedName, endpoint string, out bool) {
	if out {
		m.ejections.WithLabelValues(key.Namespace, key.Name, endpoint).Inc()
		m.ejectedNow.WithLabelValues(key.Namespace, key.Name, endpoint).Set(1)
		return
	}
	m.ejectedNow.WithLabelValues(key.Namespace, key.Name, endpoint).Set(0)
}

// forgetEndpoint drops a replica's series once it no longer serves.
func (m *Metrics) forgetEndpoint(key types.NamespacedName, endpoint string) {
	labels := prometheus.Labels{"namespace": key.Namespace, "name": key.Name, "endpoint": endpoint}
	m.requests.DeletePartialMatch(labels)
	m.picks.DeletePartialMatch(labels)
	m.ttft.DeletePartialMatch(labels)
	m.inFlight.DeletePartialMatch(labels)
	m.upstreamErrors.DeletePartialMatch(labels)
	m.ejectedNow.DeletePartialMatch(labels)
	m.ejections.DeletePartialMatch(labels)
}
