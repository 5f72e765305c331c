package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/s3test"
	"github.com/aiinference/operator/test/testutil/freeport"
)

// The tests in this file run pods for real on the cluster's real node: the model
// loader downloads from the cluster's object store into the cache volume, and
// the engine (llm-d-inference-sim, a CPU stand-in that speaks vLLM's API) serves.

// realNodeEnv asks for the real-node tests, as for localcluster's own (root and
// cgroup v1 needed; where they are missing the run fails and says why).
const realNodeEnv = "LOCALCLUSTER_REAL_NODE"

// realGPUProduct is the GPU product of the real node, which no simulated node has.
const realGPUProduct = "NVIDIA-T4"

// realReadyTimeout bounds a real pod's way to Ready: a load from the store and
// the engine's start, on a busy 2-core machine.
const realReadyTimeout = 2 * time.Minute

func realNodeAsked() bool { return os.Getenv(realNodeEnv) == "1" }

// needRealNode skips a real-node test when the run did not ask for real nodes; a
// run that asks on a host that cannot has already failed in TestMain.
func needRealNode(t *testing.T) *localcluster.ObjectStore {
	t.Helper()
	if !realNodeAsked() {
		t.Skipf("set %s=1 to run the real-node tests (root and cgroup v1; make test does where the host can)", realNodeEnv)
	}
	return cluster.ObjectStore()
}

// realNodes is how many real nodes the shared cluster has when the run asks for
// them: each has the host's cores, and each pod the operator makes asks for a
// core (its loader's request), so one node holds as many of them as the host
// has cores.
const realNodes = 2

// realPods are the pods the real nodes hold at once, for reserveRealPods.
var realPods = newRoom(int64(realNodes * runtime.NumCPU()))

// roomHeld is about how long each real-node test holds its room in a whole
// suite run (their logs, 2026-12-04): the room lets the heaviest in first. A
// test not listed counts as roomHeldUnknown.
var roomHeld = map[string]time.Duration{
	"TestRealNodeGatewayCarriesTheCanarySplit":            60 * time.Second,
	"TestRealNodeModelCacheFaults":                        45 * time.Second,
	"TestRealNodeFailureReasons/real-image-pull":          40 * time.Second,
	"TestRealNodeRetryableFailureIsBounded":               38 * time.Second,
	"TestRealNodeWarmupGateHoldsABrokenEngine":            35 * time.Second,
	"TestRealNodeRollingUpdateDropsNoRequest":             30 * time.Second,
	"TestRealNodeRestrictedPodsRunAsNonRoot":              28 * time.Second,
	"TestRealNodeFailureReasons/real-warmup-failing":      20 * time.Second,
	"TestRealNodeFailureReasons/real-loader-oom":          17 * time.Second,
	"TestRealNodeEngineThatCannotStart":                   12 * time.Second,
	"TestRealNodeFailureReasons/real-engine-crash-loop":   11 * time.Second,
	"TestRealNodeFailureReasons/real-model-not-found":     10 * time.Second,
	"TestRealNodeFailureReasons/real-access-denied":       9 * time.Second,
	"TestRealNodeFullLoad":                                9 * time.Second,
	"TestAdmissionPolicyOnTheLocalCluster":                7 * time.Second,
	"TestRealNodeCorruptionStopsDownloads":                5 * time.Second,
	"TestRealNodeModelCacheDownloadsOncePerNode":          12 * time.Second,
	"TestRealNodeAdaptersLoadWithoutRestart":              45 * time.Second,
	"TestRealNodeRouterRoutesThroughTheService":           30 * time.Second,
	"TestRealNodeAdaptersThroughTheRouterAndTheNodeCache": 40 * time.Second,
	"TestRealNodeMultiNodeGroupServesAndRecoversAsOne":    60 * time.Second,
	// Not from a suite run yet: 44 s alone, 2026-12-07.
	"TestRealNodeAutoscalerScalesAMultiNodeModelFromZeroAsOneGroup": 60 * time.Second,
	"TestRealNodeAutoscalerAddsAGroupOnLoadAndRemovesIt":            60 * time.Second,
	// Not from a suite run yet: 39.5 s beside the two NetworkPolicy tests, 2026-12-07.
	"TestRealNodeRouterMetricsOnlyWhereThePolicyAdmits": 40 * time.Second,
}

