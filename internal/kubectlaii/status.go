package kubectlaii

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/internal/units"
)

// StatusReport is what `status` shows.
type StatusReport struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Phase       string `json:"phase"`
	Ready       string `json:"ready"`
	Model       string `json:"model"`
	Engine      string `json:"engine"`
	GPU         string `json:"gpu"`
	ModelLoaded bool   `json:"modelLoaded"`
	LoadRetries int32  `json:"loadRetries"`
	MaxRetries  int32  `json:"maxRetries"`
	// Source says where the model comes from and what it resolved to (a Hub
	// commit, an OCI digest), e.g. "hf://org/name@main, commit 0123abc...".
	Source      string                `json:"source,omitempty"`
	Conditions  []ConditionReport     `json:"conditions"`
	Replicas    []ReplicaReport       `json:"replicas"`
	LastLoad    *servingv1.LoadReport `json:"lastLoad,omitempty"`
	LastFailure *FailureReport        `json:"lastFailure,omitempty"`
	// Rollout is the canary rollout, as status.rollout holds it.
	Rollout *servingv1.RolloutStatus `json:"rollout,omitempty"`
	// Autoscaling is the autoscaler's view: its bounds and status.autoscaling.
	Autoscaling *AutoscalingReport `json:"autoscaling,omitempty"`
	// ModelCache is the node cache's copies of the model (cache.type Node).
	ModelCache *ModelCacheReport `json:"modelCache,omitempty"`
	// Routing is where the router sent the requests (spec.routing.enabled).
	Routing *RoutingReport `json:"routing,omitempty"`
	// Adapters are spec.adapters with what status says of each.
	Adapters []AdapterReport `json:"adapters,omitempty"`
	// Karmada is set when the object is a Karmada resource template (asked of
	// Karmada's API server): the members' parts, in place of pods.
	Karmada *KarmadaReport `json:"karmada,omitempty"`
}

// AdapterReport is one LoRA adapter: its source and revision, and the
// replicas that serve it.
type AdapterReport struct {
	Name     string `json:"name"`
	Source   string `json:"source"`
	Revision string `json:"revision,omitempty"`
	servingv1.AdapterStatus
}

// AutoscalingReport is the autoscaler's view.
type AutoscalingReport struct {
	MinReplicas int32 `json:"minReplicas"`
	MaxReplicas int32 `json:"maxReplicas"`
	servingv1.AutoscalingStatus
}

// ConditionReport is one condition.
type ConditionReport struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Since   string `json:"since"`
}

// ReplicaReport is one pod of the object.
type ReplicaReport struct {
	Pod string `json:"pod"`
	// Group is, for a replica that spans nodes, the pod's group and role
	// ("0/leader", "0/worker"); empty otherwise.
	Group string `json:"group,omitempty"`
	// Spec is "current" for pods of the current spec, "earlier" otherwise.
	Spec       string `json:"spec"`
	Node       string `json:"node,omitempty"`
	GPUProduct string `json:"gpuProduct,omitempty"`
	Ready      bool   `json:"ready"`
	Loader     string `json:"loader"`
	Warmup     string `json:"warmup,omitempty"`
	Engine     string `json:"engine"`
	// Progress is the loader's own report while it loads.
	Progress *loadspec.Progress `json:"progress,omitempty"`
}

// readProgress asks each running loader for its progress through the API
// server's pod proxy; a loader that does not answer (an older image, a node the
// API server cannot reach) keeps the container's state alone.
func (e *env) readProgress(v *view) {
	v.progress = map[string]*loadspec.Progress{}
	for i := range v.pods {
		p := &v.pods[i]
		cs := containerStatus(p, servingv1.LoaderContainerName)
		if cs == nil || cs.State.Running == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
		data, err := e.cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(loadspec.ProgressPort), loadspec.ProgressPath, nil).DoRaw(ctx)
		cancel()
		var prog loadspec.Progress
		if err == nil && json.Unmarshal(data, &prog) == nil {
			v.progress[p.Name] = &prog
		}
	}
}

