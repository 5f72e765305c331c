package router

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/eventrecorder"
	"github.com/aiinference/operator/internal/ingresspolicy"
	"github.com/aiinference/operator/internal/tracing"
)

// Config is the router binary's command line.
type Config struct {
	BindAddress, MetricsBindAddress string
	OTLPEndpoint                    string
	Options                         Options
}

// ParseFlags reads the command line (see the package doc): the binary's, and a
// test harness's that runs the router with the same defaults.
func ParseFlags(args []string, out io.Writer) (Config, *zap.Options, error) {
	var c Config
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &c.Options
	fs.StringVar(&c.BindAddress, "bind-address", ":8080", "where requests are served")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", ":9090", "where /metrics, /healthz and /readyz are served")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "OTLP/HTTP receiver of the traces (host:port or URL); empty: none")
	fs.IntVar(&o.BlockSize, "block-size", DefaultBlockSize, "bytes of prompt per prefix block")
	fs.Float64Var(&o.Picker.LoadFactor, "load-factor", 1.25, "bounded load: a replica takes at most this times the mean load (plus one)")
	fs.IntVar(&o.Picker.MinBound, "min-load-bound", 4, "a load no replica is past, however low the mean")
	fs.IntVar(&o.MaxWaiting, "max-waiting", DefaultMaxWaiting, "requests per model waiting for a serving replica; more are answered 429")
	fs.DurationVar(&o.HoldTimeout, "hold-timeout", DefaultHoldTimeout, "longest wait for a serving replica; then 503")
	fs.Int64Var(&o.MaxBodyBytes, "max-body-bytes", DefaultMaxBodyBytes, "largest request body")
	fs.Int64Var(&o.MaxBodiesBytes, "max-bodies-bytes", DefaultMaxBodiesBytes, "bytes of request bodies held at once, across models, counted as they arrive")
	fs.Int64Var(&o.MaxBodies, "max-bodies", DefaultMaxBodies, "request bodies being read or kept at once, across models")
	fs.Int64Var(&o.MaxRequests, "max-requests", DefaultMaxRequests, "requests in the router at once, from their headers to the end of their answer, across models")
	fs.Float64Var(&o.NamespaceShare, "namespace-share", DefaultNamespaceShare, "share of each of the three bounds above one namespace's models may hold")
	fs.Float64Var(&o.ModelShare, "model-share", DefaultModelShare, "share of each of the three bounds above one model may hold")
	fs.DurationVar(&o.HeaderTimeout, "header-timeout", DefaultHeaderTimeout, "longest wait for the headers of an answer that is not streamed (they come with the whole answer)")
	fs.DurationVar(&o.StreamHeaderTimeout, "stream-header-timeout", DefaultStreamHeaderTimeout,
		"longest wait for the headers of a streamed answer (engines send them before the first token); then the replica counts as failing and the request goes to another")
	fs.IntVar(&o.MaxRetries, "max-retries", DefaultMaxRetries, "other replicas a request goes to after one failed it before its answer began (-1: none)")
	fs.Float64Var(&o.RetryBudget, "retry-budget", DefaultRetryBudget, "share of a model's requests being sent that may be retries at once")
	fs.IntVar(&o.MinRetries, "min-retries", DefaultMinRetries, "retries a model may have at once whatever its budget")
	fs.IntVar(&o.Picker.Outliers.ConsecutiveFailures, "outlier-consecutive-failures", 5, "failed answers in a row that take a replica out of the picking")
	fs.DurationVar(&o.Picker.Outliers.BaseEjection, "outlier-base-ejection", 10*time.Second, "how long a replica is first taken out; twice as long each time after")
	fs.DurationVar(&o.Picker.Outliers.MaxEjection, "outlier-max-ejection", 5*time.Minute, "the longest a replica is taken out")
	fs.Float64Var(&o.Picker.Outliers.MaxEjectedShare, "outlier-max-ejected-share", 0.5, "share of a model's replicas that may be out at once (at least one)")
	fs.Float64Var(&o.Picker.Saturation.QueueThreshold, "saturation-queue", 5, "an engine queue this long saturates its replica until its batch is known (the spec's --max-num-seqs, or a reading with a queue): while all are saturated, requests wait in the router's fair queues")
	fs.Float64Var(&o.Picker.Saturation.KVCacheThreshold, "saturation-kv-cache", 0.8, "a KV cache this full (0-1) saturates its replica")
	fs.DurationVar(&o.BodyReadTimeout, "body-read-timeout", DefaultBodyReadTimeout, "time to read a request's headers and body")
	fs.StringVar(&o.SessionHeader, "session-header", DefaultSessionHeader, "header a client keeps a session by")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", DefaultScrapeInterval, "how often each serving replica's /metrics is read")
	fs.Int64Var(&o.MaxScrapeBytes, "max-scrape-bytes", DefaultMaxScrapeBytes, "the most of one replica's /metrics read")
	fs.IntVar(&o.ScrapeParallel, "scrape-parallel", DefaultScrapeParallel, "replicas' /metrics read at once")
	fs.DurationVar(&o.DrainDelay, "drain-delay", DefaultDrainDelay, "after SIGTERM, how long new requests are still taken while the pod leaves the Services' endpoints")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout,
		"after the drain delay, how long requests in flight may take to finish; then they are cut (drain delay and this within terminationGracePeriodSeconds)")
	zapOpts := &zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return c, nil, err
	}
	if fs.NArg() > 0 {
		return c, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Picker.LoadFactor <= 1 {
		return c, nil, fmt.Errorf("--load-factor %v: give a number above 1 (1.25 lets a replica take a quarter more than its share)", o.Picker.LoadFactor)
	}
	return c, zapOpts, nil
}