const roomHeldUnknown = 10 * time.Second

// reserveRealPods waits until the real nodes have room for n more pods of the
// operator and keeps it for the test until its cleanups registered from now on
// have run: tests in parallel would otherwise find their pods Pending for want
// of CPU, and run into their timeouts.
func reserveRealPods(t *testing.T, n int64) {
	t.Helper()
	held, ok := roomHeld[t.Name()]
	if !ok {
		held = roomHeldUnknown
	}
	asked := time.Now()
	realPods.acquire(n, time.Duration(n)*held)
	got := time.Now()
	t.Logf("real-node room for %d pods after %s", n, got.Sub(asked).Round(100*time.Millisecond))
	t.Cleanup(func() {
		realPods.release(n)
		t.Logf("real-node room for %d pods held %s", n, time.Since(got).Round(100*time.Millisecond))
	})
}

// realInference is an AIInference for the real node that loads the seeded model
// from the store and serves it with the simulator, told by the spec's image and
// args (the simulator has no tokenizer to read; it invents one).
func realInference(t *testing.T, store *localcluster.ObjectStore, ns, name string) *servingv1.AIInference {
	t.Helper()
	engine, err := localcluster.FindImage(cluster.Images(), localcluster.EngineSimImage)
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	g.Expect(k8s.Create(context.Background(), store.CredentialsSecret(ns))).To(Succeed())
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name: name + "-model",
				Size: ptr.To(*resource.NewQuantity(store.ModelBytes, resource.BinarySI)),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{
					Bucket: store.Bucket, Prefix: store.ModelPrefix, Endpoint: store.Endpoint, PathStyle: true,
					CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: store.CredentialsSecret(ns).Name},
				}},
			},
			Engine: servingv1.EngineSpec{Type: servingv1.EngineVLLM, Image: engine.Ref, Args: []string{"--force-dummy-tokenizer"}},
			GPU:    servingv1.GPUSpec{Count: 1, Products: []string{realGPUProduct}},
			Loading: servingv1.LoadingSpec{
				Timeout: &metav1.Duration{Duration: 2 * time.Minute}, Backoff: &metav1.Duration{Duration: time.Second},
				MaxRetries: ptr.To[int32](1),
			},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
		},
	}
}

// startRealNodeTest starts a test of one object on the real nodes: it shares
// the cluster, is skipped unless the run asked for real nodes, holds room for
// pods of its pods (reserveRealPods), and returns the test's gomega, the store
// and realInference(name) in a namespace of its own, not created yet.
func startRealNodeTest(t *testing.T, pods int64, name string) (*WithT, *localcluster.ObjectStore, *servingv1.AIInference) {
	t.Helper()
	shared.share(t)
	store := needRealNode(t)
	reserveRealPods(t, pods)
	return NewWithT(t), store, realInference(t, store, newNamespace(t), name)
}

// servingPods are the pods of obj that are ready, with their IPs.
func servingPods(g Gomega, obj *servingv1.AIInference) []corev1.Pod {
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
		client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	var ready []corev1.Pod
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				ready = append(ready, p)
			}
		}
	}
	return ready
}

