package localcluster

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// cluster is the one cluster of this test binary, started by TestMain with the
// default node pools; nil with -short.
var cluster *Cluster

// TestMain starts one cluster for all tests (a start costs seconds of both
// cores), and checks after them that Stop leaves no process and no directory.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	begin := time.Now()
	var err error
	// Kubelet delays a tenth of the real ones: a pod starts within 2 s, a crash
	// loop backs off 1 s, 2 s, 4 s...
	cluster, err = Start(context.Background(), Options{Progress: os.Stderr, KubeletDelayScale: 0.1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting the local cluster:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "Local cluster started in %s\n", time.Since(begin).Round(100*time.Millisecond))

	code := m.Run()

	procs, dir := cluster.Processes(), cluster.Dir()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: Stop:", err)
		code = 1
	}
	if err := checkStopped(procs, dir); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: after Stop:", err)
		code = 1
	}
	os.Exit(code)
}

// checkStopped reports any process of procs (or of its process group) that is
// still there, and dir if it still exists.
func checkStopped(procs []Process, dir string) error {
	var problems []string
	if len(procs) != 5 {
		problems = append(problems, fmt.Sprintf("%d processes recorded, want 5: %v", len(procs), procs))
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	groups := map[int]string{}
	for _, p := range procs {
		groups[p.PID] = p.Name
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// "pid (comm) state ppid pgrp ..."
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		var pgrp int
		if len(fields) > 2 {
			fmt.Sscanf(fields[2], "%d", &pgrp)
		}
		// A zombie holds no port or file; it waits for its new parent to reap it.
		if name, ok := groups[pgrp]; ok && fields[0] != "Z" {
			problems = append(problems, fmt.Sprintf("process %d of %s's group is still there (state %s)", pid, name, fields[0]))
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		problems = append(problems, fmt.Sprintf("cluster directory %s still exists (%v)", dir, err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

func needCluster(t *testing.T) (context.Context, kubernetes.Interface) {
	t.Helper()
	if cluster == nil {
		t.Skip("no local cluster with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx, cluster.Client()
}

// testNamespace creates a namespace for t, waits for its default service account
// (pods are refused without it), and dumps its pods and events if t fails.
func testNamespace(ctx context.Context, t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if t.Failed() {
			dump(ctx, t, client, ns.Name)
		}
		_ = client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	eventually(ctx, t, "the default service account", func() (bool, string) {
		_, err := client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return ns.Name
}

// eventually polls cond every 250ms until it holds, failing t when ctx ends.
// cond returns a description of what it saw, for the failure message.
func eventually(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var seen string
	for {
		var ok bool
		if ok, seen = cond(); ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; last seen: %s", what, ctx.Err(), seen)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// dump logs the pods and events of a namespace, the nodes, and the end of each
// component's log.
func dump(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string) {
	if pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			t.Logf("pod %s node=%q phase=%s conditions=%v initContainerStatuses=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, p.Status.InitContainerStatuses)
		}
	}
	if events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range events.Items {
			t.Logf("event %s/%s %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
	}
	if nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nodes.Items {
			t.Logf("node %s schedulable=%v taints=%v", n.Name, nodeSchedulable(&n), n.Spec.Taints)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(cluster.LogsDir(), "*.log"))
	for _, l := range logs {
		t.Logf("end of %s:\n%s", l, tail(l, 20))
	}
}

func TestDefaultPoolNodesAreReady(t *testing.T) {
	ctx, client := needCluster(t)
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*corev1.Node{}
	for _, n := range Nodes(DefaultNodePools()) {
		want[n.Name] = n
	}
	for _, n := range nodes.Items {
		w, ok := want[n.Name]
		if !ok {
			continue // a node another test added
		}
		delete(want, n.Name)
		if !nodeSchedulable(&n) {
			t.Errorf("node %s is not Ready and schedulable: conditions %v, taints %v", n.Name, n.Status.Conditions, n.Spec.Taints)
		}
		for _, r := range []corev1.ResourceName{GPUResource, corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods} {
			wantQ, wantOK := w.Status.Capacity[r]
			for what, list := range map[string]corev1.ResourceList{"capacity": n.Status.Capacity, "allocatable": n.Status.Allocatable} {
				got, gotOK := list[r]
				if gotOK != wantOK || !got.Equal(wantQ) {
					t.Errorf("node %s %s %s = %s (set %v), want %s (set %v)", n.Name, what, r, got.String(), gotOK, wantQ.String(), wantOK)
				}
			}
		}
		if got, want := n.Labels[GPUProductLabel], w.Labels[GPUProductLabel]; got != want {
			t.Errorf("node %s product label = %q, want %q", n.Name, got, want)
		}
		if n.Labels["type"] != "kwok" || n.Annotations[KwokNodeAnnotation] != "fake" {
			t.Errorf("node %s lacks the kwok label or annotation: %v %v", n.Name, n.Labels, n.Annotations)
		}
		gpuTainted := false
		for _, taint := range n.Spec.Taints {
			if taint.Key == GPUTaintKey && taint.Effect == corev1.TaintEffectNoSchedule {
				gpuTainted = true
			}
		}
		if isGPU := w.Labels[GPUProductLabel] != ""; gpuTainted != isGPU {
			t.Errorf("node %s GPU taint = %v, want %v", n.Name, gpuTainted, isGPU)
		}
	}
	for name := range want {
		t.Errorf("node %s of the default pools is missing", name)
	}

	// kwok renews a lease per node, as a kubelet does; without it the node
	// lifecycle controller would mark the nodes unknown within a minute.
	for _, n := range Nodes(DefaultNodePools()) {
		lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("lease of node %s: %v", n.Name, err)
			continue
		}
		if lease.Spec.RenewTime == nil || time.Since(lease.Spec.RenewTime.Time) > time.Minute {
			t.Errorf("lease of node %s renewed at %v, want within the last minute", n.Name, lease.Spec.RenewTime)
		}
	}
}

// gpuPodSpec is a pod that needs gpus GPUs of one of products: a model server
// with a loader init container, as the operator makes them.
func gpuPodSpec(gpus int64, products ...string) corev1.PodSpec {
	limits := corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	return corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "loader", Image: "loader:test"}},
		Containers: []corev1.Container{{Name: "server", Image: "server:test",
			Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits}}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: GPUProductLabel, Operator: corev1.NodeSelectorOpIn, Values: products}},
			}}},
		}},
		Tolerations: []corev1.Toleration{{Key: GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	}
}

func TestGPUDeploymentRunsOnMatchingNodesOnly(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	labels := map[string]string{"app": "model"}
	_, err := client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "model"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       gpuPodSpec(4, GPUProductA100),
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the Deployment to have 2 ready replicas", func() (bool, string) {
		d, err := client.AppsV1().Deployments(ns).Get(ctx, "model", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.ReadyReplicas == 2 && d.Status.AvailableReplicas == 2, fmt.Sprintf("%+v", d.Status)
	})

	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		node, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s on node %q: %v", p.Name, p.Spec.NodeName, err)
		}
		if got := node.Labels[GPUProductLabel]; got != GPUProductA100 {
			t.Errorf("pod %s runs on %s with GPU %q, want %s", p.Name, node.Name, got, GPUProductA100)
		}
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s phase = %s, want Running", p.Name, p.Status.Phase)
		}
		if len(p.Status.InitContainerStatuses) != 1 || p.Status.InitContainerStatuses[0].State.Terminated == nil ||
			p.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 0 {
			t.Errorf("pod %s init container statuses = %+v, want loader completed with exit code 0", p.Name, p.Status.InitContainerStatuses)
		}
	}
}

