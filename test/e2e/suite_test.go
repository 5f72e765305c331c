// Package e2e runs the operator as a process against a local cluster: a real
// kube-apiserver, etcd, kube-scheduler and kube-controller-manager, with kwok
// simulating the kubelets of GPU nodes.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	sigsyaml "sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/localcluster"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/internal/testutil"
)

var (
	cluster *localcluster.Cluster
	k8s     client.Client
	op      *operatorProcess
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	root, err := testutil.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	workDir, err := os.MkdirTemp("", "aiinference-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)

	started := time.Now()
	// Simulated kubelets ten times faster than real ones: a pod starts in 0.4-2 s
	// rather than 4-20 s, a crash loop backs off 1 s, 2 s, 4 s...
	opts := localcluster.Options{RepoRoot: root, Progress: os.Stderr, KubeletDelayScale: 0.1}
	if realNodeAsked() {
		if err := localcluster.CheckRealNodeHost(); err != nil {
			fmt.Fprintf(os.Stderr, "%s=1 asks for the real-node tests, and this host cannot run a real node: %v\n", realNodeEnv, err)
			return 1
		}
		// One real node, with a GPU product no simulated node has, so that only the
		// real-node tests land there; and a store its pods load from.
		opts.NodePools = append(localcluster.DefaultNodePools(),
			localcluster.NodePool{Name: "real", Count: 1, Real: true, GPUProduct: realGPUProduct, GPUCount: 4})
		opts.ObjectStore = &localcluster.ObjectStoreOptions{ModelBytes: 48 << 20}
	}
	cluster, err = localcluster.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the local cluster:", err)
		return 1
	}
	defer func() { _ = cluster.Stop() }()
	fmt.Fprintf(os.Stderr, "Local cluster usable after %s\n", time.Since(started).Round(time.Millisecond))

	scheme := manager.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8s, err = client.New(cluster.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := testutil.InstallCRD(ctx, k8s, filepath.Join(root, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml")); err != nil {
		fmt.Fprintln(os.Stderr, "installing the CRD:", err)
		return 1
	}

	bin := filepath.Join(workDir, "manager")
	build := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the operator:", err)
		return 1
	}
	// Simulated kubelets run no image; real nodes run the loader built here.
	loaderImage := "example.test/model-loader:e2e"
	if realNodeAsked() {
		image, err := localcluster.FindImage(cluster.Images(), localcluster.ModelLoaderImage)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		loaderImage = image.Ref
	}
	op = &operatorProcess{bin: bin, kubeconfig: cluster.Kubeconfig(), logPath: filepath.Join(workDir, "operator.log"), loaderImage: loaderImage}
	if err := op.start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer op.stop()
	return m.Run()
}

// operatorProcess is the operator binary running against the local cluster, as a
// user would run it with `make run`.
type operatorProcess struct {
	bin, kubeconfig, logPath, loaderImage string
	extraArgs                             []string // after the usual ones, so they win
	cmd                                   *exec.Cmd
	logFile                               *os.File
}

func (o *operatorProcess) start() error {
	logFile, err := os.OpenFile(o.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	cmd := exec.Command(o.bin, "--leader-elect", "--leader-election-namespace=default",
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", port),
		"--loader-image="+o.loaderImage)
	cmd.Args = append(cmd.Args, o.extraArgs...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+o.kubeconfig)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting the operator: %w", err)
	}
	o.cmd, o.logFile = cmd, logFile
	return nil
}

// kill ends the operator at once, as a crash or an OOM kill would: no clean
// hand-over of the leader lease.
func (o *operatorProcess) kill() {
	if o.cmd == nil {
		return
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
	_ = o.cmd.Wait()
	o.logFile.Close()
	o.cmd = nil
}

func (o *operatorProcess) stop() {
	if o.cmd == nil {
		return
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = o.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	o.logFile.Close()
	o.cmd = nil
}

func (o *operatorProcess) logTail(lines int) string {
	f, err := os.Open(o.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var all []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		all = append(all, scanner.Text())
	}
	return strings.Join(all[max(len(all)-lines, 0):], "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// newNamespace gives a test its own namespace; on failure it dumps what is in it,
// the events and the operator's log.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, ns.Name)
		}
		deleteAll(t, ns.Name)
	})
	return ns.Name
}

// deleteAll removes the test's AIInferences and waits for their pods to go, so the
// next test finds every GPU free.
func deleteAll(t *testing.T, ns string) {
	ctx := context.Background()
	begin := time.Now()
	defer func() { t.Logf("namespace %s emptied in %s", ns, time.Since(begin).Round(100*time.Millisecond)) }()
	_ = k8s.DeleteAllOf(ctx, &servingv1.AIInference{}, client.InNamespace(ns))
	// The garbage collector would remove the children, but only once it watches
	// the CRD, which takes it up to 30 s (TestScaleRollAndDelete checks it does).
	_ = k8s.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns), client.PropagationPolicy(metav1.DeletePropagationBackground))
	_ = k8s.DeleteAllOf(ctx, &appsv1.ReplicaSet{}, client.InNamespace(ns), client.PropagationPolicy(metav1.DeletePropagationBackground))
	_ = k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns))
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(ns)); err == nil && len(pods.Items) == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	_ = k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

func dump(t *testing.T, ns string) {
	ctx := context.Background()
	var out strings.Builder
	for _, list := range []client.ObjectList{&servingv1.AIInferenceList{}, &appsv1.DeploymentList{}, &corev1.PodList{}, &corev1.EventList{}} {
		if err := k8s.List(ctx, list, client.InNamespace(ns)); err != nil {
			fmt.Fprintf(&out, "listing %T: %v\n", list, err)
			continue
		}
		items, _ := meta.ExtractList(list)
		for _, item := range items {
			obj := item.(client.Object)
			obj.SetManagedFields(nil)
			y, _ := sigsyaml.Marshal(obj)
			fmt.Fprintf(&out, "---\n# %T %s\n%s", obj, obj.GetName(), y)
		}
	}
	t.Logf("Objects and events in namespace %s:\n%s", ns, out.String())
	t.Logf("Operator log (last 150 lines):\n%s", op.logTail(150))
}
