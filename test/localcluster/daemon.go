package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/nodecachespec"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// A detached cluster outlives the command that started it: `localcluster up`
// starts a supervisor process in a session of its own, which runs the cluster and
// records it in a state directory; `localcluster down` stops it by the recorded
// process ids. The state directory holds:
//
//	state.json      the State of the running cluster
//	supervisor.log  the supervisor's output
//	cluster/        the cluster's directory (kubeconfig, logs/, etcd data, keys)
//	lock            serialises up and down
const (
	stateFile         = "state.json"
	supervisorLogFile = "supervisor.log"
	clusterSubdir     = "cluster"
	lockFile          = "lock"
)

// State describes a detached cluster.
type State struct {
	// SupervisorPID is the process that holds the cluster; its executable's base
	// name is SupervisorExe.
	SupervisorPID int    `json:"supervisorPID"`
	SupervisorExe string `json:"supervisorExe"`
	// Ready is false while the cluster is starting.
	Ready bool `json:"ready"`
	// Kubeconfig is the admin kubeconfig's path; LogsDir holds the components' logs.
	Kubeconfig string    `json:"kubeconfig,omitempty"`
	LogsDir    string    `json:"logsDir,omitempty"`
	APIServer  string    `json:"apiServer,omitempty"`
	Processes  []Process `json:"processes,omitempty"`
	// RealNodeHost is what the real nodes changed on the host, for down to undo
	// when the supervisor could not.
	RealNodeHost *RealNodeHost `json:"realNodeHost,omitempty"`
	// Images are the image archives imported into the real nodes.
	Images []ImageArchive `json:"images,omitempty"`
	// ObjectStore is the cluster's object store, if it has one.
	ObjectStore *ObjectStore `json:"objectStore,omitempty"`
	// Gateway is the cluster's gateway (Traefik), if it runs one.
	Gateway   *Gateway  `json:"gateway,omitempty"`
	StartedAt time.Time `json:"startedAt"`
}

// DefaultStateDir is where the command keeps a detached cluster:
// $AIINFERENCE_CACHE/localcluster, by default ~/.cache/aiinference-operator/localcluster
// (the cache root of hack/tools/build.sh).
func DefaultStateDir() string {
	root := os.Getenv("AIINFERENCE_CACHE")
	if root == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		root = filepath.Join(cache, "aiinference-operator")
	}
	return filepath.Join(root, "localcluster")
}

// ReadState reads the state of the detached cluster in stateDir; nil when there is none.
func ReadState(stateDir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(stateDir, stateFile), err)
	}
	return &s, nil
}

func writeState(stateDir string, s *State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(stateDir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(stateDir, stateFile))
}

// Running reports whether the supervisor of s is alive.
func (s *State) Running() bool {
	return s != nil && processIs(s.SupervisorPID, s.SupervisorExe)
}