// describeProgress is one line: bytes of total, percent, rate, ETA, files.
func describeProgress(p *loadspec.Progress) string {
	if p.Stage != "downloading" {
		return p.Stage
	}
	pct := 0.0
	if p.Total > 0 {
		pct = float64(p.Bytes) * 100 / float64(p.Total)
	}
	eta := "ETA unknown"
	if p.ETASeconds >= 0 {
		eta = "ETA " + (time.Duration(p.ETASeconds) * time.Second).String()
	}
	s := fmt.Sprintf("loading %s of %s (%.0f%%), %s/s, %s, %d/%d files", units.Bytes(p.Bytes), units.Bytes(p.Total), pct, units.Bytes(int64(p.RateBytesPerSecond)), eta, p.FilesDone, p.Files)
	if p.Retries > 0 || p.Stalls > 0 {
		s += fmt.Sprintf(", %d retried, %d stalled requests", p.Retries, p.Stalls)
	}
	return s
}

// FailureReport is status.lastFailure with what it means and what to do.
type FailureReport struct {
	servingv1.LoadFailure `json:",inline"`
	Meaning               string `json:"meaning"`
	Fix                   string `json:"fix"`
}

// view is what the API server holds about one AIInference.
type view struct {
	// progress is the loader's progress endpoint's answer, per loading pod.
	progress   map[string]*loadspec.Progress
	obj        *servingv1.AIInference
	deployment *appsv1.Deployment
	// groups is the LeaderWorkerSet of a model whose replica spans nodes.
	groups *lwsv1.LeaderWorkerSet
	pods   []corev1.Pod
	nodes  map[string]*corev1.Node
	// reports are the nodes' model cache reports, read for a model on the
	// node cache; reportsErr says why they could not be.
	reports    []nodecachespec.Report
	reportsErr error
}

func (e *env) load(name string) (*view, error) {
	obj, err := e.get(name)
	if err != nil {
		return nil, err
	}
	v := &view{obj: obj, nodes: map[string]*corev1.Node{}}
	d := &appsv1.Deployment{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.Name}, d); err == nil && metav1.IsControlledBy(d, obj) {
		v.deployment = d
	}
	if obj.SpansNodes() {
		groups := &lwsv1.LeaderWorkerSet{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: obj.Namespace, Name: obj.GroupSetName()}, groups); err == nil && metav1.IsControlledBy(groups, obj) {
			v.groups = groups
		}
	}
	pods := &corev1.PodList{}
	if err := e.c.List(e.ctx, pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name}); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	v.pods = pods.Items
	sort.Slice(v.pods, func(i, j int) bool { return v.pods[i].CreationTimestamp.Before(&v.pods[j].CreationTimestamp) })
	for _, p := range v.pods {
		if n := p.Spec.NodeName; n != "" && v.nodes[n] == nil {
			node := &corev1.Node{}
			if err := e.c.Get(e.ctx, client.ObjectKey{Name: n}, node); err == nil {
				v.nodes[n] = node
			}
		}
	}
	return v, nil
}

// current is true for a pod of the Deployment's current template.
func (v *view) current(p *corev1.Pod) bool {
	if v.deployment == nil {
		return true
	}
	return servingv1.PodRunsTemplate(p, &v.deployment.Spec.Template)
}

func (e *env) status(name string) error {
	v, err := e.load(name)
	if err != nil {
		return err
	}
	e.readProgress(v)
	if onNodeCache(v.obj) {
		v.reports, v.reportsErr = e.readNodeReports()
	}
	r := statusReport(v, time.Now())
	if v.deployment == nil && v.groups == nil && len(v.pods) == 0 {
		r.Karmada = e.readKarmada(v.obj)
	}
	if r.Karmada != nil && r.Ready == "" {
		// Karmada's aggregation sums the members' counts; the template's
		// spec.replicas is the whole.
		r.Ready = fmt.Sprintf("%d/%d", v.obj.Status.ReadyReplicas, ptr.Deref(v.obj.Spec.Replicas, 1))
	}
	if v.obj.RoutingEnabled() {
		r.Routing = e.readRouting(v.obj)
	}
	if done, err := e.printStructured("AIInferenceStatus", r); done {
		return err
	}
	writeStatus(e.out, r)
	return nil
}

