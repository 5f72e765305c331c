// Package integration tests the AIInference controller inside the real manager
// against a real kube-apiserver and etcd (envtest). The pure unit tests live
// beside the controller and need no binaries.
package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/testutil"
)

// The suite runs one real kube-apiserver and etcd (envtest) and the real manager.
var (
	k8s client.Client
	// managerWrites counts the manager's write requests to the API server.
	managerWrites atomic.Int64
	// writeLog records the manager's write requests, for failure messages.
	writeLog sync.Map
	// secretReads counts, per namespace ("" for the cluster), the manager's
	// requests for Secrets: there must be none, as the operator may not read them.
	secretReads sync.Map
	// reconciles counts, per namespace, the reconciles the controller started (its
	// Reconcile spans): a test sees its own object's reconciles this way.
	reconciles sync.Map
	// childReads records, per namespace, the manager's reads of single
	// ConfigMaps, Services and Deployments from the API server (not the cache).
	childReads sync.Map
)

// operatorNamespace is where the suite's operator runs, as a pod would: the
// router's Service is looked for there.
const operatorNamespace = "aiinference-system"

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	var logs io.Writer = io.Discard
	if os.Getenv("TEST_OPERATOR_LOGS") != "" {
		logs = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	trafficCRDs, err := testutil.TrafficCRDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, cfg, err := testutil.StartSuiteEnvtest(trafficCRDs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	k8s, err = client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(reconcileCounter{})))
	mgrCfg := rest.CopyConfig(cfg)
	mgrCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return writeCounter{rt} }
	activatorIP, err = hostIP()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := manager.New(mgrCfg, manager.Options{MetricsBindAddress: "0", HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test",
		AutoscaleInterval: time.Second, ActivatorBindAddress: net.JoinHostPort(activatorIP, "0"), ActivatorAdvertiseAddress: activatorIP,
		OperatorNamespace: operatorNamespace, RouterService: manager.DefaultRouterService})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	code := m.Run()
	var read []string
	secretReads.Range(func(ns, n any) bool {
		read = append(read, fmt.Sprintf("%q: %d", ns, n.(*atomic.Int64).Load()))
		return true
	})
	if len(read) > 0 {
		fmt.Fprintf(os.Stderr, "the operator asked the API server for Secrets (requests by namespace: %s); it may not read them\n", strings.Join(read, ", "))
		code = 1
	}
	return code
}

// reconcileCounter counts the controller's reconciles by namespace, as their
// Reconcile spans start (internal/controller/aiinference's tracing).
type reconcileCounter struct{}

func (reconcileCounter) OnStart(_ context.Context, span sdktrace.ReadWriteSpan) {
	if span.Name() != "Reconcile" {
		return
	}
	for _, kv := range span.Attributes() {
		if kv.Key == "aiinference.namespace" {
			n, _ := reconciles.LoadOrStore(kv.Value.AsString(), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}
	}
}

func (reconcileCounter) OnEnd(sdktrace.ReadOnlySpan)      {}
func (reconcileCounter) Shutdown(context.Context) error   { return nil }
func (reconcileCounter) ForceFlush(context.Context) error { return nil }

// writeCounter counts requests that change state on the API server, requests
// for Secrets, and reads of single children.
type writeCounter struct{ next http.RoundTripper }

func (w writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		writeLog.Store(managerWrites.Add(1), req.Method+" "+req.URL.Path)
	case http.MethodGet:
		if ns, ok := secretsPath(req.URL.Path); ok {
			n, _ := secretReads.LoadOrStore(ns, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}
		if ns, kind, ok := singleChild(req.URL.Path); ok {
			reads, _ := childReads.LoadOrStore(ns, &sync.Map{})
			reads.(*sync.Map).Store(kind+"/"+path.Base(req.URL.Path), true)
		}
	}
	return w.next.RoundTrip(req)
}

// secretsPath tells whether a path is of Secrets (one, a list or a watch), and
// their namespace ("" for every namespace).
func secretsPath(p string) (namespace string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	// api/v1/secrets, api/v1/namespaces/NS/secrets[/NAME]
	switch {
	case len(parts) >= 3 && parts[0] == "api" && parts[2] == "secrets":
		return "", true
	case len(parts) >= 5 && parts[0] == "api" && parts[2] == "namespaces" && parts[4] == "secrets":
		return parts[3], true
	}
	return "", false
}

// singleChild tells whether a path names one ConfigMap, Service or Deployment,
// and its namespace and resource.
func singleChild(p string) (namespace, resource string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	// api/v1/namespaces/NS/RESOURCE/NAME or apis/apps/v1/namespaces/NS/RESOURCE/NAME
	if len(parts) < 6 || parts[len(parts)-4] != "namespaces" {
		return "", "", false
	}
	switch resource = parts[len(parts)-2]; resource {
	case "configmaps", "services", "deployments":
		return parts[len(parts)-3], resource, true
	}
	return "", "", false
}

// childReadsOf lists the children of a namespace the manager read from the API server.
func childReadsOf(namespace string) []string {
	var names []string
	if reads, ok := childReads.Load(namespace); ok {
		reads.(*sync.Map).Range(func(k, _ any) bool {
			names = append(names, k.(string))
			return true
		})
	}
	return names
}

// reconcilesOf counts the reconciles of objects in a namespace.
func reconcilesOf(namespace string) int64 {
	if n, ok := reconciles.Load(namespace); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// secretReadsOf counts the manager's requests for the Secrets of a namespace.
func secretReadsOf(namespace string) int64 {
	if n, ok := secretReads.Load(namespace); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// newNamespace gives a test its own namespace.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "aii-test-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ns) })
	return ns.Name
}

// eventually waits for the AIInference to satisfy check, asserting the kstatus
// invariants on every version of it seen on the way.
func eventually(t *testing.T, g *WithT, key client.ObjectKey, timeout time.Duration, check func(g Gomega, obj *servingv1.AIInference)) *servingv1.AIInference {
	t.Helper()
	obj := &servingv1.AIInference{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), key, obj)).To(Succeed())
		// Every version seen must hold the invariants, not just the last one.
		if problems := testutil.KstatusViolations(obj); len(problems) > 0 {
			t.Errorf("kstatus invariants broken by %s at resourceVersion %s: %v", key, obj.ResourceVersion, problems)
		}
		check(g, obj)
	}).WithTimeout(timeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	return obj
}

func containsFold(s, substr string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(substr))
}

// writesSince lists the manager's write requests into a namespace after the count
// n (tests run in parallel, each in its own namespace).
func writesSince(n int64, namespace string) []string {
	var writes []string
	for i := n + 1; i <= managerWrites.Load(); i++ {
		if w, ok := writeLog.Load(i); ok && strings.Contains(w.(string), "/namespaces/"+namespace+"/") {
			writes = append(writes, w.(string))
		}
	}
	return writes
}

// activatorIP is where the suite's operator runs its activator (each model at
// zero on a port the kernel picks): the host's own address, since an
// EndpointSlice may not name a loopback one.
var activatorIP string

// hostIP is an address of the host's, not loopback.
func hostIP() (string, error) {
	probe, err := net.Dial("udp", "192.0.2.1:9") // sends nothing: picks the outgoing address
	if err != nil {
		return "", err
	}
	defer probe.Close()
	return probe.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
