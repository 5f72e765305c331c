// Command manager runs the AIInference operator against the cluster of KUBECONFIG
// (or the in-cluster configuration).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/internal/tracing"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/internal/webhook"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", "", "Address the metrics endpoint binds to; empty: "+manager.DefaultMetricsBindAddress+" (HTTPS); 0 disables it. Plain HTTP (--metrics-secure=false) needs one named, e.g. 127.0.0.1:8080.")
	flag.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "Address the health probe endpoint binds to.")
	flag.StringVar(&opts.PprofBindAddress, "pprof-bind-address", "0", "Address Go's profiles (/debug/pprof/) are served on, e.g. 127.0.0.1:8082; 0 disables them.")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "Elect a leader, so only one of several operator replicas acts at a time.")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election lease; defaults to the pod's namespace.")
	flag.DurationVar(&opts.LeaseDuration, "leader-elect-lease-duration", 12*time.Second, "How long a replica waits after the leader's last renewal before it takes the lease.")
	flag.DurationVar(&opts.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps retrying to renew before it gives up leading (and exits).")
	flag.DurationVar(&opts.RetryPeriod, "leader-elect-retry-period", 1500*time.Millisecond, "How often replicas try to acquire or renew the lease.")
	var watchNamespaces string
	flag.StringVar(&watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch and act in (namespace mode: needs only Roles there, see config/namespaced); empty: all namespaces.")
	metricsSecure := flag.Bool("metrics-secure", true, "Serve metrics over HTTPS to callers whose token the API server authenticates and authorizes for GET /metrics (the aiinference-metrics-reader ClusterRole); false: plain HTTP to anyone who connects, on the --metrics-bind-address named.")
	flag.StringVar(&opts.MetricsCertDir, "metrics-cert-dir", "", "Folder of the metrics server's tls.crt and tls.key; empty: a self-signed certificate.")
	flag.StringVar(&opts.LoaderImage, "loader-image", manager.DefaultLoaderImage, "Image of the model loader init container.")
	flag.DurationVar(&opts.AutoscaleInterval, "autoscale-interval", manager.DefaultAutoscaleInterval, "How often the autoscaler reads the signals of the engines of AIInferences with spec.autoscaling.")
	opts.OperatorNamespace = os.Getenv("POD_NAMESPACE")
	flag.StringVar(&opts.RouterService, "router-service", manager.DefaultRouterService, "The router's Service in the operator's namespace ($POD_NAMESPACE), which the Services of models with spec.routing.enabled lead to (docs/routing.md); empty: no model is routed.")
	flag.StringVar(&opts.ActivatorBindAddress, "activator-bind-address", manager.DefaultActivatorBindAddress, "Where the activator, which holds requests for models at zero replicas, listens: each model at zero on a port of its own, the first free one from this port up (1000 at most; port 0: one the kernel picks). 0 turns it off (and no model goes to zero).")
	flag.StringVar(&opts.ActivatorAdvertiseAddress, "activator-advertise-address", os.Getenv("POD_IP"), "IP the models' Services send requests to while the models are at zero (the operator pod's IP; default $POD_IP). Empty: no activator, and no model goes to zero.")
	flag.StringVar(&opts.PrometheusURL, "prometheus-url", "", "Prometheus that canary analysis steps query (e.g. http://prometheus.monitoring:9090); an AIInference's rollout.canary.prometheusURL overrides it.")
	flag.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", 4, "How many AIInference objects are reconciled at once.")
	var qps float64
	flag.Float64Var(&qps, "kube-api-qps", 50, "Requests per second the operator may send to the API server (client-go's token bucket).")
	flag.IntVar(&opts.KubeAPIBurst, "kube-api-burst", 100, "Requests the operator may send to the API server in a burst above --kube-api-qps.")
	var webhooks bool
	wh := webhook.Options{CertMode: webhook.CertSelfManaged}
	var webhookService string
	flag.BoolVar(&webhooks, "webhooks", false, "Serve the admission and conversion webhooks (needed in a cluster that serves v1alpha1; config/webhook turns it on).")
	flag.IntVar(&wh.Port, "webhook-port", webhook.DefaultPort, "Port the webhook server listens on.")
	flag.StringVar(&wh.CertDir, "webhook-cert-dir", webhook.DefaultCertDir, "Folder of the webhook's tls.crt and tls.key; reloaded when they change.")
	flag.StringVar((*string)(&wh.CertMode), "webhook-cert-mode", string(webhook.CertSelfManaged), "Who issues the webhook certificate: self-managed (the operator's own CA, rotated) or cert-manager (mounted at --webhook-cert-dir).")
	flag.StringVar(&wh.SecretNamespace, "webhook-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the webhook Service and certificate Secret; defaults to $POD_NAMESPACE.")
	flag.StringVar(&wh.SecretName, "webhook-secret-name", webhook.DefaultSecretName, "Secret holding the self-managed CA and serving certificate.")
	flag.StringVar(&webhookService, "webhook-service-name", "aiinference-webhook-service", "Service the API server calls the webhooks through; the certificate is issued for <service>.<namespace>.svc.")
	flag.StringVar(&wh.DNSName, "webhook-dns-name", "", "Name the certificate is issued for instead of the Service's (e.g. localhost when the operator runs outside the cluster).")
	flag.StringVar(&wh.CRDName, "webhook-crd-name", webhook.DefaultCRDName, "CRD whose conversion webhook gets the CA bundle.")
	flag.StringVar(&wh.MutatingConfigName, "webhook-mutating-config", webhook.DefaultMutatingConfigName, "MutatingWebhookConfiguration that gets the CA bundle.")
	flag.StringVar(&wh.ValidatingConfigName, "webhook-validating-config", webhook.DefaultValidatingConfigName, "ValidatingWebhookConfiguration that gets the CA bundle.")
	var traceOpts tracing.Options
	flag.StringVar(&traceOpts.Endpoint, "otlp-endpoint", "", "OTLP/HTTP receiver to send reconcile traces to: host:port (e.g. otel-collector.observability:4318; traces go to /v1/traces) or a URL; empty (the default) turns tracing off.")
	flag.BoolVar(&traceOpts.Insecure, "otlp-insecure", false, "Send traces to a host:port --otlp-endpoint over plain HTTP, without TLS.")
	flag.Float64Var(&traceOpts.SampleRatio, "trace-sample-ratio", 1, "Share of reconciles traced when --otlp-endpoint is set, 0 to 1.")
	printVersion := flag.Bool("version", false, "Print the version and exit.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	opts.KubeAPIQPS = float32(qps)
	opts.MetricsInsecure = !*metricsSecure
	for _, ns := range strings.Split(watchNamespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			opts.WatchNamespaces = append(opts.WatchNamespaces, ns)
		}
	}
	if *printVersion {
		fmt.Println(version.Version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")
	if set := manager.SetMemoryDefaults(); set != "" {
		log.Info("Garbage collector settings", "set", set)
	}

	if webhooks {
		if wh.DNSName == "" {
			wh.DNSName = webhookService + "." + wh.SecretNamespace + ".svc"
		}
		opts.Webhook = &wh
	}

	shutdownTracing, err := tracing.Setup(context.Background(), traceOpts)
	if err != nil {
		log.Error(err, "Unable to set up tracing")
		os.Exit(1)
	}
	// Flushes the spans not sent yet on a clean stop.
	defer func() { _ = shutdownTracing(context.Background()) }()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "Unable to find a cluster: set KUBECONFIG or run in a pod")
		os.Exit(1)
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		log.Error(err, "Unable to create the manager")
		os.Exit(1)
	}
	log.Info("Starting the AIInference operator", "loaderImage", opts.LoaderImage, "leaderElection", opts.LeaderElection, "webhooks", webhooks)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "The manager stopped with an error")
		os.Exit(1)
	}
}
