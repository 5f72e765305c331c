package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loader/s3test"
	"github.com/aiinference/operator/internal/localcluster"
	"github.com/aiinference/operator/internal/nodecache"
)

// modelCacheNamespace receives the real nodes' cache reports.
const modelCacheNamespace = "aiinference-model-cache"

var modelCache struct {
	once  sync.Once
	nodes []localcluster.ModelCacheNode
	err   error
}

// startModelCache runs the node cache's plugin for the shared cluster's real
// nodes, once per suite, with a budget far above what the tests load.
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
		modelCache.nodes, modelCache.err = cluster.StartModelCache(ctx, localcluster.ModelCacheOptions{Binary: bin, Budget: "4Gi", Namespace: modelCacheNamespace})
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
func nodeReport(g Gomega, node string) nodecache.Report {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: modelCacheNamespace, Name: "model-cache-" + node}, cm)).To(Succeed())
	var r nodecache.Report
	g.Expect(json.Unmarshal([]byte(cm.Data[nodecache.StateKey]), &r)).To(Succeed())
	return r
}

// TestRealNodeModelCacheDownloadsOncePerNode runs three replicas of a model on
// the node cache over the two real nodes (a node holds two of the suite's pods,
// so at least two share a node): the store serves the model's files once per
// node that runs a replica, counted in its access log. Then the copies are
// corrupted in place on the hosts while no pod runs, and the replicas come back:
// each node's copy has only its corrupted file fetched again.
func TestRealNodeModelCacheDownloadsOncePerNode(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 3, "node-cache")
	caches := startModelCache(t)
	ctx := context.Background()
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

	key := nodecache.Key(obj.Namespace, "s3://"+store.Bucket+"/"+prefix, store.Endpoint)
	for node, pods := range placed {
		g.Eventually(func(g Gomega) {
			r := nodeReport(g, node)
			var entry *nodecache.Entry
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
			g.Expect(n.Labels).To(HaveKeyWithValue(nodecache.NodeLabel(key), "true"))
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
