package kubectlaii

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/test/testutil"
)

// The plugin reads only what the API server holds, so these tests run it against
// a real kube-apiserver (envtest) holding objects and statuses written by the
// test, as the operator, the scheduler and the kubelet would have written them.
var (
	k8s        client.Client
	kubeconfig string
	// viewerKubeconfig is a user's who may read the AIInferences and their
	// pods, Deployments, nodes and events, and no ConfigMap.
	viewerKubeconfig string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	env, cfg, err := testutil.StartSuiteEnvtest()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	// The plugin's scheme, and CRDs for the tests that install one.
	testScheme := scheme()
	if err := apiextensionsv1.AddToScheme(testScheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	data, err := user.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "kubectl-aii")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if viewerKubeconfig, err = addViewer(env, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// addViewer adds the user of viewerKubeconfig, bound to a ClusterRole that
// reads what kubectl aii reads except ConfigMaps.
func addViewer(env *envtest.Environment, dir string) (string, error) {
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "aii-viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{servingv1.GroupVersion.Group}, Resources: []string{"aiinferences"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"", "apps", "events.k8s.io"}, Resources: []string{"pods", "nodes", "events", "deployments"}, Verbs: []string{"get", "list"}},
	}}
	if err := k8s.Create(ctx, role); err != nil {
		return "", err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "aii-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "viewer"}}}
	if err := k8s.Create(ctx, binding); err != nil {
		return "", err
	}
	user, err := env.AddUser(envtest.User{Name: "viewer"}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "viewer-kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// aii runs the plugin as `kubectl aii ARGS... --kubeconfig K`.
func aii(t *testing.T, args ...string) string {
	t.Helper()
	out, err := aiiAs(t, kubeconfig, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// aiiAs runs the plugin with the user of config.
func aiiAs(t *testing.T, config string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", config))
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		return "", fmt.Errorf("kubectl aii %v: %w\n%s", args, err, errOut.String())
	}
	t.Logf("$ kubectl aii %s\n%s", strings.Join(args, " "), out.String())
	return out.String(), nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func namespace(t *testing.T, name string) string {
	must(t, k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

func inference(ns, name string) *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{Name: "llama-3.1-8b", Size: ptr.To(resource.MustParse("16Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "llama/", Endpoint: "http://minio.storage:9000",
					CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: "s3-creds"}}}},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: 2, Products: []string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}},
			Replicas: ptr.To[int32](1),
		},
	}
}

// setup creates the AIInference with the status the operator would have written,
// its Deployment of template hash "h1", and its pods with the given statuses.
func setup(t *testing.T, obj *servingv1.AIInference, status servingv1.AIInferenceStatus, pods ...*corev1.Pod) {
	t.Helper()
	createWithStatus(t, obj, status)
	labels := map[string]string{servingv1.LabelInference: obj.Name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: obj.Namespace, Name: obj.Name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{servingv1.AnnotationTemplateHash: "h1"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
		}},
	}
	must(t, ctrlRef(obj, d))
	must(t, k8s.Create(context.Background(), d))
	for _, p := range pods {
		p.Labels = labels
		createPod(t, obj, p)
	}
}

// createWithStatus creates the AIInference with the status the operator would
// have written.
func createWithStatus(t *testing.T, obj *servingv1.AIInference, status servingv1.AIInferenceStatus) {
	t.Helper()
	ctx := context.Background()
	must(t, k8s.Create(ctx, obj))
	status.ObservedGeneration = obj.Generation
	for i := range status.Conditions {
		status.Conditions[i].ObservedGeneration = obj.Generation
		if status.Conditions[i].LastTransitionTime.IsZero() {
			status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Now().Add(-2 * time.Minute))
		}
	}
	obj.Status = status
	must(t, k8s.Status().Update(ctx, obj))
}

