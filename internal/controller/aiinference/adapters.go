package aiinference

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

// LoRA adapters (spec.adapters). Their files go into the cache volume's
// adapter folder, one folder per adapter source and revision, fetched by the
// model loader (verified and resumable like the model, and so on the node's
// cache with the model for cache.type Node, where the folder is inside the
// model's copy).
//
// An engine that loads them at run time (vLLM) gets the adapter agent, a
// sidecar that fetches and loads each adapter of its set; the set is in the
// loader ConfigMap (not in the pod template, so a change rolls no pod) for the
// pods that start, and each pass puts it to the agents of the running pods
// and reads where each adapter stands. An engine that takes them only at start
// (TGI) is started with them: its loader fetches them after the model, and a
// change is a rolling update.

// adapterPassRequeue is how soon a pass looks again while an adapter is being
// fetched or loaded, or an agent could not be reached.
const adapterPassRequeue = 2 * time.Second

// agentCallTimeout bounds one call to a pod's agent.
const agentCallTimeout = 3 * time.Second

// maxAdapterPods bounds status.adapters[].pods.
const maxAdapterPods = 32

// agentClient calls the adapter agents: a pod's address answers whatever runs
// in the pod, so the calls follow no redirect, use no proxy, carry no
// credential of the operator's, and read a bounded answer within a bounded time.
var agentClient = &http.Client{
	Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true, ResponseHeaderTimeout: agentCallTimeout},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       agentCallTimeout,
}

// adapterLoading is how obj's engine takes adapters.
func adapterLoading(obj *servingv1.AIInference) engine.AdapterLoading {
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		return engine.AdaptersUnsupported
	}
	return eng.AdapterLoading()
}

// runtimeAdapters is true when obj's pods run the adapter agent.
func runtimeAdapters(obj *servingv1.AIInference) bool {
	return len(obj.Spec.Adapters) > 0 && adapterLoading(obj) == engine.AdaptersAtRunTime
}

// adapterDir is the adapter's folder in the pod: named after the adapter, and
// keyed by what it is fetched from, so that a new source or revision goes to a
// new folder and the engine never reads one half replaced.
func adapterDir(a servingv1.AdapterSpec) string {
	var from loadspec.Config
	setSource(&from, a.Source)
	key := hashOf(from.Source, from.S3, from.HuggingFace, from.OCI, a.Revision, a.SHA256Manifest)[:12]
	return path.Join(cacheMountPath, loadspec.AdaptersDir, unsafePathChars.ReplaceAllString(a.Name, "_")+"-"+key)
}

// adapterConfig is the loader configuration of one adapter's files. The pod
// holds the model's credentials only: an adapter whose source names the same
// Secret uses them, any other is fetched anonymously (admission refuses an
// adapter naming another Secret), so that the model's keys never go elsewhere.
func adapterConfig(obj *servingv1.AIInference, a servingv1.AdapterSpec) loadspec.Config {
	cfg := loadspec.Config{
		Dest:           adapterDir(a),
		Timeout:        loadspec.Duration{Duration: obj.LoadTimeout()},
		SHA256Manifest: a.SHA256Manifest,
		Fsync:          cacheOutlivesPod(obj),
		Anonymous:      !obj.Spec.Model.Source.SameCredentials(a.Source),
	}
	setSource(&cfg, a.Source)
	return cfg
}

// adapterSet is the set the agents serve: every adapter, and the model's
// retry bound and back-off.
func adapterSet(obj *servingv1.AIInference) loadspec.AdapterSet {
	set := loadspec.AdapterSet{
		MaxAttempts: int(obj.MaxRetries()) + 1,
		Backoff:     loadspec.Duration{Duration: obj.Backoff()},
		Adapters:    make([]loadspec.Adapter, 0, len(obj.Spec.Adapters)),
	}
	for _, a := range obj.Spec.Adapters {
		set.Adapters = append(set.Adapters, loadspec.Adapter{Name: a.Name, Load: adapterConfig(obj, a)})
	}
	set.Revision = hashOf(set)
	return set
}

// startAdapters are the adapters of an engine that takes them only at start:
// the loader fetches them after the model.
func startAdapters(obj *servingv1.AIInference) []loadspec.Adapter {
	if adapterLoading(obj) != engine.AdaptersAtStart {
		return nil
	}
	return adapterSet(obj).Adapters
}

