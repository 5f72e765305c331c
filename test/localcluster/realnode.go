package localcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// A real node runs beside the kwok nodes on this host: its own containerd (with
// runc and the bridge CNI plugin) and its own kubelet, which joins the cluster's
// API server as system:node:NAME. Everything it writes lives in the node's
// folder under the cluster's, except what the kernel keeps elsewhere: its cgroups
// (one root per node, in every hierarchy), its bridge link, the shim socket
// folder (a unix socket path must stay short), a few sysctls, and files in host
// folders that the kubelet and libcni have built in. Stop removes or restores
// all of them. REAL-NODE settings that a cgroup v1 host without
// CAP_SYS_RESOURCE needs are noted where they are set.

// The binaries of a real node, as hack/tools/build.sh node puts them in one
// folder; the CNI plugins are in its cni/ subfolder.
const (
	kubeletBinary    = "kubelet"
	containerdBinary = "containerd"
	shimBinary       = "containerd-shim-runc-v2"
	ctrBinary        = "ctr"
	runcBinary       = "runc"
	cniSubdir        = "cni"
)

var cniPlugins = []string{"bridge", "loopback", "host-local", "portmap"}

// realPodSubnetPrefix starts the pod subnets of real nodes, one /24 per node:
// outside kwok's podCIDR, whose addresses are only data, so the two never collide.
const realPodSubnetPrefix = "10.245."

// RealNodeOptions configure the real nodes of a cluster: the nodes of the pools
// with Real set, and those added later with AddNodes.
type RealNodeOptions struct {
	// BinDir holds kubelet, kube-proxy, containerd, containerd-shim-runc-v2,
	// ctr, runc, coredns and cni/ with the bridge, loopback, host-local and
	// portmap plugins. Empty:
	// BuildRealNodeBinaries builds them or finds them in its cache.
	BinDir string
	// ImageDir holds the image archives (*.tar) imported into every real node,
	// among them pause.tar, the pods' sandbox image. Empty: BuildImages.
	ImageDir string
}

// BuildRealNodeBinaries runs `hack/tools/build.sh node` in repoRoot, which
// builds the kubelet, containerd, runc and the CNI plugins from their pinned
// module versions (or reuses them from the cache), and returns their folder.
// A cold build takes about 10 minutes on 2 cores.
func BuildRealNodeBinaries(ctx context.Context, repoRoot string, progress io.Writer) (string, error) {
	dir, err := runBuildScript(ctx, repoRoot, "node", progress)
	if err != nil {
		return "", err
	}
	return dir, checkRealNodeBinaries(dir)
}

// checkRealNodeBinaries reports a missing binary in dir.
func checkRealNodeBinaries(dir string) error {
	var errs []error
	bins := []string{kubeletBinary, kubeProxyBinary, containerdBinary, shimBinary, ctrBinary, runcBinary, corednsBinary}
	for _, p := range cniPlugins {
		bins = append(bins, filepath.Join(cniSubdir, p))
	}
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			errs = append(errs, fmt.Errorf("real node binary %s: %w", b, err))
		}
	}
	return errors.Join(errs...)
}

// prepareRealNodes checks the host and finds (or builds) the binaries and images
// when a pool is real; otherwise it returns opts.RealNodes as they are.
func prepareRealNodes(ctx context.Context, opts Options, pools []NodePool, progress io.Writer) (RealNodeOptions, error) {
	prepared, err := prepareRealNodesAsync(ctx, opts, pools, progress)
	if err != nil || prepared == nil {
		return opts.RealNodes, err
	}
	return prepared()
}

// prepareRealNodesAsync checks the host when a pool is real, and starts finding
// (or building) the binaries and images in the background: the control plane
// starts meanwhile, and the first real node waits for them. It returns nil when
// no pool is real.
func prepareRealNodesAsync(ctx context.Context, opts Options, pools []NodePool, progress io.Writer) (func() (RealNodeOptions, error), error) {
	if !slices.ContainsFunc(pools, func(p NodePool) bool { return p.Real && p.Count > 0 }) {
		return nil, nil
	}
	if err := CheckRealNodeHost(); err != nil {
		return nil, err
	}
	prepared := sync.OnceValues(func() (RealNodeOptions, error) {
		return resolveRealNodeOptions(ctx, opts.RealNodes, opts.RepoRoot, progress)
	})
	go prepared()
	return prepared, nil
}

