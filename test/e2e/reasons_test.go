package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/s3test"
	"github.com/aiinference/operator/test/testutil"
)

// The failure reasons of issue 12, end to end: for each cause, an AIInference
// meets it on the local cluster, the test records when the child (pod or
// ReplicaSet) shows the failure and when the AIInference's Ready condition
// gives the reason, checks the reason and message, removes the cause as a user
// would, and records when the object is Ready again.
//
// Where the cause lives:
//   - the real scheduler (no node of the accepted products, no free GPU), the
//     real API server's admission (ResourceQuota, Pod Security), and API
//     objects (a missing PVC, a name taken);
//   - the simulated kubelets' failure behaviours (test/localcluster's
//     chaos.go): the loader's and the warm-up gate's exits, and the engine's
//     crash loop. The loader's termination message is what the real loader
//     writes: its summary built by its own FailureOf and ExitCode
//     (loaderFailure); the kubelet's reasons and exit codes are its own
//     (OOMKilled and 137 for an OOM kill, Error otherwise).
//   - an image that cannot be pulled: kwok pulls no image, so the test plays
//     the kubelet's image puller for the pods whose engine image is
//     unpullableImage (fakeImagePuller), writing the kubelet's waiting reasons
//     ErrImagePull, then ImagePullBackOff.
//
// Where the simulated kubelet differs from a real one, the operator's verdict
// does not: it backs off after a container's first exit where a real kubelet
// restarts it at once the first time (so the simulated messages say "restarted
// 0 times"); with a failing warm-up gate the engine waits where a real one runs
// beside it (WarmupFailed is judged before the engine's state); an unready
// engine stays so, where a real kubelet kills it once the startup probe's
// budget (loading.timeout) is spent and it crash-loops; a loader that works
// again in the same pod restarts from restartCount 0. TestRealNodeFailureReasons
// runs the causes that need a real kubelet, containerd and kernel on the real
// node: the image pull, the OOM kill, a missing Secret or key (kwok's simulated
// kubelet reads no Secret and would run the pod), and the real loader's,
// gate's and engine's own failures.
//
// The cases run at once, each in a namespace of its own, on GPU nodes of a
// product of their own (reasonsProduct) that the test adds, so that no other
// test's pods take their GPUs or theirs others'.

// reasonsProduct is the GPU product of the nodes the test adds.
const reasonsProduct = "NVIDIA-L40S-e2e-reasons"

// reasonsPool is those nodes: a GPU for every case and its replacement pod.
var reasonsPool = localcluster.NodePool{Name: "reasons", Count: 12, GPUProduct: reasonsProduct, GPUCount: 4,
	CPU: resource.MustParse("64"), Memory: resource.MustParse("512Gi")}

// detectBound bounds the time from the failure's appearance on the child the
// operator watches to the reason on the AIInference. One reconcile takes
// milliseconds; on a 2-core machine running every case at once (and the other
// tests of the package) the operator's passes queue: 0.1-1.4 s were measured
// with this file alone; in a full make test, where about 30 objects arrive at
// once while two other clusters start beside, the first pass of a new object
// came 13-16.6 s after its creation (4 workers, about 2 s a creating pass).
// "Within one reconcile" is what the count of status writes in between
// asserts; the bound only has to tell that pass from the 30 s look-again of
// unwatched references.
const detectBound = 25 * time.Second

// unpullableImage is an engine image that fakeImagePuller cannot pull.
const unpullableImage = "aiinference-e2e/no-such-engine:v0"

// reasonCase is one cause of a failure and its remedy.
type reasonCase struct {
	// name names the subtest and the AIInference.
	name string
	// setup prepares the namespace and the object before it is created.
	setup func(t *testing.T, g *WithT, ns string, obj *servingv1.AIInference)
	// failedAt tells, for each object of the namespace the test sees change
	// (Pod, ReplicaSet), whether it shows the failure and since when (at is when
	// the test saw it). Nil: the cause is there before the AIInference, and
	// detection counts from its creation.
	failedAt func(at time.Time, obj client.Object) (time.Time, bool)
	// inputFailed, when set, tells whether the child the operator reads (the
	// Deployment) shows the failure, which its controller copies from a
	// grandchild (the ReplicaSet) that failedAt looks at: the test reports the lag.
	inputFailed func(obj client.Object) bool
	// reason, phase and message are the Ready condition's reason, the phase and
	// substrings of the message the AIInference must show.
	reason  string
	phase   servingv1.Phase
	message []string
	// patterns are regular expressions the message must match, for the parts
	// that depend on how far the kubelet got before the operator's write (its
	// back-offs are short in tests): which retry comes next, ErrImagePull or the
	// ImagePullBackOff that follows it.
	patterns []string
	// laterMessage are substrings the message must show within readyTimeout,
	// with the reason's first status write or a later one: what the operator
	// reads from a source that can lag the failure, as the previous run's log,
	// which a real kubelet sometimes cannot serve yet right after a restart.
	laterMessage []string
	// lastFailure is status.lastFailure.reason; empty: not checked.
	lastFailure string
	// stalled: the Stalled condition is True with the same reason.
	stalled bool
	// fix removes the cause, as a user (or the store coming back) would.
	fix func(t *testing.T, g *WithT, ns string, obj *servingv1.AIInference)
	// fixText describes the fix for the table.
	fixText string
}

// reasonResult is a row of the table the test prints.
type reasonResult struct {
	name, reason, lastFailure, fix string
	detect, recover                time.Duration
	// inputLag is how long after the failure the Deployment showed it (only
	// with reasonCase.inputFailed).
	inputLag time.Duration
	// writes counts the operator's status writes between the child's failure
	// and the reason's appearance.
	writes int
}

// TestFailureReasons runs every case of reasonCases in parallel and prints the
// table of reason, detection latency and recovery time.
func TestFailureReasons(t *testing.T) {
	shared.share(t)
	// The nodes go once every case's namespace is empty (their cleanups run
	// before this one).
	if err := newTestNodes(t).add(reasonsPool); err != nil {
		t.Fatal(err)
	}
	runReasonCases(t, reasonCases(), func(_ *testing.T, ns, name string) *servingv1.AIInference {
		obj := inference(ns, name, 1, reasonsProduct)
		// Room for the retries the kubelet makes before the fix.
		obj.Spec.Loading.MaxRetries = ptr.To[int32](10)
		return obj
	}, nil)
}

