// Package e2e runs the operator as a process against a local cluster: a real
// kube-apiserver, etcd, kube-scheduler and kube-controller-manager, with kwok
// simulating the kubelets of GPU nodes.
//
// The tests mostly wait on the cluster, so they run in parallel (up to
// defaultParallel at once unless -parallel says otherwise), each in namespaces
// of its own, on three clusters:
//   - shared (cluster, k8s and op are its): the suite's operator, cluster-wide,
//     and the real node when asked. A test there calls shared.share(t) first; one
//     that stops the suite's operator or changes cluster-wide objects (the CRD,
//     webhooks) calls shared.own(t) instead, and runs alone on it.
//   - chaos (chaosCluster): the chaos test, which kills operators at random and
//     restarts the API server.
//   - solo (soloCluster): tests that run operators of their own, cluster-wide or
//     with the lease settings under test, one test at a time (solo.own(t)).
//
// The whole suite starts all three at once; a run of some tests (-run) starts
// the chaos and solo clusters on first use.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	sigsyaml "sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/operatorproc"
	"github.com/aiinference/operator/test/testutil"
	"github.com/aiinference/operator/test/testutil/freeport"
)

// defaultParallel is how many tests run at once when -parallel is not given
// (go test's default is GOMAXPROCS, 2 here): they wait on the clusters far more
// than they compute.
const defaultParallel = 32

