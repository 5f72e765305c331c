package aiinference

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// observe reads the Deployment and the pods, and judges the loads. A pod list that
// fails leaves the pod-derived status as it was (see observation.podsSeen).
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	key := client.ObjectKey{Namespace: s.obj.Namespace, Name: s.obj.Name}
	d := &appsv1.Deployment{}
	err := r.Get(ctx, key, d)
	if err == nil && isCanary(s.obj) && podSpecDropped(d) {
		// A canary rollout keeps the stable pods' template as it runs, which the
		// cache does not hold in full.
		err = r.APIReader.Get(ctx, key, d)
	}
	if err == nil && metav1.IsControlledBy(d, s.obj) {
		s.obs.deployment = d
	} else if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("reading Deployment %s: %w", s.obj.Name, err)
	}
	var groups *lwsv1.LeaderWorkerSet
	if s.obj.SpansNodes() {
		// The groups are the replicas; a Deployment left from the model's
		// single-node form serves until they do, but is no replica of the spec.
		s.obs.deployment = nil
		if groups, err = r.observeGroups(ctx, s); err != nil {
			return err
		}
	}
	canary := &appsv1.Deployment{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: s.obj.Namespace, Name: s.obj.CanaryName()}, canary); err == nil && metav1.IsControlledBy(canary, s.obj) {
		s.obs.canary = canary
	} else if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("reading Deployment %s: %w", s.obj.CanaryName(), err)
	}
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(s.obj.Namespace), client.MatchingLabels(selectorLabels(s.obj))); err != nil {
		s.loads = keptAssessment(s.obj)
		return fmt.Errorf("listing pods: %w", err)
	}
	s.obs.podsSeen = true
	s.obs.pods = observePods(pods.Items, s.templateHash)
	if groups != nil {
		s.obs.deployment = groupsAsDeployment(groups, s.obs.pods)
	}
	r.readCrashLogs(ctx, s)
	s.loads = assessLoads(s.obj, s.obs.pods, s.templateHash, s.now)
	return nil
}

// observeGroups reads the LeaderWorkerSet of a model that spans nodes; nil
// when there is none of its own.
func (r *Reconciler) observeGroups(ctx context.Context, s *scope) (*lwsv1.LeaderWorkerSet, error) {
	if !r.served(leaderWorkerSetKind) {
		return nil, nil // checkReferences reports it
	}
	lws := &lwsv1.LeaderWorkerSet{}
	err := r.Get(ctx, client.ObjectKey{Namespace: s.obj.Namespace, Name: s.obj.GroupSetName()}, lws)
	switch {
	case err == nil && metav1.IsControlledBy(lws, s.obj):
		return lws, nil
	case client.IgnoreNotFound(err) != nil:
		return nil, fmt.Errorf("reading LeaderWorkerSet %s: %w", s.obj.GroupSetName(), err)
	}
	return nil, nil
}

// readCrashLogs adds the last log line of each current crash-looping engine whose
// exit left no message. It only costs a request while an engine crash-loops; a
// log that cannot be read (the node is gone) leaves the message as it was.
func (r *Reconciler) readCrashLogs(ctx context.Context, s *scope) {
	if r.Logs == nil {
		return
	}
	for i := range s.obs.pods {
		p := &s.obs.pods[i]
		if !p.Current || !p.EngineLogWanted {
			continue
		}
		line, err := r.Logs.LastLine(ctx, s.obj.Namespace, p.Name, servingv1.EngineContainerName)
		if err != nil {
			ctrl.LoggerFrom(ctx).V(1).Info("Reading a crash-looping engine's log", "pod", klog.KRef(s.obj.Namespace, p.Name), "error", err.Error())
			continue
		}
		if line != "" {
			p.EngineCrashLoop += "; last log line" + suffix(line)
		}
	}
}

