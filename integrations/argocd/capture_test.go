package argocd

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/testutil"
)

// The testdata are objects the operator made, not written by hand: with
// CAPTURE=1 this test starts a real kube-apiserver and etcd (envtest), runs the
// real manager in a child process, drives objects into each state (pods and
// Deployment status written as the kubelet and the Deployment controller
// write them, as internal/controller/aiinference/integration does), takes the
// canary from state to state with the Lua actions themselves, applied as
// Argo CD applies them (a merge patch of the live object and the action's),
// and writes each object as the API server returns it, less managedFields:
//
//	CAPTURE=1 KUBEBUILDER_ASSETS=$(bash hack/tools/build.sh envtest) go test ./integrations/argocd/ -run TestCapture -count=1 -v
//
// The operator runs in a child process so that it can be stopped: a spec
// changed while it is down gives an object whose status is of an earlier
// generation (a new manager cannot be built twice in one process).

// captureNamespace holds every captured object, so that files stay the same
// from one capture to the next where the operator's output does.
const captureNamespace = "models"

const operatorKubeconfigEnv = "CAPTURE_OPERATOR_KUBECONFIG"

// TestOperatorProcess is the operator of a capture, run as a child process.
func TestOperatorProcess(t *testing.T) {
	path := os.Getenv(operatorKubeconfigEnv)
	if path == "" {
		t.Skip("the operator of TestCapture's child process")
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := manager.New(cfg, manager.Options{MetricsBindAddress: "0", HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// operator is the child process running the manager.
type operator struct {
	cmd *exec.Cmd
}

func startOperator(t *testing.T, kubeconfig, logPath string) *operator {
	t.Helper()
	logs, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOperatorProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), operatorKubeconfigEnv+"="+kubeconfig)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	op := &operator{cmd: cmd}
	t.Cleanup(op.stop)
	return op
}

func (o *operator) stop() {
	if o.cmd.ProcessState != nil {
		return
	}
	_ = o.cmd.Process.Signal(syscall.SIGTERM)
	_ = o.cmd.Wait()
}

// writeKubeconfig writes the admin configuration of envtest for the child.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// capturer drives objects and writes what it captures.
type capturer struct {
	t *testing.T
	g *WithT
	c client.Client
	// actionInputs are the files action_test.yaml reads, by state name.
	actionInputs map[string]bool
	// expected is health_test.yaml's health, by state name.
	expected map[string]healthStatus
	scripts  scripts
}

const waitTimeout = 30 * time.Second

func TestCapture(t *testing.T) {
	if os.Getenv("CAPTURE") != "1" {
		t.Skip("CAPTURE=1 captures testdata from the operator (see capture_test.go and docs/gitops.md)")
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	env, cfg, err := testutil.StartSuiteEnvtest()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := writeKubeconfig(t, cfg)
	logPath := filepath.Join(t.TempDir(), "operator.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("operator log:\n%s", b)
		}
	})

	cp := newCapturer(t, testutil.NewClient(t, cfg, manager.Scheme()))
	g, c, ctx := cp.g, cp.c, context.Background()
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: captureNamespace}})).To(Succeed())
	g.Expect(c.Create(ctx, testutil.S3Secret(captureNamespace, testutil.S3SecretName))).To(Succeed())

	// New: the operator has not seen it yet; the CRD defaults
	// status.observedGeneration to -1 until it has.
	llama := testutil.Inference(captureNamespace, "llama-chat", 1, "NVIDIA-H100-80GB-HBM3")
	g.Expect(c.Create(ctx, llama)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(llama), llama)).To(Succeed())
	g.Expect(llama.Status.ObservedGeneration).To(Equal(int64(-1)), "a new object reads status.observedGeneration -1")
	cp.capture(llama, "progressing_notObserved")

	op := startOperator(t, kubeconfig, logPath)

	// Loading, then Ready.
	pod := cp.podOf(llama.Name, llama.Name+"-pod", false)
	cp.setPodStatus(pod, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.LoaderContainerName,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
	cp.waitFor(llama, func(g Gomega, o *servingv1.AIInference) { g.Expect(readyReason(o)).To(Equal(servingv1.ReasonLoading)) })
	cp.capture(llama, "progressing_loading")
	summary, _ := json.Marshal(loadspec.Summary{Files: 4, Bytes: 16_000_000_000, BytesFetched: 16_000_000_000, Seconds: 20, ThroughputMBps: 800, Verified: true})
	cp.setPodStatus(pod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodRunning
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.LoaderContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Message: string(summary), StartedAt: metav1.NewTime(time.Now().Add(-20 * time.Second)), FinishedAt: metav1.Now()}}}}
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
	cp.setDeploymentStatus(llama.Name, 1, 1)
	cp.waitFor(llama, func(g Gomega, o *servingv1.AIInference) { g.Expect(o.Status.Phase).To(Equal(servingv1.PhaseReady)) })
	cp.capture(llama, "healthy_ready")

	// A claim that does not exist: Stalled.
	noClaim := testutil.Inference(captureNamespace, "from-claim", 1, "NVIDIA-H100-80GB-HBM3")
	noClaim.Spec.Model.Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "model-weights"}}
	g.Expect(c.Create(ctx, noClaim)).To(Succeed())
	cp.waitFor(noClaim, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(readyReason(o)).To(Equal(servingv1.ReasonPVCNotFound))
		g.Expect(meta.IsStatusConditionTrue(o.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
	})
	cp.capture(noClaim, "degraded_pvcNotFound")

	// A load that fails for good: Failed; retry asks for a fresh budget.
	corrupt := testutil.Inference(captureNamespace, "corrupt", 1, "NVIDIA-H100-80GB-HBM3")
	g.Expect(c.Create(ctx, corrupt)).To(Succeed())
	badPod := cp.podOf(corrupt.Name, corrupt.Name+"-pod", false)
	failure, _ := json.Marshal(loadspec.Summary{Failure: &loadspec.Failure{Reason: loadspec.ReasonChecksumMismatch,
		Message: "model-00001-of-00004.safetensors: sha256 mismatch"}})
	cp.setPodStatus(badPod, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		s.InitContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.LoaderContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: loadspec.ExitChecksum, Message: string(failure), StartedAt: metav1.NewTime(time.Now().Add(-time.Minute)), FinishedAt: metav1.Now()}}}}
	})
	cp.waitFor(corrupt, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(readyReason(o)).To(Equal(servingv1.ReasonLoadFailed))
	})
	cp.capture(corrupt, "degraded_loadFailed")
	at := cp.act(corrupt, "retry", servingv1.AnnotationRequestedAt)
	cp.waitFor(corrupt, func(g Gomega, o *servingv1.AIInference) { g.Expect(o.Status.LastHandledRequestedAt).To(Equal(at)) })

	// A canary: a pause until promoted, then an analysis against a Prometheus
	// that cannot be reached, which ends Inconclusive.
	canary := testutil.Inference(captureNamespace, "qwen-canary", 1, "NVIDIA-H100-80GB-HBM3")
	canary.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1, MaxSurge: ptr.To[int32](1), PrometheusURL: closedURL(t),
		Steps: []servingv1.CanaryStep{
			{Weight: 20, Pause: &servingv1.PauseStep{}},
			{Weight: 50, Analysis: &servingv1.AnalysisStep{
				Checks:   []servingv1.AnalysisCheck{{Name: "errors", Metric: servingv1.MetricErrorRatio, Max: "0.05"}},
				Interval: &metav1.Duration{Duration: 5 * time.Second}, Runs: 1, MinSamples: 1, InconclusiveLimit: 1}},
		},
	}}
	canary.Spec.Model.Size = ptr.To(resource.MustParse("4Gi"))
	g.Expect(c.Create(ctx, canary)).To(Succeed())
	cp.podOf(canary.Name, canary.Name+"-stable", true)
	cp.setDeploymentStatus(canary.Name, 1, 1)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) { g.Expect(o.Status.Phase).To(Equal(servingv1.PhaseReady)) })
	cp.update(canary, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len=8192"} })
	canaryDeployment := canary.Name + "-canary"
	g.Eventually(func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: captureNamespace, Name: canaryDeployment}, &appsv1.Deployment{})
	}).WithTimeout(waitTimeout).Should(Succeed())
	cp.podOf(canaryDeployment, canaryDeployment+"-pod", true)
	cp.setDeploymentStatus(canaryDeployment, 1, 1)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.Rollout).NotTo(BeNil())
		g.Expect(o.Status.Rollout.StepStartedAt).NotTo(BeNil())
		g.Expect(readyReason(o)).To(Equal(servingv1.ReasonCanaryPaused))
	})
	cp.capture(canary, "suspended_pauseStep")

	promoted := cp.act(canary, "promote", servingv1.AnnotationPromote)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.Rollout.LastHandledPromote).To(Equal(promoted))
		g.Expect(o.Status.Rollout.Step).To(Equal(int32(1)))
		g.Expect(o.Status.Rollout.Phase).To(Equal(servingv1.RolloutProgressing))
		g.Expect(readyReason(o)).To(Equal(servingv1.ReasonCanaryProgressing))
	})
	cp.capture(canary, "progressing_canaryStep")

	cp.act(canary, "pause", servingv1.AnnotationPaused)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.Rollout.Phase).To(Equal(servingv1.RolloutPaused))
	})
	cp.capture(canary, "suspended_pausedByHand")

	cp.act(canary, "resume", "")
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Annotations).NotTo(HaveKey(servingv1.AnnotationPaused))
		g.Expect(o.Status.Rollout.Phase).To(Equal(servingv1.RolloutInconclusive))
		g.Expect(meta.IsStatusConditionTrue(o.Status.Conditions, servingv1.ConditionStalled)).To(BeTrue())
	})
	cp.capture(canary, "suspended_inconclusive")

	aborted := cp.act(canary, "abort", servingv1.AnnotationAbort)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.Rollout.LastHandledAbort).To(Equal(aborted))
		g.Expect(o.Status.Rollout.Phase).To(Equal(servingv1.RolloutRolledBack))
		g.Expect(readyReason(o)).To(Equal(servingv1.ReasonRolledBack))
	})
	cp.capture(canary, "degraded_rolledBack")

	retried := cp.act(canary, "retry", servingv1.AnnotationRequestedAt)
	cp.waitFor(canary, func(g Gomega, o *servingv1.AIInference) {
		g.Expect(o.Status.LastHandledRequestedAt).To(Equal(retried))
		g.Expect(o.Status.Rollout.Phase).To(Equal(servingv1.RolloutProgressing), "the rolled-back revision runs as a canary again")
	})

	// The operator down and the spec changed: status is of generation 1.
	op.stop()
	cp.update(llama, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len=16384"} })
	got := &servingv1.AIInference{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(llama), got)).To(Succeed())
	g.Expect(got.Generation).To(Equal(int64(2)))
	g.Expect(got.Status.ObservedGeneration).To(Equal(int64(1)))
	g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionReady)).To(BeTrue(), "Ready=True of generation 1 is what a naive check reads as Healthy")
	cp.capture(llama, "progressing_generationBehind")

	cp.writeExpectedActionOutputs()
}

