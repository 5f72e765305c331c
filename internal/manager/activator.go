package manager

import (
	"context"
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
	port, err := strconv.Atoi(portText)
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("--activator-bind-address %q: give a port between 1 and 65535", opts.ActivatorBindAddress)
	}
	if net.ParseIP(opts.ActivatorAdvertiseAddress) == nil {
		return fmt.Errorf("--activator-advertise-address %q is not an IP address (the Services' endpoints need one)", opts.ActivatorAdvertiseAddress)
	}
	wake := make(chan event.GenericEvent, wakeBuffer)
	a := activator.New(activator.Options{Metrics: activator.NewMetrics(metrics.Registry)}, activator.KubeResolver{Reader: mgr.GetClient()}, func(key types.NamespacedName) {
		obj := &servingv1.AIInference{}
		obj.Namespace, obj.Name = key.Namespace, key.Name
		select {
		case wake <- event.GenericEvent{Object: obj}:
		default:
		}
	}, mgr.GetLogger().WithName("activator"))
	r.Activator = advertised{Activator: a, ip: opts.ActivatorAdvertiseAddress, port: int32(port)}
	r.Wake = wake
	// A runnable that needs the lease: the activator serves on the leader, whose
	// reconciles write the EndpointSlices that lead to it.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return a.Serve(ctx, opts.ActivatorBindAddress)
	}))
}

// advertised is the activator with the address the Services reach it at.
type advertised struct {
	*activator.Activator
	ip   string
	port int32
}

func (a advertised) Address() (string, int32) { return a.ip, a.port }
