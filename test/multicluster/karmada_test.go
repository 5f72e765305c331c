// Package multicluster runs the operator in several local clusters joined to a
// real Karmada control plane (localcluster.StartKarmada): Karmada's own
// controller manager, scheduler, webhook and aggregated API server, built from
// its module by hack/tools/build.sh karmada, with the project's
// ResourceInterpreterCustomization (integrations/karmada) telling it what an
// AIInference's replicas need and how to read their status.
//
// It is a package of its own rather than part of test/e2e: its clusters are
// not the e2e suite's (a Karmada control plane and three members with nodes of
// their own, each with its own operator), and the e2e suite's TestMain starts
// its shared cluster, LeaderWorkerSet controller and operator for any test it
// runs. The tests run only when KARMADA_E2E=1 asks for them and the Karmada
// binaries are built: Karmada's build takes tens of minutes on 2 cores, too
// long to start from a test.
package multicluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	sigsyaml "sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/kubectlaii"
	"github.com/aiinference/operator/internal/manager"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/operatorproc"
	"github.com/aiinference/operator/test/testutil"
)

// karmadaEnv is the variable that asks for these tests.
const karmadaEnv = "KARMADA_E2E"

// The Karmada binaries hack/tools/build.sh karmada builds.
const karmadaBuildCommand = "hack/tools/build.sh karmada"

var (
	repoRoot, workDir, operatorBin string
	// loaderImage: simulated kubelets run no image.
	loaderImage = "example.test/model-loader:e2e"

	envOnce sync.Once
	theEnv  *env
	envErr  error
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	code := m.Run()
	if theEnv != nil {
		theEnv.stop()
	}
	if workDir != "" {
		_ = os.RemoveAll(workDir)
	}
	os.Exit(code)
}

// env is Karmada with its members, each running the operator.
type env struct {
	karmada *localcluster.Karmada
	hub     client.Client // Karmada's API server, with the operator's scheme
	members []*member
	kubectl string
	// clusterBin holds the local clusters' binaries; crd is the AIInference
	// CRD's file.
	clusterBin, crd string
}

type member struct {
	name     string
	cluster  *localcluster.Cluster
	k8s      client.Client
	operator *operatorproc.Process
}

func (e *env) member(name string) *member {
	for _, m := range e.members {
		if m.name == name {
			return m
		}
	}
	panic("no member " + name)
}

func (e *env) stop() {
	var stops []func()
	for _, m := range e.members {
		stops = append(stops, m.operator.Stop, func() { _ = m.cluster.Stop() })
	}
	if e.karmada != nil {
		stops = append(stops, func() { _ = e.karmada.Stop() })
	}
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	wg.Wait()
}

// The members: east with two 8x H100 nodes (16 GPUs), west with one 4x A100
// node (4 GPUs), north with one 8x L4 node (8 GPUs) and, when the run asks
// for real nodes, realPool.
var memberPools = map[string][]localcluster.NodePool{
	"east": {{Name: "h100", Count: 2, GPUProduct: localcluster.GPUProductH100, GPUCount: 8,
		CPU: resource.MustParse("208"), Memory: resource.MustParse("1800Gi")}},
	"west": {{Name: "a100", Count: 1, GPUProduct: localcluster.GPUProductA100, GPUCount: 4,
		CPU: resource.MustParse("96"), Memory: resource.MustParse("1360Gi")}},
	"north": {{Name: "l4", Count: 1, GPUProduct: localcluster.GPUProductL4, GPUCount: 8,
		CPU: resource.MustParse("192"), Memory: resource.MustParse("1024Gi")}},
}

// realNodeEnv asks for north's real node, as it asks test/e2e and
// test/localcluster for theirs.
const realNodeEnv = "LOCALCLUSTER_REAL_NODE"

func realNodeAsked() bool { return os.Getenv(realNodeEnv) == "1" }

// realGPUProduct is the GPU of north's real node: no other node of a member
// has it, and only TestKarmadaServesAPartOnAMembersRealNode asks for it, so
// that only its pod runs there for real. One GPU: Karmada's summary of north
// then still gives the other tests 4 replicas of 2 GPUs there.
const realGPUProduct = "NVIDIA-T4"

var realPool = localcluster.NodePool{Name: "real", Count: 1, Real: true, GPUProduct: realGPUProduct, GPUCount: 1}

// realModelBytes is the size of the model north's object store is seeded with,
// which the real node's pod loads.
const realModelBytes = 48 << 20

// allMembers are the members' names; eastAndWest the two most tests place
// on (the failover stops west, the cordon holds west back).
var (
	allMembers  = []string{"east", "west", "north"}
	eastAndWest = []string{"east", "west"}
)

// singleClusterPools are east's and west's nodes in one cluster:
// TestBenchKarmada's single cluster with the members' free GPUs.
var singleClusterPools = append(slices.Clone(memberPools["east"]), memberPools["west"]...)

// karmadaControllerManagerArgs: cluster failover (a beta feature, off by
// default), a member unhealthy after 10 s of failed health checks rather than
// 30 s. The eviction itself is asked for by the ClusterTaintPolicy and the
// PropagationPolicy's tolerations of TestKarmadaMovesReplicasOffAStoppedMember.
var karmadaControllerManagerArgs = []string{"--feature-gates=Failover=true", "--cluster-failure-threshold=10s"}

// setup starts Karmada and the members on first use, or skips the test.
func setup(t *testing.T) *env {
	t.Helper()
	if os.Getenv(karmadaEnv) != "1" {
		t.Skipf("the Karmada tests run with %s=1, once Karmada is built (`%s`, about 20 minutes the first time on 2 cores)", karmadaEnv, karmadaBuildCommand)
	}
	envOnce.Do(func() { theEnv, envErr = startEnv() })
	if envErr != nil {
		t.Fatal(envErr)
	}
	return theEnv
}

