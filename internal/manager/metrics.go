package manager

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/webhook"
)

// DefaultMetricsBindAddress is where metrics are served unless told otherwise:
// over HTTPS, as Kubebuilder's scaffold serves them.
const DefaultMetricsBindAddress = ":8443"

// metricsOptions is the metrics server: by default HTTPS (a certificate from
// MetricsCertDir, or a self-signed one the server makes) where every request
// needs a bearer token that the API server authenticates (TokenReview) and
// authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview,
// metricsAuth): the aiinference-metrics-reader ClusterRole grants it. The
// metrics name every namespace and object, so plain HTTP, to anyone, is only
// for who asks for it (MetricsInsecure) on an address they name. HTTP/2 is off
// either way (CVE-2023-44487, CVE-2023-39325: rapid reset and stream
// exhaustion). Either way /metrics ends with every AIInference's series
// (withObjectSeries).
func metricsOptions(opts Options) (metricsserver.Options, error) {
	addr := opts.MetricsBindAddress
	if opts.MetricsInsecure {
		if addr == "" {
			return metricsserver.Options{}, errors.New("metrics over plain HTTP serve every namespace's and object's names " +
				"to anyone who connects: name the address to serve them on (--metrics-bind-address, e.g. 127.0.0.1:8080), " +
				"or serve them over HTTPS with authentication (--metrics-secure, the default)")
		}
		return metricsserver.Options{BindAddress: addr, TLSOpts: webhook.TLSOptions(), FilterProvider: objectSeriesFilter}, nil
	}
	if addr == "" {
		addr = DefaultMetricsBindAddress
	}
	return metricsserver.Options{
		BindAddress:   addr,
		SecureServing: true,
		CertDir:       opts.MetricsCertDir,
		TLSOpts:       webhook.TLSOptions(),
		FilterProvider: func(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
			auth, err := metricsAuthFilter(cfg, httpClient)
			if err != nil {
				return nil, err
			}
			return func(log logr.Logger, next http.Handler) (http.Handler, error) {
				return auth(log, withObjectSeries(next, aiinference.WriteObjectMetrics, log))
			}, nil
		},
	}, nil
}

func objectSeriesFilter(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return withObjectSeries(next, aiinference.WriteObjectMetrics, log), nil
	}, nil
}

// withObjectSeries serves next, the registry's families, in the text format,
// then writes every AIInference's series after them as the scrape goes out
// (writeObjects: aiinference.WriteObjectMetrics), rather than gathering them into the
// registry's families first: at 1,000 objects a gathered scrape held 7.3 MB,
// one written this way 0.7 MB (BenchmarkScrapeObjectMetrics). Prometheus reads
// the text format whatever it asks for first; gzip is kept when it is offered.
func withObjectSeries(next http.Handler, writeObjects func(io.Writer) error, log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != metricsPath {
			next.ServeHTTP(w, req)
			return
		}
		registry := req.Clone(req.Context())
		registry.Header.Del("Accept") // the text format, which the object series continue
		registry.Header.Del("Accept-Encoding")
		out := &scrapeWriter{ResponseWriter: w, gzip: acceptsGzip(req)}
		next.ServeHTTP(out, registry)
		out.WriteHeader(http.StatusOK) // when next wrote nothing
		if out.status == http.StatusOK {
			// The status line is out: a failure here (the scraper went away) can
			// only cut the scrape short, which Prometheus reports as a failed scrape.
			if err := writeObjects(out.body); err != nil {
				log.V(1).Info("Writing the AIInference series failed", "error", err.Error())
			}
		}
		out.close()
	})
}

const metricsPath = "/metrics"

var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// scrapeWriter passes the registry's answer through, compressing a successful
// one when the scraper accepts gzip; body is where the rest of the scrape goes.
type scrapeWriter struct {
	http.ResponseWriter
	gzip   bool
	status int
	body   io.Writer
	gz     *gzip.Writer
}

func (s *scrapeWriter) WriteHeader(code int) {
	if s.status != 0 {
		return
	}
	s.status, s.body = code, s.ResponseWriter
	s.Header().Del("Content-Length") // the object series follow
	if code == http.StatusOK && s.gzip {
		s.Header().Set("Content-Encoding", "gzip")
		s.gz = gzipWriters.Get().(*gzip.Writer)
		s.gz.Reset(s.ResponseWriter)
		s.body = s.gz
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *scrapeWriter) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.body.Write(p)
}

func (s *scrapeWriter) close() {
	if s.gz != nil {
		_ = s.gz.Close()
		s.gz.Reset(nil)
		gzipWriters.Put(s.gz)
	}
}

// acceptsGzip is true when the request's Accept-Encoding offers gzip.
func acceptsGzip(req *http.Request) bool {
	for _, part := range strings.Split(req.Header.Get("Accept-Encoding"), ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// registerClientMetrics adds client-go's request latency and its rate limiter's
// wait (rest_client_request_duration_seconds and
// rest_client_rate_limiter_duration_seconds, by verb) to controller-runtime's
// request count: they say whether a slow reconcile waits on the API server or
// on --kube-api-qps. Registering twice is harmless.
func registerClientMetrics() {
	metrics.RegisterRESTClientMetrics(metrics.MetricRequestLatency, metrics.MetricRateLimiterLatency)
}
