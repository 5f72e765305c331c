// Command scale is `make bench-scale`: on the local cluster with simulated GPU
// nodes it applies N AIInference objects and, in the same run, N plain
// Deployments with the pod template the operator generates (the baseline), and
// prints what the operator costs beside the baseline: time to every object
// Ready, the operator's peak RSS and CPU, reconcile latency, API requests per
// object, writes in steady state and the time to its first reconcile.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
	"github.com/aiinference/operator/test/testutil/freeport"
)

func main() {
	var sizes string
	flag.StringVar(&sizes, "n", "100,1000", "object counts to run, comma-separated")
	flag.StringVar(&profileDir, "heap-profiles", "", "folder to write the operator's heap profiles into (heap-N-peak.pb.gz near the peak RSS while the objects become Ready, heap-N-ready.pb.gz once every object is Ready, heap-N-steady.pb.gz after the steady state; read them with go tool pprof); empty: none")
	flag.Func("operator-env", "KEY=VALUE in the operator's environment alone, not the cluster's (say GOGC=25, to weigh the garbage collector's settings); repeat for more", func(kv string) error {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("%q is not KEY=VALUE", kv)
		}
		operatorEnv = append(operatorEnv, kv)
		return nil
	})
	flag.BoolVar(&traceReconciles, "trace", false, "trace the operator's reconciles (its --otlp-endpoint, to a receiver in the bench) and print where the slowest 1% of them spend their time, step by step; tracing costs time of its own, so the other figures of such a run are not the headline ones")
	flag.Float64Var(&arrivalRate, "arrival-rate", 0, "objects applied per second, for the baseline and the operator alike; 0 applies them all at once (the headline run). A paced run shows what a reconcile costs when the API server is not answering a burst")
	flag.Parse()
	ctrl.SetLogger(logr.Discard()) // the clients' own logs would drown the figures
	if err := run(sizes); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

const gpusPerNode = 8

// profileDir is -heap-profiles.
var profileDir string

// traceReconciles is -trace.
var traceReconciles bool

// operatorEnv is -operator-env.
var operatorEnv []string

// arrivalRate is -arrival-rate.
var arrivalRate float64

// paced calls create for each of n objects, arrivalRate a second (all at once
// when it is 0).
func paced(n int, create func(i int) error) error {
	start := time.Now()
	for i := range n {
		if arrivalRate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) / arrivalRate * float64(time.Second)))))
		}
		if err := create(i); err != nil {
			return err
		}
	}
	return nil
}

// result is one run's figures.
type result struct {
	n                            int
	baselineReady, operatorReady time.Duration
	rssPeakKiB                   int64
	// rssPeakUnscrapedKiB is the peak until every object is Ready, before the
	// bench scrapes /metrics: a scrape holds every series at once.
	rssPeakUnscrapedKiB int64
	cpu                 time.Duration
	p50, p99            time.Duration
	// reconcileTime is the reconciles' time in all; requestTime the time of the
	// operator's requests to the API server (its client's view, from the first
	// byte sent), requestMean and requestP99 per request; throttled the time its
	// requests waited on the client's rate limiter (--kube-api-qps), throttleP99
	// per request.
	reconcileTime, requestTime, requestMean, requestP99, throttled, throttleP99 time.Duration
	requests                                                                    map[string]float64
	steadyWrites                                                                float64
	// heapInUse, heapGoal and runtimeSys are the Go runtime's heap in use, the
	// heap size at which it collects next, and all it holds from the OS, in
	// bytes, once every object is Ready: where the RSS goes.
	heapInUse, heapGoal, runtimeSys float64
	// rssAnonKiB and rssFileKiB split the RSS once every object is Ready: memory
	// the process allocated, and pages of files it maps (its binary).
	rssAnonKiB, rssFileKiB int64
	firstReconcile         time.Duration
	steadyWindow           time.Duration
	// traceSummary is where the slowest reconciles spent their time (-trace).
	traceSummary string
}