// createPod creates a pod of obj's template hash "h1" with its status.
func createPod(t *testing.T, obj *servingv1.AIInference, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	st := p.Status
	p.Namespace = obj.Namespace
	p.Annotations = map[string]string{servingv1.AnnotationTemplateHash: "h1"}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "engine", Image: "vllm", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{servingv1.GPUResource: resource.MustParse("2")}, Limits: corev1.ResourceList{servingv1.GPUResource: resource.MustParse("2")}}}}
		p.Spec.InitContainers = []corev1.Container{{Name: "model-loader", Image: "loader"}}
	}
	must(t, k8s.Create(ctx, p))
	p.Status = st
	must(t, k8s.Status().Update(ctx, p))
}

func ctrlRef(owner *servingv1.AIInference, obj client.Object) error {
	obj.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: servingv1.GroupVersion.String(), Kind: "AIInference",
		Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}})
	return nil
}

func gpuNode(t *testing.T, name, product string, gpus int64) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{servingv1.GPUProductLabel: product}}}
	must(t, k8s.Create(context.Background(), n))
	n.Status.Allocatable = corev1.ResourceList{servingv1.GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	n.Status.Capacity = n.Status.Allocatable
	must(t, k8s.Status().Update(context.Background(), n))
}

func ready(reason, message string) []metav1.Condition {
	return []metav1.Condition{{Type: servingv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message}}
}

func expectAll(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func TestLoading(t *testing.T) {
	ns := namespace(t, "aii-loading")
	gpuNode(t, "gpu-a100-0", "NVIDIA-A100-SXM4-80GB", 8)
	started := metav1.NewTime(time.Now().Add(-10 * time.Minute))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm-7d9f-abcde"}, Spec: corev1.PodSpec{NodeName: "gpu-a100-0"},
		Status: corev1.PodStatus{Phase: corev1.PodPending,
			Conditions:            []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "model-loader", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}},
			ContainerStatuses:     []corev1.ContainerStatus{{Name: "engine", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}},
		}}
	setup(t, inference(ns, "llm"), servingv1.AIInferenceStatus{Phase: servingv1.PhaseLoading, Ready: "0/1", GPU: "2x NVIDIA-H100-80GB-HBM3 (+1)",
		Conditions: ready(servingv1.ReasonLoading, "0 of 1 replicas run the current spec and are ready; pod llm-7d9f-abcde is loading the model")}, pod)

	out := aii(t, "status", "llm", "-n", ns)
	expectAll(t, out, "AIInference aii-loading/llm: Loading, 0/1 ready", "llm-7d9f-abcde", "gpu-a100-0", "NVIDIA-A100-SXM4-80GB", "loading for 10m", "PodInitializing", "Last load: none yet")

	out = aii(t, "why", "llm", "-n", ns)
	expectAll(t, out, "reason Loading", "└─ Pod llm-7d9f-abcde: Pending, on node gpu-a100-0 (NVIDIA-A100-SXM4-80GB)", "└─ Container model-loader: loading for 10m", "What to do:")

	var report map[string]any
	must(t, json.Unmarshal([]byte(aii(t, "status", "llm", "-n", ns, "-o", "json")), &report))
	if report["apiVersion"] != ReportAPIVersion || report["kind"] != "AIInferenceStatus" || report["phase"] != "Loading" {
		t.Errorf("-o json: %v", report)
	}
	expectAll(t, aii(t, "why", "llm", "-n", ns, "-o", "yaml"), "kind: AIInferenceWhy", "reason: Loading")
}

