package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
	"github.com/aiinference/operator/test/testutil/freeport"
)

// The bring-your-own autoscaler: KEDA's operator (v2.20.2, built from its Go
// module by hack/tools/build.sh keda) runs on the host against the shared
// cluster, and a ScaledObject scales an AIInference through its scale
// subresource. The cron trigger's activity is what KEDA itself acts on (0 <-> 1,
// through /scale); counts above one would go through the HPA KEDA makes and
// the external metrics API, which this cluster does not serve (no
// keda-metrics-apiserver), so maxReplicaCount is 1.

// kedaModule is KEDA's Go module, as hack/tools/keda/go.mod requires it.
const kedaModule = "github.com/kedacore/keda/v2"

// kedaBuildCommand builds the binary the test runs; make tools runs it.
const kedaBuildCommand = "hack/tools/build.sh keda"

func TestKEDAScalesAnAIInferenceThroughItsScaleSubresource(t *testing.T) {
	bin, moduleDir := kedaOperator(t)
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	installKEDACRDs(t, g, moduleDir)
	keda := startKEDA(t, bin, ns)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("KEDA's log (last 80 lines):\n%s", keda.tail(80))
			dumpScaledObjects(t, ns)
		}
	})

	// Without spec.autoscaling, KEDA alone sets the count: 0 -> 1 while the
	// cron window is active, 1 -> 0 once it is not, and 0 -> 1 again.
	t.Run("without spec.autoscaling", func(t *testing.T) {
		g := NewWithT(t)
		obj := inference(ns, "keda", 1, localcluster.GPUProductL4)
		obj.Spec.Replicas = ptr.To[int32](0)
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		waitFor(t, g, obj, readyTimeout, beAtZero)

		so := scaledObject(ns, "keda", obj.Name, cronWindow(true))
		g.Expect(k8s.Create(ctx, so)).To(Succeed())
		begin := time.Now()
		waitScaledObject(t, g, so, "True", "True")
		waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
			g.Expect(got.Spec.Replicas).To(Equal(ptr.To[int32](1)), "KEDA wrote spec.replicas through /scale")
			beReady(1)(g, got)
		})
		expectScale(g, obj, 1, 1)
		expectDeploymentReplicas(g, obj, 1)
		t.Logf("KEDA: cron window active -> the AIInference serving 1 replica in %.1f s", time.Since(begin).Seconds())
		logKEDAHPA(t, g, ns, so.GetName(), obj.Name)

		setCronWindow(g, so, cronWindow(false))
		begin = time.Now()
		waitScaledObject(t, g, so, "True", "False")
		waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
			g.Expect(got.Spec.Replicas).To(Equal(ptr.To[int32](0)), "KEDA wrote spec.replicas through /scale")
			beAtZero(g, got)
		})
		expectScale(g, obj, 0, 0)
		expectDeploymentReplicas(g, obj, 0)
		expectNoPods(g, obj)
		t.Logf("KEDA: cron window inactive -> the AIInference at zero (no pod) in %.1f s (cooldownPeriod %d s)", time.Since(begin).Seconds(), kedaCooldownSeconds)

		setCronWindow(g, so, cronWindow(true))
		waitScaledObject(t, g, so, "True", "True")
		waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
			g.Expect(got.Spec.Replicas).To(Equal(ptr.To[int32](1)))
			beReady(1)(g, got)
		})
		expectDeploymentReplicas(g, obj, 1)
	})

	// With spec.autoscaling as well, KEDA's writes to spec.replicas move
	// nothing: the operator's autoscaler sets the Deployment's count
	// (docs/autoscaling.md, "One writer").
	t.Run("beside spec.autoscaling", func(t *testing.T) {
		g := NewWithT(t)
		obj := inference(ns, "keda-both", 1, localcluster.GPUProductL4)
		obj.Spec.Autoscaling = &servingv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
			Targets: servingv1.AutoscalingTargets{QueueDepth: ptr.To[int32](4)}}
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		waitFor(t, g, obj, readyTimeout, func(g Gomega, got *servingv1.AIInference) {
			beReady(1)(g, got)
			g.Expect(got.Status.Autoscaling).NotTo(BeNil())
			g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(1)))
		})

		// An inactive window and minReplicaCount 0: KEDA takes /scale to 0.
		so := scaledObject(ns, "keda-both", obj.Name, cronWindow(false))
		g.Expect(k8s.Create(ctx, so)).To(Succeed())
		waitScaledObject(t, g, so, "True", "False")
		g.Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
			g.Expect(obj.Spec.Replicas).To(Equal(ptr.To[int32](0)), "KEDA wrote spec.replicas through /scale")
		}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		g.Consistently(func(g Gomega) {
			expectDeploymentReplicas(g, obj, 1)
			expectScale(g, obj, 0, 1)
			got := &servingv1.AIInference{}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			g.Expect(got.Status.Autoscaling.DesiredReplicas).To(Equal(int32(1)))
			g.Expect(got.Status.ReadyReplicas).To(Equal(int32(1)))
			g.Expect(readyReason(got)).To(Equal(servingv1.ReasonReady))
		}).WithTimeout(10 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
		t.Logf("KEDA beside spec.autoscaling: spec.replicas 0 (KEDA's write), the Deployment and status at 1 (the autoscaler's count) for 10 s")
	})
}

