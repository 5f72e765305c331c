package analysis

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// QueryTimeout bounds each query, on the wire and in Prometheus's evaluation.
const QueryTimeout = 10 * time.Second

// Querier evaluates an instant PromQL query at a time. Errors that are
// Prometheus's answer are *promv1.Error (bad_data, execution, ...); any other
// error means Prometheus was not reached.
type Querier interface {
	Query(ctx context.Context, query string, ts time.Time) (model.Value, error)
}

// Prometheus is a Querier for a Prometheus server's HTTP API.
type Prometheus struct {
	api     promv1.API
	timeout time.Duration
}

// NewPrometheus is a Querier for the Prometheus at rawURL (e.g.
// http://prometheus.monitoring:9090), each query bounded by QueryTimeout.
func NewPrometheus(rawURL string) (*Prometheus, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("prometheus URL %q: want an http:// or https:// URL such as http://prometheus.monitoring:9090", rawURL)
	}
	client, err := api.NewClient(api.Config{Address: rawURL})
	if err != nil {
		return nil, fmt.Errorf("prometheus client for %s: %w", rawURL, err)
	}
	return &Prometheus{api: promv1.NewAPI(client), timeout: QueryTimeout}, nil
}

// Query implements Querier. Prometheus's warnings are dropped: a query that
// warns still has an answer to judge.
func (p *Prometheus) Query(ctx context.Context, query string, ts time.Time) (model.Value, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	v, _, err := p.api.Query(ctx, query, ts, promv1.WithTimeout(p.timeout))
	return v, err
}
