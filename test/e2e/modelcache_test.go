package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/s3test"
)

var modelCache struct {
	once  sync.Once
	nodes []localcluster.ModelCacheNode
	err   error
}

// startModelCache runs the node cache's plugin for the shared cluster's real
// nodes, once per suite.
func startModelCache(t *testing.T) []localcluster.ModelCacheNode {
	t.Helper()
	modelCache.once.Do(func() {
		bin := filepath.Join(workDir, "model-loader")
		build := exec.Command("go", "build", "-o", bin, "./cmd/model-loader")
		build.Dir = repoRoot
		if out, err := build.CombinedOutput(); err != nil {
			modelCache.err = &buildError{err: err, out: string(out)}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// 1 GiB: TestRealNodeModelCacheFaults fills it; the benchmark's 2 GiB
		// model needs more.
		budget := "1Gi"
		if os.Getenv(modelCacheBenchEnv) == "1" {
			budget = "8Gi"
		}
		modelCache.nodes, modelCache.err = cluster.StartModelCache(ctx, localcluster.ModelCacheOptions{Binary: bin, Budget: budget, Namespace: localcluster.ModelCacheNamespace})
	})
	if modelCache.err != nil {
		t.Fatalf("starting the node cache: %v", modelCache.err)
	}
	return modelCache.nodes
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// podsByNode are the object's pods' names by node.
func podsByNode(g Gomega, obj *servingv1.AIInference) map[string][]string {
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
		client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	out := map[string][]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = append(out[p.Spec.NodeName], p.Name)
		}
	}
	return out
}

// cacheEvents are the node cache's events on the object's pods, by reason.
func cacheEvents(g Gomega, ns string) map[string]int {
	events := &corev1.EventList{}
	g.Expect(k8s.List(context.Background(), events, client.InNamespace(ns))).To(Succeed())
	out := map[string]int{}
	for _, e := range events.Items {
		if e.Source.Component == "model-cache" {
			out[e.Reason]++
		}
	}
	return out
}

// nodeReport is a node's report of its copies.
func nodeReport(g Gomega, node string) nodecachespec.Report {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: localcluster.ModelCacheNamespace, Name: "model-cache-" + node}, cm)).To(Succeed())
	var r nodecachespec.Report
	g.Expect(json.Unmarshal([]byte(cm.Data[nodecachespec.StateKey]), &r)).To(Succeed())
	return r
}

