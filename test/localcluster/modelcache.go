package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/aiinference/operator/internal/nodecachespec"
)

// The node-local model cache on the real nodes: its CSI plugin (`model-loader
// node-cache`, built from this repository) runs on the host for each real node,
// as the chart's DaemonSet runs it on a node of a real cluster, in the host's
// mount namespace, which is the kubelet's and containerd's: the kubelet finds
// it in its plugin registration folder and calls it to mount the pods' cache
// volumes.

// ModelCacheNamespace is where `localcluster up --model-cache` puts the nodes'
// report ConfigMaps, as the chart puts them in the operator's namespace.
const ModelCacheNamespace = "aiinference-model-cache"

// ModelCacheOptions configure StartModelCache.
type ModelCacheOptions struct {
	// Binary is the model loader built for the host.
	Binary string
	// Budget is each node's budget, a quantity ("0": none).
	Budget string
	// Namespace receives the nodes' report ConfigMaps.
	Namespace string
}

// ModelCacheNode is one real node's plugin.
type ModelCacheNode struct {
	Node string
	// Dir is the cache's folder on the host.
	Dir string
	// MetricsURL is the plugin's /metrics.
	MetricsURL string
}

// StartModelCache installs the CSIDriver and starts the plugin for every real
// node, and waits until each kubelet has registered it (the node's CSINode
// lists the driver). The plugins stop with the cluster.
func (c *Cluster) StartModelCache(ctx context.Context, opts ModelCacheOptions) ([]ModelCacheNode, error) {
	nodes := c.RealNodes()
	if len(nodes) == 0 {
		return nil, errors.New("the model cache runs on real nodes, and the cluster has none")
	}
	driver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: nodecachespec.DriverName},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       ptr.To(false),
			PodInfoOnMount:       ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
			FSGroupPolicy:        ptr.To(storagev1.NoneFSGroupPolicy),
		},
	}
	if _, err := c.client.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating the CSIDriver: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.Namespace}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	var started []ModelCacheNode
	for _, n := range nodes {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		node := ModelCacheNode{Node: n.Name, Dir: filepath.Join(n.Dir, "model-cache"), MetricsURL: "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/metrics"}
		if err := os.MkdirAll(node.Dir, 0o755); err != nil {
			return nil, err
		}
		// The kubelet dials the sockets by path, which must stay short: the CSI
		// socket goes beside the shims' (the registration socket's name is short).
		if err := c.startNodeProcess(filepath.Join(c.logsDir, n.Name), "model-cache", opts.Binary, "node-cache",
			"--node-name="+n.Name, "--namespace="+opts.Namespace, "--kubeconfig="+c.kubeconfig,
			"--cache-dir="+node.Dir, "--budget="+opts.Budget,
			"--registration-dir="+filepath.Join(n.KubeletDir, "plugins_registry"),
			"--csi-socket="+filepath.Join(n.ShimSocketDir, "model-cache.sock"),
			"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(ports[0]),
			"--report-interval=2s",
		); err != nil {
			return nil, err
		}
		started = append(started, node)
	}
	ctx, cancel := context.WithTimeout(ctx, modelCacheRegistrationTimeout)
	defer cancel()
	for _, n := range started {
		if err := c.poll(ctx, "the kubelet of "+n.Node+" to register the model cache", func(ctx context.Context) (bool, error) {
			csiNode, err := c.client.StorageV1().CSINodes().Get(ctx, n.Node, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			for _, d := range csiNode.Spec.Drivers {
				if d.Name == nodecachespec.DriverName {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return nil, err
		}
	}
	return started, nil
}

// modelCacheRegistrationTimeout bounds the wait for a kubelet's registration.
const modelCacheRegistrationTimeout = time.Minute
