package manager

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/testutil"
)

// TestSecureMetrics runs the operator's manager with --metrics-secure against a
// real kube-apiserver and scrapes it with real ServiceAccount tokens: with no
// token or one the API server does not authenticate the answer is 401, with a token whose ServiceAccount is not bound to
// config/rbac's metrics-reader ClusterRole 403, with one that is 200 and the
// metrics. HTTP/2 is refused even to a client that offers it.
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
	mgr, err := New(cfg, Options{MetricsBindAddress: addr, MetricsSecure: true, HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test", skipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() { stop(); <-done })

	// The server's certificate is self-signed; what is checked here is who may read.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}, //nolint:gosec // self-signed test server
		ForceAttemptHTTP2: true,
	}}
	scrape := func(token string) (int, string, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error(), ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Proto
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, body, _ := scrape("")
		if code != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics server never answered: %s", body)
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
}

func containsMetric(body, name string) bool {
	return strings.Contains(body, "\n"+name+"{") || strings.HasPrefix(body, name)
}
