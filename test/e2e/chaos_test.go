package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
)

// chaosLongEnv runs the chaos test's long version: a longer workload phase with
// more kills.
const chaosLongEnv = "CHAOS_LONG"

// TestChaosOperatorKilledWhileItWorks runs two operator replicas with leader
// election, drives a scripted workload over 50 objects (create, scale, spec
// change, a failing load and its fix, delete) while a replica is killed with
// SIGKILL every 5-30 s and the API server restarts once, then checks that every
// object converged to its spec, no child is duplicated or orphaned, and no
// status went backwards as a watcher saw it.
//
// It has a cluster of its own: no other test would bear the chaos.
func TestChaosOperatorKilledWhileItWorks(t *testing.T) {
	loadGate.share(t)
	e := chaosCluster.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns := e.newNamespace(t)
	workload := 60 * time.Second
	if os.Getenv(chaosLongEnv) == "1" {
		workload = 10 * time.Minute
	}

	first, second := e.operator("chaos-1", e.cluster.Kubeconfig()), e.operator("chaos-2", e.cluster.Kubeconfig())
	g.Expect(first.Start()).To(Succeed())
	defer first.Stop()
	g.Expect(second.Start()).To(Succeed())
	defer second.Stop()
	replicas := []*operatorProcess{first, second}

	statuses := e.watchStatuses(t, ctx, ns)

	// The killer: SIGKILL a replica every 5-30 s, and start it again at once.
	stopChaos := make(chan struct{})
	var kills int
	var chaos sync.WaitGroup
	chaos.Add(1)
	go func() {
		defer chaos.Done()
		for {
			select {
			case <-stopChaos:
				return
			case <-time.After(time.Duration(5+rand.IntN(26)) * time.Second):
			}
			victim := replicas[rand.IntN(len(replicas))]
			victim.Kill()
			kills++
			if err := victim.Start(); err != nil {
				t.Errorf("restarting a killed operator replica: %v", err)
				return
			}
		}
	}()

	const n = 50
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("chaos-%02d", i)
		obj := chaosObject(ns, names[i])
		if i >= 20 && i < 25 {
			failing := metav1.ObjectMeta{}
			localcluster.InitContainerFailure{Container: servingv1.LoaderContainerName, ExitCode: 10, Reason: "Error", Message: "connection reset by peer"}.Apply(&failing)
			obj.Spec.PodMetadata = &servingv1.PodMetadata{Labels: failing.Labels, Annotations: failing.Annotations}
		}
		g.Expect(e.k8s.Create(ctx, obj)).To(Succeed())
	}
	step := workload / 6
	edit := func(from, to int, mutate func(*servingv1.AIInference)) {
		for i := from; i < to; i++ {
			e.update(g, &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names[i]}}, mutate)
		}
	}
	time.Sleep(step)
	edit(0, 10, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](2) })
	time.Sleep(step)
	edit(10, 20, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len", "4096"} })
	time.Sleep(step)
	restart := time.Now()
	g.Expect(e.cluster.RestartAPIServer(ctx)).To(Succeed())
	t.Logf("API server restarted in %s", time.Since(restart).Round(100*time.Millisecond))
	time.Sleep(step)
	edit(20, 25, func(o *servingv1.AIInference) { o.Spec.PodMetadata = nil })
	for i := 25; i < 30; i++ {
		g.Expect(e.k8s.Delete(ctx, &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names[i]}})).To(Succeed())
	}
	time.Sleep(2 * step)
	close(stopChaos)
	chaos.Wait()

	// Convergence: every object at its spec, Ready, within a bound.
	converge := time.Now()
	g.Eventually(func(g Gomega) {
		list := &servingv1.AIInferenceList{}
		g.Expect(e.k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(n - 5))
		for _, obj := range list.Items {
			ready := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady)
			g.Expect(ready).NotTo(BeNil(), obj.Name)
			g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), "%s: %s", obj.Name, ready.Message)
			g.Expect(ready.ObservedGeneration).To(Equal(obj.Generation), obj.Name)
			g.Expect(obj.Status.ReadyReplicas).To(Equal(*obj.Spec.Replicas), obj.Name)
		}
	}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "objects stuck after the chaos")
	t.Logf("converged %s after the chaos stopped", time.Since(converge).Round(100*time.Millisecond))

	// One of each child per object, controlled by it; none left of deleted objects.
	list := &servingv1.AIInferenceList{}
	g.Expect(e.k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	uids := map[string]string{}
	for _, obj := range list.Items {
		uids[obj.Name] = string(obj.UID)
	}
	g.Eventually(func(g Gomega) {
		for _, children := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ConfigMapList{}} {
			g.Expect(e.k8s.List(ctx, children, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelManagedBy: servingv1.ManagedByValue})).To(Succeed())
			items, err := meta.ExtractList(children)
			g.Expect(err).NotTo(HaveOccurred())
			per := map[string]int{}
			for _, item := range items {
				child := item.(client.Object)
				owner := metav1.GetControllerOf(child)
				g.Expect(owner).NotTo(BeNil(), "%T %s has no controller", child, child.GetName())
				g.Expect(uids).To(HaveKeyWithValue(owner.Name, string(owner.UID)), "%T %s is orphaned", child, child.GetName())
				per[owner.Name]++
			}
			for name := range uids {
				g.Expect(per[name]).To(Equal(1), "%T of %s", children, name)
			}
		}
	}).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(Succeed())

	// No status went backwards as the watcher saw it.
	events, backwards := statuses.stop()
	g.Expect(backwards).To(BeEmpty())
	t.Logf("chaos: %d objects, %d SIGKILLs of an operator replica, 1 API server restart, %d status versions watched, none backwards",
		n, kills, events)
}