// TestRealNodeModelCacheDownloadsOncePerNode runs three replicas of a model on
// the node cache, in a namespace that enforces Pod Security "restricted", over
// the two real nodes (a node holds two of the suite's pods,
// so at least two share a node): the store serves the model's files once per
// node that runs a replica, counted in its access log. Then the copies are
// corrupted in place on the hosts while no pod runs, and the replicas come back:
// each node's copy has only its corrupted file fetched again.
func TestRealNodeModelCacheDownloadsOncePerNode(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 3, "node-cache")
	modelCacheSerial.Lock()
	defer modelCacheSerial.Unlock()
	caches := startModelCache(t)
	ctx := context.Background()
	// The pods on the node cache pass Pod Security "restricted": their cache is
	// a csi volume, not a hostPath.
	ns := &corev1.Namespace{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: obj.Namespace}, ns)).To(Succeed())
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["pod-security.kubernetes.io/enforce"], ns.Labels["pod-security.kubernetes.io/enforce-version"] = "restricted", "latest"
	g.Expect(k8s.Update(ctx, ns)).To(Succeed())
	const prefix = "node-cache-model/"
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	// Files under the loader's smallest part (a quarter of 16 MiB, for the
	// files queued last): one GET each.
	files := []s3test.TreeFile{{Path: "model-00001-of-00002.safetensors", Size: 3 << 20}, {Path: "model-00002-of-00002.safetensors", Size: 3 << 20}, {Path: "config.json", Size: 1234}}
	for i, f := range files {
		g.Expect(server.UploadGenerated(ctx, store.Bucket, prefix+f.Path, f.Size, s3test.Layout{}, uint64(200+i))).To(Succeed())
	}
	obj.Spec.Model.Source.S3.Prefix = prefix
	obj.Spec.Model.Size = ptr.To(resource.MustParse("7Mi"))
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	obj.Spec.Replicas = ptr.To[int32](3)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, 2*realReadyTimeout, beReady(3))

	placed := podsByNode(g, obj)
	t.Logf("pods by node: %v", placed)
	gets, err := store.ObjectGets(store.Bucket, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("object GETs for 3 replicas on %d nodes: %d (%d files)", len(placed), gets, len(files))
	g.Expect(gets).To(Equal(len(files)*len(placed)), "the store serves the model once per node")
	g.Eventually(func(g Gomega) {
		events := cacheEvents(g, obj.Namespace)
		g.Expect(events["ModelCacheNew"]).To(Equal(len(placed)), "events %v", events)
		g.Expect(events["ModelCacheNew"]+events["ModelCacheShared"]+events["ModelCacheComplete"]).To(Equal(3), "events %v", events)
	}).WithTimeout(30 * time.Second).Should(Succeed())

	key := nodecachespec.Key(obj.Namespace, "s3://"+store.Bucket+"/"+prefix, store.Endpoint)
	for node, pods := range placed {
		g.Eventually(func(g Gomega) {
			r := nodeReport(g, node)
			var entry *nodecachespec.Entry
			for i := range r.Entries {
				if r.Entries[i].Key == key {
					entry = &r.Entries[i]
				}
			}
			g.Expect(entry).NotTo(BeNil(), "report %+v", r)
			g.Expect(entry.Complete).To(BeTrue())
			g.Expect(entry.Pods).To(Equal(len(pods)))
			g.Expect(entry.Bytes).To(BeNumerically(">=", 6<<20))
			n := &corev1.Node{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			g.Expect(n.Labels).To(HaveKeyWithValue(nodecachespec.NodeLabel(key), "true"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	}

	// No pod: the copies stay, unused; corrupt one file of each in place.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](0) })
	g.Eventually(func(g Gomega) { g.Expect(podsByNode(g, obj)).To(BeEmpty()) }).WithTimeout(time.Minute).Should(Succeed())
	corrupted := map[string]bool{}
	for _, c := range caches {
		shard := filepath.Join(c.Dir, "models", key, files[0].Path)
		f, err := os.OpenFile(shard, os.O_WRONLY, 0)
		if os.IsNotExist(err) {
			continue
		}
		g.Expect(err).NotTo(HaveOccurred())
		_, err = f.WriteAt([]byte("a bad disk"), 4096)
		g.Expect(err).NotTo(HaveOccurred())
		f.Close()
		corrupted[c.Node] = true
	}
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](3) })
	waitFor(t, g, obj, 2*realReadyTimeout, beReady(3))
	again := podsByNode(g, obj)
	want := 0
	for node := range again {
		if corrupted[node] {
			want++ // the corrupted file alone
		} else {
			want += len(files)
		}
	}
	after, err := store.ObjectGets(store.Bucket, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	nodes := make([]string, 0, len(again))
	for n := range again {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	t.Logf("after corrupting the copies on %v: pods on %v, %d more object GETs", corrupted, nodes, after-gets)
	g.Expect(after-gets).To(Equal(want), "each node fetches its corrupted file again, and nothing else")
}

// modelCacheBenchEnv runs TestRealNodeModelCacheColdAndWarm (make bench-cache):
// it uploads a 2 GiB model, too long for every make test.
const modelCacheBenchEnv = "MODELCACHE_BENCH"

// TestRealNodeModelCacheColdAndWarm prints the figures of docs/model-cache.md:
// for the demo's 256 MiB model and a 2 GiB one, a replica's start (replicas
// 0 -> 1 to its pod Ready) with a cold node cache, then, the pod gone, with the
// node's copy warm, beside the limit a warm cache approaches (the engine's own
// start and warm-up, from the loader's end to Ready) and the store bytes the
// replica's loader read.
func TestRealNodeModelCacheColdAndWarm(t *testing.T) {
	if os.Getenv(modelCacheBenchEnv) != "1" {
		t.Skipf("a benchmark: make bench-cache (%s=1)", modelCacheBenchEnv)
	}
	g, store, obj := startRealNodeTest(t, 1, "cache-bench")
	modelCacheSerial.Lock()
	defer modelCacheSerial.Unlock()
	startModelCache(t)
	ctx := context.Background()
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	for _, model := range []struct {
		name   string
		shards int
		shard  int64
	}{{"256MiB", 2, 128 << 20}, {"2GiB", 4, 512 << 20}} {
		prefix := "cache-bench-" + model.name + "/"
		var size int64
		for i, f := range s3test.ModelTree(model.shards, model.shard, 0, 0) {
			g.Expect(server.UploadGenerated(ctx, store.Bucket, prefix+f.Path, f.Size, s3test.Layout{PartSize: 64 << 20}, uint64(300+i))).To(Succeed())
			size += f.Size
		}
		o := obj.DeepCopy()
		o.Name = "cache-bench-" + strings.ToLower(model.name)
		o.Spec.Model.Source.S3.Prefix = prefix
		o.Spec.Model.Size = resource.NewQuantity(size, resource.BinarySI)
		o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
		o.Spec.Loading.Timeout = &metav1.Duration{Duration: 10 * time.Minute}
		o.Spec.Replicas = ptr.To[int32](0)
		g.Expect(k8s.Create(ctx, o)).To(Succeed())
		var nodes []string
		for _, run := range []string{"cold", "warm"} {
			start := time.Now()
			update(g, o, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](1) })
			var pod corev1.Pod
			g.Eventually(func(g Gomega) {
				pods := servingPods(g, o)
				g.Expect(pods).To(HaveLen(1))
				pod = pods[0]
			}).WithTimeout(10 * time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
			took := time.Since(start)
			summary, loaderEnd := loaderSummary(g, pod)
			var readyAt time.Time
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady {
					readyAt = c.LastTransitionTime.Time
				}
			}
			nodes = append(nodes, pod.Spec.NodeName)
			t.Logf("cache figure: %s model (%d bytes), %s cache, on %s: replicas 0 -> 1 to the pod Ready %.1f s; the loader %.2f s, %d bytes read from the store (cache hit %v); the engine's start and warm-up %s",
				model.name, size, run, pod.Spec.NodeName, took.Seconds(), summary.Seconds, summary.BytesFetched, summary.CacheHit, readyAt.Sub(loaderEnd))
			if run == "cold" {
				g.Expect(summary.BytesFetched).To(Equal(size))
			} else {
				g.Expect(nodes[1]).To(Equal(nodes[0]), "the warm replica goes to the node with the copy")
				g.Expect(summary.BytesFetched).To(BeZero())
			}
			update(g, o, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](0) })
			g.Eventually(func(g Gomega) { g.Expect(podsByNode(g, o)).To(BeEmpty()) }).WithTimeout(2 * time.Minute).Should(Succeed())
		}
		g.Expect(k8s.Delete(ctx, o)).To(Succeed())
	}
}