func startEnv() (_ *env, err error) {
	ctx := context.Background()
	if repoRoot, err = testutil.RepoRoot(); err != nil {
		return nil, err
	}
	binDir, err := karmadaBinDir()
	if err != nil {
		return nil, err
	}
	if workDir, err = os.MkdirTemp("", "aiinference-multicluster-"); err != nil {
		return nil, err
	}
	operatorBin = filepath.Join(workDir, "manager")
	build := exec.Command("go", "build", "-o", operatorBin, "./cmd/manager")
	build.Dir = repoRoot
	built := make(chan error, 1)
	go func() {
		out, err := build.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("building the operator: %w\n%s", err, out)
		}
		built <- err
	}()
	clusterBin, err := localcluster.BuildBinaries(ctx, repoRoot, os.Stderr)
	if err != nil {
		return nil, err
	}

	if realNodeAsked() {
		if err := localcluster.CheckRealNodeHost(); err != nil {
			<-built
			return nil, fmt.Errorf("%s=1 asks for north's real node, and this host cannot run one: %w", realNodeEnv, err)
		}
	}

	e := &env{kubectl: filepath.Join(clusterBin, "kubectl"), clusterBin: clusterBin,
		crd: filepath.Join(repoRoot, "config", "crd", "bases", "serving.aiinference.io_aiinferences.yaml")}
	defer func() {
		if err != nil {
			e.stop()
		}
	}()
	// Karmada and the members start side by side.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	wg.Go(func() {
		k, err := localcluster.StartKarmada(ctx, localcluster.KarmadaOptions{
			Cluster:               localcluster.Options{RepoRoot: repoRoot, BinDir: clusterBin, Progress: prefixed("karmada"), StartTimeout: 5 * time.Minute},
			BinDir:                binDir,
			ControllerManagerArgs: karmadaControllerManagerArgs,
		})
		mu.Lock()
		defer mu.Unlock()
		e.karmada = k
		errs = append(errs, err)
	})
	for _, name := range allMembers {
		wg.Go(func() {
			c, err := e.startCluster(ctx, name, memberPools[name], name == "north" && realNodeAsked())
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				e.members = append(e.members, &member{name: name, cluster: c})
			}
			errs = append(errs, err)
		})
	}
	wg.Wait()
	if err := errors.Join(append(errs, <-built)...); err != nil {
		return e, err
	}

	if e.hub, err = client.New(e.karmada.RESTConfig(), client.Options{Scheme: testScheme()}); err != nil {
		return e, err
	}
	// Karmada holds the templates: the CRD and the interpreter.
	if err := testutil.InstallCRDs(ctx, e.hub, e.crd); err != nil {
		return e, fmt.Errorf("installing the CRD on Karmada: %w", err)
	}
	for _, m := range e.members {
		// The CRD before the join: Karmada's scheduler places an AIInference only
		// on a member whose API enablements (collected with its status) list it.
		if err := e.runOperator(ctx, m); err != nil {
			return e, err
		}
		if err := e.karmada.Join(ctx, m.name, m.cluster); err != nil {
			return e, err
		}
	}
	return e, e.waitForDetector(ctx)
}

// waitForDetector waits until Karmada's resource detector watches
// AIInferences. It starts watching a kind at its next discovery of the API
// server's resources, every 30 s (pkg/detector's discoverResources), so a
// template applied after the CRD was installed waits up to 30 s before
// Karmada reads it: a probe, placed on no member, waits here once, so that the
// tests' times are Karmada's propagation and not that wait.
func (e *env) waitForDetector(ctx context.Context) error {
	probe := inference("default", "detector-probe", 1, 1)
	pp := propagationPolicy(probe.Namespace, probe.Name, []string{"no-member"})
	if err := e.hub.Create(ctx, pp); err != nil {
		return err
	}
	if err := e.hub.Create(ctx, probe); err != nil {
		return err
	}
	start := time.Now()
	for {
		// The detector labels a template it has matched with its policy.
		got := &servingv1.AIInference{}
		if err := e.hub.Get(ctx, client.ObjectKeyFromObject(probe), got); err != nil {
			return err
		}
		if got.Labels["propagationpolicy.karmada.io/permanent-id"] != "" {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return errors.New("karmada's detector did not match an AIInference with its PropagationPolicy within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "[karmada] Its detector watches AIInferences, %s after the probe was applied\n", time.Since(start).Round(100*time.Millisecond))
	return errors.Join(e.hub.Delete(ctx, probe), e.hub.Delete(ctx, pp))
}

// testScheme is the operator's, with the CRD type.
func testScheme() *runtime.Scheme {
	scheme := manager.Scheme()
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	return scheme
}

// startCluster starts a local cluster with pools of simulated GPU nodes and,
// with real, realPool and an object store its pods load from.
func (e *env) startCluster(ctx context.Context, name string, pools []localcluster.NodePool, real bool) (*localcluster.Cluster, error) {
	opts := localcluster.Options{RepoRoot: repoRoot, BinDir: e.clusterBin, NodePools: pools,
		Progress: prefixed(name), KubeletDelayScale: 0.1, StartTimeout: 5 * time.Minute}
	if real {
		opts.NodePools = append(slices.Clone(pools), realPool)
		opts.ObjectStore = &localcluster.ObjectStoreOptions{ModelBytes: realModelBytes}
	}
	return localcluster.Start(ctx, opts)
}

// runOperator installs the CRD in m's cluster and starts the operator on it.
func (e *env) runOperator(ctx context.Context, m *member) (err error) {
	if m.k8s, err = client.New(m.cluster.RESTConfig(), client.Options{Scheme: testScheme()}); err != nil {
		return err
	}
	if err := testutil.InstallCRDs(ctx, m.k8s, e.crd); err != nil {
		return fmt.Errorf("installing the CRD on %s: %w", m.name, err)
	}
	// A member with a real node runs the loader built for it; kwok runs no image.
	loader := loaderImage
	if image, err := localcluster.FindImage(m.cluster.Images(), localcluster.ModelLoaderImage); err == nil {
		loader = image.Ref
	}
	m.operator = &operatorproc.Process{Name: m.name, Bin: operatorBin, Kubeconfig: m.cluster.Kubeconfig(), LoaderImage: loader,
		LogPath: filepath.Join(workDir, m.name+"-operator.log")}
	return m.operator.Start()
}

// karmadaBinDir is the folder hack/tools/build.sh karmada fills, which must
// hold its binaries: a missing one fails, naming the command that builds it.
func karmadaBinDir() (string, error) {
	version, err := testutil.RequiredVersion(filepath.Join(repoRoot, "hack", "tools", "karmada", "go.mod"), "github.com/karmada-io/karmada")
	if err != nil {
		return "", err
	}
	cacheRoot := os.Getenv("AIINFERENCE_CACHE")
	if cacheRoot == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		cacheRoot = filepath.Join(cache, "aiinference-operator")
	}
	dir := filepath.Join(cacheRoot, "bin", "karmada-"+version)
	for _, bin := range []string{"karmada-controller-manager", "karmada-scheduler", "karmada-webhook", "karmada-aggregated-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("Karmada %s is not built (%v): run `%s`", version, err, karmadaBuildCommand)
		}
	}
	return dir, nil
}

// applyInterpreter applies integrations/karmada's
// ResourceInterpreterCustomization on Karmada, with edit (if set) changing it
// first: how a test breaks it.
func (e *env) applyInterpreter(t *testing.T, g *WithT, edit func(*unstructured.Unstructured)) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "integrations", "karmada", "resourceinterpretercustomization.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	ric := &unstructured.Unstructured{}
	g.Expect(utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096).Decode(&ric.Object)).To(Succeed())
	if edit != nil {
		edit(ric)
	}
	g.Expect(e.hub.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(ric),
		client.FieldOwner("multicluster-test"), client.ForceOwnership)).To(Succeed())
}