// podView is what one reconcile pass needs to know about a pod.
type podView struct {
	Name string
	UID  types.UID
	// Current is true for pods of the desired template (not of an earlier spec).
	Current bool
	// Canary is true for the pods of a canary rollout's canary Deployment.
	Canary bool
	// Scheduled is true once the pod is bound to a node.
	Scheduled bool
	// Serves is true when the pod serves traffic (servingv1.PodServes).
	Serves bool
	// IP is the pod's IP; "" until it has one.
	IP string
	// Role and Group are a multi-node replica's pod's role (leader or
	// worker) and group index; "" for a single-node replica's pod.
	Role, Group string
	// Ready is the pod's Ready condition (a worker has no engine probe of
	// its own: it is ready while it runs).
	Ready bool
	// Unschedulable is the scheduler's explanation when it cannot place the pod,
	// and UnschedulableSince when it first said so.
	Unschedulable      string
	UnschedulableSince time.Time
	// LoaderStarted is when the loader's current run began; zero unless it runs.
	LoaderStarted time.Time
	// LoaderDone is true when the loader exited 0.
	LoaderDone bool
	// ImageVolumeDigest is the digest the kubelet reports for an image volume
	// model, if any.
	ImageVolumeDigest string
	// LoaderSummary is the report of the loader's successful run, if any.
	LoaderSummary *loadspec.Summary
	// LoaderFinished is when the loader's successful run exited.
	LoaderFinished time.Time
	// LoaderFailures counts the loader's failed runs in this pod: a kubelet restarts
	// a failed init container in place, so a pod may hold many.
	LoaderFailures int32
	// LoaderLastFailure is the loader's latest failed run, kept by the kubelet as
	// the last state while the next run waits or runs; nil when none failed.
	LoaderLastFailure *loaderExit
	// EngineReady is true when the engine passes its readiness probe.
	EngineReady bool
	// EngineCrashLoop explains a crash-looping engine; empty otherwise.
	EngineCrashLoop string
	// EngineCrashLoopSince is when the crash-looping engine last had a chance:
	// the later of the loader's end and the pod's last turn to not ready; zero
	// when neither is known.
	EngineCrashLoopSince time.Time
	// EngineLogWanted is true when the crash loop's last exit left no message:
	// the last line of the engine's log is then worth reading.
	EngineLogWanted bool
	// WarmupPending is true while the pod's warm-up gate (engine.warmup) is not
	// ready: the engine has not answered a completion yet, so the pod is not ready
	// even when the engine is. False for pods without the gate.
	WarmupPending bool
	// WarmupFailure explains a warm-up gate that exited without a completion
	// (within loading.timeout) and is run again; empty otherwise.
	WarmupFailure string
	// StartFailure explains a container that cannot start (an image that cannot be
	// pulled, a missing Secret key); empty otherwise.
	StartFailure string
	// ConfigError is the kubelet's message for a container it cannot configure
	// (waiting with CreateContainerConfigError), e.g. `secret "x" not found`;
	// empty otherwise.
	ConfigError string
	// AdapterAgent is true while the pod's adapter agent runs (spec.adapters
	// on an engine that loads them at run time).
	AdapterAgent bool
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

// observePods turns pods into views, oldest first and by name among pods of the
// same second, skipping pods being deleted. The order is total: the cache lists
// pods in no fixed order, and status names the first pod that explains a wait,
// so a partial order named a different pod on each pass, and each such write
// of status started the next pass (a storm of writes with hundreds of pending
// replicas).
func observePods(pods []corev1.Pod, templateHash string) []podView {
	var views []podView
	sorted := append([]corev1.Pod(nil), pods...)
	slices.SortFunc(sorted, func(a, b corev1.Pod) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time), strings.Compare(a.Name, b.Name))
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
		Current:   pod.Annotations[servingv1.AnnotationTemplateHash] == templateHash,
		Canary:    pod.Labels[servingv1.LabelTrack] == servingv1.TrackCanary,
		Scheduled: pod.Spec.NodeName != "",
		Serves:    servingv1.PodServes(pod),
		IP:        pod.Status.PodIP,
		Role:      pod.Labels[servingv1.LabelRole],
		Group:     pod.Labels[lwsv1.GroupIndexLabelKey],
	}
	for _, c := range pod.Status.Conditions {
		switch {
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable:
			v.Unschedulable, v.UnschedulableSince = c.Message, c.LastTransitionTime.Time
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue:
			v.Scheduled = true
		case c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue:
			v.Ready = true
		case c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse:
			v.EngineCrashLoopSince = c.LastTransitionTime.Time // until the loader's end, below
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && startFailureReasons[w.Reason] && v.StartFailure == "" {
			v.StartFailure = fmt.Sprintf("container %s: %s%s", cs.Name, w.Reason, suffix(w.Message))
		}
		if w := cs.State.Waiting; w != nil && w.Reason == "CreateContainerConfigError" && v.ConfigError == "" {
			v.ConfigError = w.Message
		}
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		switch cs.Name {
		case servingv1.LoaderContainerName:
			observeLoader(&v, cs)
		case servingv1.WarmupContainerName:
			observeWarmup(&v, cs)
		case servingv1.AdapterAgentContainerName:
			v.AdapterAgent = cs.State.Running != nil
		}
	}
	hasLoader := slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == servingv1.LoaderContainerName })
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != servingv1.EngineContainerName {
			continue
		}
		v.EngineReady = cs.Ready
		v.ImageVolumeDigest = imageVolumeDigest(cs)
		if !hasLoader && (cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil) {
			// An image volume: the model is there once the engine has started.
			v.LoaderDone = true
		}
		// Between two runs the kubelet shows CrashLoopBackOff; while the next run
		// starts, only the restart count and the last exit tell the loop.
		crashed := cs.RestartCount > 0 && !cs.Ready && cs.LastTerminationState.Terminated != nil
		if w := cs.State.Waiting; (w != nil && w.Reason == "CrashLoopBackOff") || crashed {
			v.EngineCrashLoop = fmt.Sprintf("engine container restarted %d times", cs.RestartCount)
			t := cs.LastTerminationState.Terminated
			if t != nil {
				v.EngineCrashLoop += fmt.Sprintf("; last exit code %d (%s)%s", t.ExitCode, t.Reason, suffix(t.Message))
			}
			v.EngineLogWanted = t == nil || strings.TrimSpace(t.Message) == ""
			if v.LoaderFinished.After(v.EngineCrashLoopSince) {
				v.EngineCrashLoopSince = v.LoaderFinished
			}
		} else {
			v.EngineCrashLoopSince = time.Time{}
		}
	}
	return v
}

