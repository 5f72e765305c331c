package localcluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
)

func TestInitContainerFailureApply(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{"app": "x"},
		Annotations: map[string]string{InitContainerFailureReasonAnnotation: "Old", "keep": "me"},
	}}
	InitContainerFailure{Container: "loader", ExitCode: 20, Message: "download failed: 403 Forbidden", RunFor: 1500 * time.Millisecond}.Apply(pod)

	if got := pod.Labels[InitContainerFailureLabel]; got != "true" {
		t.Errorf("label = %q, want true", got)
	}
	if pod.Labels["app"] != "x" || pod.Annotations["keep"] != "me" {
		t.Errorf("other labels or annotations lost: %v %v", pod.Labels, pod.Annotations)
	}
	want := map[string]string{
		InitContainerFailureContainerAnnotation: "loader",
		InitContainerFailureExitCodeAnnotation:  "20",
		InitContainerFailureMessageAnnotation:   "download failed: 403 Forbidden",
		InitContainerFailureRunForAnnotation:    "1.5s",
		"keep":                                  "me",
	}
	if len(pod.Annotations) != len(want) {
		t.Errorf("annotations = %v, want %v", pod.Annotations, want)
	}
	for k, v := range want {
		if pod.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, pod.Annotations[k], v)
		}
	}

	ClearInitContainerFailure(pod)
	if _, ok := pod.Labels[InitContainerFailureLabel]; ok {
		t.Error("label still set after ClearInitContainerFailure")
	}
	if len(pod.Annotations) != 1 || pod.Annotations["keep"] != "me" {
		t.Errorf("annotations after ClearInitContainerFailure = %v, want only keep", pod.Annotations)
	}
}

func TestContainerCrashLoopOnPodTemplate(t *testing.T) {
	tmpl := corev1.PodTemplateSpec{}
	InitContainerFailure{ExitCode: 10}.Apply(&tmpl.ObjectMeta)
	ContainerCrashLoop{Container: "engine", Reason: "OOMKilled", ExitCode: 137}.Apply(&tmpl.ObjectMeta)
	want := map[string]string{
		InitContainerFailureExitCodeAnnotation: "10",
		ContainerCrashLoopContainerAnnotation:  "engine",
		ContainerCrashLoopExitCodeAnnotation:   "137",
		ContainerCrashLoopReasonAnnotation:     "OOMKilled",
	}
	if tmpl.Labels[ContainerCrashLoopLabel] != "true" || tmpl.Labels[InitContainerFailureLabel] != "true" || len(tmpl.Annotations) != len(want) {
		t.Fatalf("template meta = %+v, want both labels and annotations %v", tmpl.ObjectMeta, want)
	}
	for k, v := range want {
		if tmpl.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, tmpl.Annotations[k], v)
		}
	}

	// Each behaviour clears its own keys only.
	ClearContainerCrashLoop(&tmpl.ObjectMeta)
	if _, ok := tmpl.Labels[ContainerCrashLoopLabel]; ok || tmpl.Labels[InitContainerFailureLabel] != "true" ||
		len(tmpl.Annotations) != 1 || tmpl.Annotations[InitContainerFailureExitCodeAnnotation] != "10" {
		t.Errorf("after ClearContainerCrashLoop: %+v", tmpl.ObjectMeta)
	}
}

// crashLoopSeen is what the pods of a failure test went through.
type crashLoopSeen struct {
	uid         types.UID
	maxRestarts int32
	exits       int      // updates with the container terminated
	crashLoops  int      // updates with the container waiting in CrashLoopBackOff
	backOffs    []string // the messages of the CrashLoopBackOff waits, in order
	lastState   *corev1.ContainerStateTerminated
}

