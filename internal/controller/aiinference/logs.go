package aiinference

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// LogReader reads the end of a container's previous run from its log.
type LogReader interface {
	LastLine(ctx context.Context, namespace, pod, container string) (string, error)
}

// PodLogs reads the end of a container's previous run from its log, through the
// API server. A crash-looping engine that exits 0 (or whose exit left no message)
// gets no termination message from the kubelet, and its log is then the only
// place that says why.
type PodLogs struct {
	Client kubernetes.Interface
}

// LastLine is the last non-empty line the previous run of container wrote.
func (l PodLogs) LastLine(ctx context.Context, namespace, pod, container string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	data, err := l.Client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{
		Container: container, Previous: true, TailLines: ptr.To[int64](5), LimitBytes: ptr.To[int64](4096),
	}).DoRaw(ctx)
	if err != nil {
		return "", err
	}
	text := strings.TrimSpace(string(data))
	if strings.HasPrefix(text, kubeletNoLogPrefix) && !strings.Contains(text, "\n") {
		return "", fmt.Errorf("the kubelet could not serve the previous run's log yet: %s", text)
	}
	lines := strings.Split(text, "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// kubeletNoLogPrefix starts what a kubelet answers, in the body of a successful
// response, for a previous run's log it cannot find (right after a restart, or
// once the container is gone): not a line the engine wrote.
const kubeletNoLogPrefix = "unable to retrieve container logs for "
