// Package manager wires the operator: scheme, cache, controllers, health and
// metrics endpoints, and leader election. cmd/manager and the integration tests
// both start the operator through it.
package manager

import (
	"fmt"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/eventrecorder"
	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/internal/webhook"
)

// DefaultLoaderImage is the model loader image the operator puts in every pod:
// the one `make images` builds for this version.
var DefaultLoaderImage = version.LoaderImage()

// Options are the operator's settings, set from flags in cmd/manager.
// DefaultAutoscaleInterval is the autoscaler's default reading interval.
const DefaultAutoscaleInterval = aiinference.DefaultAutoscaleInterval

type Options struct {
	// MetricsBindAddress is where metrics are served: empty is
	// DefaultMetricsBindAddress, "0" serves none.
	MetricsBindAddress string
	// MetricsInsecure serves metrics over plain HTTP to anyone who can connect,
	// and needs an explicit MetricsBindAddress (e.g. 127.0.0.1:8080 for a local
	// run). Unset, metrics are served over HTTPS to authenticated, authorized
	// callers only (see metricsOptions); MetricsCertDir holds the certificate's
	// tls.crt and tls.key, or is empty for a self-signed certificate.
	MetricsInsecure        bool
	MetricsCertDir         string
	HealthProbeBindAddress string
	// PprofBindAddress serves Go's profiles (/debug/pprof/) there; empty or "0"
	// serves none.
	PprofBindAddress string
	LeaderElection   bool
	// LeaderElectionNamespace is where the lease lives; empty means the pod's namespace.
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod are the leader election's
	// timing; zero keeps controller-runtime's defaults (15 s, 10 s, 2 s). A
	// standby sees the leader's last renewal at its next try and takes over at
	// the first try after that renewal is LeaseDuration old; tries come every
	// RetryPeriod to 2.2x RetryPeriod (client-go's jitter), so a dead leader is
	// replaced within LeaseDuration + 4.4x RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// WatchNamespaces, when set, limits the operator to these namespaces: it
	// caches, watches and writes nothing elsewhere, and needs only Roles there
	// (config/namespaced). Empty watches every namespace.
	WatchNamespaces []string

	LoaderImage string
	// PrometheusURL is the Prometheus canary analyses query unless an object names its own.
	PrometheusURL string
	// AutoscaleInterval is how often the autoscaler reads the engines' signals.
	AutoscaleInterval time.Duration
	// OperatorNamespace is where the operator's pods run ($POD_NAMESPACE), which
	// the models' NetworkPolicies let in; "" outside the cluster.
	OperatorNamespace string
	// ActivatorBindAddress is where the activator listens (host:port, each model
	// at zero on a port of its own from this one up); with
	// ActivatorAdvertiseAddress, the IP the models' Services send to it, the
	// activator runs and models with autoscaling.minReplicas 0 may go to zero.
	ActivatorBindAddress, ActivatorAdvertiseAddress string
	// RouterService is the router's Service in OperatorNamespace, which the
	// Services of routed models lead to; empty (or no OperatorNamespace): no
	// model is routed.
	RouterService string

	// skipNameValidation lets a test build several managers in one process.
	skipNameValidation bool
	// Webhook, when set, serves the admission and conversion webhooks (and manages
	// their certificate); readiness then waits for them. Nil runs without webhooks.
	Webhook *webhook.Options
	// MaxConcurrentReconciles is how many AIInference objects are reconciled at
	// once; zero means one.
	MaxConcurrentReconciles int
	// KubeAPIQPS and KubeAPIBurst bound the operator's requests to the API server;
	// zero keeps client-go's defaults (20 and 30).
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// Scheme knows the built-in types and the AIInference API.
func Scheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))
	utilruntime.Must(servingv1alpha1.AddToScheme(scheme))
	// The canary traffic children: an HTTPRoute and InferencePools.
	utilruntime.Must(gatewayv1.Install(scheme))
	utilruntime.Must(inferencev1.Install(scheme))
	// Replicas that span nodes: LeaderWorkerSets.
	utilruntime.Must(lwsv1.AddToScheme(scheme))
	return scheme
}