func TestFailed(t *testing.T) {
	ns := namespace(t, "aii-failed")
	failedAt := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm-7d9f-xyz"}, Spec: corev1.PodSpec{NodeName: "gpu-a100-1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "model-loader", RestartCount: 1,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 21, Reason: "Error", FinishedAt: failedAt}}}},
		}}
	msg := "Loads stopped: a load failed permanently; last on pod llm-7d9f-xyz (SourceNotFound): no object under s3://models/llama/"
	setup(t, inference(ns, "llm"), servingv1.AIInferenceStatus{Phase: servingv1.PhaseFailed, Ready: "0/1", LoadRetries: 1,
		Conditions:  append(ready(servingv1.ReasonLoadFailed, msg), metav1.Condition{Type: servingv1.ConditionStalled, Status: metav1.ConditionTrue, Reason: servingv1.ReasonLoadFailed, Message: msg}),
		LastFailure: &servingv1.LoadFailure{Reason: "SourceNotFound", Message: "no object under s3://models/llama/", Pod: "llm-7d9f-xyz", ExitCode: 21, Time: failedAt}}, pod)

	out := aii(t, "status", "llm", "-n", ns)
	expectAll(t, out, "Failed, 0/1 ready", "1 of 3 retries spent", "waiting: CrashLoopBackOff, 1 restarts (last exit 21 Error)",
		"Last failure: SourceNotFound on pod llm-7d9f-xyz", "(exit code 21)", "Fix:   Fix spec.model.source")
	out = aii(t, "why", "llm", "-n", ns)
	expectAll(t, out, "is not Ready (phase Failed, reason LoadFailed)", "└─ Pod llm-7d9f-xyz", "└─ Container model-loader", "└─ LoadFailure SourceNotFound: SourceNotFound: no object under s3://models/llama/ (exit code 21)",
		"What to do:    Fix spec.model.source", "requestedAt")

	// Its history: the status's times and the events.
	must(t, k8s.Create(context.Background(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "loader-failed"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "llm-7d9f-xyz", Namespace: ns}, Type: corev1.EventTypeWarning, Reason: "BackOff",
		Message: "Back-off restarting failed container model-loader", LastTimestamp: failedAt, Count: 3}))
	expectAll(t, aii(t, "trace", "llm", "-n", ns), "Created", "Ready=False", "LoadFailed", "BackOff", "(x3)", "status.lastFailure")

	// The operator's events are events.k8s.io/v1: a repeat is counted in the
	// Event's series, which the trace shows as well.
	must(t, k8s.Create(context.Background(), &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm.repeated"},
		EventTime: metav1.NewMicroTime(failedAt.Add(-time.Minute)), ReportingController: "aiinference-operator", ReportingInstance: "aiinference-operator-test",
		Action: "Reconcile", Reason: "RetryingLoad", Note: "the load failed; retrying", Type: corev1.EventTypeWarning,
		Regarding: corev1.ObjectReference{Kind: "Pod", Name: "llm-7d9f-xyz", Namespace: ns},
		Series:    &eventsv1.EventSeries{Count: 4, LastObservedTime: metav1.NewMicroTime(failedAt.Time)}}))
	expectAll(t, aii(t, "trace", "llm", "-n", ns), "RetryingLoad", "the load failed; retrying (x4)")
}

func TestUnschedulableCountsGPUs(t *testing.T) {
	ns := namespace(t, "aii-unsched")
	gpuNode(t, "gpu-h100-0", "NVIDIA-H100-80GB-HBM3", 8)
	gpuNode(t, "gpu-l4-0", "NVIDIA-L4", 4)
	// Another workload holds 7 of the H100 node's GPUs.
	must(t, k8s.Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "training"},
		Spec: corev1.PodSpec{NodeName: "gpu-h100-0", Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{servingv1.GPUResource: resource.MustParse("7")}, Limits: corev1.ResourceList{servingv1.GPUResource: resource.MustParse("7")}}}}}}))
	sched := "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm-7d9f-pend"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: sched}}}}
	setup(t, inference(ns, "llm"), servingv1.AIInferenceStatus{Phase: servingv1.PhasePending, Ready: "0/1",
		Conditions:  ready(servingv1.ReasonUnschedulable, "0 of 1 replicas run the current spec and are ready; pod llm-7d9f-pend cannot be scheduled: "+sched),
		LastFailure: &servingv1.LoadFailure{Reason: servingv1.ReasonUnschedulable, Message: sched, Pod: "llm-7d9f-pend", Time: metav1.Now()}}, pod)
	out := aii(t, "why", "llm", "-n", ns)
	expectAll(t, out, "└─ Pod llm-7d9f-pend: Pending, not scheduled: Unschedulable: 0/3 nodes",
		"Nodes nvidia.com/gpu.product: each replica needs 2 GPUs of NVIDIA-H100-80GB-HBM3 or NVIDIA-A100-SXM4-80GB; NVIDIA-H100-80GB-HBM3: 1 nodes, 8 GPUs, 1 free, 0 nodes with 2 free; NVIDIA-A100-SXM4-80GB:",
		"What to do:    Free or add GPUs")
}