// engineAdapters are the adapters' names and folders, for the engine's start.
func engineAdapters(obj *servingv1.AIInference) []engine.Adapter {
	var out []engine.Adapter
	for _, a := range obj.Spec.Adapters {
		out = append(out, engine.Adapter{Name: a.Name, Path: adapterDir(a)})
	}
	return out
}

// adapterSetData is the loader ConfigMap's entry of the adapter set, for an
// engine that loads adapters at run time; nil otherwise.
func adapterSetData(obj *servingv1.AIInference) (map[string]string, error) {
	if !runtimeAdapters(obj) {
		return nil, nil
	}
	data, err := json.MarshalIndent(adapterSet(obj), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the adapter set: %w", err)
	}
	return map[string]string{loadspec.AdaptersFileName: string(data)}, nil
}

// adapterToken is the object's agent token: only a caller that knows it may
// change what a pod's agent fetches and loads. It is derived from the
// object's UID, which only those who may read the object learn, and stays the
// same for the object's life, so the pod template never changes with it.
func adapterToken(obj *servingv1.AIInference) string {
	h := sha256.Sum256([]byte("adapter-agent\x00" + string(obj.UID)))
	return hex.EncodeToString(h[:])
}

// adapterAgentContainer is the agent: a native sidecar after the loader, from
// the loader's image, with the loader's credentials and a writable cache.
func adapterAgentContainer(obj *servingv1.AIInference, eng engine.Engine, opts Options) corev1.Container {
	return corev1.Container{
		Name:  servingv1.AdapterAgentContainerName,
		Image: opts.LoaderImage,
		Args: []string{"adapters",
			"--engine-url", fmt.Sprintf("http://127.0.0.1:%d", enginePort(obj, eng)),
			"--set", path.Join(loadspec.ConfigMountDir, loadspec.AdaptersFileName),
			"--adapters-dir", path.Join(cacheMountPath, loadspec.AdaptersDir),
			"--listen", fmt.Sprintf(":%d", loadspec.AdapterAgentPort),
		},
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Env:           append(loaderEnv(obj), corev1.EnvVar{Name: loadspec.EnvAdapterToken, Value: adapterToken(obj)}),
		Ports:         []corev1.ContainerPort{{Name: loadspec.AdapterAgentPortName, ContainerPort: loadspec.AdapterAgentPort, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: loadspec.AdapterReadyPath, Port: intstr.FromString(loadspec.AdapterAgentPortName)}},
			PeriodSeconds: 2, TimeoutSeconds: 2, FailureThreshold: 3,
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: cacheVolume, MountPath: cacheMountPath},
			{Name: configVolume, MountPath: loadspec.ConfigMountDir, ReadOnly: true},
		},
		SecurityContext: restrictedSecurityContext(),
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			// As the loader's: files written to an in-memory cache count here.
			Limits: corev1.ResourceList{corev1.ResourceMemory: loaderMemoryLimit(obj)},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// adapterView is what the adapter step learnt from the pods' agents.
type adapterView struct {
	// reports are the agents' reports by pod name.
	reports map[string]loadspec.AdapterReport
	// unreachable names a pod whose agent could not be reached, and why.
	unreachable *problem
	// pending is true while an adapter is being fetched or loaded somewhere.
	pending bool
}