// record notes the failing container's status s of pod, and returns a
// problem with the pod or s, if any.
func (seen *crashLoopSeen) record(pod *corev1.Pod, s corev1.ContainerStatus) string {
	if seen.uid == "" {
		seen.uid = pod.UID
	}
	if pod.UID != seen.uid {
		return fmt.Sprintf("a new pod %s (UID %s) replaced the failing one (UID %s)", pod.Name, pod.UID, seen.uid)
	}
	if s.RestartCount < seen.maxRestarts {
		return fmt.Sprintf("restartCount went down from %d to %d", seen.maxRestarts, s.RestartCount)
	}
	seen.maxRestarts = s.RestartCount
	switch {
	case s.State.Terminated != nil:
		seen.exits++
	case s.State.Waiting != nil && s.State.Waiting.Reason == "CrashLoopBackOff":
		seen.crashLoops++
		if n := len(seen.backOffs); n == 0 || seen.backOffs[n-1] != s.State.Waiting.Message {
			seen.backOffs = append(seen.backOffs, s.State.Waiting.Message)
		}
	}
	if s.RestartCount > 0 && s.LastTerminationState.Terminated == nil {
		return fmt.Sprintf("restartCount %d without a lastState: %+v", s.RestartCount, s)
	}
	if t := s.LastTerminationState.Terminated; t != nil {
		seen.lastState = t
	}
	if s.Ready {
		return fmt.Sprintf("the failing container is ready: %+v", s)
	}
	return ""
}

func (seen *crashLoopSeen) String() string {
	return fmt.Sprintf("pod %s, restartCount up to %d, %d updates with the exit, %d in CrashLoopBackOff, back-offs %q, last state %+v",
		seen.uid, seen.maxRestarts, seen.exits, seen.crashLoops, seen.backOffs, seen.lastState)
}

// loopedTwice: the container restarted twice, was seen exited and in CrashLoopBackOff.
func (seen *crashLoopSeen) loopedTwice() bool {
	return seen.maxRestarts >= 2 && seen.exits > 0 && seen.crashLoops > 0 && seen.lastState != nil
}

// checkBackOffs checks the CrashLoopBackOff messages of pod: the kubelet's
// words, with the back-off doubling from 10 s times the test cluster's scale.
func (seen *crashLoopSeen) checkBackOffs(t *testing.T, container string, pod *corev1.Pod) {
	t.Helper()
	for i, want := range []string{"1s", "2s"} {
		want = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", want, container, pod.Name, pod.Namespace, pod.UID)
		if i >= len(seen.backOffs) || seen.backOffs[i] != want {
			t.Errorf("back-off messages %q, want %q at %d", seen.backOffs, want, i)
		}
	}
}

// watchPods calls each for every state of the pods in ns with the label
// app=name, until each returns true or an error, or ctx ends.
func watchPods(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string, each func(*corev1.Pod) (bool, error)) {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) {
		o.LabelSelector = "app=" + name
	})
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(e watch.Event) (bool, error) {
		pod, ok := e.Object.(*corev1.Pod)
		if !ok || e.Type == watch.Deleted {
			return false, nil
		}
		return each(pod)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func containerStatus(statuses []corev1.ContainerStatus, name string) (corev1.ContainerStatus, bool) {
	for _, s := range statuses {
		if s.Name == name {
			return s, true
		}
	}
	return corev1.ContainerStatus{}, false
}

// createDeployment creates a one-replica Deployment of spec with the label
// app=name, whose pod template meta is changed by apply.
func createDeployment(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string, spec corev1.PodSpec, apply func(metav1.Object)) {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: spec},
		},
	}
	apply(&d.Spec.Template.ObjectMeta)
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A real kubelet keeps a pod (restartPolicy Always, as in a Deployment) whose
// init container fails: it restarts the container in place after a growing
// back-off, the pod stays Pending and is never Failed. Once the template no
// longer asks for the failure, the new pod starts.
func TestInitContainerFailureCrashLoops(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	const message = `download failed: 403 Forbidden # "s3://models/x"`
	spec := gpuPodSpec(1, GPUProductL4)
	spec.InitContainers = []corev1.Container{{Name: "prepare", Image: "prepare:test"}, spec.InitContainers[0], {Name: "second", Image: "second:test"}}
	failure := InitContainerFailure{Container: "loader", ExitCode: 20, Reason: "AccessDenied", Message: message, RunFor: time.Second}
	createDeployment(ctx, t, client, ns, "model", spec, failure.Apply)

	seen := &crashLoopSeen{}
	var last *corev1.Pod
	watchPods(ctx, t, client, ns, "model", func(pod *corev1.Pod) (bool, error) {
		last = pod
		if pod.Status.Phase != corev1.PodPending {
			return false, fmt.Errorf("pod %s is %s, want Pending all along: %+v", pod.Name, pod.Status.Phase, pod.Status)
		}
		loader, ok := containerStatus(pod.Status.InitContainerStatuses, "loader")
		if !ok || loader.State.Waiting != nil && loader.State.Waiting.Reason == "PodInitializing" {
			return false, nil // not started yet
		}
		if problem := seen.record(pod, loader); problem != "" {
			return false, fmt.Errorf("%s; seen %s", problem, seen)
		}
		if s, _ := containerStatus(pod.Status.InitContainerStatuses, "prepare"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			return false, fmt.Errorf("the init container before the failing one did not complete: %+v", s)
		}
		if s, _ := containerStatus(pod.Status.InitContainerStatuses, "second"); s.State.Waiting == nil || s.State.Waiting.Reason != "PodInitializing" {
			return false, fmt.Errorf("the init container after the failing one does not wait: %+v", s)
		}
		if s, _ := containerStatus(pod.Status.ContainerStatuses, "server"); s.State.Waiting == nil || s.State.Waiting.Reason != "PodInitializing" {
			return false, fmt.Errorf("the server container does not wait: %+v", s)
		}
		return seen.loopedTwice(), nil
	})
	t.Logf("seen: %s", seen)
	if got := seen.lastState; got.ExitCode != 20 || got.Reason != "AccessDenied" || got.Message != message || got.StartedAt.IsZero() || got.FinishedAt.IsZero() {
		t.Errorf("lastState.terminated = %+v, want exit code 20, reason AccessDenied, the message and both times", got)
	}
	seen.checkBackOffs(t, "loader", last)

	// A new template without the failure: its pod goes through to Ready.
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "model", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ClearInitContainerFailure(&d.Spec.Template.ObjectMeta)
	if _, err := client.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the fixed Deployment to be available", func() (bool, string) {
		d, err := client.AppsV1().Deployments(ns).Get(ctx, "model", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.ObservedGeneration == d.Generation && d.Status.UpdatedReplicas == 1 && d.Status.AvailableReplicas == 1 &&
			d.Status.Replicas == 1, fmt.Sprintf("%+v", d.Status)
	})
}

