package localcluster

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kwok chaos stage "pod-init-container-running-failed" (kwok's
// kustomize/stage/pod/chaos) fails a pending pod's init container instead of
// running it: the container is terminated with an exit code and the pod's phase
// becomes Failed. It applies to pods with InitContainerFailureLabel set to "true";
// the annotations below (all optional) choose how the container fails. The stage
// only acts on pods that are still Pending, so set the label when the pod is
// created (on the pod, or on the template of the Deployment or Job that makes it):
// every pod made from such a template fails, until the label is removed.
// The operator treats exit code 10 as retryable and 20-23 as permanent.
const (
	InitContainerFailureLabel = "pod-init-container-running-failed.stage.kwok.x-k8s.io"

	// InitContainerFailureContainerAnnotation names the init container that fails;
	// the others complete. Empty or absent: every init container fails.
	InitContainerFailureContainerAnnotation = InitContainerFailureLabel + "/container-name"
	// InitContainerFailureExitCodeAnnotation is the exit code (kwok's default: 1).
	InitContainerFailureExitCodeAnnotation = InitContainerFailureLabel + "/exit-code"
	// InitContainerFailureReasonAnnotation is the terminated state's reason
	// (kwok's default: initContainerError).
	InitContainerFailureReasonAnnotation = InitContainerFailureLabel + "/reason"
	// InitContainerFailureMessageAnnotation is the terminated state's message
	// (kwok's default: "initContainer reported errors").
	InitContainerFailureMessageAnnotation = InitContainerFailureLabel + "/message"
	// InitContainerFailureDelayAnnotation is the delay before the failure, as a Go
	// duration (kwok's default: 1s plus up to 1s of jitter).
	InitContainerFailureDelayAnnotation = InitContainerFailureLabel + "/delay"
)

var failureAnnotations = []string{InitContainerFailureContainerAnnotation, InitContainerFailureExitCodeAnnotation,
	InitContainerFailureReasonAnnotation, InitContainerFailureMessageAnnotation, InitContainerFailureDelayAnnotation}

// InitContainerFailure says how kwok makes a pod's init container fail.
type InitContainerFailure struct {
	// Container is the init container that fails; empty: all of them.
	Container string
	// ExitCode is the exit code of the failed container; 0 means kwok's default, 1.
	ExitCode int32
	// Reason and Message go into the container's terminated state; empty: kwok's defaults.
	Reason  string
	Message string
	// Delay is how long the pod stays pending before the failure; 0: kwok's default.
	Delay time.Duration
}

// Apply labels and annotates obj (a Pod, or a pod template's ObjectMeta) so that
// kwok fails its init container as f says. Any earlier failure settings on obj
// are replaced.
func (f InitContainerFailure) Apply(obj metav1.Object) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[InitContainerFailureLabel] = "true"
	obj.SetLabels(labels)

	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	for _, k := range failureAnnotations {
		delete(annotations, k)
	}
	for k, v := range f.Annotations() {
		annotations[k] = v
	}
	obj.SetAnnotations(annotations)
}

// Annotations are the annotations that carry f (without the label).
func (f InitContainerFailure) Annotations() map[string]string {
	a := map[string]string{}
	if f.Container != "" {
		a[InitContainerFailureContainerAnnotation] = f.Container
	}
	if f.ExitCode != 0 {
		a[InitContainerFailureExitCodeAnnotation] = strconv.Itoa(int(f.ExitCode))
	}
	// kwok writes reason and message into a YAML template without quoting them, so
	// a message like "download failed: 403" would break the pod status. Quote them
	// here: a JSON string is a YAML double-quoted scalar, which the template then
	// reads back as the plain text.
	if f.Reason != "" {
		a[InitContainerFailureReasonAnnotation] = yamlQuote(f.Reason)
	}
	if f.Message != "" {
		a[InitContainerFailureMessageAnnotation] = yamlQuote(f.Message)
	}
	if f.Delay > 0 {
		a[InitContainerFailureDelayAnnotation] = f.Delay.String()
	}
	return a
}

// ClearInitContainerFailure removes the failure label and annotations from obj,
// so that kwok runs its init containers normally again.
func ClearInitContainerFailure(obj metav1.Object) {
	labels := obj.GetLabels()
	delete(labels, InitContainerFailureLabel)
	obj.SetLabels(labels)
	annotations := obj.GetAnnotations()
	for _, k := range failureAnnotations {
		delete(annotations, k)
	}
	obj.SetAnnotations(annotations)
}

func yamlQuote(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("marshalling a string: %v", err)) // cannot happen
	}
	return string(b)
}