// propagationPolicy places the AIInference name on the members, its
// replicas divided by the replicas each can still take (Karmada's dynamic
// weight by AvailableReplicas, from the interpreter's replica requirements).
func propagationPolicy(ns, name string, members []string) *unstructured.Unstructured {
	pp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1",
		"kind":       "PropagationPolicy",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"resourceSelectors": []any{map[string]any{"apiVersion": servingv1.GroupVersion.String(), "kind": "AIInference", "name": name}},
			"placement": map[string]any{
				"clusterAffinity": clusterAffinity(members),
				"replicaScheduling": map[string]any{
					"replicaSchedulingType":     "Divided",
					"replicaDivisionPreference": "Weighted",
					"weightPreference":          map[string]any{"dynamicWeight": "AvailableReplicas"},
				},
			},
		},
	}}
	return pp
}

func inference(ns, name string, replicas, gpus int32) *servingv1.AIInference {
	return &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{
				Name: name + "-model",
				Size: ptr.To(resource.MustParse("8Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{
					Bucket: "models", Prefix: name + "/", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
				}},
			},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: gpus, Products: []string{localcluster.GPUProductH100, localcluster.GPUProductA100}},
			Replicas: ptr.To(replicas),
			Loading:  servingv1.LoadingSpec{Backoff: &metav1.Duration{Duration: time.Second}, MaxRetries: ptr.To[int32](2)},
		},
	}
}

// namespace makes a namespace on Karmada (which propagates it to every member).
func (e *env) namespace(t *testing.T, g *WithT, name string) string {
	t.Helper()
	g.Expect(e.hub.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}

// TestKarmadaDividesAnAIInferenceByFreeGPUsAndAggregatesItsStatus applies an
// AIInference of 7 replicas of 2 GPUs (on an H100, an A100 or an L4) with a
// PropagationPolicy on Karmada over the three members. east can take 8 such
// replicas (16 GPUs), west 2 (4 GPUs), north 4 (8 GPUs): Karmada's dynamic
// weights divide the 7 as 4, 1 and 2, each member's operator runs its part to
// Ready, and the template on Karmada reads Ready with 7 ready replicas, so that
// kubectl wait on Karmada returns.
func TestKarmadaDividesAnAIInferenceByFreeGPUsAndAggregatesItsStatus(t *testing.T) {
	e := setup(t)
	g := NewWithT(t)
	ctx := context.Background()
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "divided")
	obj := inference(ns, "llama", 7, 2)
	obj.Spec.GPU.Products = append(obj.Spec.GPU.Products, localcluster.GPUProductL4)
	defer e.remove(t, obj)
	defer e.dump(t, ns, obj.Name)

	start := time.Now()
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(propagationPolicy(ns, obj.Name, allMembers)),
		client.FieldOwner("multicluster-test"))).To(Succeed())
	g.Expect(e.hub.Create(ctx, obj)).To(Succeed())

	want := map[string]int32{"east": 4, "west": 1, "north": 2}
	for name, replicas := range want {
		m := e.member(name)
		g.Eventually(func(g Gomega) {
			got := &servingv1.AIInference{}
			g.Expect(m.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			g.Expect(got.Spec.Replicas).To(HaveValue(Equal(replicas)), "%s's share", name)
			g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
			g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady), "%s: Ready condition: %+v", name, meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady))
			g.Expect(got.Status.ReadyReplicas).To(Equal(replicas))
		}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "the member %s", name)
		t.Logf("%s runs %d replicas, Ready, %s after the apply", name, replicas, time.Since(start).Round(100*time.Millisecond))
	}

	// The aggregated status on Karmada, and kubectl wait on it.
	wait := exec.Command(e.kubectl, "--kubeconfig", e.karmada.Kubeconfig(), "-n", ns, "wait", "aiinference/"+obj.Name,
		"--for=condition=Ready", "--timeout=120s")
	out, err := wait.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "kubectl wait on Karmada: %s", out)
	t.Logf("kubectl wait --for=condition=Ready on Karmada: %s (%s after the apply)", strings.TrimSpace(string(out)), time.Since(start).Round(100*time.Millisecond))
	got := &servingv1.AIInference{}
	g.Expect(e.hub.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	g.Expect(got.Status.ReadyReplicas).To(Equal(int32(7)))
	g.Expect(got.Status.Replicas).To(Equal(int32(7)))
	g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
	g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
	g.Expect(ready).NotTo(BeNil())
	g.Expect(ready.Status).To(Equal(metav1.ConditionTrue))
	t.Logf("On Karmada: phase %s, %d/%d ready, Ready: %s (%s)", got.Status.Phase, got.Status.ReadyReplicas, got.Status.Replicas, ready.Reason, ready.Message)
}