func statusReport(v *view, now time.Time) StatusReport {
	obj := v.obj
	st := obj.Status
	r := StatusReport{
		Namespace: obj.Namespace, Name: obj.Name, Phase: string(st.Phase), Ready: st.Ready,
		Model: obj.Spec.Model.Name, Engine: string(obj.Spec.Engine.Type), GPU: st.GPU,
		ModelLoaded: st.ModelLoaded, LoadRetries: st.LoadRetries, MaxRetries: ptr.Deref(obj.Spec.Loading.MaxRetries, servingv1.DefaultMaxRetries), LastLoad: st.LastLoad,
		Rollout: st.Rollout, Source: sourceLine(obj),
	}
	if a := obj.Spec.Autoscaling; a != nil {
		r.Autoscaling = &AutoscalingReport{MinReplicas: a.Min(), MaxReplicas: a.MaxReplicas}
		if st.Autoscaling != nil {
			r.Autoscaling.AutoscalingStatus = *st.Autoscaling
		}
	}
	served := map[string]servingv1.AdapterStatus{}
	for _, a := range st.Adapters {
		served[a.Name] = a
	}
	for _, a := range obj.Spec.Adapters {
		as := served[a.Name]
		as.Name = a.Name
		r.Adapters = append(r.Adapters, AdapterReport{Name: a.Name, Source: adapterSource(a.Source), Revision: a.Revision, AdapterStatus: as})
	}
	for _, c := range st.Conditions {
		r.Conditions = append(r.Conditions, ConditionReport{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, Since: age(c.LastTransitionTime, now)})
	}
	for i := range v.pods {
		p := &v.pods[i]
		rep := ReplicaReport{Pod: p.Name, Spec: "earlier", Node: p.Spec.NodeName, Loader: "not started", Engine: "not started"}
		if v.current(p) {
			rep.Spec = "current"
		}
		if n := v.nodes[p.Spec.NodeName]; n != nil {
			rep.GPUProduct = n.Labels[servingv1.GPUProductLabel]
		}
		rep.Ready = servingv1.PodServes(p)
		if role := p.Labels[servingv1.LabelRole]; role != "" {
			rep.Group = p.Labels[lwsv1.GroupIndexLabelKey] + "/" + role
			if role == servingv1.RoleWorker {
				// A worker serves through its leader: ready is its pod's readiness.
				rep.Ready = podReady(p)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				rep.Node = "(unscheduled: " + c.Reason + ")"
			}
		}
		for _, cs := range p.Status.InitContainerStatuses {
			switch cs.Name {
			case servingv1.LoaderContainerName:
				rep.Loader = containerState(cs, now, true)
				if p := v.progress[rep.Pod]; p != nil && cs.State.Running != nil {
					rep.Loader = describeProgress(p)
					rep.Progress = p
				}
			case servingv1.WarmupContainerName:
				rep.Warmup = containerState(cs, now, false)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == servingv1.EngineContainerName {
				rep.Engine = containerState(cs, now, false)
			}
		}
		r.Replicas = append(r.Replicas, rep)
	}
	if onNodeCache(obj) {
		r.ModelCache = modelCacheReport(v, now)
	}
	if f := st.LastFailure; f != nil {
		x := reasons.Explain(f.Reason)
		r.LastFailure = &FailureReport{LoadFailure: *f, Meaning: x.Meaning, Fix: x.Fix}
	}
	return r
}

// containerState is one line on a container: running (ready), waiting (why),
// or exited (code, reason), with its restarts.
func containerState(cs corev1.ContainerStatus, now time.Time, loader bool) string {
	var s string
	switch st := cs.State; {
	case st.Running != nil:
		s = "running " + age(st.Running.StartedAt, now)
		if loader {
			s = "loading for " + age(st.Running.StartedAt, now)
		} else if cs.Ready {
			s += ", ready"
		} else {
			s += ", not ready"
		}
	case st.Terminated != nil && st.Terminated.ExitCode == 0 && loader:
		s = "loaded " + age(st.Terminated.FinishedAt, now) + " ago"
	case st.Terminated != nil:
		s = fmt.Sprintf("exited %d (%s) %s ago", st.Terminated.ExitCode, st.Terminated.Reason, age(st.Terminated.FinishedAt, now))
	case st.Waiting != nil:
		s = "waiting: " + st.Waiting.Reason
	default:
		s = "unknown"
	}
	if cs.RestartCount > 0 {
		s += fmt.Sprintf(", %d restarts", cs.RestartCount)
		if t := cs.LastTerminationState.Terminated; t != nil {
			s += fmt.Sprintf(" (last exit %d %s)", t.ExitCode, t.Reason)
		}
	}
	return s
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func writeStatus(out io.Writer, r StatusReport) {
	fmt.Fprintf(out, "AIInference %s/%s: %s, %s ready\n", r.Namespace, r.Name, r.Phase, r.Ready)
	if r.Karmada != nil {
		// The members' pods, loads and failures are theirs: Karmada's API server
		// holds only the aggregate and each member's reflected status.
		fmt.Fprintf(out, "Model %s on %s\n\n", r.Model, r.Engine)
		writeConditions(out, r.Conditions)
		fmt.Fprintln(out)
		writeKarmada(out, r.Karmada)
		return
	}
	fmt.Fprintf(out, "Model %s on %s, %s per replica; %d of %d retries spent\n", r.Model, r.Engine, r.GPU, r.LoadRetries, r.MaxRetries)
	if r.Source != "" {
		fmt.Fprintf(out, "Source %s\n", r.Source)
	}
	fmt.Fprintln(out)
	writeConditions(out, r.Conditions)
	fmt.Fprintln(out)
	if len(r.Replicas) == 0 {
		fmt.Fprintln(out, "No pods.")
	} else {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		groups := slices.ContainsFunc(r.Replicas, func(p ReplicaReport) bool { return p.Group != "" })
		group := func(p ReplicaReport) string {
			if !groups {
				return ""
			}
			return dash(p.Group) + "\t"
		}
		header := "POD\tSPEC\tNODE\tGPU\tREADY\tLOADER\tWARMUP\tENGINE"
		if groups {
			header = "POD\tGROUP\tSPEC\tNODE\tGPU\tREADY\tLOADER\tWARMUP\tENGINE"
		}
		fmt.Fprintln(tw, header)
		for _, p := range r.Replicas {
			fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%t\t%s\t%s\t%s\n", p.Pod, group(p), p.Spec, dash(p.Node), dash(p.GPUProduct), p.Ready, p.Loader, dash(p.Warmup), p.Engine)
		}
		_ = tw.Flush()
	}
	if l := r.LastLoad; l != nil {
		verified := "size-checked only"
		if l.Verified {
			verified = "verified"
		}
		how := fmt.Sprintf("%d files, %d bytes (%d fetched) in %s at %s, %s", l.Files, l.Bytes, l.BytesFetched, l.Duration.Duration, l.Throughput, verified)
		if l.CacheHit {
			how = fmt.Sprintf("%d files, %d bytes found complete in the cache", l.Files, l.Bytes)
		}
		fmt.Fprintf(out, "\nLast load: pod %s, %s\n", l.Pod, how)
	} else if r.ModelLoaded {
		fmt.Fprintln(out, "\nLast load: a replica loaded the model; the loader left no report")
	} else {
		fmt.Fprintln(out, "\nLast load: none yet")
	}
	if ro := r.Rollout; ro != nil && ro.CanaryRevision != "" {
		writeRollout(out, ro)
	}
	if a := r.Autoscaling; a != nil {
		writeAutoscaling(out, a)
	}
	if m := r.ModelCache; m != nil {
		writeModelCache(out, m)
	}
	if rt := r.Routing; rt != nil {
		writeRouting(out, rt)
	}
	if len(r.Adapters) > 0 {
		writeAdapters(out, r.Adapters)
	}
	if f := r.LastFailure; f != nil {
		fmt.Fprintf(out, "Last failure: %s on pod %s at %s", f.Reason, dash(f.Pod), f.Time.UTC().Format(time.RFC3339))
		if f.ExitCode != 0 {
			fmt.Fprintf(out, " (exit code %d)", f.ExitCode)
		}
		fmt.Fprintf(out, "\n  %s\n  Means: %s\n  Fix:   %s\n", strings.TrimSpace(f.Message), f.Meaning, dash(f.Fix))
	}
}

// writeConditions is the table of conditions.
func writeConditions(out io.Writer, conditions []ConditionReport) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONDITION\tSTATUS\tREASON\tSINCE\tMESSAGE")
	for _, c := range conditions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Since, c.Message)
	}
	_ = tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeRollout shows a canary rollout: where it is, the last analysis run's
