// Command manager runs the AIInference operator against the cluster of KUBECONFIG
// (or the in-cluster configuration).
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/aiinference/operator/internal/manager"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", ":8080", "Address the metrics endpoint binds to; 0 disables it.")
	flag.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "Address the health probe endpoint binds to.")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "Elect a leader, so only one of several operator replicas acts at a time.")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election lease; defaults to the pod's namespace.")
	flag.StringVar(&opts.LoaderImage, "loader-image", manager.DefaultLoaderImage, "Image of the model loader init container.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

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
	log.Info("Starting the AIInference operator", "loaderImage", opts.LoaderImage, "leaderElection", opts.LeaderElection)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "The manager stopped with an error")
		os.Exit(1)
	}
}