// chaosObject is a CPU-only object (the simulated cluster has too few GPUs for
// 50 objects), quick to load.
func chaosObject(ns, name string) *servingv1.AIInference {
	obj := inference(ns, name, 0)
	obj.Spec.Model.Size = nil
	return obj
}

// statusWatch records, per object, the versions of its status a watcher sees.
type statusWatch struct {
	cancel    context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	events    int
	last      map[string]int64 // object -> highest generation Ready was reported for
	backwards []string
}

// watchStatuses watches the AIInference objects of ns (across API server
// restarts) and flags a Ready condition reported for an older generation than
// one already reported: what a `kubectl wait` or Argo CD would take as a lie.
func (e *env) watchStatuses(t *testing.T, ctx context.Context, ns string) *statusWatch {
	t.Helper()
	wc, err := client.NewWithWatch(e.cluster.RESTConfig(), client.Options{Scheme: e.k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	list := &servingv1.AIInferenceList{}
	if err := e.k8s.List(ctx, list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &statusWatch{cancel: cancel, done: make(chan struct{}), last: map[string]int64{}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
			return wc.Watch(ctx, &servingv1.AIInferenceList{}, &client.ListOptions{Namespace: ns, Raw: &options})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				obj, isObj := ev.Object.(*servingv1.AIInference)
				if !isObj || ev.Type == watch.Deleted {
					continue
				}
				w.record(obj)
			}
		}
	}()
	return w
}

func (w *statusWatch) record(obj *servingv1.AIInference) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	ready := meta.FindStatusCondition(obj.Status.Conditions, servingv1.ConditionReady)
	if ready == nil {
		return
	}
	if prev, seen := w.last[obj.Name]; seen && ready.ObservedGeneration < prev {
		w.backwards = append(w.backwards, fmt.Sprintf("%s: Ready=%s for generation %d after generation %d (resourceVersion %s)",
			obj.Name, ready.Status, ready.ObservedGeneration, prev, obj.ResourceVersion))
	}
	w.last[obj.Name] = max(w.last[obj.Name], ready.ObservedGeneration)
}

func (w *statusWatch) stop() (int, []string) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events, w.backwards
}