func run(sizes string) error {
	var ns []int
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-n: %q is not a positive count", s)
		}
		ns = append(ns, n)
	}
	root, err := localcluster.FindRepoRoot(".")
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "bench-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "manager")
	build := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the operator: %w", err)
	}

	var results []result
	for _, n := range ns {
		r, err := runOne(root, bin, work, n)
		if err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		results = append(results, r)
	}
	printTable(os.Stdout, results)
	for _, r := range results {
		fmt.Fprint(os.Stdout, r.traceSummary)
	}
	return nil
}

// runOne starts a cluster sized for n, runs the baseline, then the operator.
func runOne(root, bin, work string, n int) (result, error) {
	ctx := context.Background()
	r := result{n: n, steadyWindow: 60 * time.Second}
	nodes := max(100, (n+gpusPerNode-1)/gpusPerNode+10)
	fmt.Fprintf(os.Stderr, "==> N=%d on %d simulated GPU nodes\n", n, nodes)
	if len(operatorEnv) > 0 {
		fmt.Fprintf(os.Stderr, "The operator runs with %s\n", strings.Join(operatorEnv, " "))
	}
	if arrivalRate > 0 {
		fmt.Fprintf(os.Stderr, "Objects arrive %g a second\n", arrivalRate)
	}
	cluster, err := localcluster.Start(ctx, localcluster.Options{
		RepoRoot: root, KubeletDelayScale: 0.1, StartTimeout: 10 * time.Minute,
		NodePools: []localcluster.NodePool{{Name: "gpu", Count: nodes, GPUProduct: localcluster.GPUProductL4, GPUCount: gpusPerNode,
			CPU: resource.MustParse("64"), Memory: resource.MustParse("512Gi"), Pods: 250}},
	})
	if err != nil {
		return r, err
	}
	defer cluster.Stop() //nolint:errcheck // best effort
	scheme := manager.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return r, err
	}
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return r, err
	}
	if err := testutil.InstallCRDs(ctx, k8s, filepath.Join(root, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml")); err != nil {
		return r, err
	}
	objects := make([]*servingv1.AIInference, n)
	for i := range objects {
		objects[i] = benchObject("bench", fmt.Sprintf("model-%04d", i))
	}

	// The baseline: the operator's Deployments, applied without it.
	if err := createNamespace(ctx, k8s, "baseline"); err != nil {
		return r, err
	}
	begin := time.Now()
	if err := paced(n, func(i int) error {
		d, err := aiinference.DesiredDeployment(objects[i], aiinference.Options{LoaderImage: "example.test/model-loader:bench"})
		if err != nil {
			return err
		}
		d.Namespace = "baseline"
		return k8s.Create(ctx, d)
	}); err != nil {
		return r, err
	}
	if err := waitAll(ctx, "baseline Deployments ready", n, func() (int, error) { return readyDeployments(ctx, k8s, "baseline") }); err != nil {
		return r, err
	}
	r.baselineReady = time.Since(begin)
	fmt.Fprintf(os.Stderr, "Baseline: %d Deployments ready in %s\n", n, r.baselineReady.Round(10*time.Millisecond))
	if err := k8s.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace("baseline"), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		return r, err
	}
	if err := waitAll(ctx, "baseline pods gone", 0, func() (int, error) { return podCount(ctx, k8s, "baseline") }); err != nil {
		return r, err
	}

	// The operator.
	if err := createNamespace(ctx, k8s, "bench"); err != nil {
		return r, err
	}
	var traces *traceReceiver
	var traceArgs []string
	if traceReconciles {
		traces = startTraceReceiver()
		defer traces.stop()
		traceArgs = traces.operatorArgs()
	}
	op, err := startOperator(bin, cluster.Kubeconfig(), filepath.Join(work, fmt.Sprintf("operator-%d.log", n)), traceArgs...)
	if err != nil {
		return r, err
	}
	defer op.stop()
	if err := op.waitMetrics(ctx); err != nil {
		return r, err
	}
	begin = time.Now()
	stopPeakProfiles := op.profilePeaks(fmt.Sprintf("heap-%d-peak.pb.gz", n), begin)
	if err := paced(n, func(i int) error { return k8s.Create(ctx, objects[i].DeepCopy()) }); err != nil {
		return r, err
	}
	if err := waitAll(ctx, "AIInference objects Ready", n, func() (int, error) { return readyObjects(ctx, k8s, "bench") }); err != nil {
		return r, err
	}
	r.operatorReady = time.Since(begin)
	fmt.Fprintf(os.Stderr, "Operator: %d objects Ready in %s\n", n, r.operatorReady.Round(10*time.Millisecond))
	stopPeakProfiles()
	// The peak RSS so far, read before a heap profile is written: building one
	// costs memory of its own (at N=100 it took the peak from 68 to 79 MiB).
	peakBeforeProfiles, _, err := op.usage()
	if err != nil {
		return r, err
	}
	r.rssPeakUnscrapedKiB = peakBeforeProfiles
	if r.rssAnonKiB, err = procStatusKiB(op.cmd.Process.Pid, "RssAnon:"); err != nil {
		return r, err
	}
	if r.rssFileKiB, err = procStatusKiB(op.cmd.Process.Pid, "RssFile:"); err != nil {
		return r, err
	}
	if err := op.heapProfile(fmt.Sprintf("heap-%d-ready.pb.gz", n), true); err != nil {
		return r, err
	}

	families, err := op.scrape()
	if err != nil {
		return r, err
	}
	r.requests = requestsByMethod(families)
	for method, v := range r.requests {
		r.requests[method] = v / float64(n)
	}
	r.p50, r.p99 = reconcileQuantile(families, 0.5), reconcileQuantile(families, 0.99)
	r.heapInUse, r.heapGoal, r.runtimeSys = gaugeValue(families, "go_memstats_heap_inuse_bytes"),
		gaugeValue(families, "go_memstats_next_gc_bytes"), gaugeValue(families, "go_memstats_sys_bytes")
	// Where reconciles wait: on the API server, or on the client's own rate limiter.
	all := func(*dto.Metric) bool { return true }
	var requests uint64
	r.requestTime, requests = histogramSum(families, "rest_client_request_duration_seconds")
	if requests > 0 {
		r.requestMean = r.requestTime / time.Duration(requests)
	}
	r.requestP99 = histogramQuantile(families, "rest_client_request_duration_seconds", all, 0.99)
	r.throttled, _ = histogramSum(families, "rest_client_rate_limiter_duration_seconds")
	r.throttleP99 = histogramQuantile(families, "rest_client_rate_limiter_duration_seconds", all, 0.99)
	r.reconcileTime, _ = histogramSum(families, "controller_runtime_reconcile_time_seconds")

	// Steady state: everything Ready, nothing to change.
	before := writes(families)
	time.Sleep(r.steadyWindow)
	families, err = op.scrape()
	if err != nil {
		return r, err
	}
	r.steadyWrites = writes(families) - before
	r.rssPeakKiB, r.cpu, err = op.usage()
	if err != nil {
		return r, err
	}
	if profileDir != "" {
		// The steady state changes nothing; its peak would be the profile's.
		r.rssPeakKiB = peakBeforeProfiles
	}
	if err := op.heapProfile(fmt.Sprintf("heap-%d-steady.pb.gz", n), true); err != nil {
		return r, err
	}
	if traces != nil {
		// The operator's batches went out during the steady state.
		var summary strings.Builder
		summarizeTraces(&summary, n, traces.Spans())
		r.traceSummary = summary.String()
	}

	// A restart with every object present: time to the first reconcile.
	op.stop()
	op, err = startOperator(bin, cluster.Kubeconfig(), filepath.Join(work, fmt.Sprintf("operator-%d-restart.log", n)))
	if err != nil {
		return r, err
	}
	defer op.stop()
	begin = time.Now()
	if err := waitAll(ctx, "the first reconcile after a restart", 1, func() (int, error) {
		families, err := op.scrape()
		if err != nil {
			return 0, nil // not serving yet
		}
		return int(min(counter(families, "controller_runtime_reconcile_total"), 1)), nil
	}); err != nil {
		return r, err
	}
	r.firstReconcile = time.Since(begin)
	return r, nil
}