// nextRetry matches the retry a RetryingLoad message announces, of the
// budget TestFailureReasons sets.
const nextRetry = `attempt ([2-9]|1[01]) of 11 follows after a back-off`

// runReasonCases runs the cases in parallel, each on an object newObject
// makes, after reserve (if set), and prints their table.
func runReasonCases(t *testing.T, cases []reasonCase, newObject func(t *testing.T, ns, name string) *servingv1.AIInference, reserve func(t *testing.T)) {
	begin := time.Now()
	var mu sync.Mutex
	var results []reasonResult
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		order := map[string]int{}
		for i, c := range cases {
			order[c.name] = i
		}
		slices.SortFunc(results, func(a, b reasonResult) int { return order[a.name] - order[b.name] })
		var b strings.Builder
		fmt.Fprintf(&b, "%-22s %-20s %-18s %8s %6s %9s  %s\n", "case", "Ready reason", "lastFailure", "detect", "writes", "recovery", "fix")
		for _, r := range results {
			fix := r.fix
			if r.inputLag != 0 {
				fix += fmt.Sprintf(" (the Deployment showed the ReplicaSet's failure %s after it)", r.inputLag.Round(time.Millisecond))
			}
			fmt.Fprintf(&b, "%-22s %-20s %-18s %8s %6d %9s  %s\n", r.name, r.reason, r.lastFailure,
				r.detect.Round(time.Millisecond), r.writes, r.recover.Round(100*time.Millisecond), fix)
		}
		t.Logf("Failure reasons (detect: from the child's failure, as the test saw it, to the reason on the AIInference; "+
			"writes: the operator's status writes in between; recovery: from the fix to Ready), all cases in %s:\n%s",
			time.Since(begin).Round(100*time.Millisecond), b.String())
	})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if reserve != nil {
				reserve(t)
			}
			r := runReasonCase(t, c, newObject)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
}

func runReasonCase(t *testing.T, c reasonCase, newObject func(t *testing.T, ns, name string) *servingv1.AIInference) reasonResult {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	obj := newObject(t, ns, c.name)
	if c.setup != nil {
		c.setup(t, g, ns, obj)
	}
	w := watchNamespace(t, ns, c.failedAt, c.inputFailed)
	created := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())

	// The failure, and the reason.
	var failedAt, reportedAt time.Time
	var report *servingv1.AIInference
	var writes int
	g.Eventually(func(g Gomega) {
		failedAt = created
		if c.failedAt != nil {
			failedAt = w.failedAt()
			g.Expect(failedAt).NotTo(BeZero(), "the child's failure is not seen yet")
		}
		reportedAt, report, writes = w.reportedSince(failedAt, func(got *servingv1.AIInference) bool {
			return readyReason(got) == c.reason
		})
		g.Expect(report).NotTo(BeNil(), "the Ready reason is not %s yet: %s", c.reason, w.reasons())
	}).WithTimeout(2 * readyTimeout).WithPolling(50 * time.Millisecond).Should(Succeed())
	detect := reportedAt.Sub(failedAt)
	ready := meta.FindStatusCondition(report.Status.Conditions, servingv1.ConditionReady)
	var inputLag time.Duration
	if c.inputFailed != nil {
		inputLag = w.inputAt().Sub(failedAt)
		t.Logf("The Deployment showed the ReplicaSet's failure %s after it", inputLag.Round(time.Millisecond))
	}
	t.Logf("%s %s after the child's failure (%d status writes between): %s", c.reason, detect.Round(time.Millisecond), writes, ready.Message)
	// Within one reconcile: the reason comes with the operator's first status
	// write after the failure, or its second when a pass was already under way
	// as the failure showed; and promptly.
	g.Expect(writes).To(BeNumerically("<=", 1), "status writes without the reason after the failure: %s", w.reasons())
	g.Expect(detect-inputLag).To(BeNumerically("<", detectBound), "the reason came %s after the failure", detect-inputLag)
	// That first status with the reason has its message and the rest.
	g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(ready.ObservedGeneration).To(Equal(report.Generation))
	for _, s := range c.message {
		g.Expect(ready.Message).To(ContainSubstring(s))
	}
	for _, p := range c.patterns {
		g.Expect(ready.Message).To(MatchRegexp(p))
	}
	if len(c.laterMessage) > 0 {
		g.Eventually(func(g Gomega) {
			got := &servingv1.AIInference{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			later := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
			g.Expect(later).NotTo(BeNil())
			g.Expect(later.Reason).To(Equal(c.reason))
			for _, s := range c.laterMessage {
				g.Expect(later.Message).To(ContainSubstring(s))
			}
		}).WithTimeout(readyTimeout).WithPolling(200 * time.Millisecond).Should(Succeed())
	}
	if c.phase != "" {
		g.Expect(report.Status.Phase).To(Equal(c.phase))
	}
	if c.lastFailure != "" {
		g.Expect(report.Status.LastFailure).NotTo(BeNil())
		g.Expect(report.Status.LastFailure.Reason).To(Equal(c.lastFailure))
	}
	stalled := meta.FindStatusCondition(report.Status.Conditions, servingv1.ConditionStalled)
	if c.stalled {
		g.Expect(stalled).NotTo(BeNil(), "Stalled")
		g.Expect(stalled.Reason).To(Equal(c.reason))
	} else {
		g.Expect(stalled).To(BeNil(), "Stalled")
	}

	// The fix, and Ready.
	w.stopFailures()
	fixedAt := time.Now()
	c.fix(t, g, ns, obj)
	var readyAt time.Time
	g.Eventually(func(g Gomega) {
		at, got, _ := w.firstSince(fixedAt, func(got *servingv1.AIInference) bool {
			return got.Status.ObservedGeneration == got.Generation && got.Status.Phase == servingv1.PhaseReady &&
				got.Status.ReadyReplicas == 1 && meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionReady)
		})
		g.Expect(got).NotTo(BeNil(), "not Ready yet: %s", w.reasons())
		readyAt = at
	}).WithTimeout(2 * readyTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	t.Logf("Ready %s after the fix (%s)", readyAt.Sub(fixedAt).Round(100*time.Millisecond), c.fixText)

	lastFailure := ""
	if f := report.Status.LastFailure; f != nil {
		lastFailure = f.Reason
	}
	return reasonResult{name: c.name, reason: c.reason, lastFailure: lastFailure, fix: c.fixText,
		detect: detect, recover: readyAt.Sub(fixedAt), writes: writes, inputLag: inputLag}
}