// TestSidecarRunsForThePodsLife: as on a kubelet, an init container with
// restartPolicy Always (the operator's warm-up gate) starts after the init
// containers before it complete, keeps running, and is ready only with the
// pod's containers; the init containers before it complete with exit 0.
func TestSidecarRunsForThePodsLife(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	spec := gpuPodSpec(1, GPUProductA100)
	spec.InitContainers = append(spec.InitContainers, corev1.Container{Name: "gate", Image: "gate:test", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)})
	created, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "model"}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Every version of the pod, from a watch: the starting sidecar may last less
	// than a poll's interval.
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=model", ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var sawStarting bool // the sidecar running and not ready while the pod is not
	for p := created; !podReady(p); {
		ev, ok := <-w.ResultChan()
		if !ok {
			t.Fatalf("the watch ended before the pod was Ready; last seen: phase %s, init containers %+v", p.Status.Phase, p.Status.InitContainerStatuses)
		}
		if p, ok = ev.Object.(*corev1.Pod); !ok {
			t.Fatalf("watch: %+v", ev.Object)
		}
		if st := p.Status.InitContainerStatuses; len(st) == 2 && st[1].State.Running != nil && !st[1].Ready && p.Status.Phase == corev1.PodPending {
			sawStarting = true
		}
	}
	if !sawStarting {
		t.Error("never saw the sidecar running and not ready before the pod was Ready")
	}
	// Stages that still matched the pod would change it again: it stays as it is.
	time.Sleep(2 * time.Second)
	p, err := client.CoreV1().Pods(ns).Get(ctx, "model", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status.InitContainerStatuses
	if !podReady(p) || len(st) != 2 {
		t.Fatalf("pod phase %s, ready %v, init containers %+v", p.Status.Phase, podReady(p), st)
	}
	if loader := st[0]; loader.State.Terminated == nil || loader.State.Terminated.ExitCode != 0 || loader.Started == nil || *loader.Started {
		t.Errorf("loader %+v, want terminated with exit code 0, not started", loader)
	}
	if gate := st[1]; gate.State.Running == nil || !gate.Ready || gate.Started == nil || !*gate.Started || gate.RestartCount != 0 {
		t.Errorf("sidecar %+v, want running, started and ready, never restarted", gate)
	}
}