// loaderSummary is the pod's loader's report and when it ended.
func loaderSummary(g Gomega, pod corev1.Pod) (loadspec.Summary, time.Time) {
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == servingv1.LoaderContainerName && cs.State.Terminated != nil {
			var s loadspec.Summary
			g.Expect(json.Unmarshal([]byte(cs.State.Terminated.Message), &s)).To(Succeed())
			return s, cs.State.Terminated.FinishedAt.Time
		}
	}
	g.Expect(pod.Status.InitContainerStatuses).To(BeEmpty(), "no loader that ended")
	return loadspec.Summary{}, time.Time{}
}

// uploadModel puts a generated model of shards files of shard bytes (and a
// config.json) under prefix, and returns its size.
func uploadModel(g *WithT, store *localcluster.ObjectStore, prefix string, shards int, shard int64, seed uint64) int64 {
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	var size int64
	for i, f := range s3test.ModelTree(shards, shard, 0, 0) {
		g.Expect(server.UploadGenerated(context.Background(), store.Bucket, prefix+f.Path, f.Size, s3test.Layout{PartSize: 64 << 20}, seed+uint64(i))).To(Succeed())
		size += f.Size
	}
	return size
}

// onNodeCache is base for a model under prefix, on the node cache, pinned to
// one node.
func onNodeCache(base *servingv1.AIInference, name, prefix string, size int64, node string) *servingv1.AIInference {
	o := base.DeepCopy()
	o.Name = name
	o.Spec.Model.Source.S3.Prefix = prefix
	o.Spec.Model.Size = resource.NewQuantity(size, resource.BinarySI)
	o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	o.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	o.Spec.Loading.MaxRetries = ptr.To[int32](3)
	return o
}