// reasonCases are the causes of issue 12, in its order.
func reasonCases() []reasonCase {
	loaderFails := func(f localcluster.InitContainerFailure) func(*testing.T, *WithT, string, *servingv1.AIInference) {
		return func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
			f.Container = servingv1.LoaderContainerName
			podMetadata(obj, f.Apply)
		}
	}
	engineCrashes := func(c localcluster.ContainerCrashLoop) func(*testing.T, *WithT, string, *servingv1.AIInference) {
		return func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
			c.Container = servingv1.EngineContainerName
			podMetadata(obj, c.Apply)
		}
	}
	// fixSpec changes the spec as the remedy says; the pods of the new template
	// no longer carry the simulated failure.
	fixSpec := func(mutate func(*servingv1.AIInference)) func(*testing.T, *WithT, string, *servingv1.AIInference) {
		return func(_ *testing.T, g *WithT, _ string, obj *servingv1.AIInference) {
			update(g, obj, func(o *servingv1.AIInference) {
				o.Spec.PodMetadata = nil
				if mutate != nil {
					mutate(o)
				}
			})
		}
	}
	permanent := func(reason, path, msg string) localcluster.InitContainerFailure {
		code, summary := loaderFailure(&loader.Error{Reason: reason, Path: path, Err: errors.New(msg)})
		return localcluster.InitContainerFailure{ExitCode: code, Message: summary}
	}
	return []reasonCase{
		{
			name: "no-gpu-node",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.GPU.Products = []string{"NVIDIA-B300-e2e-none"}
			},
			failedAt: seen(func(obj client.Object) bool {
				return podCondition(obj, corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable)
			}),
			reason: servingv1.ReasonUnschedulable, phase: servingv1.PhasePending,
			message:     []string{"cannot be scheduled (1x NVIDIA-B300-e2e-none needed)", "didn't match Pod's node affinity/selector"},
			lastFailure: servingv1.ReasonUnschedulable,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.GPU.Products = []string{"NVIDIA-B300-e2e-none", reasonsProduct} }),
			fixText:     "accept a product the cluster has",
		},
		{
			name:  "no-free-gpu",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) { obj.Spec.GPU.Count = 8 },
			failedAt: seen(func(obj client.Object) bool {
				return podCondition(obj, corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable)
			}),
			reason: servingv1.ReasonUnschedulable, phase: servingv1.PhasePending,
			message:     []string{"(8x " + reasonsProduct + " needed)", fmt.Sprintf("%d Insufficient nvidia.com/gpu", reasonsPool.Count)},
			lastFailure: servingv1.ReasonUnschedulable,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.GPU.Count = 1 }),
			fixText:     "ask for fewer GPUs",
		},
		{
			name: "image-pull",
			setup: func(t *testing.T, _ *WithT, ns string, obj *servingv1.AIInference) {
				obj.Spec.Engine.Image = unpullableImage
				// kwok would start the engine: hold it in ContainerCreating, where
				// the kubelet pulls its image.
				podMetadata(obj, func(m metav1.Object) {
					// kwok's delay is at most its jitter-delay.
					m.SetAnnotations(map[string]string{"pod-ready.stage.kwok.x-k8s.io/delay": "1h", "pod-ready.stage.kwok.x-k8s.io/jitter-delay": "1h"})
				})
				fakeImagePuller(t, ns)
			},
			failedAt: seen(func(obj client.Object) bool {
				return containerWaiting(obj, servingv1.EngineContainerName, "ErrImagePull")
			}),
			reason: servingv1.ReasonPodStartFailed, phase: servingv1.PhaseLoading,
			message:     []string{unpullableImage, "check the image names"},
			patterns:    []string{"container engine: (ErrImagePull|ImagePullBackOff)"},
			lastFailure: servingv1.ReasonPodStartFailed,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Engine.Image = "" }),
			fixText:     "fix spec.engine.image",
		},
		{
			name:     "model-not-found",
			setup:    loaderFails(permanent(loadspec.ReasonNotFound, "", "no objects under s3://models/model-not-found/")),
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitNotFound) }),
			reason:   servingv1.ReasonLoadFailed, phase: servingv1.PhaseFailed, stalled: true,
			message:     []string{"Loads stopped: a load failed permanently", "(SourceNotFound): no objects under s3://models/model-not-found/", "check model.source"},
			lastFailure: loadspec.ReasonNotFound,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Prefix = "fixed/" }),
			fixText:     "fix spec.model.source",
		},
		{
			name: "access-denied",
			setup: loaderFails(permanent(loadspec.ReasonAccessDenied, "",
				"operation error S3: ListObjectsV2, https response error StatusCode: 403, api error AccessDenied: Access Denied.")),
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitAccessDenied) }),
			reason:   servingv1.ReasonLoadFailed, phase: servingv1.PhaseFailed, stalled: true,
			message:     []string{"(AccessDenied)", "StatusCode: 403", "check the credentials Secret"},
			lastFailure: loadspec.ReasonAccessDenied,
			fix:         fixSpec(nil),
			fixText:     "fix the credentials (new template)",
		},
		{
			name: "checksum-mismatch",
			setup: loaderFails(permanent(loadspec.ReasonChecksumMismatch, "model-00001-of-00002.safetensors",
				"crc64nvme check failed: the store says 9f0c2a41e37d5b10, the bytes give 4be1f7b62c0a9d33")),
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitChecksum) }),
			reason:   servingv1.ReasonLoadFailed, phase: servingv1.PhaseFailed, stalled: true,
			message:     []string{"(ChecksumMismatch)", "model-00001-of-00002.safetensors: crc64nvme check failed", "re-upload it"},
			lastFailure: loadspec.ReasonChecksumMismatch,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Prefix = "reuploaded/" }),
			fixText:     "re-upload, change the prefix",
		},
		{
			name: "download-stalled",
			setup: func(t *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				// The stall watchdog cuts the part; the retries in the run stall too.
				code, summary := loaderFailure(fmt.Errorf("model-00002-of-00002.safetensors part 7: %s (30s): context canceled",
					"no bytes received within the stall timeout"))
				loaderFails(localcluster.InitContainerFailure{ExitCode: code, Message: summary})(t, g, ns, obj)
			},
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitRetryable) }),
			reason:   servingv1.ReasonRetryingLoad,
			message:  []string{"(TransientError: model-00002-of-00002.safetensors part 7: no bytes received within the stall timeout (30s)"},
			patterns: []string{nextRetry},
			// The store answers again: the kubelet's next run of the loader succeeds,
			// in the same pod.
			lastFailure: loadspec.ReasonTransient,
			fix:         clearPodFailures(localcluster.ClearInitContainerFailure),
			fixText:     "the store answers again (same pod)",
		},
		{
			name: "download-timeout",
			setup: func(t *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				code, summary := loaderFailure(fmt.Errorf("model-00001-of-00002.safetensors part 3: %w", context.DeadlineExceeded))
				loaderFails(localcluster.InitContainerFailure{ExitCode: code, Message: summary})(t, g, ns, obj)
			},
			failedAt:    seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitRetryable) }),
			reason:      servingv1.ReasonRetryingLoad,
			message:     []string{"(Timeout: ", "context deadline exceeded"},
			patterns:    []string{nextRetry},
			lastFailure: loadspec.ReasonTimeout,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Loading.Timeout = &metav1.Duration{Duration: time.Hour} }),
			fixText:     "raise loading.timeout",
		},
		{
			// The loader neither finishes nor stops by itself: the operator replaces
			// its pod once loading.timeout and a minute's grace have passed.
			name: "loader-hung",
			setup: func(t *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 10 * time.Second}
				loaderFails(localcluster.InitContainerFailure{RunFor: time.Hour})(t, g, ns, obj)
			},
			failedAt: func(_ time.Time, obj client.Object) (time.Time, bool) {
				started := loaderStarted(obj)
				// The operator's deadline: loading.timeout and its grace of a minute.
				return started.Add(10*time.Second + time.Minute), !started.IsZero()
			},
			reason:      servingv1.ReasonRetryingLoad,
			message:     []string{"(LoadTimeout: the model loader ran past loading.timeout (10s) and did not stop; its pod is replaced"},
			lastFailure: servingv1.ReasonLoadTimeout,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Loading.Timeout = &metav1.Duration{Duration: time.Hour} }),
			fixText:     "raise loading.timeout",
		},
		{
			name:        "loader-oom",
			setup:       loaderFails(localcluster.InitContainerFailure{ExitCode: 137, Reason: "OOMKilled"}),
			failedAt:    seen(func(obj client.Object) bool { return loaderExited(obj, 137) }),
			reason:      servingv1.ReasonRetryingLoad,
			message:     []string{"(OOMKilled: the model loader was killed for exceeding its memory limit (exit code 137)"},
			patterns:    []string{nextRetry},
			lastFailure: "OOMKilled",
			fix: fixSpec(func(o *servingv1.AIInference) {
				o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk}
			}),
			fixText: "cache on Disk, not Memory",
		},
		{
			name: "engine-oom",
			// FallbackToLogsOnError: the message is the end of the engine's log.
			setup: engineCrashes(localcluster.ContainerCrashLoop{ExitCode: 137, Reason: "OOMKilled",
				Message: "INFO 05-02 10:00:01 model_runner.py:1071] Loading model weights took 14.9 GiB"}),
			failedAt: seen(func(obj client.Object) bool { return containerExited(obj, servingv1.EngineContainerName, 137) }),
			reason:   servingv1.ReasonEngineCrashLooping,
			message:  []string{"engine container restarted", "last exit code 137 (OOMKilled)", "Loading model weights took 14.9 GiB"},
			fix: fixSpec(func(o *servingv1.AIInference) {
				o.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Gi")}
			}),
			fixText: "raise spec.resources memory",
		},
		{
			name: "engine-crash-loop",
			setup: engineCrashes(localcluster.ContainerCrashLoop{ExitCode: 1,
				Message: "api_server.py: error: unrecognized arguments: --max-model-lenght 4096"}),
			failedAt: seen(func(obj client.Object) bool { return containerExited(obj, servingv1.EngineContainerName, 1) }),
			reason:   servingv1.ReasonEngineCrashLooping,
			message:  []string{"last exit code 1 (Error): api_server.py: error: unrecognized arguments: --max-model-lenght 4096", "check the engine's logs and engine.args"},
			fix:      fixSpec(func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len", "4096"} }),
			fixText:  "fix spec.engine.args",
		},
		{
			// The engine runs and its health endpoint never answers: the startup
			// probe fails and the container stays unready. EngineStarting shows
			// from the loader's end on, so it is there when the engine runs
			// unready (detect 0).
			name:  "probe-failing",
			setup: engineCrashes(localcluster.ContainerCrashLoop{RunFor: time.Hour}),
			failedAt: seen(func(obj client.Object) bool {
				s := containerStatus(obj, servingv1.EngineContainerName)
				return s != nil && s.State.Running != nil && !s.Ready
			}),
			reason:  servingv1.ReasonEngineStarting,
			message: []string{"the model is loaded on pod", "the engine is starting"},
			fix:     fixSpec(func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--enforce-eager"} }),
			fixText: "fix spec.engine.args",
		},
		{
			// The engine's health endpoint answers, no completion does: the warm-up
			// gate exits after loading.timeout with its reason.
			name: "warmup-failing",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				podMetadata(obj, localcluster.InitContainerFailure{Container: servingv1.WarmupContainerName, ExitCode: 1,
					Message: "no completion from the engine at http://127.0.0.1:8000 succeeded within 30m0s (186 attempts); " +
						"last: POST /v1/completions: 404 Not Found: The model `warmup-failing-model` does not exist."}.Apply)
			},
			failedAt: seen(func(obj client.Object) bool { return containerExited(obj, servingv1.WarmupContainerName, 1) }),
			reason:   servingv1.ReasonWarmupFailed,
			message:  []string{"warm-up gate exited", "times without a completion from the engine; last exit code 1 (Error)", "The model `warmup-failing-model` does not exist"},
			fix: fixSpec(func(o *servingv1.AIInference) {
				o.Spec.Engine.Args = []string{"--served-model-name", "warmup-failing-model"}
			}),
			fixText: "fix spec.engine.args",
		},
		{
			name: "quota-exceeded",
			setup: func(t *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpus"},
					Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("0")}}}
				g.Expect(k8s.Create(context.Background(), quota)).To(Succeed())
				// Admission counts against the quota once its controller has filled its status.
				g.Eventually(func(g Gomega) {
					g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(quota), quota)).To(Succeed())
					g.Expect(quota.Status.Hard).NotTo(BeEmpty())
				}).WithTimeout(30 * time.Second).Should(Succeed())
			},
			failedAt:    seen(replicaSetFailedCreate),
			inputFailed: deploymentReplicaFailure,
			reason:      servingv1.ReasonPodCreateFailed,
			message:     []string{"pods cannot be created", "exceeded quota: gpus", "requested: requests.nvidia.com/gpu=1", "limited: requests.nvidia.com/gpu=0"},
			fix: func(_ *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				quota := &corev1.ResourceQuota{}
				g.Eventually(func() error {
					if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "gpus"}, quota); err != nil {
						return err
					}
					quota.Spec.Hard["requests.nvidia.com/gpu"] = resource.MustParse("2")
					return k8s.Update(context.Background(), quota)
				}).WithTimeout(10 * time.Second).Should(Succeed())
			},
			fixText: "raise the quota",
		},
		{
			name: "pod-security",
			setup: func(_ *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				enforceRestricted(g, ns)
				// An image that must run as root.
				obj.Spec.Engine.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(false)}
			},
			failedAt:    seen(replicaSetFailedCreate),
			inputFailed: deploymentReplicaFailure,
			reason:      servingv1.ReasonPodCreateFailed,
			message:     []string{"pods cannot be created", `violates PodSecurity "restricted:latest"`, `container "engine"`},
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Engine.SecurityContext = nil }),
			fixText:     "drop spec.engine.securityContext",
		},
		{
			name: "missing-pvc",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.Model.Source = servingv1.ModelSource{PVC: &servingv1.PVCSource{ClaimName: "weights", Path: "llama"}}
			},
			reason: servingv1.ReasonPVCNotFound, phase: servingv1.PhasePending, stalled: true,
			message: []string{`PersistentVolumeClaim "weights" named in spec.model.source.pvc.claimName does not exist`},
			fix: func(t *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				boundClaim(t, g, ns, "weights")
			},
			fixText: "create the claim",
		},
		{
			name: "name-conflict",
			setup: func(_ *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				g.Expect(k8s.Create(context.Background(), &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "name-conflict"},
					Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 80}}},
				})).To(Succeed())
			},
			reason: servingv1.ReasonNameConflict, phase: servingv1.PhasePending, stalled: true,
			message: []string{`Service "name-conflict"`},
			fix: func(_ *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				g.Expect(k8s.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "name-conflict"}})).To(Succeed())
			},
			fixText: "delete the other Service",
		},
	}
}

