package analysistest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// HTTPMetricsProxy stands in for the HTTP metrics of vLLM's OpenAI API server,
// which llm-d-inference-sim does not export: it forwards every request to the
// simulator and counts the responses as prometheus-fastapi-instrumentator does in
// vLLM, http_requests_total{handler, method, status} with the status grouped as
// 2xx, 4xx, 5xx and the route as handler. Its /metrics serves the simulator's
// metrics followed by that counter, so one scrape gets both, as from vLLM.
// In production the same numbers come from vLLM itself, or from the gateway.
type HTTPMetricsProxy struct {
	// Addr is host:port to send requests to and to scrape.
	Addr string
}

// routes are the API routes vLLM's instrumentator names; others are "none"
// (its grouping of untemplated paths). vLLM leaves health and metrics routes
// uncounted; the simulator's /admin is not vLLM's and is left out too.
var routes = map[string]bool{
	"/v1/completions": true, "/v1/chat/completions": true, "/v1/models": true, "/v1/embeddings": true,
}

func uncounted(path string) bool {
	return path == "/metrics" || strings.HasPrefix(path, "/health") || strings.HasPrefix(path, "/admin")
}

// StartHTTPMetricsProxy starts a proxy in front of the server at upstream
// (host:port). It stops when the test ends.
func StartHTTPMetricsProxy(t testing.TB, upstream string) *HTTPMetricsProxy {
	t.Helper()
	target := &url.URL{Scheme: "http", Host: upstream}
	registry := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_requests_total",
		Help: "Total number of requests by method, status and handler.",
	}, []string{"handler", "method", "status"})
	registry.MustRegister(requests)

	forward := httputil.NewSingleHostReverseProxy(target)
	// A client that goes away (the load stopping) is no error of the server's:
	// answer 502 as a gateway would, without logging after the test.
	forward.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) {
		w.WriteHeader(http.StatusBadGateway)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, target.String()+"/metrics", nil)
		req.Header.Set("Accept", "text/plain;version=0.0.4")
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		var body bytes.Buffer
		if _, err := io.Copy(&body, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
			http.Error(w, fmt.Sprintf("upstream /metrics: %s %v", resp.Status, err), http.StatusBadGateway)
			return
		}
		if body.Len() > 0 && !bytes.HasSuffix(body.Bytes(), []byte("\n")) {
			body.WriteByte('\n')
		}
		families, err := registry.Gather()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		for _, mf := range families {
			if _, err := expfmt.MetricFamilyToText(&body, mf); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body.Bytes())
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if uncounted(r.URL.Path) {
			forward.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		forward.ServeHTTP(rec, r)
		handler := "none"
		if routes[r.URL.Path] {
			handler = r.URL.Path
		}
		requests.WithLabelValues(handler, r.Method, strconv.Itoa(rec.status)[:1]+"xx").Inc()
	})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &HTTPMetricsProxy{Addr: l.Addr().String()}
}

// statusRecorder keeps the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// Flush lets streamed responses through as they come.
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func splitHostPort(addr string) (string, string, error) { return net.SplitHostPort(addr) }