// TestKarmadaRollsASpecChangeOutInEveryMember divides an AIInference of 3
// replicas between east and west, Ready, then changes its model's source (a
// new model revision: a new pod template) on Karmada while west's nodes are
// cordoned. Both members take the new spec; east rolls it out, while west's
// new pod cannot be scheduled and its old one goes on serving the old
// revision. As long as west serves the old revision, the template on Karmada
// must not read Ready; once west's nodes take pods again and west serves the
// new revision too, it must, with the new revision and generation.
func TestKarmadaRollsASpecChangeOutInEveryMember(t *testing.T) {
	e := setup(t)
	g := NewWithT(t)
	ctx := context.Background()
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "rollout")
	obj := inference(ns, "revised", 3, 2)
	obj.Spec.Model.Source.S3.Prefix = "revised/v1/"
	defer e.remove(t, obj)
	defer e.dump(t, ns, obj.Name)
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(propagationPolicy(ns, obj.Name, eastAndWest)),
		client.FieldOwner("multicluster-test"))).To(Succeed())
	g.Expect(e.hub.Create(ctx, obj)).To(Succeed())
	shares := e.runningParts(g, obj, eastAndWest)
	t.Logf("Before: east runs %d, west %d", shares["east"], shares["west"])
	old := e.waitReadyOnKarmada(g, obj)
	g.Expect(old.Status.ServingRevision).NotTo(BeEmpty(), "the revision both members serve")

	west, east := e.member("west"), e.member("east")
	west.cordon(g, true)
	defer west.cordon(g, false)
	patch := client.MergeFrom(old.DeepCopy())
	revised := old.DeepCopy()
	revised.Spec.Model.Source.S3.Prefix = "revised/v2/"
	g.Expect(e.hub.Patch(ctx, revised, patch)).To(Succeed())
	changed := time.Now()
	g.Expect(revised.Generation).To(BeNumerically(">", old.Generation))
	t.Logf("The model's source changed on Karmada (generation %d to %d) with west's nodes cordoned", old.Generation, revised.Generation)

	// east serves the new revision; west has taken the new spec but serves
	// the old revision.
	var newRevision string
	g.Eventually(func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(east.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Spec.Model.Source.S3.Prefix).To(Equal("revised/v2/"))
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
		g.Expect(got.Status.UpdatedReplicas).To(Equal(shares["east"]))
		g.Expect(got.Status.ServingRevision).NotTo(Equal(old.Status.ServingRevision))
		newRevision = got.Status.ServingRevision
	}).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	t.Logf("east serves revision %s (was %s) %s after the change", newRevision, old.Status.ServingRevision, time.Since(changed).Round(100*time.Millisecond))
	westServesOld := func(g Gomega) {
		got := &servingv1.AIInference{}
		g.Expect(west.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Spec.Model.Source.S3.Prefix).To(Equal("revised/v2/"))
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		// Its new pod waits for a node (Deployment counts it as updated): the
		// old one serves.
		g.Expect(got.Status.ServingRevision).To(Equal(old.Status.ServingRevision))
		g.Expect(got.Status.Phase).NotTo(Equal(servingv1.PhaseReady))
	}
	g.Eventually(westServesOld).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())

	// Meanwhile Karmada's template is not Ready: checked for 10 s while west
	// goes on serving the old revision.
	held := &servingv1.AIInference{}
	g.Consistently(func(g Gomega) {
		westServesOld(g)
		g.Expect(e.hub.Get(ctx, client.ObjectKeyFromObject(obj), held)).To(Succeed())
		ready := meta.FindStatusCondition(held.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).NotTo(Equal(metav1.ConditionTrue), "Karmada's Ready while west serves the old revision: %s", ready.Message)
		g.Expect(held.Status.Phase).NotTo(Equal(servingv1.PhaseReady))
	}).WithTimeout(10 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	heldReady := meta.FindStatusCondition(held.Status.Conditions, servingv1.ConditionReady)
	t.Logf("While west serves the old revision, on Karmada: phase %s, %d/%d ready, %d updated, revision %q, Ready %s: %s (%s)",
		held.Status.Phase, held.Status.ReadyReplicas, held.Status.Replicas, held.Status.UpdatedReplicas, held.Status.ServingRevision,
		heldReady.Status, heldReady.Reason, heldReady.Message)
	g.Expect(heldReady.Message).To(HavePrefix("west: "), "the member that blocks it")

	// west's nodes take pods again: it rolls out, and Karmada reads Ready.
	west.cordon(g, false)
	released := time.Now()
	got := e.waitReadyOnKarmada(g, revised)
	g.Expect(got.Status.ServingRevision).To(Equal(newRevision))
	g.Expect(got.Status.UpdatedReplicas).To(Equal(int32(3)))
	for _, name := range eastAndWest {
		m := e.member(name)
		member := &servingv1.AIInference{}
		g.Expect(m.k8s.Get(ctx, client.ObjectKeyFromObject(obj), member)).To(Succeed())
		g.Expect(member.Status.ServingRevision).To(Equal(newRevision), "the revision %s serves", m.name)
	}
	t.Logf("west released: Karmada's template Ready on revision %s %s later (%s after the change)",
		newRevision, time.Since(released).Round(100*time.Millisecond), time.Since(changed).Round(100*time.Millisecond))
}

