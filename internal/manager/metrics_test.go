package manager

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/test/testutil"
)

// TestSecureMetrics runs the operator's manager with its default metrics
// options (HTTPS and authentication, --metrics-secure) against a real
// kube-apiserver and scrapes it with real ServiceAccount tokens: plain HTTP gets
// no metrics; with no token or one the API server does not authenticate the
// answer is 401, with a token whose ServiceAccount is not bound to config/rbac's
// metrics-reader ClusterRole 403, with one that is 200 and the metrics. HTTP/2
// is refused even to a client that offers it.
func TestSecureMetrics(t *testing.T) {
	cfg, root := testutil.StartEnvtest(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(cfg)

	// The reader ClusterRole exactly as config/rbac ships it.
	var reader rbacv1.ClusterRole
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "metrics_reader_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &reader); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := "metrics-test"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("prometheus"), token("stranger")
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// The default options but for the address (a free port, not :8443, which
	// another process may hold).
	mgr, err := New(cfg, Options{MetricsBindAddress: addr, HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test", skipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() { stop(); <-done })

	// The server's certificate is self-signed; what is checked here is who may read.
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}, //nolint:gosec // self-signed test server
		ForceAttemptHTTP2: true,
	}}
	scrape := func(token string) (int, string, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, err.Error(), ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Proto
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics server never listened: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Plain HTTP, without a token, gets no metrics.
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("scrape over plain HTTP: %d %.120q", resp.StatusCode, body)
		if resp.StatusCode == http.StatusOK || containsMetric(string(body), "controller_runtime_reconcile_total") {
			t.Errorf("scrape over plain HTTP without a token: %d with the metrics, want them refused", resp.StatusCode)
		}
	} else {
		t.Logf("scrape over plain HTTP: %v", err)
	}
	for {
		code, body, _ := scrape("")
		if code != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics server never answered over HTTPS: %s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct {
		who, token string
		want       int
	}{{"no token", "", http.StatusUnauthorized}, {"a token the API server does not know", "not-a-token", http.StatusUnauthorized}, {"a token without the reader role", stranger, http.StatusForbidden}, {"a token with the reader role", scraper, http.StatusOK}} {
		code, body, proto := scrape(c.token)
		short := body
		if len(short) > 120 {
			short = short[:120] + "..."
		}
		t.Logf("scrape with %s: %d %s: %q", c.who, code, proto, short)
		if code != c.want {
			t.Errorf("scrape with %s: got %d, want %d: %s", c.who, code, c.want, short)
		}
		if proto != "HTTP/1.1" {
			t.Errorf("scrape with %s: protocol %s, want HTTP/1.1 (HTTP/2 is off)", c.who, proto)
		}
		if c.want == http.StatusOK && !containsMetric(body, "controller_runtime_reconcile_total") {
			t.Errorf("accepted scrape has no controller_runtime_reconcile_total: %s", short)
		}
	}

	// An object's series come after the registry's, in one exposition that
	// Prometheus's parser reads (Go's transport asks for gzip and unpacks it).
	admin := testutil.NewClient(t, cfg, Scheme())
	if err := admin.Create(ctx, namespacedInference(ns)); err != nil {
		t.Fatal(err)
	}
	series := `aiinference_phase{name="chat",namespace="` + ns + `",phase="Pending"}`
	var body string
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(body, series); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the scrape:\n%s", series, body)
		}
		_, body, _ = scrape(scraper)
	}
	families, err := parseText(body)
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	for _, name := range []string{"controller_runtime_reconcile_total", "aiinference_phase", "aiinference_replicas_desired"} {
		if families[name] == nil {
			t.Errorf("the scrape has no family %s", name)
		}
	}
}

// TestMetricsOptions: metrics are served over HTTPS with authentication unless
// plain HTTP is asked for, and plain HTTP only on an address named for it.
func TestMetricsOptions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       Options
		wantAddr   string
		wantSecure bool
		wantErr    bool
	}{
		{name: "the defaults", opts: Options{}, wantAddr: ":8443", wantSecure: true},
		{name: "an address", opts: Options{MetricsBindAddress: "127.0.0.1:9443"}, wantAddr: "127.0.0.1:9443", wantSecure: true},
		{name: "off", opts: Options{MetricsBindAddress: "0"}, wantAddr: "0", wantSecure: true},
		{name: "plain HTTP on an address named for it", opts: Options{MetricsInsecure: true, MetricsBindAddress: "127.0.0.1:8080"}, wantAddr: "127.0.0.1:8080"},
		{name: "plain HTTP on the default address", opts: Options{MetricsInsecure: true}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := metricsOptions(tc.opts)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("served plain HTTP on %q, want it refused without an address", o.BindAddress)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.BindAddress != tc.wantAddr || o.SecureServing != tc.wantSecure || o.FilterProvider == nil {
				t.Errorf("bind %q secure %v filter %v, want bind %q secure %v and a filter", o.BindAddress, o.SecureServing,
					o.FilterProvider != nil, tc.wantAddr, tc.wantSecure)
			}
		})
	}
}

// TestObjectSeriesFollowTheRegistry: withObjectSeries answers in the text format
// whatever the scraper asks for first, compresses only a successful scrape, and
// adds nothing to an error or to another path.
func TestObjectSeriesFollowTheRegistry(t *testing.T) {
	objects := func(w io.Writer) error {
		_, err := io.WriteString(w, "# HELP aiinference_phase test\n# TYPE aiinference_phase gauge\naiinference_phase{name=\"a\",namespace=\"b\",phase=\"Ready\"} 1\n")
		return err
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "registry_gauge", Help: "test"}, func() float64 { return 2 }))
	serve := func(reg *prometheus.Registry, path string, header http.Header) *http.Response {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header = header
		withObjectSeries(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}), objects, logr.Discard()).ServeHTTP(rec, req)
		return rec.Result()
	}
	read := func(resp *http.Response) string {
		t.Helper()
		var body io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			body = gz
		}
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	prometheusAsks := http.Header{
		"Accept":          {"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"},
		"Accept-Encoding": {"gzip"},
	}
	for name, header := range map[string]http.Header{"as Prometheus asks": prometheusAsks, "plain": {}} {
		resp := serve(registry, "/metrics", header)
		body := read(resp)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if gzipped := resp.Header.Get("Content-Encoding") == "gzip"; gzipped != (header.Get("Accept-Encoding") == "gzip") {
			t.Errorf("%s: gzip %v", name, gzipped)
		}
		families, err := parseText(body)
		if err != nil || families["registry_gauge"] == nil || families["aiinference_phase"] == nil {
			t.Errorf("%s: want both families in one exposition, got %v:\n%s", name, err, body)
		}
	}

	failing := prometheus.NewRegistry()
	failing.MustRegister(failingCollector{prometheus.NewDesc("failing", "test", nil, nil)})
	resp := serve(failing, "/metrics", prometheusAsks)
	if body := read(resp); resp.StatusCode != http.StatusInternalServerError || strings.Contains(body, "aiinference_phase") {
		t.Errorf("a failed gather: %d %q, want 500 and no object series", resp.StatusCode, body)
	}
	if body := read(serve(registry, "/other", http.Header{})); strings.Contains(body, "aiinference_phase") {
		t.Errorf("another path got the object series: %q", body)
	}
}

// failingCollector's gather fails, as a collector's can.
type failingCollector struct{ desc *prometheus.Desc }

func (c failingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c failingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errors.New("the source is gone"))
}

func parseText(body string) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(strings.NewReader(body))
}

func containsMetric(body, name string) bool {
	return strings.Contains(body, "\n"+name+"{") || strings.HasPrefix(body, name)
}
