package activator

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// Metrics are the activator's own series. Held requests are labelled with
// their model (a model has series only while the activator has seen requests
// for it); results are a handful of words.
type Metrics struct {
	held     *prometheus.GaugeVec
	requests *prometheus.CounterVec
	wait     prometheus.Histogram
}

// Request results.
const (
	resultServed   = "served"
	resultFull     = "queue_full"
	resultTimedOut = "timed_out"
	resultStopping = "stopping"
	resultGone     = "client_gone"
	// resultRefused: a replica came, but the model's policy no longer lets
	// the client in (403).
	resultRefused = "refused"
)

// The activator's metric names.
const (
	heldMetric     = "aiinference_activator_held_requests"
	requestsMetric = "aiinference_activator_requests_total"
	waitMetric     = "aiinference_activator_wait_seconds"
)

// MetricNames are the names of the activator's metrics, for docs and dashboards.
func MetricNames() []string { return []string{heldMetric, requestsMetric, waitMetric} }

// NewMetrics registers the activator's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: heldMetric,
			Help: "Requests the activator holds now for a model with no serving replica."}, []string{"namespace", "name"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: requestsMetric,
			Help: "Requests the activator held, by how they ended: served, queue_full (429), timed_out (503), stopping (503), client_gone, refused (403: the policy changed while it waited)."}, []string{"result"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: waitMetric,
			Help:    "How long a served request waited in the activator for a replica: the cold start its client saw.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}}),
	}
	if reg != nil {
		reg.MustRegister(m.held, m.requests, m.wait)
	}
	return m
}

func (m *Metrics) setHeld(key types.NamespacedName, n int) {
	if m != nil {
		m.held.WithLabelValues(key.Namespace, key.Name).Set(float64(n))
	}
}

func (m *Metrics) ended(result string, waited float64) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(result).Inc()
	if result == resultServed {
		m.wait.Observe(waited)
	}
}