// TestKubectlAIIStatusOnKarmadaNamesTheBlockingMember runs kubectl aii
// status (the plugin's own command code) against Karmada's API server, where
// an AIInference is a resource template with no pods: with west's nodes
// cordoned, west's share cannot be scheduled, and status must show the
// aggregated phase and ready count, each member's part from the
// ResourceBinding, and west as the member that blocks it, and why; once west
// takes pods again, Ready with nothing blocking. Against a member it shows
// that member's pods, as against any cluster.
func TestKubectlAIIStatusOnKarmadaNamesTheBlockingMember(t *testing.T) {
	e := setup(t)
	g := NewWithT(t)
	ctx := context.Background()
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "aii-status")
	obj := inference(ns, "explained", 3, 2)
	defer e.remove(t, obj)
	defer e.dump(t, ns, obj.Name)
	west := e.member("west")
	west.cordon(g, true)
	defer west.cordon(g, false)
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(propagationPolicy(ns, obj.Name, eastAndWest)),
		client.FieldOwner("multicluster-test"))).To(Succeed())
	g.Expect(e.hub.Create(ctx, obj)).To(Succeed())

	var out string
	g.Eventually(func(g Gomega) {
		out = aiiStatus(g, e.karmada.Kubeconfig(), ns, obj.Name)
		g.Expect(out).To(ContainSubstring("AIInference aii-status/explained: Pending, 2/3 ready"))
		g.Expect(out).To(ContainSubstring("A Karmada resource template: its pods run in the member clusters"))
		g.Expect(out).To(MatchRegexp(`(?m)^east +2 +true +Healthy +Ready +2/2 `))
		g.Expect(out).To(MatchRegexp(`(?m)^west +1 +true +\S+ +Pending +0/1 .* Unschedulable$`))
		g.Expect(out).To(MatchRegexp(`(?m)^Blocked by west: Unschedulable: .*cannot be scheduled`))
		g.Expect(out).NotTo(ContainSubstring("Blocked by east"))
		g.Expect(out).NotTo(ContainSubstring("No pods."))
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	t.Logf("kubectl aii status on Karmada, west cordoned:\n%s", out)

	west.cordon(g, false)
	e.waitReadyOnKarmada(g, obj)
	out = aiiStatus(g, e.karmada.Kubeconfig(), ns, obj.Name)
	g.Expect(out).To(ContainSubstring("AIInference aii-status/explained: Ready, 3/3 ready"))
	g.Expect(out).To(MatchRegexp(`(?m)^west +1 +true +Healthy +Ready +1/1 `))
	g.Expect(out).NotTo(ContainSubstring("Blocked by"))
	t.Logf("kubectl aii status on Karmada, west released:\n%s", out)

	out = aiiStatus(g, e.member("east").cluster.Kubeconfig(), ns, obj.Name)
	g.Expect(out).To(ContainSubstring("AIInference aii-status/explained: Ready, 2/2 ready"))
	g.Expect(out).To(MatchRegexp(`(?m)^POD +SPEC +NODE`))
	g.Expect(out).NotTo(ContainSubstring("Karmada"))
}

// aiiStatus runs kubectl aii status NAME against the API server of
// kubeconfig and returns what it prints.
func aiiStatus(g Gomega, kubeconfig, ns, name string) string {
	var out, errOut bytes.Buffer
	cmd := kubectlaii.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs([]string{"--kubeconfig", kubeconfig, "-n", ns, "status", name})
	g.Expect(cmd.ExecuteContext(context.Background())).To(Succeed(), "kubectl aii status: %s", errOut.String())
	return out.String()
}

// failoverToleration is how long an AIInference stays on a member that is
// not Ready before Karmada evicts it (its PropagationPolicy's
// clusterTolerations of the NoExecute taint the ClusterTaintPolicy puts on
// such a member).
const failoverToleration = 5 * time.Second

// TestKarmadaServesAPartOnAMembersRealNode places an AIInference of 3
// replicas on east and north by static weights, 2 to 1 (Karmada's general
// estimator counts north's L4s too, whatever the product): north's replica asks
// for north's real node's GPU, so it loads the model from north's object store
// and serves it with the simulator for real, while east's two run on
// simulated kubelets. The store's Secret goes to both members through Karmada,
// as a user ships it. The template on Karmada must not read Ready before
// north's real pod serves (east's simulated pods are Ready seconds earlier),
// and north's pod must answer a completion through its cluster's API server.
func TestKarmadaServesAPartOnAMembersRealNode(t *testing.T) {
	if !realNodeAsked() {
		t.Skipf("north's real node runs with %s=1 (root, cgroup v1: docs/real-node.md)", realNodeEnv)
	}
	e := setup(t)
	g := NewWithT(t)
	ctx := context.Background()
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "real-member")
	north := e.member("north")
	store := north.cluster.ObjectStore()
	engine, err := localcluster.FindImage(north.cluster.Images(), localcluster.EngineSimImage)
	g.Expect(err).NotTo(HaveOccurred())

	members := []string{"east", "north"}
	secret := store.CredentialsSecret(ns)
	g.Expect(e.hub.Create(ctx, secret)).To(Succeed())
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(duplicatedPolicy(secret, members)),
		client.FieldOwner("multicluster-test"))).To(Succeed())

	obj := inference(ns, "served", 3, 1)
	obj.Spec.Model.Size = resource.NewQuantity(store.ModelBytes, resource.BinarySI)
	obj.Spec.Model.Source.S3 = &servingv1.S3Source{Bucket: store.Bucket, Prefix: store.ModelPrefix, Endpoint: store.Endpoint, PathStyle: true,
		CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: secret.Name}}
	obj.Spec.Engine = servingv1.EngineSpec{Type: servingv1.EngineVLLM, Image: engine.Ref, Args: []string{"--force-dummy-tokenizer"}}
	obj.Spec.GPU.Products = []string{localcluster.GPUProductH100, realGPUProduct}
	obj.Spec.Loading.Timeout = &metav1.Duration{Duration: 2 * time.Minute}
	obj.Spec.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}
	defer e.remove(t, obj)
	defer e.dump(t, ns, obj.Name)

	pp := propagationPolicy(ns, obj.Name, members)
	g.Expect(unstructured.SetNestedField(pp.Object, map[string]any{"staticWeightList": []any{
		map[string]any{"targetCluster": map[string]any{"clusterNames": []any{"east"}}, "weight": int64(2)},
		map[string]any{"targetCluster": map[string]any{"clusterNames": []any{"north"}}, "weight": int64(1)},
	}}, "spec", "placement", "replicaScheduling", "weightPreference")).To(Succeed())
	start := time.Now()
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(pp), client.FieldOwner("multicluster-test"))).To(Succeed())
	g.Expect(e.hub.Create(ctx, obj)).To(Succeed())

	// Until the template reads Ready, and never before north's part serves.
	var eastReady, karmadaReady time.Duration
	g.Eventually(func(g Gomega) {
		if eastReady == 0 && partReady(ctx, e.member("east"), obj, 2) {
			eastReady = time.Since(start)
		}
		got := &servingv1.AIInference{}
		g.Expect(e.hub.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		if ready != nil && ready.Status == metav1.ConditionTrue && !partReady(ctx, north, obj, 1) {
			StopTrying(fmt.Sprintf("the template on Karmada reads Ready (%s: %s) while north's replica on its real node does not serve yet", ready.Reason, ready.Message)).Now()
		}
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), "Ready: %s", ready.Message)
		g.Expect(got.Status.ReadyReplicas).To(Equal(int32(3)))
	}).WithTimeout(3*time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "Ready on Karmada")
	karmadaReady = time.Since(start)

	// north's replica ran on its real node: its pod, loaded from the store, answers.
	pods := &corev1.PodList{}
	g.Expect(north.k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1))
	pod := pods.Items[0]
	g.Expect(pod.Spec.NodeName).To(Equal(realPool.NodeName(0)))
	podReady := time.Duration(0)
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			podReady = c.LastTransitionTime.Sub(start.Truncate(time.Second))
		}
	}
	gets, err := store.ObjectGets(store.Bucket, store.ModelPrefix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gets).To(BeNumerically(">", 0), "north's pod loaded its model from north's store")
	answer := proxyCompletion(ctx, g, north, &pod, obj.Spec.Model.Name)
	t.Logf("karmada figure: east's 2 replicas (simulated kubelets) Ready %.1f s after the apply; north's 1 on its real node (loaded %d MiB from the store, %d GETs) Ready about %.0f s after; the template on Karmada Ready at %.1f s",
		eastReady.Seconds(), store.ModelBytes>>20, gets, podReady.Seconds(), karmadaReady.Seconds())
	t.Logf("north's pod %s on %s answered a completion through north's API server: %s", pod.Name, pod.Spec.NodeName, answer)
}

