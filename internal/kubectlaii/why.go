package kubectlaii

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/reasons"
)

// WhyReport is what `why` shows: from the AIInference, link by link, to what
// keeps it from Ready, then what that means and what to do.
type WhyReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Ready     bool   `json:"ready"`
	Reason    string `json:"reason"`
	Message   string `json:"message"`
	Chain     []Link `json:"chain"`
	Meaning   string `json:"meaning"`
	Fix       string `json:"fix"`
}

// Link is one object on the way: a child, a container, an event, a node count.
type Link struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Detail string `json:"detail"`
}

func (e *env) why(name string) error {
	v, err := e.load(name)
	if err != nil {
		return err
	}
	r, err := e.whyReport(v)
	if err != nil {
		return err
	}
	if done, err := e.printStructured("AIInferenceWhy", r); done {
		return err
	}
	writeWhy(e.out, r)
	return nil
}

func (e *env) whyReport(v *view) (WhyReport, error) {
	obj := v.obj
	r := WhyReport{Namespace: obj.Namespace, Name: obj.Name, Phase: string(obj.Status.Phase)}
	ready := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady)
	if ready == nil {
		r.Reason, r.Message = "NotObserved", "The operator has not written a status yet"
		r.Meaning = "No operator has reconciled this object (yet)."
		r.Fix = "Check that the operator runs: kubectl -n aiinference-system get pods -l app.kubernetes.io/name=aiinference-operator"
		return r, nil
	}
	r.Reason, r.Message = ready.Reason, ready.Message
	if obj.Status.ReadyFor(obj.Generation) != nil {
		r.Ready = true
		x := reasons.Explain(ready.Reason)
		r.Meaning, r.Fix = x.Meaning, "Nothing: it serves."
		return r, nil
	}
	if ready.ObservedGeneration != obj.Generation {
		r.Chain = append(r.Chain, Link{"AIInference", obj.Name, fmt.Sprintf("status is of generation %d, the spec is at %d: the operator has not seen the change yet", ready.ObservedGeneration, obj.Generation)})
	}
	x := reasons.Explain(ready.Reason)
	r.Meaning, r.Fix = x.Meaning, x.Fix

	var err error
	switch ready.Reason {
	case servingv1.ReasonSecretNotFound, servingv1.ReasonSecretKeyMissing:
		err = e.secretLinks(v, &r)
	case servingv1.ReasonPVCNotFound:
		err = e.pvcLinks(v, &r)
	case servingv1.ReasonNameConflict:
		err = e.conflictLinks(v, &r)
	case servingv1.ReasonReconcileError:
		r.Chain = append(r.Chain, Link{"APIServer", "", strings.TrimPrefix(ready.Message, "The operator could not bring the children in line with the spec, and retries with back-off: ")})
	case servingv1.ReasonPodCreateFailed:
		err = e.createFailureLinks(v, &r)
	case servingv1.ReasonLoadFailed, servingv1.ReasonRetriesExhausted, servingv1.ReasonRetryingLoad, servingv1.ReasonLoadTimeout:
		err = e.loadFailureLinks(v, &r)
	default:
		if ready.Reason == servingv1.ReasonProgressDeadlineExceeded && v.deployment != nil {
			for _, c := range v.deployment.Status.Conditions {
				if c.Type == appsv1.DeploymentProgressing {
					r.Chain = append(r.Chain, Link{"Deployment", v.deployment.Name, fmt.Sprintf("Progressing=%s %s: %s", c.Status, c.Reason, c.Message)})
				}
			}
		}
		err = e.podLinks(v, &r, ready.Reason)
	}
	return r, err
}