// cachedChildren limits the cache to the children the operator made. The
// traffic kinds of canary rollouts are listed only when the cluster serves
// them: a cache cannot be configured for a kind the API server does not know.
func cachedChildren(cfg *rest.Config, managed cache.ByObject) map[client.Object]cache.ByObject {
	byObject := map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Label: managed.Label, Transform: podStatusOnly},
		&corev1.ConfigMap{}:             managed,
		&corev1.Service{}:               managed,
		&corev1.PersistentVolumeClaim{}: managed,
		&appsv1.Deployment{}:            managed,
		&discoveryv1.EndpointSlice{}:    {Label: managed.Label, Transform: modelSliceOnly},
		&networkingv1.NetworkPolicy{}:   managed,
	}
	served := func(groupVersion, resource string) bool {
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return false
		}
		list, err := dc.ServerResourcesForGroupVersion(groupVersion)
		if err != nil {
			return false
		}
		for _, r := range list.APIResources {
			if r.Name == resource {
				return true
			}
		}
		return false
	}
	if served(gatewayv1.GroupVersion.String(), "httproutes") {
		byObject[&gatewayv1.HTTPRoute{}] = managed
	}
	if served(inferencev1.GroupVersion.String(), "inferencepools") {
		byObject[&inferencev1.InferencePool{}] = managed
	}
	if served(lwsv1.GroupVersion.String(), "leaderworkersets") {
		byObject[&lwsv1.LeaderWorkerSet{}] = managed
	}
	if served(schedulingv1beta1.SchemeGroupVersion.String(), "podgroups") {
		byObject[&schedulingv1beta1.PodGroup{}] = managed
	}
	return byObject
}

// New builds the manager with every controller registered; Start runs it.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	if opts.LoaderImage == "" {
		opts.LoaderImage = DefaultLoaderImage
	}
	metricsOpts, err := metricsOptions(opts)
	if err != nil {
		return nil, err
	}
	scheme := Scheme()
	registerClientMetrics()
	cfg = rest.CopyConfig(cfg)
	if opts.KubeAPIQPS > 0 || opts.KubeAPIBurst > 0 {
		cfg.QPS, cfg.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	}
	// Each warning of the API server once per process (a deprecated API's,
	// PodGroups' v1beta1, comes with every request), not once per request.
	cfg.WarningHandlerWithContext = crlog.NewKubeAPIWarningLogger(crlog.KubeAPIWarningLoggerOptions{Deduplicate: true})
	// Only children the operator made are cached, not every pod or ConfigMap of the cluster.
	managed := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{servingv1.LabelManagedBy: servingv1.ManagedByValue})}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  opts.HealthProbeBindAddress,
		PprofBindAddress:        opts.PprofBindAddress,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "aiinference-operator.serving.aiinference.io",
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		LeaseDuration:           nonZero(opts.LeaseDuration),
		RenewDeadline:           nonZero(opts.RenewDeadline),
		RetryPeriod:             nonZero(opts.RetryPeriod),
		// Hand the lease over at once on a clean shutdown, so a restart does not wait
		// for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       ptrTo(30 * time.Second),
		Controller:                    ctrlconfig.Controller{SkipNameValidation: ptrTo(opts.skipNameValidation)},
		// managedFields are the largest part of a cached object and nothing reads them.
		Cache: cache.Options{DefaultNamespaces: namespaces(opts.WatchNamespaces), DefaultTransform: stripForCache, ByObject: cachedChildren(cfg, managed)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	if opts.Webhook != nil {
		ready, err := webhook.Setup(mgr, *opts.Webhook)
		if err != nil {
			return nil, fmt.Errorf("setting up the webhooks: %w", err)
		}
		if err := mgr.AddReadyzCheck("webhook", ready); err != nil {
			return nil, err
		}
	}
	clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	eventsClient, err := eventsv1client.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	events := eventrecorder.New(eventsClient, scheme, "aiinference-operator", mgr.GetLogger().WithName("events"))
	if err := mgr.Add(events); err != nil {
		return nil, err
	}
	r := &aiinference.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    scheme,
		Recorder:  events,
		Options: aiinference.Options{LoaderImage: opts.LoaderImage, PrometheusURL: opts.PrometheusURL,
			AutoscaleInterval: opts.AutoscaleInterval, OperatorNamespace: opts.OperatorNamespace, RouterService: opts.RouterService,
			ImageVolumes: servesImageVolumes(clientset)},
		Logs:     aiinference.PodLogs{Client: clientset},
		Analyzer: aiinference.PrometheusAnalyzer,
		Now:      time.Now,
	}
	// Limited to its namespaces, the operator may not read the reports, which
	// live in the cache plugin's namespace: status.modelCache is left out.
	if len(opts.WatchNamespaces) == 0 {
		if r.ModelCacheReports, err = modelCacheReports(mgr); err != nil {
			return nil, err
		}
	}
	if opts.RouterService != "" && opts.OperatorNamespace != "" {
		if r.RouterEndpoints, err = aiinference.RouterEndpointsCache(mgr, opts.OperatorNamespace, opts.RouterService); err != nil {
			return nil, fmt.Errorf("creating the router endpoints' cache: %w", err)
		}
		if err := mgr.Add(r.RouterEndpoints); err != nil {
			return nil, err
		}
	}
	if opts.ActivatorAdvertiseAddress != "" && opts.ActivatorBindAddress != "" && opts.ActivatorBindAddress != "0" {
		if err := addActivator(mgr, r, opts); err != nil {
			return nil, err
		}
	}
	if err := r.SetupWithManager(mgr, opts.MaxConcurrentReconciles); err != nil {
		return nil, fmt.Errorf("setting up the AIInference controller: %w", err)
	}
	return mgr, nil
}