// successorPod waits for the one ready pod of obj that is not old (deleted
// by the caller): its Deployment's replacement.
func successorPod(g Gomega, obj *servingv1.AIInference, old corev1.Pod) corev1.Pod {
	var next corev1.Pod
	g.Eventually(func(g Gomega) {
		pods := servingPods(g, obj)
		g.Expect(pods).To(HaveLen(1))
		g.Expect(pods[0].UID).NotTo(Equal(old.UID))
		next = pods[0]
	}).WithTimeout(realReadyTimeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return next
}

// realNodePod is a pod of one container on the real nodes (their GPU taint
// tolerated), the container restricted as Pod Security "restricted" asks.
func realNodePod(ns, name string, c corev1.Container) *corev1.Pod {
	c.SecurityContext = &corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{localcluster.GPUProductLabel: realGPUProduct},
			Tolerations:  []corev1.Toleration{{Key: localcluster.GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers:   []corev1.Container{c},
		},
	}
}

// oneServingPod waits for the object's one ready pod. It was ready when the
// status said so, but a kubelet can take it out of ready for a moment right
// after its startup probe passes (seen once in a full make test: Ready, then
// unready a second later).
func oneServingPod(g Gomega, obj *servingv1.AIInference) []corev1.Pod {
	var pods []corev1.Pod
	g.Eventually(func(g Gomega) {
		pods = servingPods(g, obj)
		g.Expect(pods).To(HaveLen(1))
	}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	return pods
}

// complete sends one short completion and returns the model that answered.
//
// The request carries an Idempotency-Key, as a client that may send it twice
// does (a completion changes nothing): Go's transport then sends it again when
// the kept-alive connection it reused was closed by the server before any byte
// of an answer came back. A stopping engine closes its idle connections when it
// gets SIGTERM, and a request written at that moment met EOF or a reset (1 in
// 200-400 during a rolling update, when the machine was loaded); that race is
// between the client and the engine, not something a rollout can avoid. Any
// other failure still counts: a refused connection, a timeout, an error answer.
// serviceRouteTimeout bounds the wait for a new Service to route to its pods.
// kube-proxy programs the host's rules from the API server's watch; on this loaded
// 2-core host it lagged past 20 s in a full make test; until it catches up, a
// ClusterIP recycled from another test's Service still reaches that test's old
// pod (404 from its engine), and a new one leaves the host (see serviceURL).
const serviceRouteTimeout = 90 * time.Second

func complete(httpClient *http.Client, baseURL, model string) (string, error) {
	answer, err := postCompletion(httpClient, baseURL, "", model, "Hello")
	return answer.model, err
}

// completionAnswer is a 200 answer to a completion: the model its body names,
// and its headers.
type completionAnswer struct {
	model  string
	header http.Header
}

// postCompletion sends a short completion of prompt for model to baseURL (with
// host as the Host header, when set) and returns the answer; an answer other
// than 200 is a *statusError, and a body that is no completion an error.
func postCompletion(httpClient *http.Client, baseURL, host, model, prompt string) (completionAnswer, error) {
	header, data, err := postJSON(httpClient, baseURL+"/v1/completions", host,
		map[string]any{"model": model, "prompt": prompt, "max_tokens": 4})
	if err != nil {
		return completionAnswer{}, err
	}
	var answer struct {
		Model   string `json:"model"`
		Choices []any  `json:"choices"`
	}
	if err := json.Unmarshal(data, &answer); err != nil || len(answer.Choices) == 0 {
		return completionAnswer{}, fmt.Errorf("not a completion: %s", data)
	}
	return completionAnswer{model: answer.Model, header: header}, nil
}

// postJSON posts body as JSON to url (with host as the Host header, when set)
// and returns the answer's headers and body, up to 1 MiB. It sends an
// Idempotency-Key, as a client with retries does, so that a request met by a
// kept-alive connection's close is sent again. An answer other than 200 is a
// *statusError with its status and body.
func postJSON(httpClient *http.Client, url, host string, body any) (http.Header, []byte, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", strconv.FormatUint(completionKeys.Add(1), 10))
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if data, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, &statusError{status: resp.StatusCode, body: strings.TrimSpace(string(data)), retryAfter: resp.Header.Get("Retry-After")}
	}
	return resp.Header, data, nil
}

// statusError is an answer other than 200.
type statusError struct {
	status     int
	body       string
	retryAfter string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.status, http.StatusText(e.status), e.body)
}