func (e *env) secretLinks(v *view, r *WhyReport) error {
	src := v.obj.Spec.Model.Source
	var name, field string
	switch {
	case src.S3 != nil && src.S3.CredentialsSecretRef != nil:
		name, field = src.S3.CredentialsSecretRef.Name, "spec.model.source.s3.credentialsSecretRef"
	case src.HTTP != nil && src.HTTP.BearerTokenSecretRef != nil:
		name, field = src.HTTP.BearerTokenSecretRef.Name, "spec.model.source.http.bearerTokenSecretRef"
	default:
		return nil
	}
	s := &corev1.Secret{}
	err := e.c.Get(e.ctx, client.ObjectKey{Namespace: v.obj.Namespace, Name: name}, s)
	switch {
	case apierrors.IsNotFound(err):
		r.Chain = append(r.Chain, Link{"Secret", name, "named in " + field + ", does not exist in namespace " + v.obj.Namespace})
	case apierrors.IsForbidden(err):
		r.Chain = append(r.Chain, Link{"Secret", name, "named in " + field + " (you may not read it: " + r.Message + ")"})
	case err != nil:
		return err
	default:
		keys := make([]string, 0, len(s.Data))
		for k := range s.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		r.Chain = append(r.Chain, Link{"Secret", name, fmt.Sprintf("named in %s, has the keys %v; %s", field, keys, r.Message)})
	}
	return nil
}

func (e *env) pvcLinks(v *view, r *WhyReport) error {
	var claims []string
	if p := v.obj.Spec.Model.Source.PVC; p != nil {
		claims = append(claims, p.ClaimName+" (spec.model.source.pvc.claimName)")
	}
	if c := v.obj.Spec.Cache; c != nil && c.PVC != nil && c.PVC.ClaimName != "" {
		claims = append(claims, c.PVC.ClaimName+" (spec.cache.pvc.claimName)")
	}
	for _, c := range claims {
		name, _, _ := strings.Cut(c, " ")
		err := e.c.Get(e.ctx, client.ObjectKey{Namespace: v.obj.Namespace, Name: name}, &corev1.PersistentVolumeClaim{})
		switch {
		case apierrors.IsNotFound(err):
			r.Chain = append(r.Chain, Link{"PersistentVolumeClaim", name, "named in " + strings.Trim(strings.TrimPrefix(c, name), " ()") + ", does not exist"})
		case err != nil && !apierrors.IsForbidden(err):
			return err
		}
	}
	return nil
}

func (e *env) conflictLinks(v *view, r *WhyReport) error {
	for _, child := range aiinference.Children(v.obj) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(child.Object), child.Object)
		if err != nil {
			// A kind the cluster does not serve, or the user may not read, holds no conflict to show.
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || meta.IsNoMatchError(err) || runtime.IsNotRegisteredError(err) {
				continue
			}
			return err
		}
		if metav1.IsControlledBy(child.Object, v.obj) {
			continue
		}
		owner := "no controller"
		if ref := metav1.GetControllerOf(child.Object); ref != nil {
			owner = "controlled by " + ref.Kind + " " + ref.Name
		}
		r.Chain = append(r.Chain, Link{child.Kind, child.Object.GetName(), "exists with " + owner + "; the operator will not adopt it"})
	}
	return nil
}

func (e *env) createFailureLinks(v *view, r *WhyReport) error {
	d := v.deployment
	if d == nil {
		return nil
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			r.Chain = append(r.Chain, Link{"Deployment", d.Name, "ReplicaFailure " + c.Reason + ": " + c.Message})
		}
	}
	rss := &appsv1.ReplicaSetList{}
	if err := e.c.List(e.ctx, rss, client.InNamespace(d.Namespace), client.MatchingLabels{servingv1.LabelInference: v.obj.Name}); err != nil {
		return err
	}
	for i := range rss.Items {
		rs := &rss.Items[i]
		if !metav1.IsControlledBy(rs, d) || rs.Annotations["deployment.kubernetes.io/revision"] != d.Annotations["deployment.kubernetes.io/revision"] {
			continue
		}
		r.Chain = append(r.Chain, Link{"ReplicaSet", rs.Name, fmt.Sprintf("%d of %d pods created", rs.Status.Replicas, ptrOr(rs.Spec.Replicas))})
		if ev := e.lastWarning("ReplicaSet", rs.Name, v.obj.Namespace); ev != nil {
			r.Chain = append(r.Chain, *ev)
		}
	}
	return nil
}