// observeLoader reads the loader's runs. The kubelet numbers a container's runs:
// restartCount is the index of the latest one, whose state is current; the run
// before it is the last state. So failures are the earlier runs (all failed, or
// the init container would not have run again) plus the latest if it failed.
func observeLoader(v *podView, cs corev1.ContainerStatus) {
	state := cs.State
	latest := state.Terminated
	if state.Waiting != nil {
		// Waiting to run again: the latest run is the one that ended.
		latest = cs.LastTerminationState.Terminated
		if latest == nil {
			return // not started yet
		}
	}
	v.LoaderFailures = cs.RestartCount
	switch {
	case state.Running != nil:
		v.LoaderStarted = state.Running.StartedAt.Time
	case latest != nil && latest.ExitCode == 0:
		v.LoaderDone = true
		v.LoaderFinished = latest.FinishedAt.Time
		v.LoaderSummary = parseSummary(latest.Message)
		return
	case latest != nil:
		v.LoaderFailures++
	}
	if state.Running != nil {
		latest = cs.LastTerminationState.Terminated
	}
	if latest == nil || latest.ExitCode == 0 {
		return
	}
	v.LoaderLastFailure = loaderFailure(latest)
	if latest.ExitCode != loadspec.ExitHalted {
		return
	}
	// A refusal is no attempt: the pod's own record says how many runs failed
	// and how the last one did.
	if s := parseSummary(latest.Message); s != nil && s.Attempts != nil && s.Attempts.LastFailure != nil {
		f := s.Attempts.LastFailure
		v.LoaderFailures = int32(s.Attempts.Failed)
		v.LoaderLastFailure = &loaderExit{ExitCode: loadspec.ExitCodeOf(f.Reason), Reason: f.Reason, Message: f.Message, Finished: s.Attempts.LastTime}
	}
}