func TestAddNodeLetsPendingPodRun(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	const product = "NVIDIA-B200"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "waits"}, Spec: gpuPodSpec(8, product)}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the pod to be unschedulable", func() (bool, string) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "waits", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, ""
			}
		}
		return false, fmt.Sprintf("node %q, conditions %+v", p.Spec.NodeName, p.Status.Conditions)
	})

	names, err := cluster.AddNodes(ctx, NodePool{Name: "b200", Count: 1, GPUProduct: product, GPUCount: 8,
		CPU: resource.MustParse("224"), Memory: resource.MustParse("2Ti")})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "b200-0" {
		t.Fatalf("AddNodes made %v, want [b200-0]", names)
	}
	t.Cleanup(func() {
		if err := cluster.RemoveNode(context.Background(), "b200-0"); err != nil {
			t.Error(err)
		}
	})
	eventually(ctx, t, "the pod to run on the new node", func() (bool, string) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "waits", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == "b200-0" && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("node %q phase %s", p.Spec.NodeName, p.Status.Phase)
	})

	// A second node of the same pool takes the next free index.
	more, err := cluster.AddNodes(ctx, NodePool{Name: "b200", Count: 1, GPUProduct: product, GPUCount: 8,
		CPU: resource.MustParse("224"), Memory: resource.MustParse("2Ti")})
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 1 || more[0] != "b200-1" {
		t.Fatalf("second AddNodes made %v, want [b200-1]", more)
	}
	if err := cluster.RemoveNode(ctx, "b200-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, "b200-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node b200-1 after RemoveNode: %v, want not found", err)
	}
}

func TestComponentsRunOnLoopback(t *testing.T) {
	needCluster(t)
	if err := cluster.Healthy(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cluster.APIServerURL(), "https://127.0.0.1:") {
		t.Errorf("API server at %s, want 127.0.0.1", cluster.APIServerURL())
	}
	data, err := os.ReadFile(cluster.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), cluster.APIServerURL()) {
		t.Errorf("kubeconfig does not point at %s:\n%s", cluster.APIServerURL(), data)
	}
	// Every listening TCP socket of the cluster's processes is on 127.0.0.1.
	for _, p := range cluster.Processes() {
		for _, addr := range listeningAddrs(t, p.PID) {
			if !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Errorf("%s listens on %s", p.Name, addr)
			}
		}
	}
}

// listeningAddrs returns the local addresses of pid's listening TCP sockets
// (IPv4 and IPv6), from /proc.
func listeningAddrs(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			addrs = append(addrs, decodeProcAddr(f[1]))
		}
	}
	return addrs
}

// decodeProcAddr turns /proc/net/tcp's "0100007F:1F90" into "127.0.0.1:8080"
// (IPv6 addresses are returned in their hex form, which fails the test's check).
func decodeProcAddr(s string) string {
	hostPort := strings.SplitN(s, ":", 2)
	var port int
	fmt.Sscanf(hostPort[1], "%X", &port)
	if len(hostPort[0]) != 8 {
		return fmt.Sprintf("[%s]:%d", hostPort[0], port)
	}
	var ip uint32
	fmt.Sscanf(hostPort[0], "%X", &ip)
	return fmt.Sprintf("%d.%d.%d.%d:%d", ip&0xff, ip>>8&0xff, ip>>16&0xff, ip>>24, port)
}

// The check TestMain makes after Stop must see a process left in a group and a
// directory left behind.
func TestCheckStoppedSeesLeftovers(t *testing.T) {
	dir := t.TempDir()
	p, err := startProcess("sleep", "/bin/sh", []string{"-c", "sleep 60 & sleep 60"}, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	procs := []Process{{Name: "sleep", PID: p.PID()}}
	if err := checkStopped(procs, dir); err == nil || !strings.Contains(err.Error(), "still there") || !strings.Contains(err.Error(), "still exists") {
		t.Errorf("checkStopped with a running group and a directory = %v, want both reported", err)
	}
	p.stop(5 * time.Second)
	if err := checkStopped(procs, filepath.Join(dir, "gone")); err == nil || strings.Contains(err.Error(), "still") {
		// Only the count of recorded processes (1, not 5) may be reported now.
		t.Errorf("checkStopped after stop = %v, want only the process count reported", err)
	}
}