// A real kubelet restarts a crashing container in place after a growing
// back-off: the pod stays Running, never Ready, with the other containers
// running and ready.
func TestContainerCrashLoop(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	const message = "torch.OutOfMemoryError: CUDA out of memory.\nTried to allocate 2.00 GiB: 'GPU 0'"
	spec := gpuPodSpec(1, GPUProductL4)
	spec.Containers[0].Name = "engine"
	spec.Containers = append(spec.Containers, corev1.Container{Name: "metrics", Image: "metrics:test"})
	crash := ContainerCrashLoop{Container: "engine", ExitCode: 1, Message: message, RunFor: time.Second}
	createDeployment(ctx, t, client, ns, "model", spec, crash.Apply)

	seen := &crashLoopSeen{}
	var last *corev1.Pod
	watchPods(ctx, t, client, ns, "model", func(pod *corev1.Pod) (bool, error) {
		last = pod
		if pod.Status.Phase == corev1.PodPending {
			return false, nil // not started yet
		}
		if pod.Status.Phase != corev1.PodRunning {
			return false, fmt.Errorf("pod %s is %s, want Running: %+v", pod.Name, pod.Status.Phase, pod.Status)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status != corev1.ConditionFalse {
				return false, fmt.Errorf("pod %s is Ready %s with a crashing container: %+v", pod.Name, c.Status, pod.Status)
			}
		}
		if s, _ := containerStatus(pod.Status.ContainerStatuses, "metrics"); s.State.Running == nil || !s.Ready || s.RestartCount != 0 {
			return false, fmt.Errorf("the other container is not running and ready: %+v", s)
		}
		engine, _ := containerStatus(pod.Status.ContainerStatuses, "engine")
		if problem := seen.record(pod, engine); problem != "" {
			return false, fmt.Errorf("%s; seen %s", problem, seen)
		}
		return seen.loopedTwice(), nil
	})
	t.Logf("seen: %s", seen)
	if got := seen.lastState; got.ExitCode != 1 || got.Reason != "Error" || got.Message != message {
		t.Errorf("lastState.terminated = %+v, want exit code 1, reason Error and the message", got)
	}
	seen.checkBackOffs(t, "engine", last)
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "model", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Status.ReadyReplicas != 0 || d.Status.UnavailableReplicas != 1 {
		t.Errorf("Deployment status %+v, want no ready replica and one unavailable", d.Status)
	}
	if !strings.Contains(fmt.Sprint(d.Status.Conditions), "MinimumReplicasUnavailable") {
		t.Errorf("Deployment conditions %+v, want Available False (MinimumReplicasUnavailable)", d.Status.Conditions)
	}
}