// copyOf is the node's copy of obj's model on the host.
func copyOf(c localcluster.ModelCacheNode, obj *servingv1.AIInference) string {
	key := nodecachespec.Key(obj.Namespace, "s3://"+obj.Spec.Model.Source.S3.Bucket+"/"+obj.Spec.Model.Source.S3.Prefix, obj.Spec.Model.Source.S3.Endpoint)
	return filepath.Join(c.Dir, "models", key)
}

// killLoader kills the loader of pod on this host (a real node's containers
// are the host's processes), found by its command and the pod's cgroup.
func killLoader(g Gomega, pod corev1.Pod) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	g.Expect(err).NotTo(HaveOccurred())
	uid := string(pod.UID)
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(cmd), "model-loader") || strings.Contains(string(cmd), "node-cache") {
			continue
		}
		cgroup, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cgroup"))
		if err != nil || !(strings.Contains(string(cgroup), uid) || strings.Contains(string(cgroup), strings.ReplaceAll(uid, "-", "_"))) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
		return
	}
	g.Expect("").To(Equal(pod.Name), "no loader process of pod %s on the host", pod.Name)
}

// modelCacheSerial keeps the node cache's tests apart: eviction in one would
// choose among the other's copies. Taken after t.Parallel (in
// startRealNodeTest): a test waiting for it before would hold up the
// sequential phase that the holder waits for.
var modelCacheSerial sync.Mutex