// loaderFailure is the exit code and termination message of the real loader
// for a run that failed with err: its summary, as its Main writes it.
func loaderFailure(err error) (int32, string) {
	data, jerr := json.Marshal(loadspec.Summary{Failure: loader.FailureOf(err)})
	if jerr != nil {
		panic(jerr)
	}
	return int32(loader.ExitCode(err)), string(data)
}

// podMetadata sets the pod template's labels and annotations with apply.
func podMetadata(obj *servingv1.AIInference, apply func(metav1.Object)) {
	m := metav1.ObjectMeta{}
	if pm := obj.Spec.PodMetadata; pm != nil {
		m.Labels, m.Annotations = pm.Labels, pm.Annotations
	}
	apply(&m)
	obj.Spec.PodMetadata = &servingv1.PodMetadata{Labels: m.Labels, Annotations: m.Annotations}
}

// clearPodFailures removes a failure behaviour from the object's pods (not
// from their template): the simulated kubelet runs their containers normally
// from then on, in the same pods.
func clearPodFailures(clear func(metav1.Object)) func(*testing.T, *WithT, string, *servingv1.AIInference) {
	return func(_ *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).NotTo(BeEmpty())
		for _, p := range pods.Items {
			g.Eventually(func() error {
				pod := &corev1.Pod{}
				if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(&p), pod); err != nil {
					return err
				}
				clear(pod)
				return k8s.Update(context.Background(), pod)
			}).WithTimeout(10 * time.Second).Should(Succeed())
		}
	}
}