// partReady reports whether m runs its part of obj, replicas of them, Ready
// for its current generation.
func partReady(ctx context.Context, m *member, obj *servingv1.AIInference, replicas int32) bool {
	got := &servingv1.AIInference{}
	return m.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got) == nil &&
		got.Status.ObservedGeneration == got.Generation && got.Status.Phase == servingv1.PhaseReady && got.Status.ReadyReplicas == replicas
}

// clusterAffinity is a PropagationPolicy's placement on exactly the members.
func clusterAffinity(members []string) map[string]any {
	clusterNames := []any{}
	for _, m := range members {
		clusterNames = append(clusterNames, m)
	}
	return map[string]any{"clusterNames": clusterNames}
}

// duplicatedPolicy is a PropagationPolicy that puts obj, as it is, on each of
// the members.
func duplicatedPolicy(obj client.Object, members []string) *unstructured.Unstructured {
	gvk, err := apiutil.GVKForObject(obj, testScheme())
	utilruntime.Must(err)
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1",
		"kind":       "PropagationPolicy",
		"metadata":   map[string]any{"namespace": obj.GetNamespace(), "name": strings.ToLower(gvk.Kind) + "-" + obj.GetName()},
		"spec": map[string]any{
			"resourceSelectors": []any{map[string]any{"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind, "name": obj.GetName()}},
			"placement": map[string]any{
				"clusterAffinity":   clusterAffinity(members),
				"replicaScheduling": map[string]any{"replicaSchedulingType": "Duplicated"},
			},
		},
	}}
}

// proxyCompletion asks the engine of pod in m's cluster for a short completion
// of model through the cluster's API server (pods/proxy), as a user of the
// member could, and returns the answer's body.
func proxyCompletion(ctx context.Context, g *WithT, m *member, pod *corev1.Pod, model string) string {
	clientset, err := kubernetes.NewForConfig(m.cluster.RESTConfig())
	g.Expect(err).NotTo(HaveOccurred())
	var port int32
	for _, c := range pod.Spec.Containers {
		if c.Name == servingv1.EngineContainerName && len(c.Ports) > 0 {
			port = c.Ports[0].ContainerPort
		}
	}
	g.Expect(port).NotTo(BeZero(), "the engine's port")
	body, err := json.Marshal(map[string]any{"model": model, "prompt": "Hello", "max_tokens": 4})
	g.Expect(err).NotTo(HaveOccurred())
	answer, err := clientset.CoreV1().RESTClient().Post().Namespace(pod.Namespace).Resource("pods").
		Name(fmt.Sprintf("%s:%d", pod.Name, port)).SubResource("proxy").Suffix("v1", "completions").
		SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
	g.Expect(err).NotTo(HaveOccurred(), "a completion from %s: %s", pod.Name, answer)
	g.Expect(string(answer)).To(ContainSubstring(`"choices"`))
	return string(answer)
}

// TestKarmadaMovesReplicasOffAStoppedMember divides an AIInference of 3
// replicas between east and west, stops west (its operator and its whole
// control plane), and measures how long until east runs all 3, Ready: Karmada
// marks west not Ready after --cluster-failure-threshold (10 s), the
// ClusterTaintPolicy taints it NoExecute, the taint manager evicts the
// AIInference after the policy's toleration (5 s), and the scheduler gives its
// replicas to east. It stops west: it runs last.
func TestKarmadaMovesReplicasOffAStoppedMember(t *testing.T) {
	e := setup(t)
	g := NewWithT(t)
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "failover")
	obj := inference(ns, "moved", 3, 2)
	defer e.dump(t, ns, obj.Name)
	f := e.failOver(t, g, obj)
	g.Expect(f.shares["east"] + f.shares["west"]).To(Equal(int32(3)))
	t.Logf("After west stopped: Karmada's Cluster west not Ready at %s, tainted NoExecute at %s; east runs 3 replicas, Ready, at %s",
		f.notReady.Round(100*time.Millisecond), f.tainted.Round(100*time.Millisecond), f.moved.Round(100*time.Millisecond))
}

// failover is what failOver saw, its times from the start of west's stop.
type failover struct {
	shares                      map[string]int32 // before the stop
	stopping, notReady, tainted time.Duration
	// moved: east runs every replica, Ready.
	moved time.Duration
}

