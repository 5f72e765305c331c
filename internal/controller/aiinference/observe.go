package aiinference

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aiinference/operator/internal/loadspec"
)

// podView is what one reconcile pass needs to know about a pod.
type podView struct {
	Name string
	UID  types.UID
	// Current is true for pods of the desired template (not of an earlier spec).
	Current bool
	// Scheduled is true once the pod is bound to a node.
	Scheduled bool
	// Unschedulable is the scheduler's explanation when it cannot place the pod.
	Unschedulable string
	// LoaderStarted is when the loader's current attempt began; zero if it has not.
	LoaderStarted time.Time
	// LoaderDone is true when the loader exited 0.
	LoaderDone bool
	// LoaderSummary is the loader's report from its termination message, if any.
	LoaderSummary *loadspec.Summary
	// LoaderFinished is when the loader exited.
	LoaderFinished time.Time
	// LoaderFailed is set when the loader's last run exited non-zero.
	LoaderFailed *loaderExit
	// EngineReady is true when the engine passes its readiness probe.
	EngineReady bool
	// EngineCrashLoop explains a crash-looping engine; empty otherwise.
	EngineCrashLoop string
	// StartFailure explains a container that cannot start (an image that cannot be
	// pulled, a missing Secret key); empty otherwise.
	StartFailure string
}

// startFailureReasons are the waiting reasons of a container that will not start
// without a change: waiting on them would otherwise look like a slow start forever.
var startFailureReasons = map[string]bool{
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"InvalidImageName":           true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
}

// loaderExit is a failed loader run.
type loaderExit struct {
	ExitCode int32
	Reason   string
	Message  string
	Finished time.Time
}

// observePods turns pods into views, oldest first, skipping pods being deleted.
func observePods(pods []corev1.Pod, templateHash string) []podView {
	var views []podView
	sorted := append([]corev1.Pod(nil), pods...)
	sort.Slice(sorted, func(i, j int) bool {
		return sorted[i].CreationTimestamp.Before(&sorted[j].CreationTimestamp)
	})
	for i := range sorted {
		pod := &sorted[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		views = append(views, observePod(pod, templateHash))
	}
	return views
}

func observePod(pod *corev1.Pod, templateHash string) podView {
	v := podView{
		Name:      pod.Name,
		UID:       pod.UID,
		Current:   pod.Annotations[AnnotationTemplateHash] == templateHash,
		Scheduled: pod.Spec.NodeName != "",
	}
	for _, c := range pod.Status.Conditions {
		switch {
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable:
			v.Unschedulable = c.Message
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue:
			v.Scheduled = true
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && startFailureReasons[w.Reason] && v.StartFailure == "" {
			v.StartFailure = fmt.Sprintf("container %s: %s%s", cs.Name, w.Reason, suffix(w.Message))
		}
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == LoaderContainerName {
			observeLoader(&v, cs)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != EngineContainerName {
			continue
		}
		v.EngineReady = cs.Ready
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			v.EngineCrashLoop = fmt.Sprintf("engine container restarted %d times", cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil {
				v.EngineCrashLoop += fmt.Sprintf("; last exit code %d (%s)%s", t.ExitCode, t.Reason, suffix(t.Message))
			}
		}
	}
	return v
}

// observeLoader reads the loader's state. A kubelet restarts a failed init container
// in place, so a failure shows either as the current state or, while the next run
// waits in back-off, as the last state.
func observeLoader(v *podView, cs corev1.ContainerStatus) {
	state := cs.State
	if state.Running != nil {
		v.LoaderStarted = state.Running.StartedAt.Time
		return
	}
	term := state.Terminated
	if term == nil && state.Waiting != nil {
		term = cs.LastTerminationState.Terminated
	}
	if term == nil {
		return
	}
	v.LoaderFinished = term.FinishedAt.Time
	v.LoaderSummary = parseSummary(term.Message)
	if term.ExitCode == 0 {
		v.LoaderDone = true
		return
	}
	exit := &loaderExit{ExitCode: term.ExitCode, Reason: term.Reason, Message: term.Message, Finished: term.FinishedAt.Time}
	if s := v.LoaderSummary; s != nil && s.Failure != nil {
		exit.Reason, exit.Message = s.Failure.Reason, s.Failure.Message
	}
	if exit.Reason == "" || exit.Reason == "Error" {
		exit.Reason = loadspec.ReasonTransient
		if !loadspec.IsRetryableExit(exit.ExitCode) {
			exit.Reason = "LoaderExit" + fmt.Sprint(exit.ExitCode)
		}
	}
	v.LoaderFailed = exit
}

// parseSummary reads the loader's JSON termination message; nil when it is not one.
func parseSummary(message string) *loadspec.Summary {
	message = strings.TrimSpace(message)
	if !strings.HasPrefix(message, "{") {
		return nil
	}
	var s loadspec.Summary
	if err := json.Unmarshal([]byte(message), &s); err != nil {
		return nil
	}
	return &s
}

func suffix(msg string) string {
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return ""
	}
	const maxLen = 256
	if len(msg) > maxLen {
		msg = msg[:maxLen] + "..."
	}
	return ": " + msg
}