func (e *env) loadFailureLinks(v *view, r *WhyReport) error {
	f := v.obj.Status.LastFailure
	if f == nil {
		return e.podLinks(v, r, r.Reason)
	}
	if pod := v.pod(f.Pod); pod != nil {
		r.Chain = append(r.Chain, podLink(v, pod))
		if cs := containerStatus(pod, servingv1.LoaderContainerName); cs != nil {
			r.Chain = append(r.Chain, Link{"Container", servingv1.LoaderContainerName, containerState(*cs, time.Now(), true)})
		}
	} else if f.Pod != "" {
		r.Chain = append(r.Chain, Link{"Pod", f.Pod, "gone (replaced)"})
	}
	detail := fmt.Sprintf("%s: %s", f.Reason, strings.TrimSpace(f.Message))
	if f.ExitCode != 0 {
		detail += fmt.Sprintf(" (exit code %d)", f.ExitCode)
	}
	r.Chain = append(r.Chain, Link{"LoadFailure", f.Reason, detail})
	x := reasons.Explain(f.Reason)
	r.Meaning += " The last load failed with " + f.Reason + ": " + x.Meaning
	if r.Reason == servingv1.ReasonRetryingLoad {
		r.Fix = x.Fix
	} else {
		r.Fix = x.Fix
		if !strings.Contains(x.Fix, servingv1.AnnotationRequestedAt) {
			r.Fix += " Then retry: kubectl annotate aii/" + v.obj.Name + " " + servingv1.AnnotationRequestedAt + `="$(date -Is)" --overwrite`
		}
	}
	return nil
}

// podLinks explains a reason that lives on a pod: the pod the status names, or the
// first current pod that is not ready, its blocking container, its last warning.
func (e *env) podLinks(v *view, r *WhyReport, reason string) error {
	pod := v.blockingPod(reason)
	if pod == nil {
		if len(v.pods) == 0 {
			r.Chain = append(r.Chain, v.workloadLink())
		}
		return nil
	}
	if v.deployment != nil || v.groups != nil {
		r.Chain = append(r.Chain, v.workloadLink())
	}
	if v.groups != nil {
		r.Chain = append(r.Chain, v.groupLink(pod))
	}
	r.Chain = append(r.Chain, podLink(v, pod))
	now := time.Now()
	container := ""
	switch reason {
	case servingv1.ReasonUnschedulable, servingv1.ReasonPodsPending:
		if link, err := e.gpuCapacity(v); err != nil {
			return err
		} else if link != nil {
			r.Chain = append(r.Chain, *link)
		}
	case servingv1.ReasonLoading:
		container = servingv1.LoaderContainerName
	case servingv1.ReasonWarmupFailed, servingv1.ReasonWarmingUp:
		container = servingv1.WarmupContainerName
	case servingv1.ReasonEngineCrashLooping, servingv1.ReasonEngineStarting:
		container = servingv1.EngineContainerName
	case servingv1.ReasonPodStartFailed:
		for _, cs := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
				r.Chain = append(r.Chain, Link{"Container", cs.Name, fmt.Sprintf("waiting: %s: %s", w.Reason, w.Message)})
				break
			}
		}
	}
	if container != "" {
		if cs := containerStatus(pod, container); cs != nil {
			detail := containerState(*cs, now, container == servingv1.LoaderContainerName)
			if t := cs.LastTerminationState.Terminated; t != nil && strings.TrimSpace(t.Message) != "" {
				detail += ": " + strings.TrimSpace(t.Message)
			}
			r.Chain = append(r.Chain, Link{"Container", container, detail})
		}
	}
	if ev := e.lastWarning("Pod", pod.Name, pod.Namespace); ev != nil {
		r.Chain = append(r.Chain, *ev)
	}
	return nil
}

// blockingPod is the pod the Ready condition's reason is about.
func (v *view) blockingPod(reason string) *corev1.Pod {
	if f := v.obj.Status.LastFailure; f != nil && f.Reason == reason {
		if p := v.pod(f.Pod); p != nil {
			return p
		}
	}
	if f := v.obj.Status.LastFailure; f != nil {
		if p := v.pod(f.Pod); p != nil && !servingv1.PodServes(p) && strings.Contains(v.readyMessage(), f.Pod) {
			return p
		}
	}
	for i := range v.pods {
		p := &v.pods[i]
		if v.current(p) && blocks(p) && strings.Contains(v.readyMessage(), p.Name) {
			return p
		}
	}
	for i := range v.pods {
		p := &v.pods[i]
		if v.current(p) && blocks(p) {
			return p
		}
	}
	return nil
}