// failOver places obj on east and west with failover asked for (a
// ClusterTaintPolicy that taints a member not Ready NoExecute, tolerated by
// the PropagationPolicy for failoverToleration), waits until both run a part,
// Ready, stops west (its operator and its control plane) and waits until east
// runs every replica, Ready.
func (e *env) failOver(t *testing.T, g *WithT, obj *servingv1.AIInference) failover {
	t.Helper()
	ctx := context.Background()
	taintPolicy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.karmada.io/v1alpha1",
		"kind":       "ClusterTaintPolicy",
		"metadata":   map[string]any{"name": "not-ready-no-execute"},
		"spec": map[string]any{
			"addOnConditions":    []any{map[string]any{"conditionType": "Ready", "operator": "NotIn", "statusValues": []any{"True"}}},
			"removeOnConditions": []any{map[string]any{"conditionType": "Ready", "operator": "In", "statusValues": []any{"True"}}},
			"taints":             []any{map[string]any{"key": "cluster.karmada.io/not-ready", "effect": "NoExecute"}},
		},
	}}
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(taintPolicy), client.FieldOwner("multicluster-test"))).To(Succeed())
	pp := propagationPolicy(obj.Namespace, obj.Name, eastAndWest)
	tolerations := []any{}
	for _, key := range []string{"cluster.karmada.io/not-ready", "cluster.karmada.io/unreachable"} {
		tolerations = append(tolerations, map[string]any{"key": key, "operator": "Exists", "effect": "NoExecute",
			"tolerationSeconds": int64(failoverToleration / time.Second)})
	}
	g.Expect(unstructured.SetNestedSlice(pp.Object, tolerations, "spec", "placement", "clusterTolerations")).To(Succeed())
	g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(pp), client.FieldOwner("multicluster-test"))).To(Succeed())
	g.Expect(e.hub.Create(ctx, obj)).To(Succeed())

	// Both members run a part, Ready.
	f := failover{shares: e.runningParts(g, obj, eastAndWest)}
	t.Logf("Before: east runs %d, west %d", f.shares["east"], f.shares["west"])

	west, east := e.member("west"), e.member("east")
	stopped := time.Now()
	west.operator.Stop()
	g.Expect(west.cluster.Stop()).To(Succeed())
	f.stopping = time.Since(stopped)
	t.Logf("west stopped (its operator and control plane) in %s", f.stopping.Round(100*time.Millisecond))

	replicas := *obj.Spec.Replicas
	g.Eventually(func(g Gomega) {
		cluster := &unstructured.Unstructured{}
		cluster.SetGroupVersionKind(localcluster.ClusterGVK)
		g.Expect(e.hub.Get(ctx, client.ObjectKey{Name: "west"}, cluster)).To(Succeed())
		if f.notReady == 0 && clusterReady(cluster) != "True" {
			f.notReady = time.Since(stopped)
		}
		taints, _, _ := unstructured.NestedSlice(cluster.Object, "spec", "taints")
		for _, taint := range taints {
			if taint.(map[string]any)["effect"] == "NoExecute" && f.tainted == 0 {
				f.tainted = time.Since(stopped)
			}
		}
		got := &servingv1.AIInference{}
		g.Expect(east.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Spec.Replicas).To(HaveValue(Equal(replicas)))
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
		g.Expect(got.Status.ReadyReplicas).To(Equal(replicas))
	}).WithTimeout(3 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	f.moved = time.Since(stopped)
	return f
}

// benchEnv is the variable that asks for TestBenchKarmada (make
// bench-karmada), besides karmadaEnv.
const benchEnv = "KARMADA_BENCH"

// benchReplicas are the counts of replicas of 2 GPUs TestBenchKarmada
// applies; the last is also the count it fails over.
var benchReplicas = []int32{4, 8}

// benchRuns is how many times TestBenchKarmada applies each count each way.
const benchRuns = 3

// median is the middle of durations (the upper of the two middle ones for an
// even count).
func median(durations []time.Duration) time.Duration {
	sorted := slices.Sorted(slices.Values(durations))
	return sorted[len(sorted)/2]
}

// TestBenchKarmada prints the figures of docs/multicluster.md: seconds from
// the apply of an AIInference of N replicas of 2 GPUs to Ready, on Karmada
// over east and west (the template's aggregated Ready), against the same N
// applied straight to one cluster with the same free GPUs (single: east's and
// west's nodes together, its own operator, no Karmada); and seconds from
// west stopped to its replicas Ready on east. It stops west: run it alone
// (make bench-karmada).
func TestBenchKarmada(t *testing.T) {
	if os.Getenv(benchEnv) == "" {
		t.Skipf("%s=1 runs it (make bench-karmada)", benchEnv)
	}
	e := setup(t)
	g := NewWithT(t)
	ctx := context.Background()
	e.applyInterpreter(t, g, nil)
	ns := e.namespace(t, g, "bench")

	singleCluster, err := e.startCluster(ctx, "single", singleClusterPools, false)
	g.Expect(err).NotTo(HaveOccurred())
	single := &member{name: "single", cluster: singleCluster}
	defer func() {
		if single.operator != nil {
			single.operator.Stop()
		}
		_ = single.cluster.Stop()
	}()
	g.Expect(e.runOperator(ctx, single)).To(Succeed())
	g.Expect(single.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	for _, n := range benchReplicas {
		var viaKarmada, straight []time.Duration
		for run := range benchRuns {
			obj := inference(ns, fmt.Sprintf("karmada-%d-%d", n, run), n, 2)
			g.Expect(e.hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(propagationPolicy(ns, obj.Name, eastAndWest)),
				client.FieldOwner("multicluster-test"))).To(Succeed())
			start := time.Now()
			g.Expect(e.hub.Create(ctx, obj)).To(Succeed())
			got := e.waitReadyOnKarmada(g, obj)
			viaKarmada = append(viaKarmada, time.Since(start))
			g.Expect(got.Status.ReadyReplicas).To(Equal(n))
			shares := map[string]int32{}
			for _, m := range e.members {
				part := &servingv1.AIInference{}
				if err := m.k8s.Get(ctx, client.ObjectKeyFromObject(obj), part); err == nil {
					shares[m.name] = *part.Spec.Replicas
				}
			}
			e.remove(t, obj)

			direct := inference(ns, fmt.Sprintf("single-%d-%d", n, run), n, 2)
			start = time.Now()
			g.Expect(single.k8s.Create(ctx, direct)).To(Succeed())
			g.Eventually(func(g Gomega) {
				got := &servingv1.AIInference{}
				g.Expect(single.k8s.Get(ctx, client.ObjectKeyFromObject(direct), got)).To(Succeed())
				g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
				g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
				g.Expect(got.Status.ReadyReplicas).To(Equal(n))
			}).WithTimeout(3 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
			straight = append(straight, time.Since(start))
			g.Expect(single.k8s.Delete(ctx, direct)).To(Succeed())
			g.Eventually(podsGone(single.k8s, direct)).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
			t.Logf("karmada figure: run %d, %d replicas: %.1f s on Karmada (east %d, west %d), %.1f s on one cluster",
				run+1, n, viaKarmada[run].Seconds(), shares["east"], shares["west"], straight[run].Seconds())
		}
		k, o := median(viaKarmada), median(straight)
		t.Logf("karmada figure: apply -> Ready, %d replicas of 2 GPUs, median of %d: %.1f s on Karmada over east and west (%.1f-%.1f), %.1f s applied to one cluster with the same 20 GPUs (%.1f-%.1f); %.2fx",
			n, benchRuns, k.Seconds(), slices.Min(viaKarmada).Seconds(), slices.Max(viaKarmada).Seconds(),
			o.Seconds(), slices.Min(straight).Seconds(), slices.Max(straight).Seconds(), k.Seconds()/o.Seconds())
	}

	n := benchReplicas[len(benchReplicas)-1]
	f := e.failOver(t, g, inference(ns, "moved", n, 2))
	t.Logf("karmada figure: west stopped (%d of %d replicas) -> east runs all %d, Ready: %.1f s (west's API server stopped in %.1f s; Cluster west not Ready at %.1f s, tainted NoExecute at %.1f s)",
		f.shares["west"], n, n, f.moved.Seconds(), f.stopping.Seconds(), f.notReady.Seconds(), f.tainted.Seconds())
}

// runningParts waits until every member runs a part of obj (a share of its
// replicas) for the member's current generation, Ready, and returns the
// shares.
func (e *env) runningParts(g *WithT, obj *servingv1.AIInference, members []string) map[string]int32 {
	ctx := context.Background()
	shares := map[string]int32{}
	for _, name := range members {
		m := e.member(name)
		g.Eventually(func(g Gomega) {
			got := &servingv1.AIInference{}
			g.Expect(m.k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			g.Expect(got.Spec.Replicas).To(HaveValue(BeNumerically(">", 0)))
			g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
			g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
			g.Expect(got.Status.ReadyReplicas).To(Equal(*got.Spec.Replicas))
			shares[m.name] = *got.Spec.Replicas
		}).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(), "the member %s", m.name)
	}
	return shares
}

// waitReadyOnKarmada waits until the template on Karmada reads Ready for its
// current generation, and returns it.
func (e *env) waitReadyOnKarmada(g *WithT, obj *servingv1.AIInference) *servingv1.AIInference {
	got := &servingv1.AIInference{}
	g.Eventually(func(g Gomega) {
		g.Expect(e.hub.Get(context.Background(), client.ObjectKeyFromObject(obj), got)).To(Succeed())
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		ready := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), "Ready: %s", ready.Message)
		g.Expect(ready.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
	}).WithTimeout(3*time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "Ready on Karmada")
	return got
}