func newCapturer(t *testing.T, c client.Client) *capturer {
	cp := &capturer{t: t, g: NewWithT(t), c: c, actionInputs: map[string]bool{}, expected: map[string]healthStatus{}, scripts: builtIn(t)}
	var at actionTests
	readYAML(t, filepath.Join(CustomizationDir, "actions", "action_test.yaml"), &at)
	for _, d := range at.DiscoveryTests {
		cp.actionInputs[d.InputPath] = true
	}
	for _, a := range at.ActionTests {
		cp.actionInputs[a.InputPath] = true
	}
	var ht healthTests
	readYAML(t, filepath.Join(CustomizationDir, "health_test.yaml"), &ht)
	for _, h := range ht.Tests {
		cp.expected[h.InputPath] = h.HealthStatus
	}
	return cp
}

func readyReason(o *servingv1.AIInference) string {
	if c := meta.FindStatusCondition(o.Status.Conditions, servingv1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// closedURL is an http URL at which nothing listens.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr
}

func (cp *capturer) waitFor(obj *servingv1.AIInference, check func(g Gomega, o *servingv1.AIInference)) {
	cp.t.Helper()
	cp.g.Eventually(func(g Gomega) {
		o := &servingv1.AIInference{}
		g.Expect(cp.c.Get(context.Background(), client.ObjectKeyFromObject(obj), o)).To(Succeed())
		g.Expect(o.Status.ObservedGeneration).To(Equal(o.Generation))
		check(g, o)
	}).WithTimeout(waitTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
}

func (cp *capturer) update(obj *servingv1.AIInference, mutate func(*servingv1.AIInference)) {
	cp.g.Eventually(func() error {
		o := &servingv1.AIInference{}
		if err := cp.c.Get(context.Background(), client.ObjectKeyFromObject(obj), o); err != nil {
			return err
		}
		mutate(o)
		return cp.c.Update(context.Background(), o)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// podOf makes a pod of a Deployment's template bound to a node, ready or not.
func (cp *capturer) podOf(deployment, name string, ready bool) *corev1.Pod {
	cp.t.Helper()
	ctx := context.Background()
	d := &appsv1.Deployment{}
	cp.g.Eventually(func() error {
		return cp.c.Get(ctx, client.ObjectKey{Namespace: captureNamespace, Name: deployment}, d)
	}).WithTimeout(waitTimeout).Should(Succeed())
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: captureNamespace, Name: name, Labels: d.Spec.Template.Labels,
		Annotations: d.Spec.Template.Annotations}, Spec: d.Spec.Template.Spec}
	cp.g.Expect(cp.c.Create(ctx, pod)).To(Succeed())
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: captureNamespace, Name: name},
		Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-node-1"}}
	cp.g.Expect(cp.c.SubResource("binding").Create(ctx, pod, binding)).To(Succeed())
	if ready {
		cp.setPodStatus(pod, func(s *corev1.PodStatus) {
			s.Phase = corev1.PodRunning
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			s.ContainerStatuses = []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
		})
	}
	return pod
}

func (cp *capturer) setPodStatus(pod *corev1.Pod, mutate func(*corev1.PodStatus)) {
	cp.g.Eventually(func() error {
		if err := cp.c.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		mutate(&pod.Status)
		return cp.c.Status().Update(context.Background(), pod)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// setDeploymentStatus writes a Deployment's status as its controller does.
func (cp *capturer) setDeploymentStatus(name string, replicas, ready int32) {
	cp.g.Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := cp.c.Get(context.Background(), client.ObjectKey{Namespace: captureNamespace, Name: name}, d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas,
			ReadyReplicas: ready, AvailableReplicas: ready}
		return cp.c.Status().Update(context.Background(), d)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// live is the object as the API server returns it, less managedFields.
func (cp *capturer) live(obj *servingv1.AIInference) map[string]any {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(servingv1.GroupVersion.WithKind("AIInference"))
	cp.g.Expect(cp.c.Get(context.Background(), client.ObjectKeyFromObject(obj), u)).To(Succeed())
	u.SetManagedFields(nil)
	return u.Object
}

// capture writes the object into testdata (and the actions' testdata when
// action_test.yaml reads it there), after checking the health check gives
// health_test.yaml's status for it.
func (cp *capturer) capture(obj *servingv1.AIInference, state string) {
	cp.t.Helper()
	o := cp.live(obj)
	rel := "testdata/" + state + ".yaml"
	hs, err := health(o, cp.scripts.health, false)
	cp.g.Expect(err).NotTo(HaveOccurred())
	cp.t.Logf("%s: %s %q", state, hs.Status, hs.Message)
	if want, ok := cp.expected[rel]; ok && hs.Status != want.Status {
		cp.t.Errorf("%s: health %s, want %s", state, hs.Status, want.Status)
	}
	b, err := yaml.Marshal(o)
	cp.g.Expect(err).NotTo(HaveOccurred())
	cp.g.Expect(os.WriteFile(filepath.Join(CustomizationDir, rel), b, 0o644)).To(Succeed())
	if cp.actionInputs[rel] {
		cp.g.Expect(os.WriteFile(filepath.Join(CustomizationDir, "actions", rel), b, 0o644)).To(Succeed())
	}
}

// act runs an action on the live object as Argo CD does: discovery must offer
// it, the script runs in the sandbox, and the merge patch from the live object
// to the script's, which may touch only annotations, is applied. It returns
// the value the action gave the annotation (if any).
func (cp *capturer) act(obj *servingv1.AIInference, action, annotation string) string {
	cp.t.Helper()
	live := cp.live(obj)
	offered, err := discover(live, cp.scripts.discovery)
	cp.g.Expect(err).NotTo(HaveOccurred())
	cp.g.Expect(offered).To(HaveKey(action))
	cp.g.Expect(offered[action].Disabled).To(BeFalse(), "%s is disabled on %s", action, obj.Name)
	changed, err := act(cp.live(obj), cp.scripts.actions[action])
	cp.g.Expect(err).NotTo(HaveOccurred())
	expectOnlyAnnotationsChange(cp.t, live, changed)
	a, _ := json.Marshal(live)
	b, _ := json.Marshal(changed)
	patch, err := jsonpatch.CreateMergePatch(a, b)
	cp.g.Expect(err).NotTo(HaveOccurred())
	cp.t.Logf("%s on %s: merge patch %s", action, obj.Name, patch)
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(servingv1.GroupVersion.WithKind("AIInference"))
	u.SetNamespace(obj.Namespace)
	u.SetName(obj.Name)
	cp.g.Expect(cp.c.Patch(context.Background(), u, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
	if annotation == "" {
		return ""
	}
	return u.GetAnnotations()[annotation]
}

// writeExpectedActionOutputs writes what each action case of
// action_test.yaml must return: its input with the annotation the operator
// reads (api/v1's constants) set or removed; a stamped value reads Placeholder.
func (cp *capturer) writeExpectedActionOutputs() {
	var at actionTests
	dir := filepath.Join(CustomizationDir, "actions")
	readYAML(cp.t, filepath.Join(dir, "action_test.yaml"), &at)
	for _, tc := range at.ActionTests {
		obj := loadObject(cp.t, filepath.Join(dir, tc.InputPath))
		u := &unstructured.Unstructured{Object: obj}
		annotations := u.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		switch tc.Action {
		case "promote":
			annotations[servingv1.AnnotationPromote] = Placeholder
		case "abort":
			annotations[servingv1.AnnotationAbort] = Placeholder
		case "retry":
			annotations[servingv1.AnnotationRequestedAt] = Placeholder
		case "pause":
			annotations[servingv1.AnnotationPaused] = "true"
		case "resume":
			delete(annotations, servingv1.AnnotationPaused)
		default:
			cp.t.Fatalf("no expected output for action %s", tc.Action)
		}
		u.SetAnnotations(annotations)
		if len(annotations) == 0 {
			unstructured.RemoveNestedField(u.Object, "metadata", "annotations")
		}
		b, err := yaml.Marshal(u.Object)
		cp.g.Expect(err).NotTo(HaveOccurred())
		cp.g.Expect(os.WriteFile(filepath.Join(dir, tc.ExpectedOutputPath), b, 0o644)).To(Succeed())
	}
	cp.t.Logf("wrote %d expected action outputs; compare health_test.yaml's messages with the log above", len(at.ActionTests))
}
