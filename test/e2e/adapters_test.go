package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/s3test"
)

// LoRA adapters on the real node: the simulator serves vLLM's adapter API
// (load, unload, /v1/models with each adapter's path) but reads no file, so
// the test also checks, on the host, that the folder the engine was told to
// load holds the store's files, whole and verified.

// adapterFiles are an adapter's files as a PEFT folder has them.
var adapterFiles = []s3test.TreeFile{{Path: "adapter_config.json", Size: 512}, {Path: "adapter_model.safetensors", Size: 2 << 20}}

// uploadAdapter puts an adapter's files into the cluster's store under
// adapters/NAME/ and returns its spec, with the model's credentials.
func uploadAdapter(g Gomega, store *localcluster.ObjectStore, obj *servingv1.AIInference, name string, seed uint64) servingv1.AdapterSpec {
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	prefix := fmt.Sprintf("adapters/%s-%s/%s/", obj.Namespace, obj.Name, name)
	for i, f := range adapterFiles {
		g.Expect(server.UploadGenerated(context.Background(), store.Bucket, prefix+f.Path, f.Size, s3test.Layout{}, seed+uint64(i))).To(Succeed())
	}
	src := *obj.Spec.Model.Source.S3.DeepCopy()
	src.Prefix = prefix
	return servingv1.AdapterSpec{Name: name, Source: servingv1.ModelSource{S3: &src}}
}

// enginesAdapters are the adapters a pod's engine lists, with the paths it
// was told to load them from.
func enginesAdapters(g Gomega, pod corev1.Pod) map[string]string {
	resp, err := http.Get(engineURL(pod) + "/v1/models")
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	var models struct {
		Data []struct {
			ID, Root string
			Parent   *string
		}
	}
	g.Expect(json.NewDecoder(resp.Body).Decode(&models)).To(Succeed())
	out := map[string]string{}
	for _, m := range models.Data {
		if m.Parent != nil {
			out[m.ID] = m.Root
		}
	}
	return out
}

// inPodCache is, on the host, the folder a pod's engine was told to load an
// adapter from, in the pod's own cache volume (an emptyDir).
func inPodCache(g Gomega, pod corev1.Pod, enginePath string) string {
	var nodeDir string
	for _, n := range cluster.RealNodes() {
		if n.Name == pod.Spec.NodeName {
			nodeDir = n.Dir
		}
	}
	g.Expect(nodeDir).NotTo(BeEmpty(), "pod %s is on no real node", pod.Name)
	g.Expect(enginePath).To(HavePrefix("/models/" + loadspec.AdaptersDir + "/"))
	return filepath.Join(nodeDir, "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~empty-dir", "model-cache", strings.TrimPrefix(enginePath, "/models"))
}

// checkAdapterOnHost reads, on the host, the folder onHost an engine was told
// to load an adapter from, and compares each file with the store's copy; the
// loader's complete marker must name a real check for each.
func checkAdapterOnHost(g Gomega, store *localcluster.ObjectStore, onHost string, spec servingv1.AdapterSpec) {
	for _, f := range adapterFiles {
		got, err := os.ReadFile(filepath.Join(onHost, f.Path))
		g.Expect(err).NotTo(HaveOccurred(), "the engine was told to load %s", onHost)
		want, err := os.ReadFile(filepath.Join(store.Root, store.Bucket, spec.Source.S3.Prefix, f.Path))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sha256.Sum256(got)).To(Equal(sha256.Sum256(want)), "%s of adapter %s differs from the store's", f.Path, spec.Name)
	}
	data, err := os.ReadFile(filepath.Join(onHost, loadspec.CompleteMarker))
	g.Expect(err).NotTo(HaveOccurred(), "no complete marker: the engine would load a folder not verified")
	var marker struct {
		Files []struct{ Path, Check string }
	}
	g.Expect(json.Unmarshal(data, &marker)).To(Succeed())
	g.Expect(marker.Files).To(HaveLen(len(adapterFiles)))
	for _, f := range marker.Files {
		g.Expect(f.Check).NotTo(Equal("size"), "%s was only size-checked", f.Path)
	}
}