// Main runs the router until SIGTERM; the exit code.
func Main(args []string, stderr io.Writer) int {
	c, zapOpts, err := ParseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		_, _ = fmt.Fprintln(stderr, "router:", err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(zapOpts), zap.WriteTo(stderr)))
	SetMemoryLimit(ctrl.Log.WithName("router"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c); err != nil {
		ctrl.Log.Error(err, "Router stopped")
		return 1
	}
	return 0
}

// memoryLimitRatio is the share of the container's memory limit the Go
// runtime keeps the heap under (GOMEMLIMIT): the rest is for what the runtime
// does not count (stacks, the kernel's socket buffers) and a margin.
const memoryLimitRatio = 0.8

// SetMemoryLimit sets the Go runtime's soft memory limit from the container's
// cgroup memory limit (automemlimit), unless GOMEMLIMIT is set: without it the
// garbage collector lets the heap double past what is live before it runs,
// and a router near its bounds would be killed for memory it no longer uses.
func SetMemoryLimit(log logr.Logger) {
	limit, err := memlimit.Set(memlimit.WithRatio(memoryLimitRatio), memlimit.WithProvider(memlimit.FromCgroup))
	if err != nil {
		log.Info("No memory limit read from the cgroup; the Go runtime runs without one", "error", err.Error())
		return
	}
	if limit != math.MaxInt64 {
		log.Info("Go memory limit", "bytes", limit)
	}
}

func run(ctx context.Context, c Config) error {
	log := ctrl.Log.WithName("router")
	shutdownTracing, err := tracing.Setup(ctx, tracing.Options{Endpoint: c.OTLPEndpoint, Insecure: true})
	if err != nil {
		return fmt.Errorf("--otlp-endpoint: %w", err)
	}
	defer func() { _ = shutdownTracing(context.Background()) }()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))
	objects, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: TrimPod}}})
	if err != nil {
		return err
	}
	if err := IndexFields(ctx, objects); err != nil {
		return err
	}
	// Inform on every kind before the cache starts, so readiness means all synced.
	for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Service{}, &corev1.Namespace{}, &servingv1.AIInference{}} {
		if _, err := objects.GetInformer(ctx, obj); err != nil {
			return err
		}
	}
	// The cache keeps the replicas current until the requests are drained.
	watching, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatching()
	go func() { _ = objects.Start(watching) }()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Replicas taken out of the picking and back are told on their model.
	eventsClient, err := eventsv1client.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c.Options.Events = eventrecorder.New(eventsClient, scheme, "aiinference-router", log.WithName("events"))
	go func() { _ = c.Options.Events.Start(watching) }()
	rt := New(c.Options, KubeDirectory{Reader: objects}, NetworkPolicyCheck{Clients: ingresspolicy.Lookup{Reader: objects}}, NewMetrics(reg), log)

	synced := make(chan struct{})
	go func() {
		if objects.WaitForCacheSync(ctx) {
			close(synced)
		}
	}()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ctx.Done():
			http.Error(w, "stopping: requests in flight are drained", http.StatusServiceUnavailable)
			return
		default:
		}
		select {
		case <-synced:
			_, _ = io.WriteString(w, "ok")
		default:
			http.Error(w, "the cache of models, Services and pods is not synced yet", http.StatusServiceUnavailable)
		}
	})
	// Metrics and probes are served until the requests are drained.
	metricsSrv := &http.Server{Addr: c.MetricsBindAddress, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	defer func() { _ = metricsSrv.Close() }()
	go func() {
		if err := metricsSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Serving metrics")
		}
	}()
	l, err := net.Listen("tcp", c.BindAddress)
	if err != nil {
		return fmt.Errorf("--bind-address %q: %w", c.BindAddress, err)
	}
	log.Info("Routing", "address", l.Addr().String(), "metrics", c.MetricsBindAddress)
	return rt.Serve(ctx, l)
}
