// Package localcluster runs a real Kubernetes control plane on loopback with
// simulated GPU nodes: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok (which plays the kubelets), each on a free port of
// 127.0.0.1, all in one directory of their own. The end-to-end tests and the
// localcluster command use it.
//
// The binaries come from hack/tools/build.sh (built from pinned module versions,
// cached outside the repository); nothing is downloaded at run time but kwok's
// module, whose Stage configurations the cluster uses.
package localcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// serviceClusterIPRange is the range of Service cluster IPs. Only the
	// kube-proxy of real nodes routes them (kubeproxy.go); else they are data.
	serviceClusterIPRange = "10.96.0.0/16"
	serviceClusterIP      = "10.96.0.1" // the kubernetes Service
	// podCIDR is where kwok takes pod IPs from; like cluster IPs they are only data.
	podCIDR = "10.244.0.0/16"
	// contextName is the cluster, user and context name in the kubeconfig.
	contextName = "localcluster"
	// workloadFeatureGates turns on, in the API server, the controller manager
	// and the scheduler, what places a multi-node replica's group all or
	// nothing: PodGroups, the pod's schedulingGroup and the scheduler's
	// GangScheduling plugin (beta in Kubernetes 1.37, off by default).
	workloadFeatureGates = "--feature-gates=GenericWorkload=true"
)

// Options configure Start. The zero value starts the default cluster from the
// repository that contains the working directory.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager, kube-scheduler
	// and kwok. Empty: BuildBinaries builds them or finds them in its cache.
	BinDir string
	// KwokStageDir is kwok's kustomize/stage folder. Empty: KwokStageDir finds it.
	KwokStageDir string
	// RepoRoot is the repository checkout, needed when BinDir or KwokStageDir is
	// empty. Empty: FindRepoRoot from the working directory.
	RepoRoot string
	// NodePools are the simulated nodes. Nil: DefaultNodePools. Empty: no nodes.
	NodePools []NodePool
	// RealNodes configure the nodes of the pools with Real set (only used then).
	RealNodes RealNodeOptions
	// ObjectStore, when set, starts an S3-compatible store seeded with a model.
	ObjectStore *ObjectStoreOptions
	// Dir is the cluster's directory (etcd data, keys, kubeconfig, logs). Empty: a
	// new temporary directory that Stop removes. A Dir given here is created if
	// needed, must be empty, and is left in place by Stop, logs included.
	Dir string
	// StartTimeout bounds Start once the binaries are there. Zero: 3 minutes.
	StartTimeout time.Duration
	// Progress receives one line per step of Start and Stop (nil: discarded).
	Progress io.Writer
	// KubeletDelayScale multiplies the delays of the simulated kubelets: each
	// step of a pod's start (1-5 s), its removal once deleted (within its grace
	// period) and the crash-loop back-off (10 s doubling up to 5 min). Zero: 1,
	// as real; tests go faster with 0.1.
	KubeletDelayScale float64
}

// Cluster is a running local cluster. Its methods may be called concurrently.
type Cluster struct {
	dir        string
	removeDir  bool // Dir was a temporary directory of our own
	logsDir    string
	kubeconfig string
	restConfig *rest.Config
	client     kubernetes.Interface
	progress   io.Writer
	ports      ports

	mu      sync.Mutex
	procs   []*process // in start order
	stopped bool

	real        realNodes
	objectStore *ObjectStore
	// stopConfigCheck ends the check of pods' Secrets and ConfigMaps (configcheck.go).
	stopConfigCheck context.CancelFunc
	gateway         *Gateway // set by StartGateway
	// lwsStarted is set by StartLeaderWorkerSet (guarded by mu).
	lwsStarted bool
}

// ports are the loopback ports of the components.
type ports struct {
	etcdClient, etcdPeer, apiServer, controllerManager, scheduler int
}

