package analysistest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ScrapeInterval is how often the test Prometheus scrapes: short, so a run's
// window of a few seconds holds enough scrapes.
const ScrapeInterval = time.Second

// ScrapeTarget is one pod's metrics endpoint and the labels Prometheus gives its
// series: namespace and pod, as a Prometheus Operator PodMonitor (or kubernetes_sd
// relabeling) does, so analysis.Target selectors written for a cluster match.
type ScrapeTarget struct {
	// Addr is host:port serving /metrics.
	Addr string
	// Namespace and Pod label every series scraped from Addr.
	Namespace, Pod string
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	// URL of its HTTP API, e.g. http://127.0.0.1:40123.
	URL string
	srv *server
}

// StartPrometheus starts a Prometheus server that scrapes the targets every
// ScrapeInterval, and waits until it is ready. It stops when the test ends, or on Stop.
func StartPrometheus(t testing.TB, targets []ScrapeTarget) *Prometheus {
	t.Helper()
	_, promBin, err := binaries()
	if err != nil {
		t.Skipf("analysis real-component test needs llm-d-inference-sim and prometheus: %v", err)
	}
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n",
		ScrapeInterval, ScrapeInterval, ScrapeInterval)
	cfg.WriteString("scrape_configs:\n  - job_name: model-servers\n    static_configs:\n")
	for _, tg := range targets {
		// JSON strings are YAML strings.
		addr, _ := json.Marshal(tg.Addr)
		ns, _ := json.Marshal(tg.Namespace)
		pod, _ := json.Marshal(tg.Pod)
		fmt.Fprintf(&cfg, "      - targets: [%s]\n        labels: {namespace: %s, pod: %s}\n", addr, ns, pod)
	}
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := launchServer(t, func(string) string { return "prometheus" }, promBin, func(port string) []string {
		return []string{
			"--config.file=" + config,
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=127.0.0.1:" + port,
			"--log.level=warn",
		}
	})
	srv.waitReady(t, "/-/ready", 30*time.Second)
	return &Prometheus{URL: "http://" + srv.addr, srv: srv}
}

// Stop stops the server; queries then fail as for an unreachable Prometheus.
func (p *Prometheus) Stop() { p.srv.proc.Stop() }

// WaitForTargetsUp waits until Prometheus has scraped n targets successfully.
// Prometheus's discovery manager hands new targets to the scrapers at most every
// 5 s, so the first scrape comes about 5 s after the start.
func (p *Prometheus) WaitForTargetsUp(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last float64
	for time.Now().Before(deadline) {
		if v, ok := p.QueryValue(t, "count(up == 1)"); ok {
			last = v
			if int(v) >= n {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("Prometheus scraped %v targets successfully within %s, want %d", last, timeout, n)
}

// QueryValue evaluates an instant query that gives one number; ok is false for
// an empty result.
func (p *Prometheus) QueryValue(t testing.TB, query string) (float64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/query?query="+url.QueryEscape(query), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("query %s: %v", query, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Status != "success" {
		t.Fatalf("query %s: %s %v %s", query, resp.Status, err, body.Error)
	}
	if len(body.Data.Result) == 0 {
		return 0, false
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("query %s: value %q: %v", query, s, err)
	}
	return f, true
}
