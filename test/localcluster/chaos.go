package localcluster

import (
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Two failure behaviours of the simulated kubelets, for pods that carry their
// label set to "true" (put it on the pod template of a Deployment: every pod
// made from it fails, until a new template without the label replaces them).
// Both are what a real kubelet does with a failing container of a pod with
// restartPolicy Always: the container exits with its exit code and message,
// waits in CrashLoopBackOff (10 s doubling up to 5 min, times the cluster's
// KubeletDelayScale) with the exit as its lastState, runs again in place (same
// pod, same UID and IP) with restartCount one higher, and so on for ever. The
// annotations below, all optional, choose the container and how it exits; a
// pod that has no such container never starts. stages.go simulates them. (With
// restartPolicy Never a kubelet would fail the pod instead; the simulation
// does not look at the policy.)
const (
	// InitContainerFailureLabel marks pods whose init container fails: the pod
	// stays Pending, its containers waiting (PodInitializing), and the init
	// containers after the failing one never run.
	InitContainerFailureLabel = "localcluster.aiinference.io/init-container-failure"
	// InitContainerFailureContainerAnnotation names the init container that
	// fails; the ones before it complete. Absent: the first.
	InitContainerFailureContainerAnnotation = InitContainerFailureLabel + "-container"
	// InitContainerFailureExitCodeAnnotation is its exit code. Absent: 1.
	InitContainerFailureExitCodeAnnotation = InitContainerFailureLabel + "-exit-code"
	// InitContainerFailureReasonAnnotation is the reason of its terminated
	// state. Absent: Error, as the kubelet says for a non-zero exit code.
	InitContainerFailureReasonAnnotation = InitContainerFailureLabel + "-reason"
	// InitContainerFailureMessageAnnotation is the message of its terminated
	// state. Absent: none.
	InitContainerFailureMessageAnnotation = InitContainerFailureLabel + "-message"
	// InitContainerFailureRunForAnnotation is how long each run lasts before
	// the exit, as a Go duration. Absent: 1 s times the KubeletDelayScale.
	InitContainerFailureRunForAnnotation = InitContainerFailureLabel + "-run-for"

	// ContainerCrashLoopLabel marks pods whose container (say, the inference
	// engine) crashes: the pod is Running but not Ready, the other containers
	// run and are ready.
	ContainerCrashLoopLabel = "localcluster.aiinference.io/container-crash-loop"
	// ContainerCrashLoopContainerAnnotation names the container that crashes.
	// Absent: the first.
	ContainerCrashLoopContainerAnnotation = ContainerCrashLoopLabel + "-container"
	// ContainerCrashLoopExitCodeAnnotation is its exit code. Absent: 1.
	ContainerCrashLoopExitCodeAnnotation = ContainerCrashLoopLabel + "-exit-code"
	// ContainerCrashLoopReasonAnnotation is the reason of its terminated state.
	// Absent: Error (OOMKilled, with exit code 137, is another the kubelet gives).
	ContainerCrashLoopReasonAnnotation = ContainerCrashLoopLabel + "-reason"
	// ContainerCrashLoopMessageAnnotation is the message of its terminated
	// state: with terminationMessagePolicy FallbackToLogsOnError, the end of its
	// log. Absent: none.
	ContainerCrashLoopMessageAnnotation = ContainerCrashLoopLabel + "-message"
	// ContainerCrashLoopRunForAnnotation is how long each run lasts before the
	// exit, as a Go duration. Absent: 1 s times the KubeletDelayScale.
	ContainerCrashLoopRunForAnnotation = ContainerCrashLoopLabel + "-run-for"
)

// InitContainerFailure says how a pod's init container fails, again and again.
// The operator treats exit code 10 as retryable and 20-23 as permanent.
type InitContainerFailure struct {
	// Container is the init container that fails; empty: the first.
	Container string
	// ExitCode is its exit code; 0: 1.
	ExitCode int32
	// Reason and Message go into its terminated state; empty Reason: Error.
	Reason  string
	Message string
	// RunFor is how long each run lasts before the exit, give or take a second
	// (the API keeps times to the second); 0: 1 s times the KubeletDelayScale.
	RunFor time.Duration
}

// Apply labels and annotates obj (a Pod, or a pod template's ObjectMeta) so
// that the simulated kubelet fails its init container as f says. Earlier
// settings of this behaviour on obj are replaced.
func (f InitContainerFailure) Apply(obj metav1.Object) {
	initContainerFailureKeys.apply(obj, f.Annotations())
}

// Annotations are the annotations that carry f (without the label).
func (f InitContainerFailure) Annotations() map[string]string {
	return initContainerFailureKeys.annotations(failure(f))
}

// ClearInitContainerFailure removes the label and annotations of
// InitContainerFailure from obj, so that its init containers run normally.
func ClearInitContainerFailure(obj metav1.Object) { initContainerFailureKeys.clear(obj) }

// ContainerCrashLoop says how a pod's container crashes, again and again.
type ContainerCrashLoop struct {
	// Container is the container that crashes; empty: the first.
	Container string
	// ExitCode is its exit code; 0: 1.
	ExitCode int32
	// Reason and Message go into its terminated state; empty Reason: Error.
	Reason  string
	Message string
	// RunFor is how long each run lasts before the exit, give or take a second
	// (the API keeps times to the second); 0: 1 s times the KubeletDelayScale.
	RunFor time.Duration
}

// Apply labels and annotates obj (a Pod, or a pod template's ObjectMeta) so
// that the simulated kubelet crashes its container as c says. Earlier settings
// of this behaviour on obj are replaced.
func (c ContainerCrashLoop) Apply(obj metav1.Object) {
	containerCrashLoopKeys.apply(obj, c.Annotations())
}

// Annotations are the annotations that carry c (without the label).
func (c ContainerCrashLoop) Annotations() map[string]string {
	return containerCrashLoopKeys.annotations(failure(c))
}

// ClearContainerCrashLoop removes the label and annotations of
// ContainerCrashLoop from obj, so that its containers run normally.
func ClearContainerCrashLoop(obj metav1.Object) { containerCrashLoopKeys.clear(obj) }

// failure is what both behaviours have.
type failure struct {
	Container       string
	ExitCode        int32
	Reason, Message string
	RunFor          time.Duration
}

// failureKeys are the label and annotation keys of a behaviour.
type failureKeys struct {
	label, container, exitCode, reason, message, runFor string
}

var (
	initContainerFailureKeys = failureKeys{InitContainerFailureLabel, InitContainerFailureContainerAnnotation,
		InitContainerFailureExitCodeAnnotation, InitContainerFailureReasonAnnotation,
		InitContainerFailureMessageAnnotation, InitContainerFailureRunForAnnotation}
	containerCrashLoopKeys = failureKeys{ContainerCrashLoopLabel, ContainerCrashLoopContainerAnnotation,
		ContainerCrashLoopExitCodeAnnotation, ContainerCrashLoopReasonAnnotation,
		ContainerCrashLoopMessageAnnotation, ContainerCrashLoopRunForAnnotation}
)

// annotations hold f's settings as they are (the stages quote them where they
// write YAML, so a message may hold colons and quotes).
func (k failureKeys) annotations(f failure) map[string]string {
	a := map[string]string{}
	if f.Container != "" {
		a[k.container] = f.Container
	}
	if f.ExitCode != 0 {
		a[k.exitCode] = strconv.Itoa(int(f.ExitCode))
	}
	if f.Reason != "" {
		a[k.reason] = f.Reason
	}
	if f.Message != "" {
		a[k.message] = f.Message
	}
	if f.RunFor > 0 {
		a[k.runFor] = f.RunFor.String()
	}
	return a
}

func (k failureKeys) apply(obj metav1.Object, annotations map[string]string) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[k.label] = "true"
	obj.SetLabels(labels)
	all := obj.GetAnnotations()
	if all == nil {
		all = map[string]string{}
	}
	k.deleteAnnotations(all)
	for key, v := range annotations {
		all[key] = v
	}
	obj.SetAnnotations(all)
}

func (k failureKeys) clear(obj metav1.Object) {
	labels := obj.GetLabels()
	delete(labels, k.label)
	obj.SetLabels(labels)
	annotations := obj.GetAnnotations()
	k.deleteAnnotations(annotations)
	obj.SetAnnotations(annotations)
}

func (k failureKeys) deleteAnnotations(annotations map[string]string) {
	for _, key := range []string{k.container, k.exitCode, k.reason, k.message, k.runFor} {
		delete(annotations, key)
	}
}