// baseLoad sends a base-model completion through the Service every 50 ms
// until stop, and counts the answers and failures.
type baseLoad struct {
	mu           sync.Mutex
	ok, failed   int
	firstFailure error
	stop         chan struct{}
	done         chan struct{}
}

func startBaseLoad(url, model string) *baseLoad {
	l := &baseLoad{stop: make(chan struct{}), done: make(chan struct{})}
	httpClient := &http.Client{Timeout: 5 * time.Second}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			_, err := complete(httpClient, url, model)
			l.mu.Lock()
			if err != nil {
				l.failed++
				if l.firstFailure == nil {
					l.firstFailure = err
				}
			} else {
				l.ok++
			}
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *baseLoad) finish() (ok, failed int, first error) {
	close(l.stop)
	<-l.done
	return l.ok, l.failed, l.firstFailure
}

// firstAnswer polls a pod's engine for a completion of model and returns
// how long after since the first one came.
func firstAnswer(g Gomega, pod corev1.Pod, model string, since time.Time, timeout time.Duration) time.Duration {
	httpClient := &http.Client{Timeout: 2 * time.Second}
	g.Eventually(func() (string, error) { return complete(httpClient, engineURL(pod), model) }).
		WithTimeout(timeout).WithPolling(100 * time.Millisecond).Should(Equal(model))
	return time.Since(since)
}

func adapterStatus(got *servingv1.AIInference, name string) servingv1.AdapterStatus {
	for _, a := range got.Status.Adapters {
		if a.Name == name {
			return a
		}
	}
	return servingv1.AdapterStatus{}
}

func adapterEvents(g Gomega, obj *servingv1.AIInference) map[string]int {
	events := &corev1.EventList{}
	g.Expect(k8s.List(context.Background(), events, client.InNamespace(obj.Namespace))).To(Succeed())
	out := map[string]int{}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == obj.Name && (e.Reason == servingv1.ReasonAdaptersLoaded || e.Reason == servingv1.ReasonAdapterFailed) {
			out[e.Reason]++
		}
	}
	return out
}

func adaptersReady(g Gomega, got *servingv1.AIInference) {
	c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionAdaptersReady)
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.ObservedGeneration).To(Equal(got.Generation))
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
}

