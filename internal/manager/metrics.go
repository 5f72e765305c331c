package manager

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/aiinference/operator/internal/webhook"
)

// metricsOptions is the metrics server: with MetricsSecure, HTTPS (a certificate
// from MetricsCertDir, or a self-signed one the server makes) where every request
// needs a bearer token that the API server authenticates (TokenReview) and
// authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview,
// metricsAuth):
// the aiinference-metrics-reader ClusterRole grants it. HTTP/2 is off either way
// (CVE-2023-44487, CVE-2023-39325: rapid reset and stream exhaustion).
func metricsOptions(opts Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsBindAddress, TLSOpts: webhook.TLSOptions()}
	if opts.MetricsSecure {
		o.SecureServing = true
		o.FilterProvider = metricsAuthFilter
		o.CertDir = opts.MetricsCertDir
	}
	return o
}

// registerClientMetrics adds client-go's request latency and its rate limiter's
// wait (rest_client_request_duration_seconds and
// rest_client_rate_limiter_duration_seconds, by verb) to controller-runtime's
// request count: they say whether a slow reconcile waits on the API server or
// on --kube-api-qps. Registering twice is harmless.
func registerClientMetrics() {
	metrics.RegisterRESTClientMetrics(metrics.MetricRequestLatency, metrics.MetricRateLimiterLatency)
}