// cordon marks every node of the member unschedulable, or schedulable again:
// its running pods go on, new ones wait.
func (m *member) cordon(g *WithT, unschedulable bool) {
	ctx := context.Background()
	nodes := &corev1.NodeList{}
	g.Expect(m.k8s.List(ctx, nodes)).To(Succeed())
	for i := range nodes.Items {
		node := &nodes.Items[i]
		patch := client.MergeFrom(node.DeepCopy())
		node.Spec.Unschedulable = unschedulable
		g.Expect(m.k8s.Patch(ctx, node, patch)).To(Succeed())
	}
}

// remove deletes obj on Karmada and waits until no member runs a pod of it
// and Karmada's summaries of the members count no GPU in use, so that the
// next test finds every member's GPUs free (Karmada divides by them).
func (e *env) remove(t *testing.T, obj *servingv1.AIInference) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	g.Expect(client.IgnoreNotFound(e.hub.Delete(ctx, obj))).To(Succeed())
	start := time.Now()
	for _, m := range e.members {
		g.Eventually(func(g Gomega) {
			podsGone(m.k8s, obj)(g)
			cluster := &unstructured.Unstructured{}
			cluster.SetGroupVersionKind(localcluster.ClusterGVK)
			g.Expect(e.hub.Get(ctx, client.ObjectKey{Name: m.name}, cluster)).To(Succeed())
			for _, field := range []string{"allocated", "allocating"} {
				gpus, _, _ := unstructured.NestedString(cluster.Object, "status", "resourceSummary", field, "nvidia.com/gpu")
				g.Expect(gpus).To(Or(BeEmpty(), Equal("0")), "GPUs %s on %s, in Karmada's summary", field, m.name)
			}
		}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Succeed(), "%s freed of %s", m.name, obj.Name)
	}
	t.Logf("Removed %s: its pods gone and every member's GPUs free in Karmada's summaries %s later", obj.Name, time.Since(start).Round(100*time.Millisecond))
}

// podsGone checks that no pod of obj is left in the cluster of k8s.
func podsGone(k8s client.Client, obj *servingv1.AIInference) func(Gomega) {
	return func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace), client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
	}
}

// clusterReady is the status of a Karmada Cluster's Ready condition.
func clusterReady(cluster *unstructured.Unstructured) string {
	conditions, _, _ := unstructured.NestedSlice(cluster.Object, "status", "conditions")
	for _, c := range conditions {
		if c, ok := c.(map[string]any); ok && c["type"] == "Ready" {
			s, _ := c["status"].(string)
			return s
		}
	}
	return ""
}

// dump logs what Karmada made of the object (its ResourceBinding and the
// template's status) and the members' objects, when the test failed.
func (e *env) dump(t *testing.T, ns, name string) {
	if !t.Failed() {
		return
	}
	ctx := context.Background()
	for _, kind := range []string{"ResourceBinding", "Work"} {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion("work.karmada.io/v1alpha2")
		if kind == "Work" {
			list.SetAPIVersion("work.karmada.io/v1alpha1")
		}
		list.SetKind(kind + "List")
		if err := e.hub.List(ctx, list); err != nil {
			t.Logf("listing %ss: %v", kind, err)
			continue
		}
		for _, item := range list.Items {
			if kind == "ResourceBinding" && item.GetNamespace() != ns {
				continue
			}
			y, _ := sigsyaml.Marshal(map[string]any{"metadata": map[string]any{"namespace": item.GetNamespace(), "name": item.GetName()}, "spec": item.Object["spec"], "status": item.Object["status"]})
			t.Logf("%s on Karmada:\n%s", kind, y)
		}
	}
	got := &servingv1.AIInference{}
	if err := e.hub.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err == nil {
		y, _ := sigsyaml.Marshal(map[string]any{"spec.replicas": got.Spec.Replicas, "status": got.Status})
		t.Logf("the template on Karmada:\n%s", y)
	}
	for _, m := range e.members {
		if err := m.k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
			t.Logf("%s: %v", m.name, err)
			continue
		}
		y, _ := sigsyaml.Marshal(map[string]any{"spec.replicas": got.Spec.Replicas, "status": got.Status})
		t.Logf("%s:\n%s\noperator log:\n%s", m.name, y, m.operator.LogTail(20))
	}
	t.Logf("Karmada's logs: %s", e.karmada.LogsDir())
}

// prefixed writes progress lines to stderr behind the component's name.
func prefixed(name string) *prefixWriter { return &prefixWriter{prefix: "[" + name + "] "} }

type prefixWriter struct {
	mu     sync.Mutex
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line != "" {
			fmt.Fprint(os.Stderr, w.prefix+line)
		}
	}
	return len(p), nil
}
