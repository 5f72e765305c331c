package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// RealNodeTestEnv asks for the tests that run a real node on this host. They
// need root and cgroup v1, and fail (never skip) when asked on a host without.
const RealNodeTestEnv = "LOCALCLUSTER_REAL_NODE"

// TestRealNode starts a cluster with a real node beside a kwok node, runs a
// Deployment there whose init container (the model loader) writes into an
// emptyDir and whose engine (llm-d-inference-sim) passes a readiness probe, calls
// the engine from the host at the pod's IP, reads its log through the API
// server, adds a second real node, and checks
// that Stop leaves nothing behind on the host.
func TestRealNode(t *testing.T) {
	if os.Getenv(RealNodeTestEnv) != "1" {
		t.Skip("set " + RealNodeTestEnv + "=1 to run a real node on this host (root, cgroup v1)")
	}
	if err := CheckRealNodeHost(); err != nil {
		t.Fatalf("%s=1 asks for a real node, and this host cannot run one: %v", RealNodeTestEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sysctlsBefore, err := readSysctls()
	if err != nil {
		t.Fatal(err)
	}
	hostDirsBefore := existingHostDirs()

	// The binaries and images first, so that the start time below is the cluster's.
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	real, err := resolveRealNodeOptions(ctx, RealNodeOptions{}, root, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	realPool := NodePool{Name: "real", Count: 1, Real: true, GPUProduct: GPUProductL4, GPUCount: 2}
	begin := time.Now()
	c, err := Start(ctx, Options{
		NodePools: []NodePool{realPool, {Name: "h100", Count: 1, GPUProduct: GPUProductH100, GPUCount: 8,
			CPU: resource.MustParse("208"), Memory: resource.MustParse("1800Gi")}},
		RealNodes: real,
		Progress:  os.Stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Cluster with a real node and a kwok node Ready in %s", time.Since(begin).Round(100*time.Millisecond))
	stopped := false
	defer func() {
		if !stopped {
			dumpRealNodeLogs(t, c)
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		}
	}()

	nodes := c.RealNodes()
	if len(nodes) != 1 || nodes[0].Name != "real-0" {
		t.Fatalf("RealNodes() = %+v, want one node real-0", nodes)
	}
	node, err := c.Client().CoreV1().Nodes().Get(ctx, "real-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpus := node.Status.Allocatable[GPUResource]
	if gpus.Value() != 2 || node.Labels[GPUProductLabel] != GPUProductL4 || node.Annotations[KwokNodeAnnotation] != "" {
		t.Fatalf("node real-0: allocatable %s=%s, labels %v, annotations %v; want 2 GPUs of %s and no kwok annotation",
			GPUResource, gpus.String(), node.Labels, node.Annotations, GPUProductL4)
	}

	loader, err := FindImage(c.Images(), ModelLoaderImage)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := FindImage(c.Images(), EngineSimImage)
	if err != nil {
		t.Fatal(err)
	}
	const port = 8000
	deployment := simDeployment(loader.Ref, engine.Ref, port)
	created := time.Now()
	if _, err := c.Client().AppsV1().Deployments(metav1.NamespaceDefault).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.poll(ctx, "the engine pod to be Ready", func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "app=" + deployment.Name})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		pod = pods.Items[0]
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, fmt.Errorf("pod %s: phase %s, init %v, containers %v", pod.Name, pod.Status.Phase, pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Engine pod Ready %s after the Deployment was created", time.Since(created).Round(100*time.Millisecond))

	if pod.Spec.NodeName != "real-0" {
		t.Fatalf("pod on node %q, want real-0", pod.Spec.NodeName)
	}
	_, podCIDR, _ := net.ParseCIDR(nodes[0].PodCIDR)
	if ip := net.ParseIP(pod.Status.PodIP); ip == nil || !podCIDR.Contains(ip) {
		t.Fatalf("pod IP %q is not in the node's pod CIDR %s", pod.Status.PodIP, nodes[0].PodCIDR)
	}
	// The loader ran for real: it exited 0 and left its summary as the
	// termination message, which the kubelet read from the container's file.
	loaded := pod.Status.InitContainerStatuses[0].State.Terminated
	if loaded == nil || loaded.ExitCode != 0 || !strings.Contains(loaded.Message, `"bytes"`) {
		t.Fatalf("loader init container: %+v, want exit code 0 and its JSON summary", pod.Status.InitContainerStatuses[0].State)
	}
	models := getModels(t, "http://"+net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))+"/v1/models")
	if !strings.Contains(models, `"sim-model"`) {
		t.Fatalf("/v1/models = %s, want the served model sim-model", models)
	}
	// The API server reaches the kubelet, as kubectl logs does.
	logs, err := c.Client().CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "engine"}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "sim-model") {
		t.Fatalf("the engine's log through the API server: %v: %s", err, logs)
	}

	// A second real node, added to the running cluster: its own subnet and bridge.
	added, err := c.AddNodes(ctx, NodePool{Name: "real-a100", Count: 1, Real: true, GPUProduct: GPUProductA100, GPUCount: 8})
	if err != nil {
		t.Fatal(err)
	}
	nodes = c.RealNodes()
	if len(added) != 1 || len(nodes) != 2 || nodes[1].PodCIDR == nodes[0].PodCIDR || nodes[1].Bridge == nodes[0].Bridge {
		t.Fatalf("after AddNodes %v: RealNodes() = %+v, want two nodes with their own pod CIDR and bridge", added, nodes)
	}

	procs := c.Processes()
	stopped = true
	stopping := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Cluster with two real nodes stopped and torn down in %s", time.Since(stopping).Round(100*time.Millisecond))
	for _, problem := range realNodeLeftovers(procs, nodes, c.Dir(), sysctlsBefore, hostDirsBefore) {
		t.Error(problem)
	}
}

// simDeployment runs llm-d-inference-sim after a model loader init container
// that copies a file into the emptyDir the engine mounts, on the node with the
// L4 GPUs (the real one), as a non-root user.
func simDeployment(loaderImage, engineImage string, port int32) *appsv1.Deployment {
	labels := map[string]string{"app": "sim"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sim", Namespace: metav1.NamespaceDefault},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{GPUProductLabel: GPUProductL4},
					Tolerations:                   []corev1.Toleration{{Key: GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
					Volumes:                       []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					InitContainers: []corev1.Container{{
						Name:            "loader",
						Image:           loaderImage,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"--source=file:///etc/hostname", "--dest=/model"},
						VolumeMounts:    []corev1.VolumeMount{{Name: "model", MountPath: "/model"}},
					}},
					Containers: []corev1.Container{{
						Name:            "engine",
						Image:           engineImage,
						ImagePullPolicy: corev1.PullNever,
						Args: []string{"--port=" + strconv.Itoa(int(port)), "--model=sim-model", "--served-model-name=sim-model",
							"--force-dummy-tokenizer"},
						Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: port}},
						VolumeMounts: []corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
						Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
							GPUResource: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
}

// getModels GETs url, the engine's model list, a few times at most.
func getModels(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var lastErr error
	for range 5 {
		resp, err := client.Get(url)
		if err == nil {
			body, readErr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && readErr == nil {
				return string(body)
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		lastErr = err
		time.Sleep(time.Second)
	}
	t.Fatalf("GET %s: %v", url, lastErr)
	return ""
}

// realNodeLeftovers lists what a stopped cluster with real nodes left on the
// host: processes, anything mounted under the cluster's folder, the folder
// itself, bridges, cgroups, shim socket folders, changed sysctls, and files or
// new folders in the host folders the kubelet and libcni share.
func realNodeLeftovers(procs []Process, nodes []RealNode, clusterDir string, sysctlsBefore map[string]string, hostDirsBefore map[string]bool) []string {
	var problems []string
	for _, p := range procs {
		if processIs(p.PID, p.Name) {
			problems = append(problems, fmt.Sprintf("%s (pid %d) still runs", p.Name, p.PID))
		}
	}
	// The shims name their containerd's socket, in the node's folder.
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), clusterDir) {
			problems = append(problems, fmt.Sprintf("pid %d still runs: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	if mounts, err := mountsUnder(clusterDir); err != nil || len(mounts) > 0 {
		problems = append(problems, fmt.Sprintf("still mounted under %s: %v %v", clusterDir, mounts, err))
	}
	if _, err := os.Stat(clusterDir); err == nil {
		problems = append(problems, "the cluster folder "+clusterDir+" is still there")
	}
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		problems = append(problems, err.Error())
	}
	for _, n := range nodes {
		if _, err := net.InterfaceByName(n.Bridge); err == nil {
			problems = append(problems, "bridge "+n.Bridge+" is still there")
		}
		for _, h := range hierarchies {
			if _, err := os.Stat(filepath.Join(h, n.CgroupRoot)); err == nil {
				problems = append(problems, "cgroup "+filepath.Join(h, n.CgroupRoot)+" is still there")
			}
		}
		if _, err := os.Stat(n.ShimSocketDir); err == nil {
			problems = append(problems, "shim socket folder "+n.ShimSocketDir+" is still there")
		}
	}
	after, err := readSysctls()
	if err != nil {
		problems = append(problems, err.Error())
	}
	for key, before := range sysctlsBefore {
		if after[key] != before {
			problems = append(problems, fmt.Sprintf("sysctl %s is %s, was %s", key, after[key], before))
		}
	}
	for dir, existed := range existingHostDirs() {
		if existed && !hostDirsBefore[dir] {
			problems = append(problems, "host folder "+dir+" was created and is still there")
		}
	}
	for _, dir := range []string{containerLogsDir, cniResultsDir} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			target, _ := os.Readlink(path)
			data, _ := os.ReadFile(path)
			if strings.HasPrefix(target, clusterDir+"/") || strings.Contains(string(data), clusterDir+"/") {
				problems = append(problems, path+" is still there")
			}
		}
	}
	return problems
}

// dumpRealNodeLogs logs the end of every real node's kubelet and containerd
// logs, and the pods' states, for a failed test.
func dumpRealNodeLogs(t *testing.T, c *Cluster) {
	t.Helper()
	for _, n := range c.RealNodes() {
		for _, name := range []string{containerdBinary, kubeletBinary} {
			path := filepath.Join(c.LogsDir(), n.Name, name+".log")
			t.Logf("--- end of %s ---\n%s", path, tail(path, 40))
		}
	}
	pods, err := c.Client().CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			status, _ := json.Marshal(p.Status)
			t.Logf("pod %s/%s on %s: %s", p.Namespace, p.Name, p.Spec.NodeName, status)
		}
	}
}