// TestRealNodeAdaptersLoadWithoutRestart (make bench-adapters prints its
// figures): a running vLLM replica takes an adapter added to the spec without
// a restart, unloads one removed, reports a broken one without leaving
// service; the same change made by a rolling restart is timed beside it; the
// base model's requests through the Service go on throughout.
func TestRealNodeAdaptersLoadWithoutRestart(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 2, "adapters")
	sql := uploadAdapter(g, store, obj, "sql-lora", 500)
	chat := uploadAdapter(g, store, obj, "chat-lora", 510)
	docs := uploadAdapter(g, store, obj, "docs-lora", 520)
	obj.Spec.Adapters = []servingv1.AdapterSpec{sql}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		beReady(1)(g, got)
		adaptersReady(g, got)
	})
	pod := oneServingPod(g, obj)[0]
	firstAnswer(g, pod, sql.Name, time.Now(), 10*time.Second)
	checkAdapterOnHost(g, store, inPodCache(g, pod, enginesAdapters(g, pod)[sql.Name]), sql)
	load := startBaseLoad(serviceURL(g, obj), obj.Spec.Model.Name)

	// Added at run time: served by the running replica, no restart.
	added := time.Now()
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Adapters = append(o.Spec.Adapters, chat) })
	runtimeLoad := firstAnswer(g, pod, chat.Name, added, time.Minute)
	checkAdapterOnHost(g, store, inPodCache(g, pod, enginesAdapters(g, pod)[chat.Name]), chat)
	after := &corev1.Pod{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(&pod), after)).To(Succeed())
	g.Expect(after.UID).To(Equal(pod.UID))
	for _, cs := range after.Status.ContainerStatuses {
		g.Expect(cs.RestartCount).To(BeZero(), "container %s restarted", cs.Name)
	}
	waitFor(t, g, obj, 30*time.Second, func(g Gomega, got *servingv1.AIInference) {
		adaptersReady(g, got)
		g.Expect(adapterStatus(got, chat.Name).Pods).To(Equal([]string{pod.Name}))
	})

	// Removed: unloaded, and no longer served.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Adapters = []servingv1.AdapterSpec{chat} })
	g.Eventually(func(g Gomega) { g.Expect(enginesAdapters(g, pod)).NotTo(HaveKey(sql.Name)) }).WithTimeout(30 * time.Second).Should(Succeed())
	_, err := complete(&http.Client{Timeout: 2 * time.Second}, engineURL(pod), sql.Name)
	g.Expect(err).To(HaveOccurred(), "a removed adapter still answers")

	// A broken adapter (nothing in the store) fails on the replica, which
	// keeps serving the base model and the other adapter.
	broken := chat
	broken.Name = "broken-lora"
	broken.Source.S3 = broken.Source.S3.DeepCopy()
	broken.Source.S3.Prefix = "adapters/none/"
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Adapters = append(o.Spec.Adapters, broken) })
	waitFor(t, g, obj, time.Minute, func(g Gomega, got *servingv1.AIInference) {
		c := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionAdaptersReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(servingv1.ReasonAdapterFailed), c.Message)
		f := adapterStatus(got, broken.Name).LastFailure
		g.Expect(f).NotTo(BeNil())
		g.Expect(f.Reason).To(Equal(loadspec.ReasonNotFound))
		g.Expect(f.Pod).To(Equal(pod.Name))
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(1)))
	})
	firstAnswer(g, pod, chat.Name, time.Now(), 5*time.Second)
	g.Eventually(func(g Gomega) {
		events := adapterEvents(g, obj)
		g.Expect(events[servingv1.ReasonAdaptersLoaded]).To(BeNumerically(">=", 2))
		g.Expect(events[servingv1.ReasonAdapterFailed]).To(BeNumerically(">=", 1))
	}).WithTimeout(10 * time.Second).Should(Succeed())

	// The same change by a rolling restart: a new replica comes up with every
	// adapter (the agent loads them before the pod is ready), the old one goes.
	restarted := time.Now()
	update(g, obj, func(o *servingv1.AIInference) {
		o.Spec.Adapters = []servingv1.AdapterSpec{chat, docs}
		o.Spec.PodMetadata = &servingv1.PodMetadata{Annotations: map[string]string{"restarted-at": restarted.Format(time.RFC3339Nano)}}
	})
	var newPod corev1.Pod
	g.Eventually(func(g Gomega) {
		pods := servingPods(g, obj)
		g.Expect(pods).NotTo(BeEmpty())
		for _, p := range pods {
			if p.UID != pod.UID {
				newPod = p
			}
		}
		g.Expect(newPod.Name).NotTo(BeEmpty())
	}).WithTimeout(realReadyTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	rollingRestart := firstAnswer(g, newPod, docs.Name, restarted, 30*time.Second)
	g.Expect(enginesAdapters(g, newPod)).To(And(HaveKey(chat.Name), HaveKey(docs.Name)), "a replica that starts later comes up with every adapter")
	checkAdapterOnHost(g, store, inPodCache(g, newPod, enginesAdapters(g, newPod)[docs.Name]), docs)
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		beReady(1)(g, got)
		adaptersReady(g, got)
	})

	ok, failed, first := load.finish()
	t.Logf("adapters figure: an adapter added to the spec answered on the running replica after %s; the same change by a rolling restart answered after %s; base-model requests through the Service: %d answered, %d failed",
		runtimeLoad.Round(100*time.Millisecond), rollingRestart.Round(100*time.Millisecond), ok, failed)
	g.Expect(failed).To(BeZero(), "first failure: %v", first)
	g.Expect(ok).To(BeNumerically(">", 20))
	g.Expect(runtimeLoad).To(BeNumerically("<", rollingRestart), "loading at run time must beat a restart")
}