// beAtZero is what an AIInference at zero replicas says: Ready (nothing is
// desired, nothing runs) with reason ScaledToZero, 0 replicas stored (the
// scale subresource's status.replicas), and Available False.
func beAtZero(g Gomega, got *servingv1.AIInference) {
	g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
	g.Expect(readyReason(got)).To(Equal(servingv1.ReasonScaledToZero))
	g.Expect(got.Status.Replicas).To(BeZero())
	g.Expect(got.Status.ReadyReplicas).To(BeZero())
	available := meta.FindStatusCondition(got.Status.Conditions, servingv1.ConditionAvailable)
	g.Expect(available).NotTo(BeNil())
	g.Expect(available.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(available.Reason).To(Equal(servingv1.ReasonNoReadyReplicas))
}

// logKEDAHPA checks that the HPA KEDA made for the ScaledObject targets the
// AIInference, and logs what the HPA says: counts above one go through it and
// the external metrics API, which no keda-metrics-apiserver serves here.
func logKEDAHPA(t *testing.T, g *WithT, ns, scaledObject, target string) {
	t.Helper()
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "keda-hpa-" + scaledObject}, hpa)).To(Succeed())
		g.Expect(hpa.Spec.ScaleTargetRef).To(Equal(autoscalingv2.CrossVersionObjectReference{
			APIVersion: servingv1.GroupVersion.String(), Kind: "AIInference", Name: target}))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	var conds []string
	for _, c := range hpa.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	t.Logf("KEDA's HPA %s: min %d, max %d; conditions: %s", hpa.Name, ptr.Deref(hpa.Spec.MinReplicas, 1), hpa.Spec.MaxReplicas, strings.Join(conds, "; "))
}

// expectScale reads the AIInference's scale subresource, as KEDA and the HPA do.
func expectScale(g Gomega, obj *servingv1.AIInference, spec, status int32) {
	scale := &autoscalingv1.Scale{}
	g.Expect(k8s.SubResource("scale").Get(context.Background(), obj, scale)).To(Succeed())
	g.Expect(scale.Spec.Replicas).To(Equal(spec), "/scale spec.replicas")
	g.Expect(scale.Status.Replicas).To(Equal(status), "/scale status.replicas")
	g.Expect(scale.Status.Selector).To(ContainSubstring(servingv1.LabelInference + "=" + obj.Name))
}

func expectDeploymentReplicas(g Gomega, obj *servingv1.AIInference, replicas int32) {
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), d)).To(Succeed())
	g.Expect(d.Spec.Replicas).To(Equal(ptr.To(replicas)), "the Deployment's replicas")
}

func expectNoPods(g Gomega, obj *servingv1.AIInference) {
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(context.Background(), pods, client.InNamespace(obj.Namespace),
			client.MatchingLabels{servingv1.LabelInference: obj.Name})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "no pod, so no GPU, at zero")
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// KEDA's loop: a trigger is read every second; a target goes to zero 3 s after
// its triggers were last active (KEDA's defaults: 30 s and 300 s).
const (
	kedaPollingSeconds  = 1
	kedaCooldownSeconds = 3
)

var scaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// scaledObject is a ScaledObject on the AIInference's scale subresource with
// one cron trigger, between 0 and 1 replicas.
func scaledObject(ns, name, target string, window map[string]any) *unstructured.Unstructured {
	so := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": scaledObjectGVK.Group + "/" + scaledObjectGVK.Version,
		"kind":       scaledObjectGVK.Kind,
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"scaleTargetRef": map[string]any{
				"apiVersion": servingv1.GroupVersion.String(),
				"kind":       "AIInference",
				"name":       target,
			},
			"minReplicaCount": int64(0),
			"maxReplicaCount": int64(1),
			"pollingInterval": int64(kedaPollingSeconds),
			"cooldownPeriod":  int64(kedaCooldownSeconds),
			"triggers":        []any{map[string]any{"type": "cron", "metadata": window}},
		},
	}}
	return so
}

// cronWindow is a cron trigger's metadata for a daily window, in UTC, that
// is active now (it began a minute ago and ends in an hour) or is not (it
// begins in an hour). KEDA's cron scaler is active when the window's next end
// comes before its next start.
func cronWindow(active bool) map[string]any {
	now := time.Now().UTC()
	at := func(t time.Time) string { return fmt.Sprintf("%d %d * * *", t.Minute(), t.Hour()) }
	start, end := now.Add(time.Hour), now.Add(2*time.Hour)
	if active {
		start, end = now.Add(-time.Minute), now.Add(time.Hour)
	}
	return map[string]any{"timezone": "UTC", "start": at(start), "end": at(end), "desiredReplicas": "1"}
}

func setCronWindow(g *WithT, so *unstructured.Unstructured, window map[string]any) {
	g.Eventually(func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(so), so); err != nil {
			return err
		}
		if err := unstructured.SetNestedSlice(so.Object, []any{map[string]any{"type": "cron", "metadata": window}}, "spec", "triggers"); err != nil {
			return err
		}
		return k8s.Update(context.Background(), so)
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// waitScaledObject waits for the ScaledObject's own Ready and Active
// conditions to say ready and active as given ("True" or "False").
func waitScaledObject(t *testing.T, g *WithT, so *unstructured.Unstructured, ready, active string) {
	t.Helper()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(so.GroupVersionKind())
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(so), got)).To(Succeed())
		conds := scaledObjectConditions(got)
		g.Expect(conds["Ready"]).To(HavePrefix(ready+" "), "Ready")
		g.Expect(conds["Active"]).To(HavePrefix(active+" "), "Active")
		kind, _, _ := unstructured.NestedString(got.Object, "status", "scaleTargetKind")
		g.Expect(kind).To(Equal(servingv1.GroupVersion.String() + ".AIInference"))
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("ScaledObject %s: %v", so.GetName(), scaledObjectConditions(got))
}

// scaledObjectConditions are a ScaledObject's conditions by type, each as
// "Status Reason: message".
func scaledObjectConditions(so *unstructured.Unstructured) map[string]string {
	conds := map[string]string{}
	list, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
	for _, c := range list {
		m, _ := c.(map[string]any)
		typ, _ := m["type"].(string)
		status, _ := m["status"].(string)
		reason, _ := m["reason"].(string)
		message, _ := m["message"].(string)
		conds[typ] = fmt.Sprintf("%s %s: %s", status, reason, message)
	}
	return conds
}

func dumpScaledObjects(t *testing.T, ns string) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(scaledObjectGVK.GroupVersion().WithKind("ScaledObjectList"))
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Logf("listing ScaledObjects: %v", err)
		return
	}
	for _, so := range list.Items {
		so.SetManagedFields(nil)
		y, _ := sigsyaml.Marshal(so.Object)
		t.Logf("ScaledObject %s:\n%s", so.GetName(), y)
	}
}

// kedaOperator is the KEDA operator binary that hack/tools/build.sh keda
// puts in the tool cache, and KEDA's module folder (for its CRDs). A missing
// binary fails the test, naming the command that builds it: the build takes
// half an hour on 2 cores, too long to start from a test.
func kedaOperator(t *testing.T) (bin, moduleDir string) {
	t.Helper()
	toolsDir := filepath.Join(repoRoot, "hack", "tools", "keda")
	version, err := testutil.RequiredVersion(filepath.Join(toolsDir, "go.mod"), kedaModule)
	if err != nil {
		t.Fatal(err)
	}
	cacheRoot := os.Getenv("AIINFERENCE_CACHE")
	if cacheRoot == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cacheRoot = filepath.Join(cache, "aiinference-operator")
	}
	bin = filepath.Join(cacheRoot, "bin", "keda-"+version, "keda")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("KEDA's operator %s is not built (%v): run `%s` (make tools does; about 31 minutes the first time on 2 cores)",
			version, err, kedaBuildCommand)
	}
	download := exec.Command("go", "mod", "download", "-json", kedaModule)
	download.Dir = toolsDir
	out, err := download.Output()
	if err != nil {
		t.Fatalf("finding KEDA's module (go mod download in %s): %v", toolsDir, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("finding KEDA's module: %v: %s", err, out)
	}
	return bin, mod.Dir
}