var (
	// shared is the cluster most tests run on; cluster, k8s and op are its
	// cluster, client and operator.
	shared  *env
	cluster *localcluster.Cluster
	k8s     client.Client
	op      *operatorProcess

	chaosCluster = &lazyEnv{name: "chaos"}
	soloCluster  = &lazyEnv{name: "solo"}

	// repoRoot, workDir, operatorBin and loaderImage are set by TestMain.
	repoRoot, workDir, operatorBin, loaderImage string
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	var err error
	if repoRoot, err = testutil.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if workDir, err = os.MkdirTemp("", "aiinference-e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)

	// The operator builds while the cluster starts.
	operatorBin = filepath.Join(workDir, "manager")
	build := exec.Command("go", "build", "-o", operatorBin, "./cmd/manager")
	var buildLog strings.Builder
	build.Dir, build.Stdout, build.Stderr = repoRoot, &buildLog, &buildLog
	built := make(chan error, 1)
	go func() { built <- build.Run() }()

	// The whole suite starts the chaos cluster now, beside the shared one: its
	// test is long. The solo cluster starts on first use, once the shared one is
	// up (its tests are short, and the shared cluster's start is on the suite's
	// critical path); a run of some tests (-run) starts each on first use, if at all.
	// The clusters stop side by side at the end: an API server takes about a
	// second to shut down, a real node another.
	stops := []func(){chaosCluster.stop, soloCluster.stop}
	defer func() { stopSideBySide(stops) }()
	if flag.Lookup("test.run").Value.String() == "" {
		go chaosCluster.start()
	}

	started := time.Now()
	opts := clusterOptions()
	if realNodeAsked() {
		if err := localcluster.CheckRealNodeHost(); err != nil {
			<-built
			fmt.Fprintf(os.Stderr, "%s=1 asks for the real-node tests, and this host cannot run a real node: %v\n", realNodeEnv, err)
			return 1
		}
		// Real nodes, with a GPU product no simulated node has, so that only the
		// real-node tests land there (realNodes of them, for the tests that run at
		// once); and a store their pods load from.
		opts.NodePools = append(opts.NodePools,
			localcluster.NodePool{Name: "real", Count: realNodes, Real: true, GPUProduct: realGPUProduct, GPUCount: 4})
		opts.ObjectStore = &localcluster.ObjectStoreOptions{ModelBytes: 48 << 20}
	}
	shared, err = startEnv(ctx, "shared", opts)
	if err != nil {
		<-built
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stops = append(stops, shared.stop)
	fmt.Fprintf(os.Stderr, "Local cluster usable after %s\n", time.Since(started).Round(time.Millisecond))
	if realNodeAsked() {
		// The Gateway API before the operator starts, which keeps for a minute
		// its answer to whether the cluster serves HTTPRoutes: the gateway's
		// test (sharedGateway) would otherwise wait for it. While the operator
		// builds.
		if err := shared.cluster.InstallGatewayAPI(ctx, repoRoot); err != nil {
			<-built
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// The LeaderWorkerSet controller before the operator, which watches
	// LeaderWorkerSets only when the cluster serves them as it starts.
	if err := shared.cluster.StartLeaderWorkerSet(ctx, localcluster.LeaderWorkerSetOptions{RepoRoot: repoRoot}); err != nil {
		<-built
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := <-built; err != nil {
		fmt.Fprintf(os.Stderr, "building the operator: %v\n%s", err, buildLog.String())
		return 1
	}

	// Simulated kubelets run no image; real nodes run the loader built here.
	loaderImage = "example.test/model-loader:e2e"
	if realNodeAsked() {
		image, err := localcluster.FindImage(shared.cluster.Images(), localcluster.ModelLoaderImage)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		loaderImage = image.Ref
	}
	cluster, k8s = shared.cluster, shared.k8s
	// The suite's operator runs the activator at the host's own address, which
	// kube-proxy's rules on the host lead a model's Service to while it is at zero.
	if activatorAddr, err = hostAddr(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	activatorIP, _, _ := net.SplitHostPort(activatorAddr)
	// Its pod webhook names each multi-node group's PodGroup in the group's
	// pods, which the cluster's scheduler then places all or nothing.
	webhookPort, err := freeport.Pick()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	webhookCerts := filepath.Join(workDir, "webhook-certs")
	if err := os.Mkdir(webhookCerts, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cluster.RegisterGroupPodWebhook(ctx, repoRoot, webhookCerts, webhookPort); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// It runs as the chart installs it: in operatorNamespace ($POD_NAMESPACE,
	// which the models' NetworkPolicies let in), with the router's Service
	// there (--router-service), which routed models lead to once a router
	// runs (TestRealNodeRouterRoutesThroughTheService installs one).
	op = shared.operator("suite", cluster.Kubeconfig(), "--autoscale-interval=2s",
		"--activator-bind-address="+activatorAddr, "--activator-advertise-address="+activatorIP,
		"--router-service="+routerService,
		"--webhooks", "--webhook-cert-mode=cert-manager", "--webhook-cert-dir="+webhookCerts, "--webhook-port="+strconv.Itoa(webhookPort))
	op.Env = []string{"POD_NAMESPACE=" + operatorNamespace}
	if err := op.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer op.Stop()
	return m.Run()
}

// clusterOptions are the simulated nodes of a cluster of the suite: the default
// pools with twice the L4 nodes, for the tests that run at once, and kubelets
// ten times faster than real ones: a pod starts in 0.4-2 s rather than 4-20 s,
// a crash loop backs off 1 s, 2 s, 4 s...
func clusterOptions() localcluster.Options {
	pools := localcluster.DefaultNodePools()
	for i := range pools {
		if pools[i].GPUProduct == localcluster.GPUProductL4 {
			pools[i].Count *= 2
		}
	}
	return localcluster.Options{RepoRoot: repoRoot, Progress: os.Stderr, NodePools: pools, KubeletDelayScale: 0.1}
}

// env is one local cluster of the suite, with the CRD installed. Its gate is
// shared by the tests that share the cluster, and owned by a test that needs
// it to itself.
type env struct {
	gate
	name    string
	cluster *localcluster.Cluster
	k8s     client.Client

	mu        sync.Mutex
	operators []*operatorProcess // every operator started on the cluster, for the dumps
}

// gate lets tests share something, or one of them own it.
type gate struct {
	use sync.RWMutex
	// sharing counts the tests in share that have not taken use yet.
	sharing atomic.Int32
}

// loadGate keeps the test that times a takeover against a target (own) apart
// from the test that loads the whole machine (share): the chaos test's 50
// objects, operators killed at random and API server restart pushed the
// failover's takeover past its 20 s (20.4 s; 15.5-17 s on a quiet machine,
// where the lease's 15 s and the standby's 2-4.4 s retry leave little room).
var loadGate gate

func startEnv(ctx context.Context, name string, opts localcluster.Options) (*env, error) {
	c, err := localcluster.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("starting the %s local cluster: %w", name, err)
	}
	e := &env{name: name, cluster: c}
	scheme := manager.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		e.stop()
		return nil, err
	}
	if e.k8s, err = client.New(c.RESTConfig(), client.Options{Scheme: scheme}); err != nil {
		e.stop()
		return nil, err
	}
	if err := testutil.InstallCRDs(ctx, e.k8s, filepath.Join(repoRoot, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml")); err != nil {
		e.stop()
		return nil, fmt.Errorf("installing the CRD on the %s cluster: %w", name, err)
	}
	return e, nil
}

func (e *env) stop() {
	e.mu.Lock()
	operators := e.operators
	e.mu.Unlock()
	for _, o := range operators {
		o.Stop()
	}
	_ = e.cluster.Stop()
}

// share runs the test in parallel with the others that share the cluster (or
// what the gate guards). Call it first: it is shared until the test's cleanups
// have run.
func (g *gate) share(t *testing.T) {
	g.sharing.Add(1)
	parallel(t)
	g.use.RLock()
	g.sharing.Add(-1)
	t.Cleanup(g.use.RUnlock)
}

// own runs the test alone on the cluster (or what the gate guards) from now
// until the cleanups it registers from now on have run, and in parallel with
// the tests of the other clusters. Work that needs no cluster to itself goes
// before it, after a call to parallel.
//
// The tests that share it and were started with this one go first (it waits up
// to 5 s for them to take it): it would wait as long either way, and it then
// runs on a quieter machine, once most tests of the other clusters are done.
func (g *gate) own(t *testing.T) {
	parallel(t)
	for deadline := time.Now().Add(5 * time.Second); g.sharing.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	g.use.Lock()
	t.Cleanup(g.use.Unlock)
}

// parallelTests holds the tests that called t.Parallel through parallel.
var parallelTests sync.Map

// parallel calls t.Parallel unless it did already for this test (a second call
// panics). A test that works before it takes a cluster calls it first: until
// then the tests that run in parallel wait.
func parallel(t *testing.T) {
	if _, called := parallelTests.LoadOrStore(t, true); !called {
		t.Parallel()
	}
}

// lazyEnv is a cluster started by the first test that asks for it.
type lazyEnv struct {
	name string
	once sync.Once
	env  *env
	err  error
}

// own takes the cluster (started on the first call) for the test alone, as
// env.own does.
func (l *lazyEnv) own(t *testing.T) *env {
	t.Helper()
	e := l.get(t)
	e.own(t)
	return e
}

// get starts the cluster on the first call and returns it; the test fails if
// it cannot start. The test runs in parallel with the others (parallel); it
// then takes the cluster with own or share.
func (l *lazyEnv) get(t *testing.T) *env {
	t.Helper()
	parallel(t)
	l.start()
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.env
}

// start starts the cluster unless it was started or stopped already, and
// returns once it is usable or failed.
func (l *lazyEnv) start() {
	l.once.Do(func() {
		begin := time.Now()
		l.env, l.err = startEnv(context.Background(), l.name, clusterOptions())
		if l.err == nil {
			fmt.Fprintf(os.Stderr, "The %s local cluster usable after %s\n", l.name, time.Since(begin).Round(time.Millisecond))
		}
	})
}

// stopSideBySide runs every stop at once and returns when all have.
func stopSideBySide(stops []func()) {
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	wg.Wait()
}

func (l *lazyEnv) stop() {
	l.once.Do(func() { l.err = errors.New("the suite is over") }) // waits for a start under way
	if l.env != nil {
		l.env.stop()
	}
}

// operator is an operator process for the cluster, run with kubeconfig, its log
// named after name; the dumps show its log.
func (e *env) operator(name, kubeconfig string, extraArgs ...string) *operatorProcess {
	o := &operatorProcess{Name: name, Bin: operatorBin, Kubeconfig: kubeconfig, LoaderImage: loaderImage,
		LogPath: filepath.Join(workDir, e.name+"-operator-"+name+".log"), ExtraArgs: extraArgs}
	e.mu.Lock()
	e.operators = append(e.operators, o)
	e.mu.Unlock()
	return o
}

// operatorProcess is the operator binary running against a local cluster.
type operatorProcess = operatorproc.Process

// newNamespace gives a test its own namespace on the shared cluster; see
// env.newNamespace.
func newNamespace(t *testing.T) string { t.Helper(); return shared.newNamespace(t) }

// testNodes are the nodes a test adds to the shared cluster, removed when the
// test ends. Make them before the test's namespace: their cleanup then runs
// once the namespace is empty (a pod bound to a node that is gone waits for the
// pod garbage collector, 40 s and more).
type testNodes struct{ names []string }

func newTestNodes(t *testing.T) *testNodes {
	nodes := &testNodes{}
	t.Cleanup(func() {
		for _, n := range nodes.names {
			_ = cluster.RemoveNode(context.Background(), n)
		}
	})
	return nodes
}

// newNamespaceWithNodes gives a test its own namespace on the shared cluster,
// and the nodes it adds, which go once the namespace is empty.
func newNamespaceWithNodes(t *testing.T) (string, *testNodes) {
	t.Helper()
	nodes := newTestNodes(t)
	return newNamespace(t), nodes
}

// add adds a pool's nodes to the shared cluster.
func (nodes *testNodes) add(pool localcluster.NodePool) error {
	names, err := cluster.AddNodes(context.Background(), pool)
	nodes.names = append(nodes.names, names...)
	return err
}

// newNamespace gives a test its own namespace; on failure it dumps what is in
// it, the events and the operators' logs.
func (e *env) newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := e.k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			e.dump(t, ns.Name)
		}
		e.deleteAll(t, ns.Name)
	})
	return ns.Name
}

// tokenKubeconfig is a ServiceAccount's kubeconfig for the shared cluster; see
// env.tokenKubeconfig.
func tokenKubeconfig(t *testing.T, g *WithT, namespace, name string) string {
	t.Helper()
	return shared.tokenKubeconfig(t, g, namespace, name)
}

// deleteAll empties a namespace of the shared cluster; see env.deleteAll.
func deleteAll(t *testing.T, ns string) { shared.deleteAll(t, ns) }

// deleteAll removes the test's AIInferences and waits for their pods to go, so
// that their GPUs are free for other tests, then deletes the namespace.
func (e *env) deleteAll(t *testing.T, ns string) {
	e.emptyNamespace(t, ns)
	_ = e.k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

// emptyNamespace removes the namespace's AIInferences, Deployments and pods,
// and waits for the pods to go.
func (e *env) emptyNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	begin := time.Now()
	defer func() { t.Logf("namespace %s emptied in %s", ns, time.Since(begin).Round(100*time.Millisecond)) }()
	_ = e.k8s.DeleteAllOf(ctx, &servingv1.AIInference{}, client.InNamespace(ns))
	// The garbage collector would remove the children, but only once it watches
	// the CRD, which takes it up to 30 s (TestScaleRollAndDelete checks it does).
	_ = e.k8s.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns), client.PropagationPolicy(metav1.DeletePropagationBackground))
	_ = e.k8s.DeleteAllOf(ctx, &appsv1.ReplicaSet{}, client.InNamespace(ns), client.PropagationPolicy(metav1.DeletePropagationBackground))
	// At once, as `kubectl delete --force` does: a real kubelet's graceful stop of
	// an engine and its sidecars took 7-16 s a namespace, during which the pods
	// held real-node room other tests waited for. The test is over; how pods
	// stop is what TestRealNodeRollingUpdateDropsNoRequest checks.
	_ = e.k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0))
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pods := &corev1.PodList{}
		if err := e.k8s.List(ctx, pods, client.InNamespace(ns)); err == nil && len(pods.Items) == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// dump logs what is in a namespace of the shared cluster; see env.dump.