// lockStateDir takes an exclusive lock on stateDir (created if needed) until the
// returned function is called.
func lockStateDir(stateDir string) (func(), error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(stateDir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// UpOptions configure Up.
type UpOptions struct {
	StateDir string
	// NodesFile is a node pool description; empty: DefaultNodePools.
	NodesFile string
	// KubeletDelayScale is Options.KubeletDelayScale.
	KubeletDelayScale float64
	// ObjectStoreModelBytes, when positive, starts an object store seeded with a
	// model of that size (Options.ObjectStore).
	ObjectStoreModelBytes int64
	// Gateway runs the cluster's gateway (StartGateway: Traefik on the host).
	Gateway bool
	// NetworkPolicy enforces NetworkPolicies on the real nodes
	// (StartNetworkPolicy: kube-router's firewall on the host).
	NetworkPolicy bool
	// ModelCacheBudget, when set, runs the node-local model cache's plugin on
	// the real nodes with this budget per node, a quantity (StartModelCache).
	ModelCacheBudget string
	// RepoRoot is the repository checkout; empty: found from the working directory.
	RepoRoot string
	// Timeout bounds the wait for the cluster once the binaries are built. Zero: 5 minutes.
	Timeout time.Duration
	// Out receives progress and the final instructions.
	Out io.Writer
}

// Up starts a detached cluster, unless one is already running in the state
// directory, and returns its state once it is usable. The binaries are built (or
// found in the cache) first, in the foreground. The supervisor is this very
// executable, run as `<exe> supervise --state-dir DIR ...` in a new session;
// the command must therefore call RunSupervisor for that argument.
func Up(ctx context.Context, opts UpOptions) (*State, error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	unlock, err := lockStateDir(opts.StateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if s, err := ReadState(opts.StateDir); err != nil {
		return nil, err
	} else if s.Running() && s.Ready {
		fmt.Fprintf(out, "The local cluster is already running (supervisor pid %d)\n", s.SupervisorPID)
		return s, nil
	} else if s != nil {
		fmt.Fprintln(out, "Cleaning up a local cluster that did not stop cleanly")
		cleanup(opts.StateDir, s, out)
	}
	if err := os.RemoveAll(filepath.Join(opts.StateDir, clusterSubdir)); err != nil {
		return nil, err
	}

	var pools []NodePool
	if opts.NodesFile != "" {
		if pools, err = LoadNodePools(opts.NodesFile); err != nil {
			return nil, err
		}
	}
	if err := checkDelayScale(opts.KubeletDelayScale); err != nil {
		return nil, err
	}
	root := opts.RepoRoot
	if root == "" {
		if root, err = FindRepoRoot("."); err != nil {
			return nil, err
		}
	}
	binDir, err := BuildBinaries(ctx, root, out)
	if err != nil {
		return nil, err
	}
	stageDir, err := KwokStageDir(ctx, root)
	if err != nil {
		return nil, err
	}
	real, err := prepareRealNodes(ctx, Options{RepoRoot: root}, pools, out)
	if err != nil {
		return nil, err
	}
	if opts.ModelCacheBudget != "" && real.BinDir == "" {
		return nil, errors.New("--model-cache runs on real nodes, and the node pool has none (a pool with real: true, as config/localcluster/demo-nodepool.yaml)")
	}

	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"supervise", "--state-dir", opts.StateDir, "--bin-dir", binDir, "--kwok-stage-dir", stageDir,
		"--kubelet-delay-scale", strconv.FormatFloat(opts.KubeletDelayScale, 'g', -1, 64)}
	if opts.NodesFile != "" {
		nodes, err := filepath.Abs(opts.NodesFile)
		if err != nil {
			return nil, err
		}
		args = append(args, "--nodes", nodes)
	}
	if real.BinDir != "" {
		args = append(args, "--real-node-bin-dir", real.BinDir, "--image-dir", real.ImageDir)
	}
	if opts.ObjectStoreModelBytes > 0 {
		store, err := prepareObjectStore(ctx, Options{RepoRoot: root, ObjectStore: &ObjectStoreOptions{}}, out)
		if err != nil {
			return nil, err
		}
		args = append(args, "--object-store-model-bytes", strconv.FormatInt(opts.ObjectStoreModelBytes, 10),
			"--object-store-bin-dir", store.BinDir, "--object-store-gguf-dir", store.GGUFDir)
	}
	if opts.Gateway {
		fmt.Fprintln(out, "Finding or building traefik (hack/tools/build.sh traefik)")
		dir, err := runBuildScript(ctx, root, "traefik", out)
		if err != nil {
			return nil, err
		}
		args = append(args, "--gateway", "--gateway-bin-dir", dir, "--repo-root", root)
	}
	if opts.NetworkPolicy {
		fmt.Fprintln(out, "Finding or building kube-router (hack/tools/build.sh netpol)")
		dir, err := runBuildScript(ctx, root, "netpol", out)
		if err != nil {
			return nil, err
		}
		args = append(args, "--network-policy", "--network-policy-bin-dir", dir, "--repo-root", root)
	}
	if opts.ModelCacheBudget != "" {
		if _, err := nodecachespec.ParseBudget(opts.ModelCacheBudget); err != nil {
			return nil, fmt.Errorf("--model-cache: %w", err)
		}
		fmt.Fprintln(out, "Building the node cache's plugin (model-loader) for the host")
		binary := filepath.Join(opts.StateDir, "bin", "model-loader")
		build := exec.CommandContext(ctx, "go", "build", "-o", binary, "./cmd/model-loader")
		build.Dir = root
		if output, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building the model loader: %w: %s", err, output)
		}
		args = append(args, "--model-cache", opts.ModelCacheBudget, "--model-cache-binary", binary)
	}
	logPath := filepath.Join(opts.StateDir, supervisorLogFile)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = "/"
	// A session of its own: no terminal signals, and it outlives this command.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	fmt.Fprintln(out, "Starting the local cluster")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	deadline := time.After(timeout)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("the local cluster did not start (%v); end of %s:\n%s", err, logPath, tail(logPath, 40))
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return nil, ctx.Err()
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return nil, fmt.Errorf("the local cluster was not ready within %s; end of %s:\n%s", timeout, logPath, tail(logPath, 40))
		case <-time.After(200 * time.Millisecond):
		}
		s, err := ReadState(opts.StateDir)
		if err == nil && s != nil && s.Ready && s.SupervisorPID == cmd.Process.Pid {
			// Leave the supervisor running; its exit is no longer ours to wait for.
			_ = cmd.Process.Release()
			return s, nil
		}
	}
}