// modelCacheReports is a cache of the nodes' model cache reports alone: the
// manager's cache holds only the operator's own ConfigMaps, and these are the
// cache plugin's.
func modelCacheReports(mgr ctrl.Manager) (cache.Cache, error) {
	reports, err := labels.NewRequirement(nodecachespec.StateLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), DefaultTransform: stripForCache,
		ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: labels.NewSelector().Add(*reports)}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the model cache reports' cache: %w", err)
	}
	return c, mgr.Add(c)
}

func ptrTo[T any](v T) *T { return &v }

// nonZero is d, or nil (the default) when d is zero.
func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// namespaces is the cache's namespaces: nil (all) or those listed.
func namespaces(list []string) map[string]cache.Config {
	if len(list) == 0 {
		return nil
	}
	m := map[string]cache.Config{}
	for _, ns := range list {
		m[ns] = cache.Config{}
	}
	return m
}

// podStatusOnly keeps of a cached pod what the controller reads: its metadata,
// the node it runs on and its status. The spec (containers, probes, volumes) is
// a copy of the Deployment's template and most of the pod's size; at a thousand
// objects dropping it halves the cache.
func podStatusOnly(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	pod.ManagedFields = nil
	pod.Spec = corev1.PodSpec{NodeName: pod.Spec.NodeName}
	return pod, nil
}

// DefaultRouterService is the router's Service that config/router and the
// chart install beside the operator.
const DefaultRouterService = aiinference.DefaultRouterService

// servesImageVolumes tells whether the API server is Kubernetes v1.35 or later,
// where image volumes are on by default: an oci model in mode Auto is then
// mounted as one. A server that cannot say is taken not to.
func servesImageVolumes(clientset kubernetes.Interface) bool {
	v, err := clientset.Discovery().ServerVersion()
	if err != nil {
		return false
	}
	major, errMajor := strconv.Atoi(strings.TrimSuffix(v.Major, "+"))
	minor, errMinor := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	return errMajor == nil && errMinor == nil && (major > 1 || major == 1 && minor >= 35)
}