func TestReferencesAndConflicts(t *testing.T) {
	ns := namespace(t, "aii-refs")
	setup(t, inference(ns, "nosecret"), servingv1.AIInferenceStatus{Phase: servingv1.PhasePending,
		Conditions: ready(servingv1.ReasonSecretNotFound, `Secret "s3-creds" named in spec.model.source.s3.credentialsSecretRef does not exist`)})
	expectAll(t, aii(t, "why", "nosecret", "-n", ns), "└─ Secret s3-creds: named in spec.model.source.s3.credentialsSecretRef, does not exist in namespace aii-refs", "What to do:    Create the Secret")

	must(t, k8s.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}))
	setup(t, inference(ns, "taken"), servingv1.AIInferenceStatus{Phase: servingv1.PhasePending,
		Conditions: ready(servingv1.ReasonNameConflict, `Service "taken" exists and is not controlled by this AIInference`)})
	expectAll(t, aii(t, "why", "taken", "-n", ns), "└─ Service taken: exists with no controller; the operator will not adopt it", "What to do:    Delete or rename")
}

// TestEveryReasonHasAnAnswer: whatever reason Ready gives, why ends with what it
// means and, for a problem, what to do.
func TestEveryReasonHasAnAnswer(t *testing.T) {
	ns := namespace(t, "aii-every")
	for i, x := range reasons.All {
		if x.Reason == servingv1.ReasonReady || x.Reason == servingv1.ReasonScaledToZero || strings.ToLower(x.Reason) == x.Reason {
			continue
		}
		name := fmt.Sprintf("r%d", i)
		setup(t, inference(ns, name), servingv1.AIInferenceStatus{Phase: servingv1.PhasePending, Conditions: ready(x.Reason, "message of "+x.Reason)})
		out := aii(t, "why", name, "-n", ns)
		expectAll(t, out, "reason "+x.Reason, "message of "+x.Reason, "What it means: "+x.Meaning)
		if x.Warning && strings.Contains(out, "What to do:    -") {
			t.Errorf("%s: why gives no fix", x.Reason)
		}
	}
}

func TestCanaryRollout(t *testing.T) {
	ns := namespace(t, "aii-canary")
	at := metav1.NewTime(time.Now().Add(-5 * time.Minute).Truncate(time.Second))
	st := servingv1.AIInferenceStatus{Phase: servingv1.PhaseCanary, Ready: "4/4",
		Conditions: ready(servingv1.ReasonCanaryProgressing, "Canary revision b2 takes 10% of the traffic"),
		Rollout: &servingv1.RolloutStatus{StableRevision: "a1", CanaryRevision: "b2", Phase: servingv1.RolloutProgressing, Step: 0, Weight: 10,
			TrafficSplit: "Gateway", Message: "step 1 of 2: 10% of the traffic; analysis run Pass",
			Analysis: []servingv1.AnalysisRun{{Step: 0, Time: at, Verdict: servingv1.VerdictPass, Checks: []servingv1.CheckResult{
				{Name: "ttft", Query: "q", Value: "0.21", Threshold: "0.8", Samples: 412, Verdict: servingv1.VerdictPass}}}},
			History: []servingv1.RolloutDecision{{Time: at, Decision: "CanaryStarted", Revision: "b2", Message: "revision b2 starts as a canary"}}}}
	setup(t, inference(ns, "llm"), st)

	expectAll(t, aii(t, "status", "llm", "-n", ns), "Canary rollout: Progressing, step 1, canary weight 10% (Gateway); stable a1, canary b2",
		"ttft", "0.21", "0.8", "412", "CanaryStarted")
	expectAll(t, aii(t, "trace", "llm", "-n", ns), "status.rollout", "CanaryStarted", "revision b2, step 1, canary weight 0%")
	expectAll(t, aii(t, "why", "llm", "-n", ns), "reason CanaryProgressing")
}