// resolveRealNodeOptions fills the empty fields of real by running the build script.
func resolveRealNodeOptions(ctx context.Context, real RealNodeOptions, repoRoot string, progress io.Writer) (RealNodeOptions, error) {
	if progress == nil {
		progress = io.Discard
	}
	if real.BinDir == "" || real.ImageDir == "" {
		if repoRoot == "" {
			var err error
			if repoRoot, err = FindRepoRoot("."); err != nil {
				return real, err
			}
		}
	}
	var err error
	if real.BinDir == "" {
		fmt.Fprintln(progress, "Finding or building the real node binaries (hack/tools/build.sh node)")
		if real.BinDir, err = BuildRealNodeBinaries(ctx, repoRoot, progress); err != nil {
			return real, err
		}
	}
	if real.ImageDir == "" {
		fmt.Fprintln(progress, "Finding or building the real node images (hack/tools/build.sh images)")
		if real.ImageDir, err = BuildImages(ctx, repoRoot, progress); err != nil {
			return real, err
		}
	}
	return real, checkRealNodeBinaries(real.BinDir)
}

// RealNode describes one real node of a cluster.
type RealNode struct {
	// Name is the node's name.
	Name string `json:"name"`
	// Dir is the node's folder: containerd's root and state, the kubelet's root
	// folder, configuration files and the pods' logs.
	Dir string `json:"dir"`
	// PodCIDR is where the node's pods take their IPs from; the host routes it
	// through Bridge, so the host reaches the pods directly.
	PodCIDR string `json:"podCIDR"`
	// Bridge is the name of the node's bridge link.
	Bridge string `json:"bridge"`
	// CgroupRoot is the kubelet's cgroupRoot, present in every cgroup hierarchy;
	// containerd and its shims run in its runtime child.
	CgroupRoot string `json:"cgroupRoot"`
	// ContainerdSocket is the address of the node's containerd, for ctr --address.
	ContainerdSocket string `json:"containerdSocket"`
	// ShimSocketDir holds the shims' sockets; outside Dir because a unix socket
	// path must stay short.
	ShimSocketDir string `json:"shimSocketDir"`
	// KubeletDir is the kubelet's root, outside Dir for the same reason: the
	// kubelet and its plugins (the node cache) make sockets in it, and under a
	// deep Dir their paths passed the 107 bytes a socket path may have. Dir's
	// kubelet is a link to it.
	KubeletDir string `json:"kubeletDir"`
}

// realNodes are the real nodes of a cluster, and what they changed on the host.
type realNodes struct {
	// mu serialises starting nodes and importing images, and guards the fields
	// up to images. Stop does not take it (it holds Cluster.mu, which a starting
	// node takes to record its processes).
	mu      sync.Mutex
	options RealNodeOptions
	// prepared, when set, gives the options as Start found them in the
	// background (prepareRealNodesAsync).
	prepared func() (RealNodeOptions, error)
	repoRoot string
	images   []ImageArchive

	// host is guarded by Cluster.mu; its SysctlsBefore is nil until the first
	// real node starts.
	host RealNodeHost
	// kubeProxy is guarded by Cluster.mu.
	kubeProxy kubeProxyState
	// apiRelay, guarded by Cluster.mu, is nil until the first real node has
	// its bridge (apirelay.go).
	apiRelay *apiRelay
	// dns, guarded by Cluster.mu, is nil until the first real node has its
	// bridge (dns.go).
	dns *clusterDNS
	// netPolicy, guarded by Cluster.mu, is nil until StartNetworkPolicy has
	// started the NetworkPolicy agent (netpol.go).
	netPolicy *NetworkPolicyAgent
}

// RealNodeHost is what the real nodes of a cluster changed on the host. Stop
// undoes it; TearDownRealNodeHost undoes it from another process, for a
// cluster whose owner died (localcluster down).
type RealNodeHost struct {
	// ClusterDir is the cluster's folder, which holds the nodes' folders.
	ClusterDir string     `json:"clusterDir"`
	Nodes      []RealNode `json:"nodes"`
	// SysctlsBefore are the host's sysctls from before the first real node started.
	SysctlsBefore map[string]string `json:"sysctlsBefore"`
	// HostDirsBefore tells which host folders that the kubelet and libcni share
	// existed then.
	HostDirsBefore map[string]bool `json:"hostDirsBefore"`
	// KubeProxy is set once the cluster's kube-proxy is about to start.
	KubeProxy *KubeProxyHost `json:"kubeProxy,omitempty"`
	// NetworkPolicy is set once the cluster's NetworkPolicy agent is about to start.
	NetworkPolicy *NetworkPolicyHost `json:"networkPolicy,omitempty"`
}