func dump(t *testing.T, ns string) { shared.dump(t, ns) }

// dump logs the objects and events of a namespace and the tails of the logs of
// the operators started on the cluster.
func (e *env) dump(t *testing.T, ns string) {
	ctx := context.Background()
	var out strings.Builder
	for _, list := range []client.ObjectList{&servingv1.AIInferenceList{}, &appsv1.DeploymentList{}, &corev1.PodList{}, &corev1.EventList{}} {
		if err := e.k8s.List(ctx, list, client.InNamespace(ns)); err != nil {
			fmt.Fprintf(&out, "listing %T: %v\n", list, err)
			continue
		}
		items, _ := meta.ExtractList(list)
		for _, item := range items {
			obj := item.(client.Object)
			obj.SetManagedFields(nil)
			y, _ := sigsyaml.Marshal(obj)
			fmt.Fprintf(&out, "---\n# %T %s\n%s", obj, obj.GetName(), y)
		}
	}
	t.Logf("Objects and events in namespace %s of the %s cluster:\n%s", ns, e.name, out.String())
	e.mu.Lock()
	operators := e.operators
	e.mu.Unlock()
	for _, o := range operators {
		t.Logf("Log of the %s operator, lines about namespace %s and errors:\n%s", o.Name, ns, o.LogLines(ns, 200))
		t.Logf("Log of the %s operator (last 150 lines; the cluster's other tests' objects too):\n%s", o.Name, o.LogTail(150))
	}
}