// benchObject is an AIInference of one L4 GPU with a public S3 model (no Secret
// to read) and a 1 s back-off.
func benchObject(ns, name string) *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{Name: name, Size: ptr.To(resource.MustParse("1Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: name + "/", Endpoint: "http://store.example:9000", PathStyle: true}}},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: 1, Products: []string{localcluster.GPUProductL4}},
			Replicas: ptr.To[int32](1),
		},
	}
}

func createNamespace(ctx context.Context, k8s client.Client, name string) error {
	return k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// waitAll polls count until it returns want, for at most 30 minutes.
func waitAll(ctx context.Context, what string, want int, count func() (int, error)) error {
	deadline := time.Now().Add(30 * time.Minute)
	last := -1
	for {
		got, err := count()
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if got != last {
			last = got
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d after 30 minutes", what, got, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func readyDeployments(ctx context.Context, k8s client.Client, ns string) (int, error) {
	list := &appsv1.DeploymentList{}
	if err := k8s.List(ctx, list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	ready := 0
	for _, d := range list.Items {
		s := d.Status
		if s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == *d.Spec.Replicas && s.AvailableReplicas == *d.Spec.Replicas && s.ReadyReplicas == *d.Spec.Replicas {
			ready++
		}
	}
	return ready, nil
}

func readyObjects(ctx context.Context, k8s client.Client, ns string) (int, error) {
	list := &servingv1.AIInferenceList{}
	if err := k8s.List(ctx, list, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	ready := 0
	for _, obj := range list.Items {
		if c := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == obj.Generation {
			ready++
		}
	}
	return ready, nil
}

func podCount(ctx context.Context, k8s client.Client, ns string) (int, error) {
	list := &corev1.PodList{}
	err := k8s.List(ctx, list, client.InNamespace(ns))
	return len(list.Items), err
}

// operator is the operator binary running against the cluster, with its
// metrics on a loopback port.
type operator struct {
	cmd         *exec.Cmd
	metricsAddr string
	pprofAddr   string // with -heap-profiles
	log         *os.File
}

func startOperator(bin, kubeconfig, logPath string, extraArgs ...string) (*operator, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	health, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	o := &operator{metricsAddr: fmt.Sprintf("127.0.0.1:%d", port), log: log}
	// Plain HTTP on loopback, asked for by name (the default is HTTPS with
	// authentication): the scrapes measured are the registry's and the object
	// series' cost, as in the earlier runs of docs/performance.md.
	o.cmd = exec.Command(bin, "--metrics-secure=false", "--metrics-bind-address="+o.metricsAddr, fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health),
		"--loader-image=example.test/model-loader:bench")
	o.cmd.Args = append(o.cmd.Args, extraArgs...)
	if profileDir != "" {
		pprof, err := freeport.Pick()
		if err != nil {
			return nil, err
		}
		o.pprofAddr = fmt.Sprintf("127.0.0.1:%d", pprof)
		o.cmd.Args = append(o.cmd.Args, "--pprof-bind-address="+o.pprofAddr)
	}
	o.cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig), operatorEnv...)
	o.cmd.Stdout, o.cmd.Stderr = log, log
	if err := o.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	return o, nil
}

func (o *operator) stop() {
	if o.cmd == nil || o.cmd.Process == nil {
		return
	}
	_ = o.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = o.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = o.cmd.Process.Kill()
		<-done
	}
	o.log.Close()
	o.cmd = nil
}

func (o *operator) waitMetrics(ctx context.Context) error {
	return waitAll(ctx, "the operator's metrics", 1, func() (int, error) {
		if _, err := o.scrape(); err != nil {
			return 0, nil
		}
		return 1, nil
	})
}

func (o *operator) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + o.metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// profilePeaks, with -heap-profiles, watches the operator's RSS from begin and
// writes its heap profile under name each time the RSS has grown by 8 MiB since
// the last one (without a collection of its own: in-use is what the last one
// left), so that the last profile shows the heap near the peak. The function it
// returns stops the watch and says when the RSS was highest.
func (o *operator) profilePeaks(name string, begin time.Time) (stop func()) {
	if profileDir == "" {
		return func() {}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		var peak, profiled int64
		var peakAt time.Duration
		for {
			select {
			case <-done:
				fmt.Fprintf(os.Stderr, "RSS highest %.1f MiB, %s after the first object was applied; last peak profile at %.1f MiB\n",
					float64(peak)/1024, peakAt.Round(time.Second), float64(profiled)/1024)
				return
			case <-time.After(500 * time.Millisecond):
			}
			rss, err := o.rssKiB()
			if err != nil || rss <= peak {
				continue
			}
			peak, peakAt = rss, time.Since(begin)
			if rss >= profiled+8<<10 && o.heapProfile(name, false) == nil {
				profiled = rss
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// rssKiB is the process's resident set now (VmRSS).
func (o *operator) rssKiB() (int64, error) {
	return procStatusKiB(o.cmd.Process.Pid, "VmRSS:")
}

// procStatusKiB reads one field in KiB of /proc/PID/status.
func procStatusKiB(pid int, field string) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == field {
			return strconv.ParseInt(fields[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// heapProfile writes the operator's heap profile into profileDir under name,
// after a garbage collection when gc (so in-use is what is live), when
// -heap-profiles is set.
func (o *operator) heapProfile(name string, gc bool) error {
	if profileDir == "" {
		return nil
	}
	url := "http://" + o.pprofAddr + "/debug/pprof/heap"
	if gc {
		url += "?gc=1"
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("heap profile: %s", resp.Status)
	}
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(profileDir, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	fmt.Fprintf(os.Stderr, "Heap profile in %s\n", f.Name())
	return f.Close()
}

// usage is the process's peak RSS (VmHWM) and CPU time so far.
func (o *operator) usage() (int64, time.Duration, error) {
	pid := o.cmd.Process.Pid
	hwm, err := procStatusKiB(pid, "VmHWM:")
	if err != nil {
		return 0, 0, err
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command's closing parenthesis; utime and stime are the
	// 14th and 15th of the whole line, in clock ticks (100 per second here).
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return hwm, time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// requestsByMethod sums client-go's rest_client_requests_total by HTTP method:
// every request the operator sent to the API server.
func requestsByMethod(families map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	if f, ok := families["rest_client_requests_total"]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// writes counts the operator's requests that change state.
func writes(families map[string]*dto.MetricFamily) float64 {
	var n float64
	for method, v := range requestsByMethod(families) {
		switch method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			n += v
		}
	}
	return n
}

func counter(families map[string]*dto.MetricFamily, name string) float64 {
	var n float64
	if f, ok := families[name]; ok {
		for _, m := range f.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// reconcileQuantile estimates a quantile of the AIInference controller's
// reconcile time from its histogram, interpolating inside the bucket.
func reconcileQuantile(families map[string]*dto.MetricFamily, q float64) time.Duration {
	return histogramQuantile(families, "controller_runtime_reconcile_time_seconds", func(m *dto.Metric) bool { return hasLabel(m, "controller", "aiinference") }, q)
}

// histogramSum is the sum and count of the series of a histogram, summed.
func histogramSum(families map[string]*dto.MetricFamily, name string) (time.Duration, uint64) {
	var sum float64
	var count uint64
	if f, ok := families[name]; ok {
		for _, m := range f.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			count += m.GetHistogram().GetSampleCount()
		}
	}
	return time.Duration(sum * float64(time.Second)), count
}

// histogramQuantile estimates a quantile of the series of a histogram that keep
// selects, summed, interpolating inside the bucket.
func histogramQuantile(families map[string]*dto.MetricFamily, name string, keep func(*dto.Metric) bool, q float64) time.Duration {
	f, ok := families[name]
	if !ok {
		return 0
	}
	type bucket struct{ le, count float64 }
	var buckets []bucket
	var total float64
	for _, m := range f.GetMetric() {
		if !keep(m) {
			continue
		}
		h := m.GetHistogram()
		total += float64(h.GetSampleCount())
		for i, b := range h.GetBucket() {
			if i >= len(buckets) {
				buckets = append(buckets, bucket{le: b.GetUpperBound()})
			}
			buckets[i].count += float64(b.GetCumulativeCount())
		}
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			frac := 0.0
			if b.count > below {
				frac = (rank - below) / (b.count - below)
			}
			return time.Duration((lower + frac*(b.le-lower)) * float64(time.Second))
		}
		lower, below = b.le, b.count
	}
	return 0
}

// gaugeValue is the value of an unlabelled gauge, 0 if absent.
func gaugeValue(families map[string]*dto.MetricFamily, name string) float64 {
	if f, ok := families[name]; ok && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// printTable prints the figures beside the targets.
func printTable(w io.Writer, results []result) {
	fmt.Fprintf(w, "\n%-44s", "")
	for _, r := range results {
		fmt.Fprintf(w, " %18s", fmt.Sprintf("N=%d", r.n))
	}
	fmt.Fprintf(w, "  target\n")
	row := func(name, target string, cell func(r result) string) {
		fmt.Fprintf(w, "%-44s", name)
		for _, r := range results {
			fmt.Fprintf(w, " %18s", cell(r))
		}
		fmt.Fprintf(w, "  %s\n", target)
	}
	row("baseline Deployments: apply to all ready", "", func(r result) string { return r.baselineReady.Round(10 * time.Millisecond).String() })
	row("operator: apply to all Ready", "", func(r result) string { return r.operatorReady.Round(10 * time.Millisecond).String() })
	row("ratio operator / baseline", "<= 1.1 (N=100), <= 1.2 (N=1000)", func(r result) string {
		return fmt.Sprintf("%.2f", r.operatorReady.Seconds()/r.baselineReady.Seconds())
	})
	row("operator peak RSS", "<= 50 MiB + 30 KiB x N", func(r result) string {
		return fmt.Sprintf("%.1f MiB (%.0f)", float64(r.rssPeakKiB)/1024, 50+30*float64(r.n)/1024)
	})
	row("  of it, until Ready (no scrape of the objects yet)", "", func(r result) string {
		return fmt.Sprintf("%.1f MiB", float64(r.rssPeakUnscrapedKiB)/1024)
	})
	row("RSS at Ready: anonymous / the binary's pages", "", func(r result) string {
		return fmt.Sprintf("%.1f / %.1f MiB", float64(r.rssAnonKiB)/1024, float64(r.rssFileKiB)/1024)
	})
	row("Go heap in use / GC goal / from the OS, at Ready", "", func(r result) string {
		return fmt.Sprintf("%.0f / %.0f / %.0f MiB", r.heapInUse/(1<<20), r.heapGoal/(1<<20), r.runtimeSys/(1<<20))
	})
	row("operator CPU seconds", "", func(r result) string { return fmt.Sprintf("%.1f s", r.cpu.Seconds()) })
	row("reconcile p50", "", func(r result) string { return r.p50.Round(10 * time.Microsecond).String() })
	row("reconcile p99", "<= 25ms", func(r result) string { return r.p99.Round(10 * time.Microsecond).String() })
	row("reconciles' time in all", "", func(r result) string { return r.reconcileTime.Round(10 * time.Millisecond).String() })
	row("API request latency mean / p99", "", func(r result) string {
		return r.requestMean.Round(10*time.Microsecond).String() + " / " + r.requestP99.Round(100*time.Microsecond).String()
	})
	row("requests' time in all", "", func(r result) string { return r.requestTime.Round(10 * time.Millisecond).String() })
	row("wait on --kube-api-qps: all / p99", "", func(r result) string {
		return r.throttled.Round(10*time.Millisecond).String() + " / " + r.throttleP99.Round(100*time.Microsecond).String()
	})
	methods := map[string]bool{}
	for _, r := range results {
		for m := range r.requests {
			methods[m] = true
		}
	}
	var names []string
	for m := range methods {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		row("API requests per object, "+m, "", func(r result) string { return fmt.Sprintf("%.2f", r.requests[m]) })
	}
	row("writes in a 60 s steady state", "0", func(r result) string { return fmt.Sprintf("%.0f", r.steadyWrites) })
	row("operator start to first reconcile", "", func(r result) string { return r.firstReconcile.Round(10 * time.Millisecond).String() })
}