func storeSecret(ns string, keys ...string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store-credentials"}, Data: map[string][]byte{}}
	for _, k := range keys {
		s.Data[k] = []byte("e2e-" + strings.ToLower(k))
	}
	return s
}

// boundClaim creates a claim and a volume bound to it (the scheduler places
// no pod whose claim is unbound).
func boundClaim(t *testing.T, g *WithT, ns, name string) {
	ctx := context.Background()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/e2e/" + ns}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name},
			StorageClassName:       "",
		},
	}
	g.Expect(k8s.Create(ctx, pv)).To(Succeed())
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), pv) })
	g.Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}},
			VolumeName:       pv.Name,
			StorageClassName: ptr.To(""),
		},
	})).To(Succeed())
}

// enforceRestricted makes the namespace enforce Pod Security "restricted".
func enforceRestricted(g *WithT, ns string) {
	g.Eventually(func() error {
		n := &corev1.Namespace{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: ns}, n); err != nil {
			return err
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		n.Labels["pod-security.kubernetes.io/enforce-version"] = "latest"
		return k8s.Update(context.Background(), n)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// seen is a failedAt that dates the failure to when the test saw it.
func seen(failed func(client.Object) bool) func(time.Time, client.Object) (time.Time, bool) {
	return func(at time.Time, obj client.Object) (time.Time, bool) { return at, failed(obj) }
}

func podCondition(obj client.Object, t corev1.PodConditionType, status corev1.ConditionStatus, reason string) bool {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == t && c.Status == status && c.Reason == reason {
			return true
		}
	}
	return false
}

func containerStatus(obj client.Object, name string) *corev1.ContainerStatus {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.DeletionTimestamp != nil {
		return nil
	}
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	for i := range pod.Status.InitContainerStatuses {
		if pod.Status.InitContainerStatuses[i].Name == name {
			return &pod.Status.InitContainerStatuses[i]
		}
	}
	return nil
}

func containerWaiting(obj client.Object, name, reason string) bool {
	s := containerStatus(obj, name)
	return s != nil && s.State.Waiting != nil && s.State.Waiting.Reason == reason
}

// containerExited: the container's run ended with the exit code, shown as its
// state or, once the kubelet waits to run it again, as its last state.
func containerExited(obj client.Object, name string, code int32) bool {
	s := containerStatus(obj, name)
	if s == nil {
		return false
	}
	for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
		if t != nil && t.ExitCode == code {
			return true
		}
	}
	return false
}

func loaderExited(obj client.Object, code int32) bool {
	return containerExited(obj, servingv1.LoaderContainerName, code)
}

// loaderStarted is when the loader's current run began; zero unless it runs.
func loaderStarted(obj client.Object) time.Time {
	s := containerStatus(obj, servingv1.LoaderContainerName)
	if s == nil || s.State.Running == nil {
		return time.Time{}
	}
	return s.State.Running.StartedAt.Time
}

func replicaSetFailedCreate(obj client.Object) bool {
	rs, ok := obj.(*appsv1.ReplicaSet)
	if !ok {
		return false
	}
	for _, c := range rs.Status.Conditions {
		if c.Type == appsv1.ReplicaSetReplicaFailure && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func deploymentReplicaFailure(obj client.Object) bool {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return false
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// fakeImagePuller plays the kubelet's image puller for the namespace's pods
// whose engine image is unpullableImage, which kwok holds in
// ContainerCreating: it fails the pull as the kubelet does (ErrImagePull, then
// ImagePullBackOff), with containerd's words. The pod stays Pending.
func fakeImagePuller(t *testing.T, ns string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	handled := map[string]bool{}
	go func() {
		for ctx.Err() == nil {
			pods := &corev1.PodList{}
			if err := k8s.List(ctx, pods, client.InNamespace(ns)); err == nil {
				for i := range pods.Items {
					pod := &pods.Items[i]
					s := containerStatus(pod, servingv1.EngineContainerName)
					if handled[pod.Name] || s == nil || s.Image != unpullableImage || s.State.Waiting == nil ||
						!podCondition(pod, corev1.PodInitialized, corev1.ConditionTrue, "") {
						continue
					}
					handled[pod.Name] = true
					msg := fmt.Sprintf(`failed to pull and unpack image %q: failed to resolve reference %q: not found`, unpullableImage, unpullableImage)
					setEngineWaiting(ctx, pod, "ErrImagePull", "rpc error: code = NotFound desc = "+msg)
					go func() {
						select {
						case <-ctx.Done():
						case <-time.After(time.Second):
							setEngineWaiting(ctx, pod, "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", unpullableImage))
						}
					}()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

func setEngineWaiting(ctx context.Context, pod *corev1.Pod, reason, message string) {
	for range 20 {
		got := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil || got.DeletionTimestamp != nil {
			return
		}
		for i := range got.Status.ContainerStatuses {
			if got.Status.ContainerStatuses[i].Name == servingv1.EngineContainerName {
				got.Status.ContainerStatuses[i].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
			}
		}
		if err := k8s.Status().Update(ctx, got); err == nil || ctx.Err() != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nsWatch records, as they arrive, the updates of a namespace's AIInferences,
// and when its pods or ReplicaSets first show a failure.
type nsWatch struct {
	t        *testing.T
	failed   func(time.Time, client.Object) (time.Time, bool)
	input    func(client.Object) bool
	mu       sync.Mutex
	first    time.Time // when the failure began; zero until seen
	inputSaw time.Time // when input first held; zero until then
	stopped  bool      // failures are no longer looked for
	statuses []statusAt
}

type statusAt struct {
	at  time.Time
	obj *servingv1.AIInference
}

// watchNamespace watches the AIInferences, pods and ReplicaSets of ns until
// the test ends.
func watchNamespace(t *testing.T, ns string, failed func(time.Time, client.Object) (time.Time, bool), input func(client.Object) bool) *nsWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wc, err := client.NewWithWatch(cluster.RESTConfig(), client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w := &nsWatch{t: t, failed: failed, input: input}
	for _, list := range []client.ObjectList{&servingv1.AIInferenceList{}, &corev1.PodList{}, &appsv1.ReplicaSetList{}, &appsv1.DeploymentList{}} {
		if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		empty := list.DeepCopyObject().(client.ObjectList)
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
			WatchFuncWithContext: func(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
				return wc.Watch(ctx, empty.DeepCopyObject().(client.ObjectList), &client.ListOptions{Namespace: ns, Raw: &options})
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer rw.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-rw.ResultChan():
					if !ok {
						return
					}
					if obj, isObj := ev.Object.(client.Object); isObj && ev.Type != watch.Deleted && ev.Type != watch.Error {
						w.see(time.Now(), obj)
					}
				}
			}
		}()
	}
	return w
}

func (w *nsWatch) see(at time.Time, obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if got, ok := obj.(*servingv1.AIInference); ok {
		if problems := testutil.KstatusViolations(got); len(problems) > 0 {
			w.t.Errorf("kstatus invariants broken by %s: %v", got.Name, problems)
		}
		w.statuses = append(w.statuses, statusAt{at: at, obj: got})
		return
	}
	if w.stopped {
		return
	}
	if w.input != nil && w.inputSaw.IsZero() && w.input(obj) {
		w.inputSaw = at
	}
	if w.failed == nil || !w.first.IsZero() {
		return
	}
	if since, ok := w.failed(at, obj); ok {
		w.first = since
	}
}

// failedAt is when the child's failure began; zero until seen.
func (w *nsWatch) failedAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first
}

// inputAt is when the child the operator reads first showed the failure.
func (w *nsWatch) inputAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inputSaw
}

// stopFailures stops looking for the failure: the fix comes.
func (w *nsWatch) stopFailures() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}

// firstSince is the first update at or after since that passes check, when it
// arrived, and how many of the operator's status writes arrived from since
// until then; nil if none.
func (w *nsWatch) firstSince(since time.Time, check func(*servingv1.AIInference) bool) (time.Time, *servingv1.AIInference, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.statuses {
		if s.at.Before(since) {
			continue
		}
		if check(s.obj) {
			return s.at, s.obj, n
		}
		if s.obj.Status.ObservedGeneration > 0 {
			n++ // a status the operator wrote
		}
	}
	return time.Time{}, nil, 0
}

// reportedSince is the first update that passes check from since on, when it
// arrived, and how many updates arrived in between. An update that arrived
// before since and was still the latest then counts as arriving at since: its
// watch delivered it first.
func (w *nsWatch) reportedSince(since time.Time, check func(*servingv1.AIInference) bool) (time.Time, *servingv1.AIInference, int) {
	w.mu.Lock()
	var latest *servingv1.AIInference
	for _, s := range w.statuses {
		if !s.at.Before(since) {
			break
		}
		latest = s.obj
	}
	w.mu.Unlock()
	if latest != nil && check(latest) {
		return since, latest, 0
	}
	return w.firstSince(since, check)
}

// reasons lists the Ready reasons seen, for failure messages.
func (w *nsWatch) reasons() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.statuses {
		if r := readyReason(s.obj); len(out) == 0 || out[len(out)-1] != r {
			out = append(out, r)
		}
	}
	return strings.Join(out, " -> ")
}

// TestRealNodeFailureReasons runs the causes a simulated kubelet can only
// pretend to on the real node, where the kubelet, containerd, runc and the
// kernel produce them and the real loader, warm-up gate and engine report
// them: an image that cannot be pulled, a loader killed by the kernel's OOM
// killer, a credentials Secret or key that does not exist (the kubelet cannot
// build the loader's environment), a model the store does not have,
// credentials the store refuses, an engine that exits at once, and an engine
// that answers no completion.
func TestRealNodeFailureReasons(t *testing.T) {
	shared.share(t)
	store := needRealNode(t)
	runReasonCases(t, realReasonCases(store), func(t *testing.T, ns, name string) *servingv1.AIInference {
		obj := realInference(t, store, ns, name)
		obj.Spec.Loading.MaxRetries = ptr.To[int32](10)
		return obj
	}, func(t *testing.T) {
		// The failing pod and the one the fix rolls out beside it.
		reserveRealPods(t, 2)
	})
}

// realReasonCases are the cases of TestRealNodeFailureReasons.
func realReasonCases(store *localcluster.ObjectStore) []reasonCase {
	fixSpec := func(mutate func(*servingv1.AIInference)) func(*testing.T, *WithT, string, *servingv1.AIInference) {
		return func(_ *testing.T, g *WithT, _ string, obj *servingv1.AIInference) { update(g, obj, mutate) }
	}
	// Nothing listens there: the pull fails without a request leaving the host.
	const unpullable = "127.0.0.1:1/aiinference-e2e/no-such-engine:v0"
	// A model larger than the loader's memory limit (512Mi), which the operator
	// keeps in an in-memory cache by default (models up to 2Gi): the kernel
	// charges tmpfs pages to the memory cgroup of the container that writes
	// them, so the loader is OOM-killed at about 512Mi. (The loader's limit does
	// not grow with the cache; if it comes to, this case needs another way past
	// the limit.)
	const bigPrefix = "big-model/"
	var uploadBig sync.Once
	var uploadErr error
	return []reasonCase{
		{
			name:     "real-image-pull",
			setup:    func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) { obj.Spec.Engine.Image = unpullable },
			failedAt: seen(func(obj client.Object) bool { return imagePullFailing(obj, servingv1.EngineContainerName) }),
			reason:   servingv1.ReasonPodStartFailed, phase: servingv1.PhaseLoading,
			message:     []string{"cannot start: container engine: ", "no-such-engine"},
			lastFailure: servingv1.ReasonPodStartFailed,
			fix: func(t *testing.T, g *WithT, _ string, obj *servingv1.AIInference) {
				engine, err := localcluster.FindImage(cluster.Images(), localcluster.EngineSimImage)
				g.Expect(err).NotTo(HaveOccurred())
				update(g, obj, func(o *servingv1.AIInference) { o.Spec.Engine.Image = engine.Ref })
			},
			fixText: "fix spec.engine.image",
		},
		{
			name: "real-loader-oom",
			setup: func(t *testing.T, g *WithT, _ string, obj *servingv1.AIInference) {
				uploadBig.Do(func() {
					server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
					for i, f := range s3test.ModelTree(3, 256<<20, 0, 0) {
						if uploadErr = server.UploadGenerated(context.Background(), store.Bucket, bigPrefix+f.Path, f.Size,
							s3test.Layout{PartSize: 64 << 20}, uint64(200+i)); uploadErr != nil {
							return
						}
					}
				})
				g.Expect(uploadErr).NotTo(HaveOccurred())
				// A Memory cache of unknown size: the loader's limit cannot grow with
				// it (with model.size it would), so the kernel kills the loader as the
				// cache fills.
				obj.Spec.Model.Source.S3.Prefix = bigPrefix
				obj.Spec.Model.Size = nil
				obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheMemory}
			},
			failedAt:    seen(func(obj client.Object) bool { return loaderExited(obj, 137) }),
			reason:      servingv1.ReasonRetryingLoad,
			message:     []string{"(OOMKilled: the model loader was killed for exceeding its memory limit (exit code 137)"},
			lastFailure: "OOMKilled",
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheDisk} }),
			fixText:     "cache on Disk, not Memory",
		},
		{
			// The operator reads no Secret: the real kubelet cannot build the
			// loader's environment and says why in the pod's status.
			name: "real-missing-secret",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "store-credentials"}
			},
			failedAt: seen(func(obj client.Object) bool {
				return configErrorOn(obj, servingv1.LoaderContainerName, `secret "store-credentials" not found`)
			}),
			reason: servingv1.ReasonSecretNotFound, phase: servingv1.PhasePending, stalled: true,
			message: []string{`Secret "store-credentials" named in spec.model.source.s3.credentialsSecretRef does not exist in namespace `,
				"; create it with the keys [AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY]"},
			fix: func(_ *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				g.Expect(k8s.Create(context.Background(), storeCredentials(store, ns, loadspec.EnvAccessKeyID, loadspec.EnvSecretAccessKey))).To(Succeed())
			},
			fixText: "create the Secret",
		},
		{
			name: "real-missing-secret-key",
			setup: func(_ *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				g.Expect(k8s.Create(context.Background(), storeCredentials(store, ns, loadspec.EnvAccessKeyID))).To(Succeed())
				obj.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "store-credentials"}
			},
			failedAt: seen(func(obj client.Object) bool {
				return configErrorOn(obj, servingv1.LoaderContainerName, "couldn't find key AWS_SECRET_ACCESS_KEY in Secret "+obj.GetNamespace()+"/store-credentials")
			}),
			reason: servingv1.ReasonSecretKeyMissing, phase: servingv1.PhasePending, stalled: true,
			message: []string{`Secret "store-credentials" named in spec.model.source.s3.credentialsSecretRef has no key "AWS_SECRET_ACCESS_KEY"; add it, or name the key that holds it`},
			fix: func(_ *testing.T, g *WithT, ns string, _ *servingv1.AIInference) {
				g.Expect(k8s.Update(context.Background(), storeCredentials(store, ns, loadspec.EnvAccessKeyID, loadspec.EnvSecretAccessKey))).To(Succeed())
			},
			fixText: "add the key",
		},
		{
			name: "real-model-not-found",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.Model.Source.S3.Prefix = "no-such-model/"
			},
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitNotFound) }),
			reason:   servingv1.ReasonLoadFailed, phase: servingv1.PhaseFailed, stalled: true,
			message:     []string{"(SourceNotFound)", "no-such-model/", "check model.source"},
			lastFailure: loadspec.ReasonNotFound,
			fix:         fixSpec(func(o *servingv1.AIInference) { o.Spec.Model.Source.S3.Prefix = store.ModelPrefix }),
			fixText:     "fix spec.model.source",
		},
		{
			name: "real-access-denied",
			setup: func(_ *testing.T, g *WithT, ns string, obj *servingv1.AIInference) {
				g.Expect(k8s.Create(context.Background(), storeSecret(ns, loadspec.EnvAccessKeyID, loadspec.EnvSecretAccessKey))).To(Succeed())
				obj.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: "store-credentials"}
			},
			failedAt: seen(func(obj client.Object) bool { return loaderExited(obj, loadspec.ExitAccessDenied) }),
			reason:   servingv1.ReasonLoadFailed, phase: servingv1.PhaseFailed, stalled: true,
			message:     []string{"(AccessDenied)", "check the credentials Secret"},
			lastFailure: loadspec.ReasonAccessDenied,
			fix: fixSpec(func(o *servingv1.AIInference) {
				o.Spec.Model.Source.S3.CredentialsSecretRef = &servingv1.S3CredentialsSecretRef{Name: store.CredentialsSecret(o.Namespace).Name}
			}),
			fixText: "name the right Secret",
		},
		{
			name: "real-engine-crash-loop",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--no-such-flag")
			},
			failedAt: seen(func(obj client.Object) bool { return containerExited(obj, servingv1.EngineContainerName, 0) }),
			reason:   servingv1.ReasonEngineCrashLooping,
			message:  []string{"last exit code 0"},
			// The exit left no message; the log says why. The kubelet can fail to
			// serve the previous run's log for a moment after the restart (once
			// in a fresh-clone CI run); the operator then adds the line at a later pass.
			laterMessage: []string{"unknown flag: --no-such-flag"},
			fix:          fixSpec(func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--force-dummy-tokenizer"} }),
			fixText:      "fix spec.engine.args",
		},
		{
			// The engine's health endpoint answers and every completion fails: the
			// warm-up gate gives up after loading.timeout.
			name: "real-warmup-failing",
			setup: func(_ *testing.T, _ *WithT, _ string, obj *servingv1.AIInference) {
				obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 10 * time.Second}
				obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--failure-injection-rate=100", "--failure-types=server_error")
			},
			failedAt: seen(func(obj client.Object) bool { return containerExited(obj, servingv1.WarmupContainerName, 1) }),
			reason:   servingv1.ReasonWarmupFailed,
			message:  []string{"warm-up gate exited", "no completion from the engine at http://127.0.0.1:8000 succeeded within 10s"},
			fix: fixSpec(func(o *servingv1.AIInference) {
				o.Spec.Engine.Args = []string{"--force-dummy-tokenizer"}
				o.Spec.Loading.Timeout = &metav1.Duration{Duration: 2 * time.Minute}
			}),
			fixText: "fix spec.engine.args",
		},
	}
}

// configErrorOn: the kubelet cannot configure the container (it waits with
// CreateContainerConfigError), for the reason its message gives.
func configErrorOn(obj client.Object, name, message string) bool {
	s := containerStatus(obj, name)
	return s != nil && s.State.Waiting != nil && s.State.Waiting.Reason == "CreateContainerConfigError" && s.State.Waiting.Message == message
}

// storeCredentials is the Secret store-credentials with the keys of the
// store's own credentials Secret.
func storeCredentials(store *localcluster.ObjectStore, ns string, keys ...string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store-credentials"}, Data: map[string][]byte{}}
	for _, k := range keys {
		s.Data[k] = []byte(store.CredentialsSecret(ns).StringData[k])
	}
	return s
}

// imagePullFailing: the kubelet cannot pull the container's image.
func imagePullFailing(obj client.Object, name string) bool {
	return containerWaiting(obj, name, "ErrImagePull") || containerWaiting(obj, name, "ImagePullBackOff")
}
