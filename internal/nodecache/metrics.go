package nodecache

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aiinference/operator/internal/nodecachespec"
)

// metrics are the plugin's own: what the node holds and what publishes gave.
// Hits, misses and bytes read from the store are the loaders' (their summaries,
// which the operator exports per model).
type metrics struct {
	publishes    *prometheus.CounterVec
	hitBytes     prometheus.Counter
	evictions    prometheus.Counter
	evictedBytes prometheus.Counter
	bytes        prometheus.Gauge
	copies       *prometheus.GaugeVec
	budget       prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aiinference_node_cache_publishes_total",
			Help: "Pod volumes the node's model cache served, by outcome: Complete (a complete copy was on the node), Shared (a copy in progress), New (no copy yet), OverBudget (no room: a folder of the pod's own).",
		}, []string{"outcome"}),
		hitBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aiinference_node_cache_hit_bytes_total",
			Help: "Bytes of the complete copies handed to pods: what the store did not serve again (the loaders still check each file against it).",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aiinference_node_cache_evictions_total",
			Help: "Copies evicted (least recently used, mounted by no pod) to make room within the node's budget.",
		}),
		evictedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aiinference_node_cache_evicted_bytes_total",
			Help: "Bytes of the copies evicted.",
		}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aiinference_node_cache_bytes",
			Help: "Bytes of all copies on the node.",
		}),
		copies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "aiinference_node_cache_copies",
			Help: "Copies on the node, by state: complete, incomplete.",
		}, []string{"state"}),
		budget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aiinference_node_cache_budget_bytes",
			Help: "The node's budget for copies (0: none).",
		}),
	}
	reg.MustRegister(m.publishes, m.hitBytes, m.evictions, m.evictedBytes, m.bytes, m.copies, m.budget)
	return m
}

func (m *metrics) published(p Published) {
	m.publishes.WithLabelValues(string(p.Outcome)).Inc()
	m.hitBytes.Add(float64(p.HitBytes))
	for _, e := range p.Evicted {
		m.evictions.Inc()
		m.evictedBytes.Add(float64(e.Bytes))
	}
}

func (m *metrics) observe(r nodecachespec.Report) {
	m.bytes.Set(float64(r.UsedBytes))
	m.budget.Set(float64(r.BudgetBytes))
	var done, partial float64
	for _, e := range r.Entries {
		if e.Complete {
			done++
		} else {
			partial++
		}
	}
	m.copies.WithLabelValues("complete").Set(done)
	m.copies.WithLabelValues("incomplete").Set(partial)
}