// completionKeys numbers the completions' Idempotency-Keys.
var completionKeys atomic.Uint64

// engineURL is the engine of a pod, at its IP: the host routes the real node's
// pod subnet.
func engineURL(pod corev1.Pod) string {
	return "http://" + net.JoinHostPort(pod.Status.PodIP, "8000")
}

// 1. A full load: S3 to the cache volume to the engine to Ready, with the real
// figures in status.
func TestRealNodeFullLoad(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 1, "tiny")
	begin := time.Now()
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	t.Logf("apply to Ready on the real node: %s", time.Since(begin).Round(100*time.Millisecond))

	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got)).To(Succeed())
	load := got.Status.LastLoad
	g.Expect(load).NotTo(BeNil(), "the loader's report reaches status")
	g.Expect(load.Files).To(Equal(store.ModelFiles))
	g.Expect(load.Bytes).To(Equal(store.ModelBytes))
	g.Expect(load.BytesFetched).To(Equal(store.ModelBytes))
	g.Expect(load.Verified).To(BeTrue())
	// Every file checked against a checksum the store keeps: CRC64-NVME for the
	// shards, the ETag's MD5 for a small file the store added no CRC to.
	var checked int32
	for _, n := range load.Checks {
		checked += n
	}
	g.Expect(checked).To(Equal(int32(store.ModelFiles)))
	g.Expect(load.Checks["crc64nvme"]).To(BeNumerically(">=", 1))
	t.Logf("lastLoad: %d files, %d bytes in %s at %s, checks %v", load.Files, load.Bytes, load.Duration.Duration, load.Throughput, load.Checks)

	// The engine reads the model where the loader wrote it: the folder the engine
	// reports serving from (/v1/models' root, as vLLM reports it) is the loader's
	// destination in its ConfigMap.
	pods := oneServingPod(g, obj)
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: obj.Namespace, Name: obj.Name + "-loader"}, cm)).To(Succeed())
	var config loadspec.Config
	g.Expect(json.Unmarshal([]byte(cm.Data[loadspec.ConfigFileName]), &config)).To(Succeed())
	httpClient := &http.Client{Timeout: 5 * time.Second}
	resp, err := httpClient.Get(engineURL(pods[0]) + "/v1/models")
	g.Expect(err).NotTo(HaveOccurred())
	var models struct {
		Data []struct{ ID, Root string } `json:"data"`
	}
	g.Expect(json.NewDecoder(resp.Body).Decode(&models)).To(Succeed())
	resp.Body.Close()
	g.Expect(models.Data).To(HaveLen(1))
	g.Expect(models.Data[0].ID).To(Equal(obj.Spec.Model.Name))
	g.Expect(models.Data[0].Root).To(Equal(config.Dest))

	// A completion through the Service answers with the served model's name.
	begin = time.Now()
	serviceURL(g, obj)
	t.Logf("a completion through the Service answered %s after Ready was checked", time.Since(begin).Round(100*time.Millisecond))
}