// Start starts a cluster and returns once it is usable: the API server is ready,
// the controller-manager and scheduler are healthy, the default service account
// exists, and every node of the pools is Ready and schedulable. On error,
// everything it started is stopped again.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	begin := time.Now()
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	pools := opts.NodePools
	if pools == nil {
		pools = DefaultNodePools()
	}
	if err := ValidateNodePools(pools); err != nil {
		return nil, err
	}

	binDir, stageDir := opts.BinDir, opts.KwokStageDir
	var err error
	if binDir == "" || stageDir == "" {
		root := opts.RepoRoot
		if root == "" {
			if root, err = FindRepoRoot("."); err != nil {
				return nil, err
			}
		}
		if binDir == "" {
			fmt.Fprintln(progress, "Finding or building the cluster binaries (hack/tools/build.sh cluster)")
			if binDir, err = BuildBinaries(ctx, root, progress); err != nil {
				return nil, err
			}
		}
		if stageDir == "" {
			if stageDir, err = KwokStageDir(ctx, root); err != nil {
				return nil, err
			}
		}
	}
	if err := checkBinaries(binDir); err != nil {
		return nil, err
	}
	realOptions, err := prepareRealNodesAsync(ctx, opts, pools, progress)
	if err != nil {
		return nil, err
	}
	if opts.ObjectStore, err = prepareObjectStore(ctx, opts, progress); err != nil {
		return nil, err
	}

	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// The ports are free when chosen, but another program (say, the cluster of a
	// test package running in parallel) can take one before its component binds
	// it. Then start again on new ports.
	for attempt := 1; ; attempt++ {
		c, err := start(ctx, opts, binDir, stageDir, pools, realOptions, progress)
		if err == nil {
			fmt.Fprintf(progress, "Local cluster ready in %s: export KUBECONFIG=%s\n", time.Since(begin).Round(100*time.Millisecond), c.kubeconfig)
			return c, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		fmt.Fprintf(progress, "A port was taken meanwhile; starting again: %v\n", firstLine(err.Error()))
		if opts.Dir != "" {
			// Only what the failed attempt wrote is there (start wants it empty).
			if err := os.RemoveAll(opts.Dir); err != nil {
				return nil, err
			}
		}
	}
}