// TestRealNodeModelCacheFaults: a loader killed halfway leaves nothing another
// pod could take for a copy and the next run resumes it; a full budget evicts
// the least recently used copy that no pod uses, never one in use; deleting an
// AIInference whose model another AIInference's pods use keeps that copy.
func TestRealNodeModelCacheFaults(t *testing.T) {
	g, store, base := startRealNodeTest(t, 2, "cache-faults")
	modelCacheSerial.Lock()
	defer modelCacheSerial.Unlock()
	caches := startModelCache(t)
	g.Expect(len(caches)).To(BeNumerically(">=", 2))
	ctx := context.Background()

	t.Run("kill the loader mid-download", func(t *testing.T) {
		g := NewWithT(t)
		c := caches[1]
		size := uploadModel(g, store, "cache-kill/", 3, 256<<20, 400)
		obj := onNodeCache(base, "killed", "cache-kill/", size, c.Node)
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		pod := &corev1.Pod{}
		g.Eventually(func(g Gomega) {
			pods := podsByNode(g, obj)[c.Node]
			g.Expect(pods).To(HaveLen(1))
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: obj.Namespace, Name: pods[0]}, pod)).To(Succeed())
			g.Expect(pod.Status.PodIP).NotTo(BeEmpty())
		}).WithTimeout(time.Minute).Should(Succeed())
		// The loader's own progress, from the host (which routes the pods'
		// subnet): killed once it has written some of the model.
		var progress loadspec.Progress
		progressURL := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(loadspec.ProgressPort)) + loadspec.ProgressPath
		g.Eventually(func(g Gomega) {
			resp, err := http.Get(progressURL)
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			g.Expect(json.NewDecoder(resp.Body).Decode(&progress)).To(Succeed())
			g.Expect(progress.Fetched).To(BeNumerically(">", 200<<20))
		}).WithTimeout(2 * time.Minute).WithPolling(20 * time.Millisecond).Should(Succeed())
		killLoader(g, *pod)
		dir := copyOf(c, obj)
		_, err := os.Stat(filepath.Join(dir, loadspec.CompleteMarker))
		g.Expect(os.IsNotExist(err)).To(BeTrue(), "a killed download left a complete marker")
		t.Logf("killed the loader at %d of %d bytes fetched (%s)", progress.Fetched, size, progress.Stage)
		g.Expect(progress.Fetched).To(BeNumerically("<", size))
		g.Consistently(func(g Gomega) {
			_, err := os.Stat(filepath.Join(dir, loadspec.CompleteMarker))
			g.Expect(os.IsNotExist(err)).To(BeTrue())
			// The report never calls a copy complete before its loader does.
			for _, e := range nodeReport(g, c.Node).Entries {
				if e.Source == "s3://"+store.Bucket+"/cache-kill/" {
					g.Expect(e.Complete).To(BeFalse())
				}
			}
		}).WithTimeout(300 * time.Millisecond).WithPolling(50 * time.Millisecond).Should(Succeed())
		waitFor(t, g, obj, 2*realReadyTimeout, beReady(1))
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		summary, _ := loaderSummary(g, *pod)
		t.Logf("the restarted loader read %d bytes of %d (restarts %d)", summary.BytesFetched, size, pod.Status.InitContainerStatuses[0].RestartCount)
		g.Expect(summary.Verified).To(BeTrue())
		// The parts in flight at the kill (up to the loader's concurrency times
		// its part size) are fetched again; the journaled ones are not.
		g.Expect(summary.BytesFetched).To(BeNumerically("<", size), "the next run resumes the partial copy")
		g.Expect(k8s.Delete(ctx, obj)).To(Succeed())
	})

	t.Run("eviction and a deleted AIInference", func(t *testing.T) {
		g := NewWithT(t)
		c := caches[0]
		// The node's budget is 1 GiB: two of these fit, not three.
		const shard = 200 << 20
		inUse := onNodeCache(base, "in-use", "cache-in-use/", uploadModel(g, store, "cache-in-use/", 2, shard, 500), c.Node)
		idle := onNodeCache(base, "idle", "cache-idle/", uploadModel(g, store, "cache-idle/", 2, shard, 600), c.Node)
		third := onNodeCache(base, "third", "cache-third/", uploadModel(g, store, "cache-third/", 2, shard, 700), c.Node)
		// In use, the least recently used: pure LRU would evict it.
		g.Expect(k8s.Create(ctx, inUse)).To(Succeed())
		waitFor(t, g, inUse, 2*realReadyTimeout, beReady(1))
		idle.Spec.Replicas = ptr.To[int32](1)
		g.Expect(k8s.Create(ctx, idle)).To(Succeed())
		waitFor(t, g, idle, 2*realReadyTimeout, beReady(1))
		update(g, idle, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](0) })
		g.Eventually(func(g Gomega) { g.Expect(podsByNode(g, idle)).To(BeEmpty()) }).WithTimeout(time.Minute).Should(Succeed())
		g.Expect(k8s.Delete(ctx, idle)).To(Succeed())
		// A third model needs room: the idle copy goes, the one in use stays.
		g.Expect(k8s.Create(ctx, third)).To(Succeed())
		waitFor(t, g, third, 2*realReadyTimeout, beReady(1))
		_, err := os.Stat(copyOf(c, idle))
		g.Expect(os.IsNotExist(err)).To(BeTrue(), "the idle copy was not evicted")
		_, err = os.Stat(filepath.Join(copyOf(c, inUse), loadspec.CompleteMarker))
		g.Expect(err).NotTo(HaveOccurred(), "the copy in use was evicted")
		g.Expect(servingPods(g, inUse)).To(HaveLen(1), "the model in use stopped serving")
		t.Logf("eviction: %s's copy evicted, %s's kept in use; report %+v", idle.Name, inUse.Name, nodeReport(g, c.Node))

		// Another AIInference of the same model and namespace shares the copy;
		// deleting the first one leaves it to the second.
		twin := onNodeCache(base, "twin", inUse.Spec.Model.Source.S3.Prefix, inUse.Spec.Model.Size.Value(), c.Node)
		g.Expect(k8s.Delete(ctx, third)).To(Succeed())
		g.Expect(k8s.Create(ctx, twin)).To(Succeed())
		waitFor(t, g, twin, 2*realReadyTimeout, beReady(1))
		g.Expect(k8s.Delete(ctx, inUse)).To(Succeed())
		g.Eventually(func(g Gomega) { g.Expect(podsByNode(g, inUse)).To(BeEmpty()) }).WithTimeout(time.Minute).Should(Succeed())
		g.Expect(servingPods(g, twin)).To(HaveLen(1))
		_, err = os.Stat(filepath.Join(copyOf(c, twin), loadspec.CompleteMarker))
		g.Expect(err).NotTo(HaveOccurred(), "the shared copy went with the deleted AIInference")
		// A new replica of the twin still finds it complete.
		update(g, twin, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](0) })
		g.Eventually(func(g Gomega) { g.Expect(podsByNode(g, twin)).To(BeEmpty()) }).WithTimeout(time.Minute).Should(Succeed())
		update(g, twin, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](1) })
		waitFor(t, g, twin, 2*realReadyTimeout, beReady(1))
		pod := servingPods(g, twin)[0]
		summary, _ := loaderSummary(g, pod)
		g.Expect(summary.BytesFetched).To(BeZero())
		g.Expect(summary.CacheHit).To(BeTrue())
	})
}
