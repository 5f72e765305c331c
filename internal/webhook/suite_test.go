package webhook_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/internal/webhook"
	"github.com/aiinference/operator/test/testutil"
)

// The suite runs a real kube-apiserver and etcd (envtest) and the real manager
// with its webhooks. The API server calls the webhooks over TLS at
// https://localhost:<port>, with the CA bundle the operator's own certificate
// rotation injects. The serving certificate is issued for 60 s and replaced 45 s
// before it expires, so it rotates about every 15 s all through the suite.
const (
	certNamespace = "aiinference-system"
	certLifetime  = 60 * time.Second
	rotateBefore  = 45 * time.Second
)

var (
	k8s         client.Client
	restConfig  *rest.Config
	envtestEnv  *envtest.Environment
	webhookAddr string // 127.0.0.1:port of the webhook server
	readyzURL   string
	manifests   *webhook.LocalManifests
	// stopManager stops the operator (for the webhook-down check after the tests).
	stopManager func()
	// operatorLog is everything the operators of this process log, at debug level.
	operatorLog = &lockedBuffer{}
	// notReadySeen is whether readiness was seen failing before the webhook served.
	notReadySeen bool
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func testScheme() *runtime.Scheme {
	s := manager.Scheme()
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	return s
}

func runSuite(m *testing.M) int {
	var logs io.Writer = io.Discard
	if os.Getenv("TEST_OPERATOR_LOGS") != "" {
		logs = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(logs, operatorLog)), zap.UseDevMode(true)))
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		return 1
	}
	assets, err := testutil.EnvtestAssets()
	if err != nil {
		return fail("envtest binaries", err)
	}
	root, err := testutil.RepoRoot()
	if err != nil {
		return fail("repository root", err)
	}
	port, err := freePort()
	if err != nil {
		return fail("free port", err)
	}
	webhookAddr = "127.0.0.1:" + strconv.Itoa(port)
	manifests, err = webhook.LoadLocalManifests(root, "https://localhost:"+strconv.Itoa(port))
	if err != nil {
		return fail("manifests", err)
	}
	// The CRD is installed below rather than by envtest, which would point its
	// conversion webhook at a server and CA of its own.
	envtestEnv = &envtest.Environment{BinaryAssetsDirectory: assets}
	restConfig, err = testutil.StartEnvironment(envtestEnv)
	if err != nil {
		return fail("starting envtest", err)
	}
	defer func() { _ = envtestEnv.Stop() }()
	k8s, err = client.New(restConfig, client.Options{Scheme: testScheme()})
	if err != nil {
		return fail("client", err)
	}
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: certNamespace}},
		manifests.CRD.DeepCopy(), manifests.Mutating.DeepCopy(), manifests.Validating.DeepCopy(),
	} {
		if err := k8s.Create(ctx, obj); err != nil {
			return fail("installing "+obj.GetName(), err)
		}
	}
	if err := envtest.WaitForCRDs(restConfig, []*apiextensionsv1.CustomResourceDefinition{manifests.CRD},
		envtest.CRDInstallOptions{MaxTime: time.Minute, PollInterval: 100 * time.Millisecond}); err != nil {
		return fail("waiting for the CRD", err)
	}

	probePort, err := freePort()
	if err != nil {
		return fail("free port", err)
	}
	readyzURL = fmt.Sprintf("http://127.0.0.1:%d/readyz/webhook", probePort)
	certDir, err := os.MkdirTemp("", "aiinference-webhook-certs-")
	if err != nil {
		return fail("cert dir", err)
	}
	defer func() { _ = os.RemoveAll(certDir) }()
	mgr, err := manager.New(restConfig, manager.Options{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: fmt.Sprintf("127.0.0.1:%d", probePort),
		LoaderImage:            "example.test/model-loader:test",
		Webhook: &webhook.Options{
			Port: port, Host: "127.0.0.1", CertDir: certDir, CertMode: webhook.CertSelfManaged,
			SecretName: webhook.DefaultSecretName, SecretNamespace: certNamespace, DNSName: "localhost",
			CRDName: manifests.CRD.Name, MutatingConfigName: manifests.Mutating.Name, ValidatingConfigName: manifests.Validating.Name,
			CertValidity: certLifetime, RotateBefore: rotateBefore, CheckEvery: 2 * time.Second,
		},
	})
	if err != nil {
		return fail("manager", err)
	}
	mgrCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	stopped := false
	stopManager = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stopManager()

	start := time.Now()
	if err := waitReady(2 * time.Minute); err != nil {
		return fail("the operator never became ready", err)
	}
	fmt.Fprintf(os.Stderr, "operator ready with its webhooks after %s (readiness failed before: %v)\n", time.Since(start).Round(time.Millisecond), notReadySeen)
	code := m.Run()
	logf := func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	if err := checkWebhookDownIsAClearAPIError(logf); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: with the operator down:", err)
		code = 1
	}
	return code
}

// waitReady polls the manager's webhook readiness check until it passes.
func waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(readyzURL)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			notReadySeen = true
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("last answer: %s", last)
}

// lockedBuffer is a bytes.Buffer that the operator's goroutines may write to
// while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Since returns what was written after the first offset bytes, and the new offset.
func (b *lockedBuffer) Since(offset int) (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf.Bytes()[offset:]), b.buf.Len()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// servedCert is the SHA-256 of the certificate the webhook server presents now.
func servedCert() (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", webhookAddr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate only
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	return fmt.Sprintf("%x", sha256.Sum256(conn.ConnectionState().PeerCertificates[0].Raw)), nil
}

// newNamespace gives a test its own namespace.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "aii-webhook-test-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}