// 2. Corruption: an object corrupted in the store fails the load for good, and
// the store serves no further download, whatever the kubelet does. The real
// kubelet restarts a failed loader at once the first time and the second run
// refuses within a second: an operator that sees the pod only after both still
// reports the checksum mismatch, from the refusal's copy of the attempt record.
func TestRealNodeCorruptionStopsDownloads(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 1, "corrupt")
	ctx := context.Background()
	const prefix = "corrupt-model/"
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	for i, f := range s3test.ModelTree(2, 4<<20, 0, 0) {
		g.Expect(server.UploadGenerated(ctx, store.Bucket, prefix+f.Path, f.Size, s3test.Layout{}, uint64(100+i))).To(Succeed())
	}
	// A failing disk under the store: one byte of a shard flips behind its back.
	shard := filepath.Join(store.Root, store.Bucket, prefix+"model-00001-of-00002.safetensors")
	data, err := os.ReadFile(shard)
	g.Expect(err).NotTo(HaveOccurred())
	data[len(data)/2] ^= 0xff
	g.Expect(os.WriteFile(shard, data, 0o644)).To(Succeed())

	obj.Spec.Model.Source.S3.Prefix = prefix
	obj.Spec.Model.Size = ptr.To(resource.MustParse("16Mi"))
	obj.Spec.Loading.MaxRetries = ptr.To[int32](3)
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(readyReason(got)).To(Equal(servingv1.ReasonLoadFailed))
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Reason).To(Equal(loadspec.ReasonChecksumMismatch))
	})
	gets, err := store.ObjectGets(store.Bucket, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("object GETs under %s when Failed: %d", prefix, gets)
	g.Expect(gets).To(BeNumerically(">", 0), "the store's access log shows the load's downloads")

	// The kubelet restarts the loader in place; each run refuses before any request.
	restartsAtFailure := loaderRestarts(g, obj)
	g.Eventually(func() int32 { return loaderRestarts(g, obj) }).WithTimeout(45*time.Second).WithPolling(time.Second).
		Should(BeNumerically(">", restartsAtFailure), "the kubelet restarts the failed loader")
	after, err := store.ObjectGets(store.Bucket, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after).To(Equal(gets), "downloads after the object failed")
	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
}

// loaderRestarts is the restart count of the object's loader containers.
func loaderRestarts(g Gomega, obj *servingv1.AIInference) int32 {
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
		client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	var n int32
	for _, p := range pods.Items {
		for _, cs := range p.Status.InitContainerStatuses {
			if cs.Name == servingv1.LoaderContainerName {
				n += cs.RestartCount
			}
		}
	}
	return n
}

// 3. A retryable failure, retried in place by the real kubelet and bounded; the
// same scenario runs on the simulated kubelet (TestLoaderFailureRetriesThenFailsThenRecovers).
func TestRealNodeRetryableFailureIsBounded(t *testing.T) {
	// Two pods: the fix rolls a new one out beside the failing one.
	g, store, obj := startRealNodeTest(t, 2, "unreachable")
	// Nothing listens there: every request fails with a retryable error, and the
	// loader retries it within the attempt until loading.timeout (at its least)
	// ends the attempt; without it, an attempt retries a refused connection for
	// about 40 s.
	closed, err := freeport.Pick()
	g.Expect(err).NotTo(HaveOccurred())
	endpoint, err := url.Parse(store.Endpoint)
	g.Expect(err).NotTo(HaveOccurred())
	obj.Spec.Model.Source.S3.Endpoint = "http://" + net.JoinHostPort(endpoint.Hostname(), strconv.Itoa(closed))
	obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 10 * time.Second}
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	retriedInPlaceThenFixed(t, g, obj, func(o *servingv1.AIInference) {
		o.Spec.Model.Source.S3.Endpoint = store.Endpoint
		o.Spec.Loading.Timeout = &metav1.Duration{Duration: 2 * time.Minute}
	}, realReadyTimeout)
}

// 4. An engine that cannot start gives a crash-loop reason with its exit code and
// the last line of its log.
func TestRealNodeEngineThatCannotStart(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 1, "bad-args")
	obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--no-such-flag")
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Reason).To(Equal(servingv1.ReasonEngineCrashLooping))
		// The simulator exits 0 on a bad flag, leaving no termination message: the
		// operator reads the log's last line.
		g.Expect(ready.Message).To(And(ContainSubstring("last exit code 0"), ContainSubstring("last log line"), ContainSubstring("unknown flag: --no-such-flag")))
	})
}

// newConnectionClient opens a connection per request, so that kube-proxy
// picks anew each time.
var newConnectionClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// clusterIPURL reads svc and returns its first port at its ClusterIP, once
// kube-proxy on the real nodes serves Services.
func clusterIPURL(g Gomega, svc *corev1.Service) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g.Expect(cluster.WaitKubeProxy(ctx)).To(Succeed())
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(svc), svc)).To(Succeed())
	return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
}