// blocks is true for a pod that keeps its replica from serving: one that does
// not serve, or a multi-node replica's worker that is not ready (a worker
// never serves itself: its leader does).
func blocks(p *corev1.Pod) bool {
	if p.Labels[servingv1.LabelRole] == servingv1.RoleWorker {
		return !podReady(p)
	}
	return !servingv1.PodServes(p)
}

// workloadLink is the replicas' workload: the Deployment, or for a replica
// that spans nodes the LeaderWorkerSet whose groups are the replicas.
func (v *view) workloadLink() Link {
	if g := v.groups; g != nil {
		size := ptrOr(g.Spec.LeaderWorkerTemplate.Size)
		return Link{"LeaderWorkerSet", g.Name, fmt.Sprintf("%d groups of %d pods (a leader and %d worker(s), each on its own node), %d ready",
			ptrOr(g.Spec.Replicas), size, size-1, v.obj.Status.ReadyReplicas)}
	}
	if v.obj.SpansNodes() {
		return Link{"LeaderWorkerSet", v.obj.GroupSetName(), "not created yet"}
	}
	name := v.obj.Name
	if v.deployment != nil {
		name = v.deployment.Name
	}
	return Link{"Deployment", name, deploymentSummary(v.deployment)}
}

// groupLink is the group of a multi-node replica's pod: its members and which
// of them serve or run ready.
func (v *view) groupLink(pod *corev1.Pod) Link {
	index := pod.Labels[lwsv1.GroupIndexLabelKey]
	var leader string
	var workers, readyWorkers int
	for i := range v.pods {
		p := &v.pods[i]
		if p.Labels[lwsv1.GroupIndexLabelKey] != index || p.DeletionTimestamp != nil {
			continue
		}
		if p.Labels[servingv1.LabelRole] == servingv1.RoleWorker {
			workers++
			if podReady(p) {
				readyWorkers++
			}
			continue
		}
		leader = fmt.Sprintf("leader %s does not serve yet", p.Name)
		if servingv1.PodServes(p) {
			leader = fmt.Sprintf("leader %s serves", p.Name)
		}
	}
	if leader == "" {
		leader = "no leader pod"
	}
	want := 0
	if v.groups != nil {
		want = int(ptrOr(v.groups.Spec.LeaderWorkerTemplate.Size)) - 1
	}
	return Link{"Group", index, fmt.Sprintf("%s; %d of %d worker(s) ready (%d made); %s blocks it", leader, readyWorkers, want, workers, pod.Name)}
}

func (v *view) readyMessage() string {
	if c := meta.FindStatusCondition(v.obj.Status.Conditions, servingv1.ConditionReady); c != nil {
		return c.Message
	}
	return ""
}

func (v *view) pod(name string) *corev1.Pod {
	for i := range v.pods {
		if v.pods[i].Name == name {
			return &v.pods[i]
		}
	}
	return nil
}