// installKEDACRDs applies KEDA's CRDs (config/crd/bases of its module) server-side,
// as KEDA's install does (the ScaledJob CRD is too large for a client-side
// apply's annotation), and waits until they are established. Other tests on
// the cluster are unaffected by the new kinds; they stay until the cluster stops.
func installKEDACRDs(t *testing.T, g *WithT, moduleDir string) {
	t.Helper()
	ctx := context.Background()
	files, err := filepath.Glob(filepath.Join(moduleDir, "config", "crd", "bases", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(files).NotTo(BeEmpty(), "KEDA's CRDs in %s", moduleDir)
	var names []string
	for _, file := range files {
		data, err := os.ReadFile(file)
		g.Expect(err).NotTo(HaveOccurred())
		u := &unstructured.Unstructured{}
		g.Expect(sigsyaml.Unmarshal(data, &u.Object)).To(Succeed(), file)
		g.Expect(k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("aiinference-e2e"), client.ForceOwnership)).
			To(Succeed(), "applying %s", filepath.Base(file))
		names = append(names, u.GetName())
	}
	for _, name := range names {
		g.Eventually(func(g Gomega) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, crd)).To(Succeed())
			established := false
			for _, c := range crd.Status.Conditions {
				established = established || (c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue)
			}
			g.Expect(established).To(BeTrue(), "CRD %s established", name)
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	}
}

// kedaProcess is KEDA's operator running on the host.
type kedaProcess struct {
	cmd     *exec.Cmd
	logPath string
}

func (k *kedaProcess) tail(lines int) string {
	data, err := os.ReadFile(k.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(all[max(len(all)-lines, 0):], "\n")
}

// startKEDA runs KEDA's operator out of cluster with the cluster's admin
// kubeconfig, watching namespace ns only (its cluster objects and lease there
// too), with its metrics and probes on loopback and its gRPC metrics service
// (which the absent keda-metrics-apiserver would call) on a self-signed
// certificate; no cert rotation, no leader election. It is stopped (SIGTERM, then SIGKILL) when the test ends.
func startKEDA(t *testing.T, bin, ns string) *kedaProcess {
	t.Helper()
	dir := t.TempDir()
	certDir := filepath.Join(dir, "certs")
	g := NewWithT(t)
	g.Expect(os.MkdirAll(certDir, 0o700)).To(Succeed())
	writeSelfSignedCert(t, g, certDir, "localhost")
	// The certificate is its own CA (ca.crt): nothing calls the gRPC service here.
	cert, err := os.ReadFile(filepath.Join(certDir, "tls.crt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(certDir, "ca.crt"), cert, 0o600)).To(Succeed())
	var ports [3]int
	for i := range ports {
		p, err := freeport.Pick()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	k := &kedaProcess{logPath: filepath.Join(workDir, "keda-"+ns+".log")}
	logFile, err := os.Create(k.logPath)
	if err != nil {
		t.Fatal(err)
	}
	k.cmd = exec.Command(bin,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--metrics-service-bind-address=127.0.0.1:%d", ports[2]),
		"--cert-dir="+certDir, "--ca-dir="+certDir,
		"--enable-cert-rotation=false", "--leader-elect=false", "--zap-log-level=info")
	k.cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig(),
		"WATCH_NAMESPACE="+ns, "KEDA_CLUSTER_OBJECT_NAMESPACE="+ns, "POD_NAMESPACE="+ns)
	k.cmd.Stdout, k.cmd.Stderr = logFile, logFile
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting KEDA's operator: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = k.cmd.Wait(); logFile.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	// Up once its health endpoint answers; it fails fast on a bad flag or env.
	healthz := fmt.Sprintf("127.0.0.1:%d", ports[1])
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-exited:
			t.Fatalf("KEDA's operator exited: %s", k.tail(40))
		default:
		}
		if conn, err := net.DialTimeout("tcp", healthz, time.Second); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("KEDA's operator does not serve its health endpoint after a minute: %s", k.tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return k
}