// RealNodes describes the real nodes of the cluster, in start order.
func (c *Cluster) RealNodes() []RealNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.real.host.Nodes)
}

// RealNodeHost is what the cluster's real nodes changed on the host so far.
func (c *Cluster) RealNodeHost() RealNodeHost {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.real.host
	h.Nodes = slices.Clone(h.Nodes)
	return h
}

// Images are the image archives imported into every real node; empty before the
// first real node starts.
func (c *Cluster) Images() []ImageArchive {
	c.real.mu.Lock()
	defer c.real.mu.Unlock()
	return slices.Clone(c.real.images)
}

// ImportImage imports an image archive into every real node's containerd, and
// into the nodes that start later.
func (c *Cluster) ImportImage(ctx context.Context, archivePath string) (ImageArchive, error) {
	ref, err := archiveRef(archivePath)
	if err != nil {
		return ImageArchive{}, fmt.Errorf("image archive %s: %w", archivePath, err)
	}
	archive := ImageArchive{Name: strings.TrimSuffix(filepath.Base(archivePath), ".tar"), Path: archivePath, Ref: ref}
	c.real.mu.Lock()
	defer c.real.mu.Unlock()
	for _, n := range c.RealNodes() {
		if err := importImage(ctx, filepath.Join(c.real.options.BinDir, ctrBinary), n.ContainerdSocket, archive); err != nil {
			return archive, err
		}
	}
	c.real.images = append(c.real.images, archive)
	return archive, nil
}