// serviceURL is the Service of obj at its ClusterIP, which kube-proxy routes on
// the host to ready pods, once a completion through it has come back from obj's
// model. One local cluster on a host at a time runs kube-proxy (its rules are
// host-wide): this waits for another's (localcluster's own real-node test, run
// beside this package) to stop.
//
// Each attempt opens a new connection. One sent before kube-proxy has written the
// Service's rules leaves the host un-translated, and this machine's egress proxy
// answers it (404, no body); a kept-alive connection stays with the proxy after
// the rules are in, since the kernel translates a connection only when it
// opens. A make test run failed so for 90 s, on a route that was there.
func serviceURL(g Gomega, obj *servingv1.AIInference) string {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: obj.Namespace, Name: obj.Name}}
	url := clusterIPURL(g, svc)
	g.Eventually(func() (string, error) { return complete(newConnectionClient, url, obj.Spec.Model.Name) }).
		WithTimeout(serviceRouteTimeout).WithPolling(500*time.Millisecond).Should(Equal(obj.Spec.Model.Name),
		func() string { return describeServiceRoute(svc) })
	return url
}

// describeServiceRoute is what routes svc on the host, for a failure: its
// EndpointSlices, the host's NAT rules for its ClusterIP, and the end of
// kube-proxy's log.
func describeServiceRoute(svc *corev1.Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, "no completion through Service %s/%s at %s\n", svc.Namespace, svc.Name, svc.Spec.ClusterIP)
	endpointSlices := &discoveryv1.EndpointSliceList{}
	if err := k8s.List(context.Background(), endpointSlices, client.InNamespace(svc.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		fmt.Fprintf(&b, "EndpointSlices: %v\n", err)
	}
	for _, slice := range endpointSlices.Items {
		for _, e := range slice.Endpoints {
			fmt.Fprintf(&b, "EndpointSlice %s: %v ready=%v\n", slice.Name, e.Addresses, ptr.Deref(e.Conditions.Ready, false))
		}
	}
	nat, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
	fmt.Fprintf(&b, "iptables-save -t nat (err %v), the lines with %s:\n", err, svc.Spec.ClusterIP)
	for line := range strings.SplitSeq(string(nat), "\n") {
		if strings.Contains(line, svc.Spec.ClusterIP+"/32") {
			fmt.Fprintln(&b, line)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(cluster.LogsDir(), "*", "kube-proxy.log"))
	for _, path := range logs {
		data, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "%s, last lines:\n%s\n", path, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return b.String()
}

// 5. A rolling update with real readiness, while a bounded client sends
// completions through the Service the whole time: none fails.
//
// It runs beside the other tests, on a loaded machine. The engine closes its
// idle keep-alive connections when it stops, and a request written on one at
// that moment met EOF (1 in 300-400 beside the other tests); the completions
// carry an Idempotency-Key, so Go's transport sends such a request again, as a
// client with retries does (see complete). Anything else fails the test.
func TestRealNodeRollingUpdateDropsNoRequest(t *testing.T) {
	// Two pods: the new one starts beside the old one.
	g, _, obj := startRealNodeTest(t, 2, "rolling")
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	url := serviceURL(g, obj)
	// A dropped request fails at once (refused, reset) or hangs on a dead
	// connection past any timeout; a slow one is no drop. The engine asks for
	// no CPU, and in a whole suite run the host's two cores are shared by
	// several clusters: one completion was seen waiting over 5 s for its
	// headers there.
	httpClient := &http.Client{Timeout: 30 * time.Second}

	// At most 3000 requests, 50 ms apart, until the rollout is over.
	stop := make(chan struct{})
	type tally struct {
		ok, failed int
		firstErr   error
		// firstAt is when the first failed request was sent, from the update.
		firstAt time.Duration
	}
	done := make(chan tally)
	begin := time.Now()
	go func() {
		var t tally
		for range 3000 {
			select {
			case <-stop:
				done <- t
				return
			case <-time.After(50 * time.Millisecond):
			}
			sent := time.Since(begin)
			if _, err := complete(httpClient, url, obj.Spec.Model.Name); err != nil {
				t.failed++
				if t.firstErr == nil {
					t.firstErr, t.firstAt = err, sent
				}
				continue
			}
			t.ok++
		}
		<-stop
		done <- t
	}()

	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Engine.Args = append(o.Spec.Engine.Args, "--max-num-seqs=8") })
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1), "the old pod is gone")
	}).WithTimeout(time.Minute).Should(Succeed())
	rollout := time.Since(begin)
	close(stop)
	result := <-done
	t.Logf("rolling update on the real node in %s: %d completions through the Service, %d failed", rollout.Round(100*time.Millisecond), result.ok, result.failed)
	g.Expect(result.failed).To(BeZero(), "first failure, sent %s after the update: %v", result.firstAt.Round(100*time.Millisecond), result.firstErr)
	g.Expect(result.ok).To(BeNumerically(">", 20))
}

