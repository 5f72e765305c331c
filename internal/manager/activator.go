package manager

import (
	"fmt"
	"net"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/activator"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/ingresspolicy"
)

// DefaultActivatorBindAddress is where the activator listens by default.
const DefaultActivatorBindAddress = ":8095"

// wakeBuffer bounds the models waiting to be woken; a wake that finds it full
// is dropped, and the model's next look (every autoscale interval at zero)
// finds the held request instead.
const wakeBuffer = 1024

// addActivator runs the activator in the manager and hands it to the
// reconciler: the models' Services lead to it while they are at zero.
func addActivator(mgr ctrl.Manager, r *aiinference.Reconciler, opts Options) error {
	_, portText, err := net.SplitHostPort(opts.ActivatorBindAddress)
	if err != nil {
		return fmt.Errorf("--activator-bind-address %q: %w", opts.ActivatorBindAddress, err)
	}
	// Each model at zero takes a port from this one up; 0: one the kernel picks.
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("--activator-bind-address %q: give a port between 0 and 65535", opts.ActivatorBindAddress)
	}
	if net.ParseIP(opts.ActivatorAdvertiseAddress) == nil {
		return fmt.Errorf("--activator-advertise-address %q is not an IP address (the Services' endpoints need one)", opts.ActivatorAdvertiseAddress)
	}
	wake := make(chan event.GenericEvent, wakeBuffer)
	a := activator.New(activator.Options{BindAddress: opts.ActivatorBindAddress, Metrics: activator.NewMetrics(metrics.Registry)},
		activator.KubeResolver{Reader: mgr.GetClient(), Clients: ingresspolicy.Lookup{Reader: mgr.GetAPIReader()}},
		func(key types.NamespacedName) {
			obj := &servingv1.AIInference{}
			obj.Namespace, obj.Name = key.Namespace, key.Name
			select {
			case wake <- event.GenericEvent{Object: obj}:
			default:
			}
		}, mgr.GetLogger().WithName("activator"))
	r.Activator = advertised{Activator: a, ip: opts.ActivatorAdvertiseAddress}
	r.Wake = wake
	// A runnable that needs the lease: the activator serves on the leader, whose
	// reconciles open its ports and write the EndpointSlices that lead to them.
	return mgr.Add(manager.RunnableFunc(a.Run))
}

// advertised is the activator with the address the Services reach it at.
type advertised struct {
	*activator.Activator
	ip string
}

func (a advertised) IP() string { return a.ip }