// Down stops the detached cluster in stateDir and removes its files. It
// succeeds when nothing is running.
func Down(stateDir string, out io.Writer) error {
	if out == nil {
		out = io.Discard
	}
	unlock, err := lockStateDir(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := ReadState(stateDir)
	if err != nil {
		return err
	}
	if s == nil {
		fmt.Fprintln(out, "The local cluster is not running")
		return os.RemoveAll(filepath.Join(stateDir, clusterSubdir))
	}
	cleanup(stateDir, s, out)
	fmt.Fprintln(out, "The local cluster is stopped")
	return nil
}

// cleanup ends the supervisor of s and every component it recorded, then
// removes the cluster directory and the state file.
func cleanup(stateDir string, s *State, out io.Writer) {
	if s.Running() {
		fmt.Fprintf(out, "Stopping the supervisor (pid %d)\n", s.SupervisorPID)
		// The supervisor stops the components itself on SIGTERM.
		_ = syscall.Kill(s.SupervisorPID, syscall.SIGTERM)
		if !waitExited(s.SupervisorPID, s.SupervisorExe, 60*time.Second) {
			_ = syscall.Kill(s.SupervisorPID, syscall.SIGKILL)
			waitExited(s.SupervisorPID, s.SupervisorExe, 5*time.Second)
		}
	}
	// Whatever the supervisor left behind (it was killed, or it crashed).
	for _, p := range s.Processes {
		if KillProcessGroup(p.PID, p.Name, 5*time.Second) {
			fmt.Fprintf(out, "Stopped %s (pid %d)\n", p.Name, p.PID)
		}
	}
	if s.RealNodeHost != nil {
		if err := TearDownRealNodeHost(*s.RealNodeHost, out); err != nil {
			// The files stay, for the next down to try again: something may
			// still be mounted in the cluster folder.
			fmt.Fprintln(out, err)
			return
		}
	}
	_ = os.RemoveAll(filepath.Join(stateDir, clusterSubdir))
	_ = os.Remove(filepath.Join(stateDir, stateFile))
}

// SupervisorOptions configure RunSupervisor.
type SupervisorOptions struct {
	StateDir     string
	BinDir       string
	KwokStageDir string
	NodesFile    string // empty: DefaultNodePools
	RealNodes    RealNodeOptions
	// KubeletDelayScale is Options.KubeletDelayScale.
	KubeletDelayScale float64
	// ObjectStore is Options.ObjectStore.
	ObjectStore *ObjectStoreOptions
	// Gateway, when set, starts the cluster's gateway with these options.
	Gateway *GatewayOptions
	// NetworkPolicy, when set, starts the real nodes' NetworkPolicy
	// enforcement with these options.
	NetworkPolicy *NetworkPolicyOptions
	// ModelCache, when set, starts the node-local model cache on the real
	// nodes with these options.
	ModelCache *ModelCacheOptions
}

// RunSupervisor runs a cluster until SIGTERM or SIGINT, recording it in the
// state directory: the `supervise` step of Up, in the detached process.
func RunSupervisor(opts SupervisorOptions) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// Base name of the path as started, as /proc/PID/cmdline shows it to Running.
	state := &State{SupervisorPID: os.Getpid(), SupervisorExe: filepath.Base(os.Args[0]), StartedAt: time.Now()}
	if err := writeState(opts.StateDir, state); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(opts.StateDir, stateFile))

	var pools []NodePool
	var err error
	if opts.NodesFile != "" {
		if pools, err = LoadNodePools(opts.NodesFile); err != nil {
			return err
		}
	}
	c, err := Start(ctx, Options{
		BinDir:            opts.BinDir,
		KwokStageDir:      opts.KwokStageDir,
		NodePools:         pools,
		RealNodes:         opts.RealNodes,
		Dir:               filepath.Join(opts.StateDir, clusterSubdir),
		Progress:          os.Stdout,
		KubeletDelayScale: opts.KubeletDelayScale,
		ObjectStore:       opts.ObjectStore,
	})
	if err != nil {
		return err
	}
	defer c.Stop() //nolint:errcheck // best effort on the way out
	state.Ready = true
	state.Kubeconfig = c.Kubeconfig()
	state.LogsDir = c.LogsDir()
	state.APIServer = c.APIServerURL()
	state.Processes = c.Processes()
	if opts.NetworkPolicy != nil {
		if _, err := c.StartNetworkPolicy(ctx, *opts.NetworkPolicy); err != nil {
			return err
		}
	}
	if opts.ModelCache != nil {
		if _, err := c.StartModelCache(ctx, *opts.ModelCache); err != nil {
			return err
		}
		state.Processes = c.Processes()
	}
	if host := c.RealNodeHost(); len(host.Nodes) > 0 {
		state.RealNodeHost = &host
	}
	state.Images = c.Images()
	state.ObjectStore = c.ObjectStore()
	if opts.Gateway != nil {
		if state.Gateway, err = c.StartGateway(ctx, *opts.Gateway); err != nil {
			return err
		}
		state.Processes = c.Processes()
	}
	if err := writeState(opts.StateDir, state); err != nil {
		return err
	}

	ticker := time.NewTicker(5 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println("Stopping the local cluster")
			if err := c.Stop(); err != nil {
				return err
			}
			return os.RemoveAll(c.Dir())
		case <-ticker.C:
			if err := c.Healthy(); err != nil {
				// A cluster without one of its parts is not usable: stop the rest, so
				// that status tells the truth. The logs stay for a look until the
				// next up or down.
				return fmt.Errorf("a component of the local cluster exited; stopping the rest: %w", err)
			}
		}
	}
}