// 7. The warm-up gate: an engine that answers its health checks but fails every
// completion never becomes ready, and no traffic reaches it.
func TestRealNodeWarmupGateHoldsABrokenEngine(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 1, "broken")
	obj.Spec.Engine.Args = append(obj.Spec.Engine.Args, "--failure-injection-rate=100", "--failure-types=server_error")
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(readyReason(got)).To(Equal(servingv1.ReasonWarmingUp))
	})
	// The engine's health says yes; its completions say no, and so does the pod.
	pods := &corev1.PodList{}
	g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1))
	pod := pods.Items[0]
	httpClient := &http.Client{Timeout: 5 * time.Second}
	health, err := httpClient.Get(engineURL(pod) + "/health")
	g.Expect(err).NotTo(HaveOccurred())
	health.Body.Close()
	g.Expect(health.StatusCode).To(Equal(http.StatusOK))
	_, err = complete(httpClient, engineURL(pod), obj.Spec.Model.Name)
	g.Expect(err).To(HaveOccurred())
	g.Consistently(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Status.ReadyReplicas).To(BeZero())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, servingv1.ConditionAvailable)).To(BeFalse())
		g.Expect(servingPods(g, obj)).To(BeEmpty())
	}).WithTimeout(10 * time.Second).WithPolling(time.Second).Should(Succeed())
}

// 6. In a namespace that enforces Pod Security "restricted", the pods run on the
// real node as the non-root user the operator asks for, enforced by runc.
func TestRealNodeRestrictedPodsRunAsNonRoot(t *testing.T) {
	shared.share(t)
	store := needRealNode(t)
	reserveRealPods(t, 1)
	g := NewWithT(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "restricted-", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	g.Expect(k8s.Create(ctx, ns)).To(Succeed())
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, ns.Name)
		}
		deleteAll(t, ns.Name)
	})
	obj := realInference(t, store, ns.Name, "restricted")
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))

	// The engine's process, seen from the host: its user is the one asked for.
	uid, err := processUID("--served-model-name", obj.Spec.Model.Name)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(uid).To(Equal("65532"))
}

// processUID finds the host process whose command line holds both words and
// returns its real user ID.
func processUID(words ...string) (string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return "", err
	}
	for _, path := range dirs {
		cmdline, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		found := 0
		for _, w := range words {
			for _, a := range args {
				if a == w {
					found++
					break
				}
			}
		}
		if found < len(words) {
			continue
		}
		status, err := os.ReadFile(filepath.Join(filepath.Dir(path), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if fields := strings.Fields(line); len(fields) > 1 && fields[0] == "Uid:" {
				return fields[1], nil
			}
		}
	}
	return "", fmt.Errorf("no process with %v on the host", words)
}
