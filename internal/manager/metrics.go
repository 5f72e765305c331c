package manager

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/aiinference/operator/internal/webhook"
)

// metricsOptions is the metrics server: with MetricsSecure, HTTPS (a certificate
// from MetricsCertDir, or a self-signed one the server makes) where every request
// needs a bearer token that the API server authenticates (TokenReview) and
// authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview):
// the aiinference-metrics-reader ClusterRole grants it. HTTP/2 is off either way
// (CVE-2023-44487, CVE-2023-39325: rapid reset and stream exhaustion).
func metricsOptions(opts Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsBindAddress, TLSOpts: webhook.TLSOptions()}
	if opts.MetricsSecure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.CertDir = opts.MetricsCertDir
	}
	return o
}