// syncAdapters puts the current set to every running agent that lacks it
// and reads where each adapter stands, for all pods at once.
func (r *Reconciler) syncAdapters(ctx context.Context, s *scope) {
	if !runtimeAdapters(s.obj) {
		return
	}
	set := adapterSet(s.obj)
	body, err := json.Marshal(set)
	if err != nil {
		return
	}
	token := adapterToken(s.obj)
	view := &adapterView{reports: map[string]loadspec.AdapterReport{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range s.obs.pods {
		if !p.AdapterAgent || p.IP == "" {
			continue
		}
		wg.Go(func() {
			url := "http://" + net.JoinHostPort(p.IP, strconv.Itoa(loadspec.AdapterAgentPort)) + loadspec.AdaptersPath
			report, err := callAgent(ctx, http.MethodGet, url, nil, "")
			if err == nil && report.Revision != set.Revision {
				ctrl.LoggerFrom(ctx).Info("Putting the adapter set to the pod's agent", "pod", klog.KRef(s.obj.Namespace, p.Name), "revision", set.Revision)
				report, err = callAgent(ctx, http.MethodPut, url, body, token)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if view.unreachable == nil {
					view.unreachable = &problem{servingv1.ReasonAdaptersUnreachable, fmt.Sprintf("cannot reach the adapter agent of pod %s: %v; retried", p.Name, err)}
				}
				return
			}
			view.reports[p.Name] = report
		})
	}
	wg.Wait()
	for _, rep := range view.reports {
		for _, a := range rep.Adapters {
			if a.State == string(servingv1.AdapterFetching) || a.State == string(servingv1.AdapterLoading) {
				view.pending = true
			}
		}
	}
	s.obs.adapters = view
}

// callAgent sends one request to a pod's agent and reads its report.
func callAgent(ctx context.Context, method, url string, body []byte, token string) (loadspec.AdapterReport, error) {
	var report loadspec.AdapterReport
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return report, err
	}
	if token != "" {
		req.Header.Set(loadspec.AdapterTokenHeader, token)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := agentClient.Do(req)
	if err != nil {
		return report, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, loadspec.MaxAdapterSetBytes+1))
	switch {
	case err != nil:
		return report, err
	case len(data) > loadspec.MaxAdapterSetBytes:
		return report, fmt.Errorf("the answer is larger than %d bytes", loadspec.MaxAdapterSetBytes)
	case resp.StatusCode != http.StatusOK:
		return report, fmt.Errorf("%s answered %d%s", method, resp.StatusCode, suffix(string(data)))
	}
	if err := json.Unmarshal(data, &report); err != nil {
		return report, fmt.Errorf("reading the agent's report: %w", err)
	}
	return report, nil
}

// adapterRequeue is how soon the adapters want a look again; 0 when nothing waits.
func (v *adapterView) requeue() time.Duration {
	if v != nil && (v.pending || v.unreachable != nil) {
		return adapterPassRequeue
	}
	return 0
}

// setAdapterStatus writes status.adapters and the AdaptersReady condition.
// Pods that serve count: a replica serves an adapter when it is ready and
// its engine has the adapter loaded (at run time, per its agent's report; at
// start, when it runs the current spec).
func setAdapterStatus(st *servingv1.AIInferenceStatus, obj *servingv1.AIInference, obs observation, now time.Time) {
	if len(obj.Spec.Adapters) == 0 {
		st.Adapters = nil
		meta.RemoveStatusCondition(&st.Conditions, servingv1.ConditionAdaptersReady)
		return
	}
	if !obs.podsSeen {
		return
	}
	runtime := runtimeAdapters(obj)
	if runtime && obs.adapters == nil {
		return // the step did not run: keep what the last pass said
	}
	prev := map[string]servingv1.AdapterStatus{}
	for _, a := range st.Adapters {
		prev[a.Name] = a
	}
	serving := 0
	for _, p := range obs.pods {
		if p.Serves {
			serving++
		}
	}
	var out []servingv1.AdapterStatus
	allServe, anyFailed, anyPending := true, false, false
	var failed *servingv1.AdapterStatus
	for _, spec := range obj.Spec.Adapters {
		as := servingv1.AdapterStatus{Name: spec.Name, LastFailure: prev[spec.Name].LastFailure}
		for _, p := range obs.pods {
			if !p.Serves {
				continue
			}
			if !runtime {
				if p.Current {
					as.ServingReplicas++
					as.Pods = appendPod(as.Pods, p.Name)
				}
				continue
			}
			rep, ok := obs.adapters.reports[p.Name]
			if !ok {
				continue
			}
			for _, a := range rep.Adapters {
				if a.Name != spec.Name {
					continue
				}
				switch {
				case a.State == string(servingv1.AdapterLoaded) && rep.Revision == adapterSet(obj).Revision:
					as.ServingReplicas++
					as.Pods = appendPod(as.Pods, p.Name)
				case a.State == string(servingv1.AdapterFailed):
					anyFailed = true
				default:
					anyPending = true
				}
				if a.Failure != nil {
					as.LastFailure = stableAdapterFailure(as.LastFailure, servingv1.AdapterFailure{
						Reason: a.Failure.Reason, Message: a.Failure.Message, Pod: p.Name,
						Attempts: int32(a.Attempts), Retrying: a.Retrying, Time: metav1.NewTime(a.FailedAt.Truncate(time.Second)),
					}, now)
				}
			}
		}
		if int(as.ServingReplicas) < serving || serving == 0 {
			allServe = false
			if failed == nil && as.LastFailure != nil {
				failed = &as
			}
		}
		out = append(out, as)
	}
	st.Adapters = out
	status, reason, msg := metav1.ConditionTrue, servingv1.ReasonAdaptersLoaded, fmt.Sprintf("every serving replica (%d) serves all %d adapters", serving, len(out))
	switch {
	case allServe:
	case !runtime:
		status, reason = metav1.ConditionFalse, servingv1.ReasonAdaptersRollingOut
		msg = fmt.Sprintf("%s takes adapters only at start, so the change of spec.adapters rolls the replicas: %d of %d serving replicas run the current adapters; the others serve the earlier ones until replaced",
			obj.Spec.Engine.Type, minServing(out), serving)
	case anyFailed && failed != nil:
		status, reason = metav1.ConditionFalse, servingv1.ReasonAdapterFailed
		f := failed.LastFailure
		retry := "it is not retried (permanent, or loading.maxRetries reached): fix the adapter's files or source, then change the adapter (a new revision) or delete the pod"
		if f.Retrying {
			retry = "it is retried with loading.backoff, up to loading.maxRetries"
		}
		msg = fmt.Sprintf("adapter %s serves on %d of %d serving replicas; on pod %s it failed after %d attempt(s) with %s: %s; %s; the replica keeps serving the base model and the other adapters",
			failed.Name, failed.ServingReplicas, serving, f.Pod, f.Attempts, f.Reason, f.Message, retry)
	case obs.adapters != nil && obs.adapters.unreachable != nil && !anyPending:
		status, reason, msg = metav1.ConditionFalse, obs.adapters.unreachable.reason, obs.adapters.unreachable.message
	case serving == 0:
		status, reason, msg = metav1.ConditionFalse, servingv1.ReasonAdaptersLoading, "no replica serves yet; each loads every adapter before it serves"
	default:
		status, reason = metav1.ConditionFalse, servingv1.ReasonAdaptersLoading
		msg = fmt.Sprintf("%d of %d serving replicas serve every adapter; the others are fetching or loading them and serve the base model meanwhile", minServing(out), serving)
	}
	setCondition(st, obj.Generation, servingv1.ConditionAdaptersReady, status, reason, msg)
}

func minServing(as []servingv1.AdapterStatus) int32 {
	n := int32(-1)
	for _, a := range as {
		if n < 0 || a.ServingReplicas < n {
			n = a.ServingReplicas
		}
	}
	return max(n, 0)
}

func appendPod(pods []string, name string) []string {
	if len(pods) >= maxAdapterPods {
		return pods
	}
	pods = append(pods, name)
	slices.Sort(pods)
	return pods
}

// stableAdapterFailure keeps the recorded failure while the same one goes
// on, so an unchanged situation writes nothing.
func stableAdapterFailure(prev *servingv1.AdapterFailure, cur servingv1.AdapterFailure, now time.Time) *servingv1.AdapterFailure {
	if prev != nil && prev.Reason == cur.Reason && prev.Pod == cur.Pod && prev.Message == cur.Message && prev.Attempts == cur.Attempts && prev.Retrying == cur.Retrying {
		return prev
	}
	if cur.Time.IsZero() {
		cur.Time = metav1.NewTime(now.Truncate(time.Second))
	}
	return &cur
}

// recordAdapterEvents makes an event when an adapter starts serving (from no
// replica to some) and for each new failure.
func (r *Reconciler) recordAdapterEvents(obj *servingv1.AIInference, before *servingv1.AIInferenceStatus) {
	prev := map[string]servingv1.AdapterStatus{}
	for _, a := range before.Adapters {
		prev[a.Name] = a
	}
	for _, a := range obj.Status.Adapters {
		old := prev[a.Name]
		if a.ServingReplicas > 0 && old.ServingReplicas == 0 {
			r.Recorder.Eventf(obj, nil, corev1.EventTypeNormal, servingv1.ReasonAdaptersLoaded, "LoadAdapter", "Adapter %s serves on %d replica(s): %s", a.Name, a.ServingReplicas, strings.Join(a.Pods, ", "))
		}
		if f := a.LastFailure; f != nil && (old.LastFailure == nil || *old.LastFailure != *f) {
			r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, servingv1.ReasonAdapterFailed, "LoadAdapter", "Adapter %s failed on pod %s (attempt %d, %s): %s", a.Name, f.Pod, f.Attempts, f.Reason, f.Message)
		}
	}
}