// TestWhyNamesTheMemberThatBlocksAGroup: for a replica that spans nodes, why
// shows the LeaderWorkerSet, the group and its member that keeps it from
// serving, and never a ready worker (a worker never serves itself).
func TestWhyNamesTheMemberThatBlocksAGroup(t *testing.T) {
	ctx := context.Background()
	module, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/lws").Output()
	must(t, err)
	must(t, testutil.InstallCRDs(ctx, k8s, filepath.Join(strings.TrimSpace(string(module)), "config", "crd", "bases", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")))
	ns := namespace(t, "aii-groups")
	obj := inference(ns, "big")
	obj.Spec.GPU = servingv1.GPUSpec{Count: 8, Nodes: 2, Products: []string{"NVIDIA-H100-80GB-HBM3"}}
	createWithStatus(t, obj, servingv1.AIInferenceStatus{Phase: servingv1.PhaseLoading, Ready: "1/2", ReadyReplicas: 1,
		Conditions: ready(servingv1.ReasonLoading, "1 of 2 replicas run the current spec and are ready")})
	template := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}}}
	groups := &lwsv1.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: obj.GroupSetName()},
		Spec: lwsv1.LeaderWorkerSetSpec{Replicas: ptr.To[int32](2), StartupPolicy: lwsv1.LeaderCreatedStartupPolicy,
			RolloutStrategy: lwsv1.RolloutStrategy{Type: lwsv1.RollingUpdateStrategyType}, LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{
				Size: ptr.To[int32](2), LeaderTemplate: template.DeepCopy(), WorkerTemplate: template}}}
	must(t, ctrlRef(obj, groups))
	must(t, k8s.Create(ctx, groups))

	running := func(ready bool) corev1.PodStatus {
		cond := corev1.ConditionFalse
		if ready {
			cond = corev1.ConditionTrue
		}
		return corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: cond}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: ready}}}
	}
	member := func(group, role, name string, status corev1.PodStatus) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{servingv1.LabelInference: obj.Name,
			servingv1.LabelRole: role, lwsv1.GroupIndexLabelKey: group}}, Spec: corev1.PodSpec{NodeName: name + "-node"}, Status: status}
		createPod(t, obj, p)
	}
	// Group 0 serves: its ready worker is made first, and blocks nothing.
	member("0", servingv1.RoleWorker, "big-group-0-1", running(true))
	member("0", servingv1.RoleLeader, "big-group-0", running(true))
	member("1", servingv1.RoleLeader, "big-group-1", running(false))
	member("1", servingv1.RoleWorker, "big-group-1-1", running(true))

	out := aii(t, "why", "big", "-n", ns)
	expectAll(t, out, "LeaderWorkerSet big-group: 2 groups of 2 pods (a leader and 1 worker(s), each on its own node), 1 ready",
		"Group 1: leader big-group-1 does not serve yet; 1 of 1 worker(s) ready (1 made); big-group-1 blocks it",
		"Pod big-group-1: Running, on node big-group-1-node")
	if strings.Contains(out, "big-group-0-1") {
		t.Errorf("why names group 0's ready worker")
	}
}