// observeWarmup reads the warm-up gate, a sidecar that the kubelet restarts
// whenever it exits: between two runs it waits in CrashLoopBackOff, and the run
// that ended, or the one before the current, holds its message.
func observeWarmup(v *podView, cs corev1.ContainerStatus) {
	if cs.Ready {
		return
	}
	v.WarmupPending = true
	exit := cs.State.Terminated
	failures := cs.RestartCount
	if exit != nil && exit.ExitCode != 0 {
		failures++
	} else {
		exit = cs.LastTerminationState.Terminated
	}
	if exit == nil || exit.ExitCode == 0 {
		return
	}
	v.WarmupFailure = fmt.Sprintf("warm-up gate exited %d times without a completion from the engine; last exit code %d (%s)%s",
		failures, exit.ExitCode, exit.Reason, suffix(exit.Message))
}

// loaderFailure reads a failed run: the loader's own report when it left one.
func loaderFailure(term *corev1.ContainerStateTerminated) *loaderExit {
	exit := &loaderExit{ExitCode: term.ExitCode, Reason: term.Reason, Message: term.Message, Finished: term.FinishedAt.Time}
	if s := parseSummary(term.Message); s != nil && s.Failure != nil {
		exit.Reason, exit.Message = s.Failure.Reason, s.Failure.Message
	}
	if exit.Reason == "" || exit.Reason == "Error" {
		exit.Reason = loadspec.ReasonTransient
		if !loadspec.IsRetryableExit(exit.ExitCode) {
			exit.Reason = "LoaderExit" + fmt.Sprint(exit.ExitCode)
		}
	}
	if strings.TrimSpace(exit.Message) == "" {
		// Killed before it could write its report (an OOM kill leaves none): say
		// what the kubelet saw rather than nothing.
		exit.Message = fmt.Sprintf("the model loader exited with code %d and left no report", term.ExitCode)
		if term.Reason == "OOMKilled" {
			exit.Message = fmt.Sprintf("the model loader was killed for exceeding its memory limit (exit code %d) and left no report", term.ExitCode)
		}
	}
	return exit
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

// observation is what one reconcile pass saw; the status is derived from it alone.
type observation struct {
	// sourceMode is how an oci model reaches the pods ("" for other sources).
	sourceMode servingv1.OCIMode
	// referenceProblem is set when a referenced PVC is missing or an API the
	// spec needs is not served. (A missing Secret shows in the pods: see
	// missingSecret.)
	referenceProblem *problem
	// nameConflict is set when a child's name is taken by an object the
	// AIInference does not control.
	nameConflict *problem
	// stepError is the error that stopped a step of this pass.
	stepError error
	// deployment is the observed Deployment; nil until it exists.
	deployment *appsv1.Deployment
	// canary is the observed canary Deployment of a canary rollout; nil when none.
	canary *appsv1.Deployment
	// rollout is the canary rollout's plan for this pass; nil with the Rolling
	// strategy, or when the pass could not plan it.
	rollout *rolloutPlan
	// autoscale is what the autoscaler saw; nil without spec.autoscaling.
	autoscale *autoscaleView
	// endpoint is the model Service's URL once it was applied in this pass.
	endpoint string
	// podsSeen is false when the pods could not be listed: what status says of
	// them is kept from the last pass.
	podsSeen bool
	// pods are the AIInference's pods, oldest first.
	pods []podView
	// childChanged is true when this pass wrote a child, so what was observed of the
	// children may describe the previous spec.
	childChanged bool
	// modelCache is status.modelCache from the nodes' reports; nil for a model
	// off the node cache or when the reports are not read.
	modelCache *servingv1.ModelCacheStatus
	// adapters is what the pods' adapter agents reported; nil when the step
	// did not run (no runtime adapters, or the pods were not seen).
	adapters *adapterView
}

// problem is a reason and a message a person can act on.
type problem struct {
	reason  string
	message string
}