// start makes one attempt at starting a cluster.
func start(ctx context.Context, opts Options, binDir, stageDir string, pools []NodePool, realOptions func() (RealNodeOptions, error), progress io.Writer) (_ *Cluster, err error) {
	c := &Cluster{dir: opts.Dir, progress: progress, real: realNodes{options: opts.RealNodes, prepared: realOptions, repoRoot: opts.RepoRoot}}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "localcluster-"); err != nil {
			return nil, err
		}
		c.removeDir = true
	} else {
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return nil, err
		}
		if entries, err := os.ReadDir(c.dir); err != nil {
			return nil, err
		} else if len(entries) > 0 {
			return nil, fmt.Errorf("cluster directory %s is not empty", c.dir)
		}
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("starting the local cluster in %s: %w%s", c.dir, err, c.logTails(15))
			if stopErr := c.Stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()

	c.logsDir = filepath.Join(c.dir, "logs")
	pkiDir := filepath.Join(c.dir, "pki")
	for _, d := range []string{c.logsDir, pkiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	sec, err := writeSecrets(pkiDir)
	if err != nil {
		return nil, err
	}
	kubeletClientCert, kubeletClientKey, err := writeKubeletClientCert(pkiDir)
	if err != nil {
		return nil, err
	}
	stageConfig := filepath.Join(c.dir, "kwok-stages.yaml")
	if err := WriteStageConfig(stageDir, stageConfig, opts.KubeletDelayScale); err != nil {
		return nil, err
	}
	p, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	c.ports = ports{etcdClient: p[0], etcdPeer: p[1], apiServer: p[2], controllerManager: p[3], scheduler: p[4]}

	// etcd
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(c.ports.etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(c.ports.etcdPeer)
	if err := c.start(etcdBinary, filepath.Join(binDir, etcdBinary),
		"--name=localcluster",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=localcluster="+peerURL,
		// A throwaway cluster: no fsync, which is much faster on slow disks.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	); err != nil {
		return nil, err
	}
	if err := c.waitHTTP(ctx, etcdBinary, etcdURL+"/health", nil); err != nil {
		return nil, err
	}

	// kube-apiserver
	serverURL := "https://127.0.0.1:" + strconv.Itoa(c.ports.apiServer)
	if err := c.start(kubeAPIServerBinary, filepath.Join(binDir, kubeAPIServerBinary),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback address for the kubernetes
		// Service's endpoints; with real nodes the cluster writes them itself,
		// pointing at a relay its pods reach (apirelay.go).
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(c.ports.apiServer),
		"--cert-dir="+pkiDir,
		"--tls-cert-file="+sec.servingCert,
		"--tls-private-key-file="+sec.servingKey,
		"--client-ca-file="+sec.caCert,
		// For logs, exec and port-forward on real nodes.
		"--kubelet-client-certificate="+kubeletClientCert,
		"--kubelet-client-key="+kubeletClientKey,
		"--etcd-servers="+etcdURL,
		"--token-auth-file="+sec.tokenAuthFile,
		// Node and NodeRestriction confine a real node's kubelet to its own node and pods.
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-key-file="+sec.saPub,
		"--service-account-signing-key-file="+sec.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceClusterIPRange,
		"--allow-privileged=true",
		// kwok gives nodes the address 127.0.0.1, so logs/exec requests (which
		// kwok does not serve) stay on loopback.
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
		// The aggregation layer, as a real control plane has it: the API server
		// proxies an aggregated API (Karmada's clusters, karmada.go) with this
		// client certificate and the user in these headers.
		"--proxy-client-cert-file="+sec.frontProxyCert,
		"--proxy-client-key-file="+sec.frontProxyKey,
		"--requestheader-client-ca-file="+sec.caCert,
		"--requestheader-allowed-names="+frontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		workloadFeatureGates,
		// PodGroups, a beta API: served only when asked for.
		"--runtime-config=scheduling.k8s.io/v1beta1=true",
	); err != nil {
		return nil, err
	}
	c.restConfig = &rest.Config{
		Host:            serverURL,
		BearerToken:     sec.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: sec.caCertPEMBytes},
		QPS:             100,
		Burst:           200,
		// Each warning once (PodGroups' v1beta1 warns of its deprecation on
		// every request).
		WarningHandler: rest.NewWarningWriter(os.Stderr, rest.WarningWriterOptions{Deduplicate: true}),
	}
	if c.client, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return nil, err
	}
	if err := c.waitAPIServerReady(ctx); err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := writeKubeconfig(c.kubeconfig, serverURL, sec); err != nil {
		return nil, err
	}

	// The rest use the admin kubeconfig, also to delegate authentication and
	// authorization of their own (health) endpoints to the API server.
	kubeconfigFlags := []string{"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig, "--authorization-kubeconfig=" + c.kubeconfig}
	if err := c.start(kubeControllerManagerBinary, filepath.Join(binDir, kubeControllerManagerBinary), append(kubeconfigFlags,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(c.ports.controllerManager),
		"--cert-dir="+filepath.Join(c.dir, "kube-controller-manager"),
		"--leader-elect=false",
		// nodeipam would need a cluster CIDR and kwok assigns pod IPs itself; the ttl
		// controller fights kwok over the node TTL annotation. Keep nodelifecycle: it
		// lifts the not-ready taint from new nodes.
		"--controllers=*,-nodeipam,-ttl",
		// On a busy 2-core machine kwok's lease renewals can lag; a simulated node
		// should not be declared dead (and its pods unready) for that.
		"--node-monitor-grace-period=5m",
		"--service-account-private-key-file="+sec.saKey,
		"--root-ca-file="+sec.caCert,
		"--cluster-signing-cert-file="+sec.caCert,
		"--cluster-signing-key-file="+sec.caKey,
		"--profiling=false",
		workloadFeatureGates,
	)...); err != nil {
		return nil, err
	}
	if err := c.start(kubeSchedulerBinary, filepath.Join(binDir, kubeSchedulerBinary), append(kubeconfigFlags,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(c.ports.scheduler),
		"--cert-dir="+filepath.Join(c.dir, "kube-scheduler"),
		"--leader-elect=false",
		"--profiling=false",
		workloadFeatureGates,
	)...); err != nil {
		return nil, err
	}
	if err := c.start(kwokBinary, filepath.Join(binDir, kwokBinary),
		"--kubeconfig="+c.kubeconfig,
		"--config="+stageConfig,
		"--manage-nodes-with-annotation-selector="+KwokNodeAnnotation+"=fake",
		// kwok keeps a lease per node, as kubelets do, so the node lifecycle
		// controller sees them alive; the heartbeat-with-lease stage refreshes
		// the node status only every ten minutes. (kwok's own default applies only
		// with a kwok configuration file.)
		"--node-lease-duration-seconds=40",
		"--node-ip=127.0.0.1",
		"--cidr="+podCIDR,
	); err != nil {
		return nil, err
	}

	checkCtx, stopCheck := context.WithCancel(context.Background())
	c.mu.Lock()
	c.stopConfigCheck = stopCheck
	c.mu.Unlock()
	if err := c.startConfigCheck(checkCtx); err != nil {
		return nil, fmt.Errorf("starting the check of pods' Secrets and ConfigMaps: %w", err)
	}

	fmt.Fprintf(progress, "Creating %d simulated nodes\n", len(Nodes(pools)))
	var names []string
	for _, pool := range pools {
		created, err := c.createNodes(ctx, pool)
		if err != nil {
			return nil, err
		}
		names = append(names, created...)
	}
	if err := c.waitHTTP(ctx, kubeControllerManagerBinary, "https://127.0.0.1:"+strconv.Itoa(c.ports.controllerManager)+"/healthz", insecureLoopback); err != nil {
		return nil, err
	}
	if err := c.waitHTTP(ctx, kubeSchedulerBinary, "https://127.0.0.1:"+strconv.Itoa(c.ports.scheduler)+"/readyz", insecureLoopback); err != nil {
		return nil, err
	}
	fmt.Fprintln(progress, "Waiting for the default service account and for the nodes to be Ready")
	if err := c.poll(ctx, "the default service account", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return nil, err
	}
	if err := c.WaitNodesReady(ctx, names...); err != nil {
		return nil, err
	}
	if opts.ObjectStore != nil {
		if err := c.startObjectStore(ctx, opts); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Kubeconfig is the path of the admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// RESTConfig returns a new copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Client is a clientset with admin rights.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

// LogsDir holds one log file per component: etcd.log, kube-apiserver.log,
// kube-controller-manager.log, kube-scheduler.log and kwok.log.
func (c *Cluster) LogsDir() string { return c.logsDir }

// APIServerURL is the https URL of the API server on 127.0.0.1.
func (c *Cluster) APIServerURL() string { return c.restConfig.Host }

// Process is one running component of a cluster.
type Process struct {
	Name string `json:"name"` // component (and binary) name, e.g. kube-apiserver
	PID  int    `json:"pid"`  // process id, also its process group id
}

// Processes lists the components in start order.
func (c *Cluster) Processes() []Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Process, 0, len(c.procs))
	for _, p := range c.procs {
		out = append(out, Process{Name: p.name, PID: p.PID()})
	}
	return out
}