// Status writes what runs in stateDir to out: the processes, the kubeconfig,
// whether the API server is ready and how many nodes are Ready. It reports
// whether the cluster is running and ready.
func Status(ctx context.Context, stateDir string, out io.Writer) (bool, error) {
	s, err := ReadState(stateDir)
	if err != nil {
		return false, err
	}
	if !s.Running() {
		fmt.Fprintln(out, "The local cluster is not running")
		return false, nil
	}
	if !s.Ready {
		fmt.Fprintf(out, "The local cluster is starting (supervisor pid %d; log: %s)\n",
			s.SupervisorPID, filepath.Join(stateDir, supervisorLogFile))
		return false, nil
	}
	fmt.Fprintf(out, "The local cluster is running since %s\n", s.StartedAt.Format(time.RFC3339))
	fmt.Fprintf(out, "  supervisor               pid %d\n", s.SupervisorPID)
	healthy := true
	for _, p := range s.Processes {
		alive := "running"
		if !processIs(p.PID, p.Name) {
			alive, healthy = "NOT RUNNING", false
		}
		fmt.Fprintf(out, "  %-24s pid %d %s\n", p.Name, p.PID, alive)
	}
	fmt.Fprintf(out, "API server:  %s\nKubeconfig:  %s\nLogs:        %s\n", s.APIServer, s.Kubeconfig, s.LogsDir)

	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return false, err
	}
	cfg.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		fmt.Fprintf(out, "API server not ready: %v %s\n", err, body)
		return false, nil
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(out, "Listing nodes: %v\n", err)
		return false, nil
	}
	ready := 0
	for i := range nodes.Items {
		if nodeSchedulable(&nodes.Items[i]) {
			ready++
		}
	}
	fmt.Fprintf(out, "Nodes:       %d of %d Ready\n", ready, len(nodes.Items))
	return healthy, nil
}