// TestRealNodeAdaptersThroughTheRouterAndTheNodeCache: a routed model on the
// node cache with an adapter. Through its Service and the router, a request
// for the adapter reaches the replica serving it; one for an adapter that no
// replica could load is answered by the router (503, Retry-After) and never
// reaches an engine (which would answer 404); /v1/models lists the adapter.
// The adapter is fetched once into the node's copy of the model, whole and
// verified, and a replica started later on the node serves it from there,
// with no further read of the store.
func TestRealNodeAdaptersThroughTheRouterAndTheNodeCache(t *testing.T) {
	// A router pod on each real node and one replica.
	g, store, obj := startRealNodeTest(t, 3, "adapters-routed")
	modelCacheSerial.Lock()
	defer modelCacheSerial.Unlock()
	caches := startModelCache(t)
	installRouter(t, g)
	ctx := context.Background()

	node := caches[0]
	sql := uploadAdapter(g, store, obj, "sql-lora", 600)
	obj.Spec.Adapters = []servingv1.AdapterSpec{sql}
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	obj.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node.Node}
	obj.Spec.Engine.Env = []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		beReady(1)(g, got)
		adaptersReady(g, got)
	})
	pod := oneServingPod(g, obj)[0]
	url := serviceURL(g, obj)

	// Through the router, to the replica that serves the adapter.
	for i := range 5 {
		a, err := routedComplete(newConnectionClient, url, sql.Name, fmt.Sprintf("SELECT %d", i))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(a.pod).To(Equal(pod.Name))
	}
	models, err := listModels(newConnectionClient, url)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(models).To(ContainElements(obj.Spec.Model.Name, sql.Name))

	// In the node's copy: whole and verified.
	key := nodecachespec.Key(obj.Namespace, "s3://"+store.Bucket+"/"+obj.Spec.Model.Source.S3.Prefix, store.Endpoint)
	inNodeCopy := func(p corev1.Pod) string {
		path := enginesAdapters(g, p)[sql.Name]
		g.Expect(path).To(HavePrefix("/models/" + loadspec.AdaptersDir + "/"))
		return filepath.Join(node.Dir, "models", key, strings.TrimPrefix(path, "/models"))
	}
	checkAdapterOnHost(g, store, inNodeCopy(pod), sql)
	gets, err := store.ObjectGets(store.Bucket, sql.Source.S3.Prefix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gets).To(Equal(len(adapterFiles)), "the store serves the adapter once")

	// An adapter no replica can load: the router answers for it, the engine
	// never sees it.
	broken := sql
	broken.Name = "broken-lora"
	broken.Source.S3 = broken.Source.S3.DeepCopy()
	broken.Source.S3.Prefix = "adapters/none/"
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Adapters = append(o.Spec.Adapters, broken) })
	waitFor(t, g, obj, time.Minute, func(g Gomega, got *servingv1.AIInference) {
		f := adapterStatus(got, broken.Name).LastFailure
		g.Expect(f).NotTo(BeNil())
		g.Expect(f.Reason).To(Equal(loadspec.ReasonNotFound))
	})
	for range 5 {
		_, err := postCompletion(newConnectionClient, url, "", broken.Name, "SELECT 1")
		var refused *statusError
		g.Expect(errors.As(err, &refused)).To(BeTrue(), "a request for %s: %v", broken.Name, err)
		g.Expect(refused.status).To(Equal(http.StatusServiceUnavailable), refused.Error())
		g.Expect(refused.retryAfter).NotTo(BeEmpty(), "503 without Retry-After")
		g.Expect(refused.body).To(ContainSubstring("has loaded adapter " + broken.Name))
	}
	_, err = routedComplete(newConnectionClient, url, sql.Name, "SELECT 2")
	g.Expect(err).NotTo(HaveOccurred(), "the adapter that loaded still serves")

	// A replica started later on the node serves the adapter from the node's
	// copy: the store is not read again.
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Adapters = []servingv1.AdapterSpec{sql} })
	g.Expect(k8s.Delete(ctx, &pod, client.GracePeriodSeconds(0))).To(Succeed())
	next := successorPod(g, obj, pod)
	g.Eventually(func() (string, error) {
		a, err := routedComplete(newConnectionClient, url, sql.Name, "SELECT 3")
		return a.pod, err
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Equal(next.Name))
	checkAdapterOnHost(g, store, inNodeCopy(next), sql)
	again, err := store.ObjectGets(store.Bucket, sql.Source.S3.Prefix)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("adapter %s: %d object GETs for two replicas one after the other on node %s", sql.Name, again, node.Node)
	g.Expect(again).To(Equal(gets), "the later replica read the adapter from the store again")
}