func podLink(v *view, p *corev1.Pod) Link {
	where := "not scheduled"
	if p.Spec.NodeName != "" {
		where = "on node " + p.Spec.NodeName
		if n := v.nodes[p.Spec.NodeName]; n != nil && n.Labels[servingv1.GPUProductLabel] != "" {
			where += " (" + n.Labels[servingv1.GPUProductLabel] + ")"
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			where = fmt.Sprintf("not scheduled: %s: %s", c.Reason, c.Message)
		}
	}
	return Link{"Pod", p.Name, fmt.Sprintf("%s, %s", p.Status.Phase, where)}
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func deploymentSummary(d *appsv1.Deployment) string {
	if d == nil {
		return "not created yet"
	}
	return fmt.Sprintf("%d replicas, %d updated, %d ready, %d available", d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas)
}

func ptrOr(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// lastWarning is the newest Warning event about an object, as a link.
func (e *env) lastWarning(kind, name, namespace string) *Link {
	events, err := e.cs.CoreV1().Events(namespace).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": kind, "involvedObject.name": name, "type": corev1.EventTypeWarning}.String()})
	if err != nil || len(events.Items) == 0 {
		return nil
	}
	sort.Slice(events.Items, func(i, j int) bool { return lastSeen(events.Items[i]).Before(lastSeen(events.Items[j])) })
	ev := events.Items[len(events.Items)-1]
	detail := fmt.Sprintf("Warning %s: %s", ev.Reason, strings.TrimSpace(ev.Message)) + timesSeen(ev)
	return &Link{"Event", ev.Source.Component + ev.ReportingController, detail}
}

// lastSeen is when ev last happened: an events.k8s.io series' last sighting,
// or its one time.
func lastSeen(ev corev1.Event) time.Time {
	if ev.Series != nil && !ev.Series.LastObservedTime.IsZero() {
		return ev.Series.LastObservedTime.Time
	}
	return eventTime(ev)
}

// timesSeen is " (xN)" for an event seen N > 1 times, counted in its series
// (events.k8s.io) or its count (core/v1), else "".
func timesSeen(ev corev1.Event) string {
	n := ev.Count
	if ev.Series != nil && ev.Series.Count > n {
		n = ev.Series.Count
	}
	if n > 1 {
		return fmt.Sprintf(" (x%d)", n)
	}
	return ""
}

// eventTime is when ev (first) happened.
func eventTime(ev corev1.Event) time.Time {
	switch {
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	}
	return ev.CreationTimestamp.Time
}

// gpuCapacity counts the nodes with an accepted GPU product and their free GPUs.
func (e *env) gpuCapacity(v *view) (*Link, error) {
	gpu := v.obj.Spec.GPU
	if len(gpu.Products) == 0 {
		return nil, nil
	}
	nodes := &corev1.NodeList{}
	if err := e.c.List(e.ctx, nodes); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, nil
		}
		return nil, err
	}
	accepted := map[string]bool{}
	for _, p := range gpu.Products {
		accepted[p] = true
	}
	type tally struct{ nodes, gpus, free, fit int64 }
	per := map[string]*tally{}
	for _, p := range gpu.Products {
		per[p] = &tally{}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		product := n.Labels[servingv1.GPUProductLabel]
		if !accepted[product] {
			continue
		}
		alloc := n.Status.Allocatable[servingv1.GPUResource]
		used, err := e.gpusInUse(n.Name)
		if err != nil {
			return nil, err
		}
		t := per[product]
		t.nodes++
		t.gpus += alloc.Value()
		free := alloc.Value() - used
		if free < 0 {
			free = 0
		}
		t.free += free
		if free >= int64(gpu.Count) {
			t.fit++
		}
	}
	var parts []string
	for _, p := range gpu.Products {
		t := per[p]
		parts = append(parts, fmt.Sprintf("%s: %d nodes, %d GPUs, %d free, %d nodes with %d free", p, t.nodes, t.gpus, t.free, t.fit, gpu.Count))
	}
	return &Link{"Nodes", servingv1.GPUProductLabel, fmt.Sprintf("each replica needs %d GPUs of %s; %s", gpu.Count, strings.Join(gpu.Products, " or "), strings.Join(parts, "; "))}, nil
}

// gpusInUse sums the GPUs requested by the pods bound to a node that still run.
func (e *env) gpusInUse(node string) (int64, error) {
	pods, err := e.cs.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			q := c.Resources.Requests[servingv1.GPUResource]
			n += q.Value()
		}
	}
	return n, nil
}

func writeWhy(out io.Writer, r WhyReport) {
	state := "is not Ready"
	if r.Ready {
		state = "is Ready"
	}
	fmt.Fprintf(out, "AIInference %s/%s %s (phase %s, reason %s)\n  %s\n", r.Namespace, r.Name, state, dash(r.Phase), r.Reason, r.Message)
	indent := "  "
	for _, l := range r.Chain {
		name := l.Kind
		if l.Name != "" {
			name += " " + l.Name
		}
		fmt.Fprintf(out, "%s└─ %s: %s\n", indent, name, l.Detail)
		indent += "   "
	}
	fmt.Fprintf(out, "\nWhat it means: %s\nWhat to do:    %s\n", r.Meaning, dash(r.Fix))
}