// Healthy returns an error, with the end of its log, for every component
// that has exited.
func (c *Cluster) Healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, p := range c.procs {
		if p.exited() {
			errs = append(errs, p.exitError())
		}
	}
	return errors.Join(errs...)
}

// Stop ends every process the cluster started (the whole process group of each,
// in reverse start order, SIGTERM then SIGKILL) and waits for them, then removes
// the cluster directory if Start created it. It may be called more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	if c.stopConfigCheck != nil {
		c.stopConfigCheck()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		fmt.Fprintf(c.progress, "Stopping %s (pid %d)\n", p.name, p.PID())
		p.stop(10 * time.Second)
	}
	if c.real.apiRelay != nil {
		c.real.apiRelay.close()
		c.real.apiRelay = nil
	}
	if err := c.tearDownRealNodes(); err != nil {
		return err // the directory stays: something may still be mounted in it
	}
	if c.removeDir {
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("removing the cluster directory: %w", err)
		}
	}
	return nil
}

// logTails returns the last n lines of every component's log, for an error
// message (the logs themselves go away with a temporary cluster directory).
func (c *Cluster) logTails(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := ""
	for _, p := range c.procs {
		out += fmt.Sprintf("\n--- end of %s ---\n%s", filepath.Base(p.logPath), tail(p.logPath, n))
	}
	return out
}

// start starts one component and records it.
func (c *Cluster) start(name, binary string, args ...string) error {
	return c.startEnv(name, binary, nil, args...)
}

// startEnv starts one component with env added to the environment (a later
// entry of a variable wins) and records it.
func (c *Cluster) startEnv(name, binary string, env []string, args ...string) error {
	fmt.Fprintf(c.progress, "Starting %s\n", name)
	p, err := startProcess(name, binary, args, env, c.logsDir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs = append(c.procs, p)
	if c.stopped { // Stop ran meanwhile
		p.stop(0)
		return errors.New("cluster stopped while starting")
	}
	return nil
}

// poll calls cond every 200ms until it returns true, it returns an error, a
// component exits, or ctx ends.
func (c *Cluster) poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	var lastErr error
	for {
		if err := c.Healthy(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), lastErr)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// insecureLoopback is for the health endpoints of the controller-manager and the
// scheduler on 127.0.0.1, which serve self-signed certificates they make
// themselves at start; nothing secret is sent.
var insecureLoopback = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // loopback health checks only

// waitHTTP waits until url answers 200.
func (c *Cluster) waitHTTP(ctx context.Context, what, url string, tlsConfig *tls.Config) error {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	defer client.CloseIdleConnections()
	return c.poll(ctx, what, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
		}
		return true, nil
	})
}

// waitAPIServerReady waits until /readyz is fully ok (RBAC bootstrap and the
// other post-start hooks included).
func (c *Cluster) waitAPIServerReady(ctx context.Context) error {
	return c.poll(ctx, kubeAPIServerBinary+" /readyz", func(ctx context.Context) (bool, error) {
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, fmt.Errorf("%w: %s", err, body)
		}
		return string(body) == "ok", nil
	})
}

// writeKubeconfig writes the admin kubeconfig.
func writeKubeconfig(path, serverURL string, sec *secrets) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[contextName] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: sec.caCertPEMBytes}
	cfg.AuthInfos[contextName] = &clientcmdapi.AuthInfo{Token: sec.adminToken}
	cfg.Contexts[contextName] = &clientcmdapi.Context{Cluster: contextName, AuthInfo: contextName}
	cfg.CurrentContext = contextName
	return clientcmd.WriteToFile(*cfg, path)
}

// nodeSchedulable reports whether node is Ready and free of the taints that the
// node lifecycle controller puts on nodes that are not (yet) ready.
func nodeSchedulable(node *corev1.Node) bool {
	ready := false
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	return ready && !node.Spec.Unschedulable
}