// checks, and the last decisions.
func writeRollout(out io.Writer, ro *servingv1.RolloutStatus) {
	if ro.Phase == "" {
		// The canary was superseded (the spec went back to the stable revision, or
		// no stable replica was left to compare it with): no rollout runs, and its
		// step, weight and analysis describe nothing that is still there.
		fmt.Fprintf(out, "Canary rollout: none in progress; stable %s. The canary of revision %s was superseded\n",
			dash(ro.StableRevision), ro.CanaryRevision)
	} else {
		fmt.Fprintf(out, "Canary rollout: %s, step %d, canary weight %d%% (%s); stable %s, canary %s\n",
			ro.Phase, ro.Step+1, ro.Weight, dash(ro.TrafficSplit), dash(ro.StableRevision), ro.CanaryRevision)
	}
	if ro.Message != "" {
		fmt.Fprintf(out, "  %s\n", ro.Message)
	}
	if n := len(ro.Analysis); n > 0 && ro.Phase != "" {
		run := ro.Analysis[n-1]
		fmt.Fprintf(out, "  Last analysis run (%d of this step) at %s: %s\n", n, run.Time.UTC().Format(time.RFC3339), run.Verdict)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CHECK\tVERDICT\tVALUE\tTHRESHOLD\tSAMPLES\tMESSAGE")
		for _, c := range run.Checks {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", c.Name, c.Verdict, dash(c.Value), dash(c.Threshold), c.Samples, dash(c.Message))
		}
		_ = tw.Flush()
	}
	history := ro.History
	if len(history) > 5 {
		history = history[len(history)-5:]
	}
	for _, d := range history {
		fmt.Fprintf(out, "  %s %-15s step %d, weight %d%%: %s\n", d.Time.UTC().Format(time.RFC3339), d.Decision, d.Step+1, d.Weight, d.Message)
	}
	fmt.Fprintln(out)
}