// waitFor polls an AIInference of the shared cluster; see env.waitFor.
func waitFor(t *testing.T, g *WithT, obj *servingv1.AIInference, timeout time.Duration, check func(g Gomega, got *servingv1.AIInference)) {
	t.Helper()
	shared.waitFor(t, g, obj, timeout, check)
}

// waitFor polls the AIInference until check passes, failing on any kstatus
// violation seen on the way.
func (e *env) waitFor(t *testing.T, g *WithT, obj *servingv1.AIInference, timeout time.Duration, check func(g Gomega, got *servingv1.AIInference)) {
	t.Helper()
	got := &servingv1.AIInference{}
	g.Eventually(func(g Gomega) {
		g.Expect(e.k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got)).To(Succeed())
		if problems := testutil.KstatusViolations(got); len(problems) > 0 {
			t.Errorf("kstatus invariants broken by %s: %v", obj.Name, problems)
		}
		check(g, got)
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// update changes an AIInference of the shared cluster; see env.update.
func update(g *WithT, obj *servingv1.AIInference, mutate func(*servingv1.AIInference)) {
	shared.update(g, obj, mutate)
}

// update reads obj, mutates it and writes it back, again on a conflict.
func (e *env) update(g *WithT, obj *servingv1.AIInference, mutate func(*servingv1.AIInference)) {
	g.Eventually(func() error {
		if err := e.k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate(obj)
		return e.k8s.Update(context.Background(), obj)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// operatorNamespace is where the suite's operator runs as far as the models
// can tell ($POD_NAMESPACE): the namespace their NetworkPolicies let in, and
// where the router runs. The chart installs both there.
const operatorNamespace = "aiinference-system"

// routerService is the router's Service as the chart names it (the
// operator's default --router-service).
const routerService = "aiinference-router"

// activatorAddr is where the suite's operator runs its activator.
var activatorAddr string

// hostAddr is an address of the host's own (not loopback: an EndpointSlice may
// not name one), with a port that was free a moment ago.
func hostAddr() (string, error) {
	probe, err := net.Dial("udp", "192.0.2.1:9") // sends nothing: picks the outgoing address
	if err != nil {
		return "", err
	}
	ip := probe.LocalAddr().(*net.UDPAddr).IP.String()
	_ = probe.Close()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
