// Package nodecache is the node-local model cache: a CSI node plugin, run once
// per node, that gives every pod of a model on that node the same folder of the
// node's disk as its model cache volume, so the model is downloaded once per
// node. The model loader in the pod stays the only thing that talks to the
// store: it finds the copy complete and verified (0 bytes read), resumes one a
// killed loader left, or waits on the folder's lock while another pod of the
// node downloads it. The plugin keeps the node's budget (least recently used
// copies that no pod has mounted are evicted), reports which models the node
// holds, and labels the node so the scheduler can prefer it.
//
// Why a CSI volume: the model pods keep passing Pod Security "restricted",
// which allows csi volumes and forbids hostPath; the privileged part is the
// plugin alone (docs/model-cache.md).
package nodecache

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/clientcmd"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aiinference/operator/internal/nodecachespec"
)

// Options are the plugin's flags. CacheDir and Budget are the admin's two
// settings (Helm values modelCache.path and modelCache.budget); the chart
// derives every other path from them and from the kubelet's folder.
type Options struct {
	NodeName        string
	Namespace       string
	CacheDir        string
	Budget          resource.Quantity
	CSISocket       string
	RegistrationDir string
	Kubeconfig      string
	MetricsAddress  string
	ReportInterval  time.Duration
	LoaderUID       int
}

// registration answers the kubelet's plugin watcher, which finds the socket in
// its plugins_registry folder and then calls the CSI socket it names.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	log      *slog.Logger
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: nodecachespec.DriverName, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.log.Info("Registered with the kubelet")
	} else {
		r.log.Error("The kubelet refused the plugin", "error", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Main runs the plugin until SIGTERM: `model-loader node-cache FLAGS`.
func Main(args []string, stderr io.Writer) int {
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	fs := flag.NewFlagSet("node-cache", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	budget := fs.String("budget", "0", "the copies' total size on this node, as a quantity (e.g. 500Gi); 0: no bound")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "where the node's report ConfigMap is written (default $POD_NAMESPACE)")
	fs.StringVar(&o.CacheDir, "cache-dir", "/var/lib/aiinference/model-cache", "the cache's folder on the node")
	fs.StringVar(&o.CSISocket, "csi-socket", "", "the CSI socket the kubelet calls (default: csi.sock in the registration folder's sibling plugins/"+nodecachespec.DriverName+")")
	fs.StringVar(&o.RegistrationDir, "registration-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration folder")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster)")
	fs.StringVar(&o.MetricsAddress, "metrics-bind-address", ":8096", "where /metrics listens; empty: nowhere")
	fs.DurationVar(&o.ReportInterval, "report-interval", 10*time.Second, "how often the node's report is refreshed (at once after every publish)")
	fs.IntVar(&o.LoaderUID, "loader-uid", 65532, "the user (and group) the model loader runs as, which owns the copies")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	q, err := nodecachespec.ParseBudget(*budget)
	if err != nil {
		fmt.Fprintf(stderr, "--budget: %v\n", err)
		return 2
	}
	o.Budget = q
	if o.NodeName == "" || o.Namespace == "" {
		fmt.Fprintln(stderr, "--node-name and --namespace are required (or $NODE_NAME and $POD_NAMESPACE)")
		return 2
	}
	if o.CSISocket == "" {
		o.CSISocket = filepath.Join(filepath.Dir(o.RegistrationDir), "plugins", nodecachespec.DriverName, "csi.sock")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, o, log); err != nil {
		log.Error("Node cache stopped", "error", err)
		return 1
	}
	return 0
}

// Run serves the kubelet and reports the node's copies until ctx ends.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	store := &Store{Root: o.CacheDir, Budget: o.Budget.Value(), UID: o.LoaderUID, GID: o.LoaderUID, Mounter: BindMounter{}}
	if err := store.Open(); err != nil {
		return fmt.Errorf("opening %s: %w", o.CacheDir, err)
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	rep := &reporter{client: c, node: o.NodeName, namespace: o.Namespace, store: store, metrics: m, log: log, kick: make(chan struct{}, 1)}
	p := &plugin{node: o.NodeName, store: store, log: log, metrics: m, published: rep.podEvent}

	csiServer := grpc.NewServer()
	csi.RegisterIdentityServer(csiServer, p)
	csi.RegisterNodeServer(csiServer, p)
	csiListener, err := listenUnix(o.CSISocket)
	if err != nil {
		return err
	}
	regServer := grpc.NewServer()
	registerapi.RegisterRegistrationServer(regServer, &registration{endpoint: o.CSISocket, log: log})
	// A short name: the kubelet dials it by path, which a unix socket keeps under 108 bytes.
	regListener, err := listenUnix(filepath.Join(o.RegistrationDir, "model-cache-reg.sock"))
	if err != nil {
		return err
	}
	errs := make(chan error, 3)
	go func() { errs <- csiServer.Serve(csiListener) }()
	go func() { errs <- regServer.Serve(regListener) }()
	var metricsServer *http.Server
	if o.MetricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		metricsServer = &http.Server{Addr: o.MetricsAddress, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metricsServer.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
	}
	go rep.run(ctx, o.ReportInterval)
	log.Info("Serving", "node", o.NodeName, "cacheDir", o.CacheDir, "budget", o.Budget.String(), "csi", o.CSISocket)
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	// The registration socket goes first, so the kubelet stops calling.
	regServer.Stop()
	csiServer.GracefulStop()
	if metricsServer != nil {
		metricsServer.Close()
	}
	return err
}

// listenUnix listens on path, replacing the socket a previous run left.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}