// writeAutoscaling shows the autoscaler's count within its bounds, the
// readings behind its last change and its last decisions.
func writeAutoscaling(out io.Writer, a *AutoscalingReport) {
	fmt.Fprintf(out, "Autoscaling: %d replicas desired (min %d, max %d)", a.DesiredReplicas, a.MinReplicas, a.MaxReplicas)
	if a.LastScaleTime != nil {
		fmt.Fprintf(out, ", last change at %s", a.LastScaleTime.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(out)
	if len(a.Signals) > 0 {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SIGNAL\tPER REPLICA\tTARGET\tASKS FOR")
		for _, s := range a.Signals {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\n", s.Signal, s.PerReplica, s.Target, s.Replicas)
		}
		_ = tw.Flush()
	}
	decisions := a.Decisions
	if len(decisions) > 5 {
		decisions = decisions[len(decisions)-5:]
	}
	for _, d := range decisions {
		fmt.Fprintf(out, "  %s %-13s %d -> %d: %s\n", d.Time.UTC().Format(time.RFC3339), d.Reason, d.From, d.To, d.Message)
	}
	fmt.Fprintln(out)
}

// sourceLine names a Hub or OCI source and what status.source says it resolved
// to; "" for the other sources.
func sourceLine(obj *servingv1.AIInference) string {
	src, st := obj.Spec.Model.Source, obj.Status.Source
	var line string
	switch {
	case src.HuggingFace != nil:
		rev := src.HuggingFace.Revision
		if rev == "" {
			rev = "main"
		}
		line = "hf://" + src.HuggingFace.Repository + "@" + rev
	case src.OCI != nil:
		line = "oci://" + src.OCI.Reference
	default:
		return ""
	}
	switch {
	case st == nil || st.Revision+st.Digest == "":
		line += ", not resolved yet"
	case st.Revision != "":
		line += ", commit " + st.Revision
	default:
		line += ", digest " + st.Digest
	}
	if st != nil && st.Mode != "" {
		line += ", mode " + string(st.Mode)
	}
	return line
}

// adapterSource is where an adapter is fetched from, in one word.
func adapterSource(src servingv1.ModelSource) string {
	switch {
	case src.S3 != nil:
		return "s3://" + src.S3.Bucket + "/" + strings.TrimPrefix(src.S3.Prefix, "/")
	case src.PVC != nil:
		return "pvc://" + src.PVC.ClaimName + "/" + src.PVC.Path
	case src.HTTP != nil:
		return src.HTTP.URL
	case src.HuggingFace != nil:
		return "hf://" + src.HuggingFace.Repository
	case src.OCI != nil:
		return "oci://" + src.OCI.Reference
	}
	return "-"
}

// writeAdapters lists the LoRA adapters: the replicas that serve each, and
// its last failure.
func writeAdapters(out io.Writer, adapters []AdapterReport) {
	fmt.Fprintln(out, "\nAdapters:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADAPTER\tREVISION\tSOURCE\tSERVING\tPODS\tLAST FAILURE")
	for _, a := range adapters {
		failure := "-"
		if f := a.LastFailure; f != nil {
			retry := "not retried"
			if f.Retrying {
				retry = "retrying"
			}
			failure = fmt.Sprintf("%s on %s, attempt %d, %s: %s", f.Reason, f.Pod, f.Attempts, retry, f.Message)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", a.Name, dash(a.Revision), a.Source, a.ServingReplicas, dash(strings.Join(a.Pods, ",")), failure)
	}
	_ = tw.Flush()
}

// podReady is the pod's Ready condition.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