// startRealNodes starts pool.Count real nodes of pool, skipping names that
// exist, and returns their names once each has registered with its GPUs
// advertised. The caller waits for them to be Ready.
func (c *Cluster) startRealNodes(ctx context.Context, pool NodePool) ([]string, error) {
	c.real.mu.Lock()
	defer c.real.mu.Unlock()
	if err := CheckRealNodeHost(); err != nil {
		return nil, err
	}
	var err error
	if c.real.prepared != nil {
		c.real.options, err = c.real.prepared()
	} else {
		c.real.options, err = resolveRealNodeOptions(ctx, c.real.options, c.real.repoRoot, c.progress)
	}
	if err != nil {
		return nil, err
	}
	if c.real.images == nil {
		if c.real.images, err = LoadImageArchives(c.real.options.ImageDir); err != nil {
			return nil, err
		}
	}
	pause, err := FindImage(c.real.images, PauseImage)
	if err != nil {
		return nil, err
	}
	sysctls, err := readSysctls()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.real.host.SysctlsBefore == nil {
		c.real.host = RealNodeHost{ClusterDir: c.dir, SysctlsBefore: sysctls, HostDirsBefore: existingHostDirs()}
	}
	c.mu.Unlock()
	var names []string
	for index := 0; len(names) < pool.Count; index++ {
		name := pool.NodeName(index)
		_, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return names, err
		}
		fmt.Fprintf(c.progress, "Starting real node %s\n", name)
		if err := c.startRealNode(ctx, pool, index, pause.Ref); err != nil {
			return names, fmt.Errorf("real node %s: %w", name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// startRealNode starts the containerd and kubelet of one node, with c.real.mu held.
func (c *Cluster) startRealNode(ctx context.Context, pool NodePool, index int, sandboxImage string) error {
	subnet, err := freePodSubnet()
	if err != nil {
		return err
	}
	node := newRealNode(filepath.Join(c.dir, "nodes"), pool.NodeName(index), subnet)
	name, dir := node.Name, node.Dir
	// Recorded before anything is created, so that teardown undoes a half start.
	c.mu.Lock()
	stopped := c.stopped
	if !stopped {
		c.real.host.Nodes = append(c.real.host.Nodes, node)
	}
	c.mu.Unlock()
	if stopped {
		return errors.New("cluster stopped while starting")
	}

	bin := c.real.options.BinDir
	logsDir := filepath.Join(c.logsDir, name)
	for _, d := range []string{dir, logsDir, node.ShimSocketDir, node.KubeletDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.Symlink(node.KubeletDir, filepath.Join(dir, "kubelet")); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, cg := range []string{node.CgroupRoot, runtimeCgroup(node)} {
		if err := createCgroup(hierarchies, cg); err != nil {
			return err
		}
	}
	// A bridge of this name is a leftover of this very node folder's last run.
	if err := deleteBridge(node.Bridge); err != nil {
		return err
	}
	if err := createBridge(node.Bridge, subnet); err != nil {
		return err
	}
	if err := c.startAPIRelay(ctx, node); err != nil {
		return err
	}
	if err := c.startClusterDNS(ctx, node); err != nil {
		return err
	}

	// containerd, with the bridge network and the pause image.
	cniConfDir := filepath.Join(dir, "cni-conf")
	if err := os.MkdirAll(cniConfDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniConfDir, "10-localcluster.conflist"), cniConfig(node), 0o644); err != nil {
		return err
	}
	containerdConfig := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(containerdConfig, []byte(containerdConfigTOML(node, bin, sandboxImage)), 0o644); err != nil {
		return err
	}
	if err := c.startNodeProcess(logsDir, containerdBinary, filepath.Join(bin, containerdBinary), "--config", containerdConfig); err != nil {
		return err
	}
	ctr := filepath.Join(bin, ctrBinary)
	if err := c.poll(ctx, name+" containerd", func(ctx context.Context) (bool, error) {
		out, err := exec.CommandContext(ctx, ctr, "--address", node.ContainerdSocket, "version").CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("ctr version: %w: %s", err, out)
		}
		return true, nil
	}); err != nil {
		return err
	}
	for _, img := range c.real.images {
		if err := importImage(ctx, ctr, node.ContainerdSocket, img); err != nil {
			return err
		}
	}

	// The kubelet, with a credential of its own.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.writeClientKubeconfig(kubeconfig, "system:node:"+name, "system:nodes"); err != nil {
		return err
	}
	nodeIP, err := defaultRouteIPv4()
	if err != nil {
		return err
	}
	port, err := freePorts(1)
	if err != nil {
		return err
	}
	kubeletConfig := filepath.Join(dir, "kubelet.yaml")
	config, err := kubeletConfigYAML(node, pool, nodeIP, port[0], filepath.Join(c.dir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(kubeletConfig, config, 0o644); err != nil {
		return err
	}
	if err := c.startNodeProcess(logsDir, kubeletBinary, filepath.Join(bin, kubeletBinary),
		"--config="+kubeletConfig,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+node.KubeletDir,
		"--cert-dir="+filepath.Join(node.KubeletDir, "pki"),
		"--hostname-override="+name,
		"--node-ip="+nodeIP.String(),
		"--node-labels="+nodeLabelsFlag(pool, index),
	); err != nil {
		return err
	}

	// Simulated GPUs: the kubelet keeps extended resources that someone else put
	// in its status, as the NVIDIA device plugin would, and derives allocatable.
	if err := c.poll(ctx, "node "+name+" to register", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return err
	}
	if pool.GPUCount > 0 {
		patch := fmt.Sprintf(`[{"op":"add","path":"/status/capacity/%s","value":"%d"}]`,
			strings.ReplaceAll(string(GPUResource), "/", "~1"), pool.GPUCount)
		if _, err := c.client.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("advertising %d GPUs: %w", pool.GPUCount, err)
		}
		if err := c.poll(ctx, "node "+name+" to have allocatable GPUs", func(ctx context.Context) (bool, error) {
			n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			q := n.Status.Allocatable[GPUResource]
			return q.Value() == int64(pool.GPUCount), nil
		}); err != nil {
			return err
		}
	}
	// CoreDNS has read the cluster meanwhile (about a second).
	if err := c.waitClusterDNS(ctx); err != nil {
		return err
	}
	return c.startKubeProxy(ctx, node)
}

// runtimeCgroup is where containerd runs, and the shims it starts.
func runtimeCgroup(n RealNode) string { return n.CgroupRoot + "/runtime" }

// freePodSubnet returns the first 10.245.N.0/24 (N from 1) whose gateway
// address no interface of the host has, so the real nodes of several clusters
// on one host get their own routes. The node's bridge takes that address when
// the node starts.
func freePodSubnet() (*net.IPNet, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for n := 1; n < 255; n++ {
		gateway := net.ParseIP(realPodSubnetPrefix + strconv.Itoa(n) + ".1")
		if !slices.ContainsFunc(addrs, func(a net.Addr) bool {
			ipNet, ok := a.(*net.IPNet)
			return ok && ipNet.IP.Equal(gateway)
		}) {
			_, subnet, err := net.ParseCIDR(realPodSubnetPrefix + strconv.Itoa(n) + ".0/24")
			return subnet, err
		}
	}
	return nil, errors.New("no free pod subnet for a real node in " + realPodSubnetPrefix + "0.0/16")
}

// startNodeProcess starts one process of a real node, logging to logsDir, and
// records it with the cluster's components, so Healthy watches it and Stop
// ends it (before the control plane, being started after it).
func (c *Cluster) startNodeProcess(logsDir, name, binary string, args ...string) error {
	fmt.Fprintf(c.progress, "Starting %s\n", filepath.Join(filepath.Base(logsDir), name))
	p, err := startProcess(name, binary, args, nil, logsDir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs = append(c.procs, p)
	if c.stopped {
		p.stop(0)
		return errors.New("cluster stopped while starting")
	}
	return nil
}

// cniConfig is the node's network: a bridge with the node's pod subnet, the
// default route through it, and portmap for hostPort.
func cniConfig(n RealNode) []byte {
	config := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "localcluster-" + strings.TrimPrefix(n.Bridge, "lcbr"),
		"plugins": []any{
			map[string]any{
				"type":      "bridge",
				"bridge":    n.Bridge,
				"isGateway": true,
				// With a 0.0.0.0/0 route in the IPAM as well, the plugin would add
				// the default route twice and fail.
				"isDefaultGateway": true,
				"ipMasq":           false,
				"hairpinMode":      true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.PodCIDR}}},
					"dataDir": filepath.Join(n.Dir, "cni-ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, _ := json.MarshalIndent(config, "", "  ") // plain maps and strings always marshal
	return data
}

// containerdConfigTOML is the node's containerd configuration (version 4).
func containerdConfigTOML(n RealNode, binDir, sandboxImage string) string {
	q := strconv.Quote
	return `version = 4
root = ` + q(filepath.Join(n.Dir, "containerd")) + `
state = ` + q(filepath.Join(n.Dir, "containerd-state")) + `
# NRI and tracing would listen or export outside the node's folder.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[cgroup]
  path = ` + q(runtimeCgroup(n)) + `

[plugins."io.containerd.server.v1.grpc"]
  address = ` + q(n.ContainerdSocket) + `
[plugins."io.containerd.server.v1.ttrpc"]
  address = ` + q(n.ContainerdSocket+".ttrpc") + `
[plugins."io.containerd.internal.v1.opt"]
  path = ` + q(filepath.Join(n.Dir, "opt")) + `
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = ` + q(n.ShimSocketDir) + `

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = ` + q(sandboxImage) + `

[plugins."io.containerd.cri.v1.runtime"]
  # Root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE in this VM).
  restrict_oom_score_adj = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = ` + q(filepath.Join(binDir, shimBinary)) + `
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = ` + q(filepath.Join(binDir, runcBinary)) + `
        Root = ` + q(filepath.Join(n.Dir, "runc")) + `
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [` + q(filepath.Join(binDir, cniSubdir)) + `]
    conf_dir = ` + q(filepath.Join(n.Dir, "cni-conf")) + `
`
}

// kubeletConfigYAML is the node's KubeletConfiguration.
func kubeletConfigYAML(n RealNode, pool NodePool, nodeIP net.IP, port int, clientCAFile string) ([]byte, error) {
	maxPods := pool.Pods
	if maxPods == 0 {
		maxPods = 110
	}
	var taints []map[string]string
	if pool.GPUCount > 0 {
		taints = append(taints, map[string]string{"key": GPUTaintKey, "effect": string(corev1.TaintEffectNoSchedule)})
	}
	config := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": "unix://" + n.ContainerdSocket,
		// The API on the node IP, where the API server looks for it (logs, exec),
		// and only for clients with a certificate of the cluster CA.
		"address":            nodeIP.String(),
		"port":               port,
		"readOnlyPort":       0,
		"healthzPort":        0,
		"authentication":     map[string]any{"anonymous": map[string]bool{"enabled": false}, "webhook": map[string]bool{"enabled": true}, "x509": map[string]string{"clientCAFile": clientCAFile}},
		"authorization":      map[string]string{"mode": "Webhook"},
		"registerWithTaints": taints,
		"maxPods":            maxPods,
		// The kubelet refuses cgroup v1 from 1.35 on unless told otherwise; the
		// cgroupRoot keeps the node's cgroups apart from the host's and other nodes'.
		"failCgroupV1":           false,
		"cgroupDriver":           "cgroupfs",
		"cgroupRoot":             n.CgroupRoot,
		"cgroupsPerQOS":          true,
		"enforceNodeAllocatable": []string{"pods"},
		// Root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE in this VM).
		"oomScoreAdj":                   0,
		"failSwapOn":                    false,
		"localStorageCapacityIsolation": false,
		"makeIPTablesUtilChains":        false,
		"podLogsDir":                    filepath.Join(n.Dir, "pod-logs"),
		"volumePluginDir":               filepath.Join(n.Dir, "volume-plugins"),
		// A host shared with other work must not have its pods evicted, nor the
		// imported images (which no registry could give back) collected.
		"evictionHard":                map[string]string{"memory.available": "1Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		"clusterDomain":               ClusterDomain,
		// The kube-dns Service, which leads to the cluster's CoreDNS (dns.go):
		// pods get it as their nameserver, with the cluster's search path.
		"clusterDNS":          []string{ClusterDNSIP},
		"shutdownGracePeriod": "0s",
	}
	return yaml.Marshal(config)
}

// nodeLabelsFlag is the kubelet's --node-labels: the pool's labels, and its GPU
// product and count. The kubelet sets the kubernetes.io ones itself.
func nodeLabelsFlag(pool NodePool, index int) string {
	var labels []string
	for k, v := range pool.Node(index).Labels {
		if k == KwokTypeLabel || strings.HasPrefix(k, "kubernetes.io/") {
			continue
		}
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	return strings.Join(labels, ",")
}

// writeClientKubeconfig writes a kubeconfig whose client certificate, signed
// by the cluster CA, names user commonName in group (none if empty). A node's
// user is system:node:NAME in group system:nodes, which the API server's Node
// authorizer and NodeRestriction admission check.
func (c *Cluster) writeClientKubeconfig(path, commonName, group string) error {
	pkiDir := filepath.Join(c.dir, "pki")
	certPEM, keyPEM, err := signClientCert(pkiDir, commonName, group)
	if err != nil {
		return err
	}
	caCertPEM, err := os.ReadFile(filepath.Join(pkiDir, "ca.crt"))
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[contextName] = &clientcmdapi.Cluster{Server: c.restConfig.Host, CertificateAuthorityData: caCertPEM}
	cfg.AuthInfos[contextName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[contextName] = &clientcmdapi.Context{Cluster: contextName, AuthInfo: contextName}
	cfg.CurrentContext = contextName
	return clientcmd.WriteToFile(*cfg, path)
}

// writeKubeletClientCert writes the client certificate with which the API
// server calls the kubelets (logs, exec, port-forward), as
// kubelet-client.crt and .key in pkiDir. Its group system:masters passes the
// kubelets' webhook authorization without any RBAC binding.
func writeKubeletClientCert(pkiDir string) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := signClientCert(pkiDir, "kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(pkiDir, "kubelet-client.crt"), filepath.Join(pkiDir, "kubelet-client.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, keyPEM, 0o600)
}

// signClientCert returns a new key and a client certificate for user
// commonName in group (none if empty), signed by the cluster CA in pkiDir,
// both PEM encoded.
func signClientCert(pkiDir, commonName, group string) (certPEM, keyPEM []byte, err error) {
	caCertPEM, err := os.ReadFile(filepath.Join(pkiDir, "ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	caKeyPEM, err := os.ReadFile(filepath.Join(pkiDir, "ca.key"))
	if err != nil {
		return nil, nil, err
	}
	caBlock, _ := pem.Decode(caCertPEM)
	caKeyBlock, _ := pem.Decode(caKeyPEM)
	if caBlock == nil || caKeyBlock == nil {
		return nil, nil, errors.New("cluster CA: no PEM data")
	}
	caCert, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	caKey, err := x509.ParseECPrivateKey(caKeyBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	subject := pkix.Name{CommonName: commonName}
	if group != "" {
		subject.Organization = []string{group}
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the client certificate of %s: %w", commonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// tearDownRealNodes undoes what the real nodes left once their kubelet and
// containerd have been stopped: the processes in their cgroups (containers and
// shims), their mounts, bridges, cgroups and shim socket folders, kube-proxy's
// chains (then the cluster releases the host's kube-proxy lock), the host
// sysctls, and their files in the host folders the kubelet and libcni share.
// It returns an error if anything is left; then the cluster folder must stay,
// as something may still be mounted in it. Stop calls it with c.mu held, after
// ending the nodes' kubelets, containerds and kube-proxy.
func (c *Cluster) tearDownRealNodes() error {
	err := TearDownRealNodeHost(c.real.host, c.progress)
	c.real.host.Nodes = nil
	if c.real.kubeProxy.lock != nil {
		c.real.kubeProxy.lock.Close()
		c.real.kubeProxy.lock = nil
	}
	return err
}

// TearDownRealNodeHost undoes what the real nodes of h changed on the host,
// once their kubelets, containerds and kube-proxy are gone; see
// tearDownRealNodes. Doing it again does no harm. progress may be nil.
func TearDownRealNodeHost(h RealNodeHost, progress io.Writer) error {
	if len(h.Nodes) == 0 {
		return nil
	}
	if progress == nil {
		progress = io.Discard
	}
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range h.Nodes {
		fmt.Fprintf(progress, "Tearing down real node %s\n", n.Name)
		errs = append(errs,
			killCgroup(hierarchies, n.CgroupRoot, 10*time.Second),
			unmountUnder(nonEmpty(n.Dir, n.ShimSocketDir, n.KubeletDir)...),
			deleteBridge(n.Bridge),
			removeCgroup(hierarchies, n.CgroupRoot, 10*time.Second),
			os.RemoveAll(n.ShimSocketDir),
		)
		mounts, err := mountsUnder(n.Dir)
		errs = append(errs, err)
		if n.KubeletDir != "" { // a cluster started before the kubelet moved out of Dir has none
			kubeletMounts, err := mountsUnder(n.KubeletDir)
			errs = append(errs, err)
			if err == nil && len(kubeletMounts) == 0 { // never remove through a mount
				errs = append(errs, os.RemoveAll(n.KubeletDir))
			}
			mounts = append(mounts, kubeletMounts...)
		}
		if len(mounts) > 0 {
			errs = append(errs, fmt.Errorf("still mounted: %v", mounts))
		}
	}
	// kube-router's chains before kube-proxy's teardown, which would remove
	// them (KUBE-*) but not their ipsets.
	errs = append(errs, tearDownNetworkPolicy(h.NetworkPolicy, progress))
	errs = append(errs, tearDownKubeProxy(h.KubeProxy, progress), writeSysctls(h.SysctlsBefore), cleanSharedHostDirs(h.ClusterDir, h.HostDirsBefore))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tearing down the real nodes: %w", err)
	}
	return nil
}

// newRealNode is where the node called name, under nodesDir, keeps its
// state, and the host's names it takes.
func newRealNode(nodesDir, name string, subnet *net.IPNet) RealNode {
	dir := filepath.Join(nodesDir, name)
	sum := sha256.Sum256([]byte(dir))
	id := hex.EncodeToString(sum[:4]) // tells this node apart from those of other clusters on the host
	return RealNode{
		Name:             name,
		Dir:              dir,
		PodCIDR:          subnet.String(),
		Bridge:           "lcbr" + id,
		CgroupRoot:       "/localcluster-" + id,
		ContainerdSocket: filepath.Join("/run/localcluster-"+id, "containerd.sock"),
		ShimSocketDir:    "/run/localcluster-" + id,
		KubeletDir:       "/var/lib/localcluster-" + id,
	}
}

func nonEmpty(dirs ...string) []string {
	return slices.DeleteFunc(dirs, func(d string) bool { return d == "" })
}
