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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// RealNodeTestEnv asks for the tests that run a real node on this host. They
// need root and cgroup v1, and fail (never skip) when asked on a host without.
const RealNodeTestEnv = "LOCALCLUSTER_REAL_NODE"

// TestRealNode starts a cluster with a real node beside a kwok node, runs a
// Deployment there whose init container (the model loader) writes into an
// emptyDir and whose engine (llm-d-inference-sim) passes a readiness probe, calls
// the engine from the host at the pod's IP and through a Service's ClusterIP
// (which never sends to a pod that is not ready), reads its log through the
// API server, adds a second real node, and checks that Stop leaves nothing
// behind on the host.
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
	netfilterBefore, err := hostNetfilterState()
	if err != nil {
		t.Fatal(err)
	}

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

	testServiceTraffic(ctx, t, c, deployment, port)
	testKubernetesService(ctx, t, c)
	testClusterDNS(ctx, t, c, engine.Ref)

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
	// Another cluster's kube-proxy could write its rules meanwhile.
	lock, err := takeKubeProxyLock(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	for _, problem := range realNodeLeftovers(procs, nodes, c.Dir(), sysctlsBefore, hostDirsBefore, netfilterBefore) {
		t.Error(problem)
	}
}

// testKubernetesService calls the API server as a pod's in-cluster client
// does, at the kubernetes Service's ClusterIP with a ServiceAccount's token,
// through kube-proxy and the cluster's relay on the first real node's bridge.
func testKubernetesService(ctx context.Context, t *testing.T, c *Cluster) {
	t.Helper()
	slice, err := c.Client().DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, apiServerEndpointsName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(slice.Endpoints) != 1 || !strings.HasPrefix(slice.Endpoints[0].Addresses[0], realPodSubnetPrefix) {
		t.Fatalf("the kubernetes Service's endpoints: %+v, want the relay on the real node's bridge", slice.Endpoints)
	}
	token, err := c.Client().CoreV1().ServiceAccounts(metav1.NamespaceDefault).CreateToken(ctx, "default",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inCluster := rest.CopyConfig(c.restConfig)
	inCluster.Host = "https://" + net.JoinHostPort(serviceClusterIP, "443")
	inCluster.BearerToken = token.Status.Token
	client, err := kubernetes.NewForConfig(inCluster)
	if err != nil {
		t.Fatal(err)
	}
	// The token authenticates; the default ServiceAccount may read no Secret.
	body, err := client.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
	if err != nil || !strings.Contains(string(body), `"gitVersion"`) {
		t.Fatalf("GET /version at %s: %v: %s", inCluster.Host, err, body)
	}
	if _, err := client.CoreV1().Secrets(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing Secrets as the default ServiceAccount at %s: %v, want forbidden", inCluster.Host, err)
	}
	t.Logf("The API server answered at the kubernetes Service %s, through the relay at %s", inCluster.Host, slice.Endpoints[0].Addresses[0])
}

// testServiceTraffic creates a ClusterIP Service for the Deployment's pods
// and calls the engine through it from the host, then adds a pod the Service
// selects that serves another model and never gets ready: 20 calls through
// the ClusterIP (each on a new connection) all reach the ready pod. A second
// Service that publishes pods that are not ready shows that the other pod
// answers through a ClusterIP too, once kube-proxy knows of it.
func testServiceTraffic(ctx context.Context, t *testing.T, c *Cluster, deployment *appsv1.Deployment, port int32) {
	t.Helper()
	waiting := time.Now()
	if err := c.WaitKubeProxy(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(waiting); waited > time.Second {
		t.Logf("Waited %s for kube-proxy: another local cluster on this host ran one", waited.Round(100*time.Millisecond))
	}
	const unreadyModel = "unready-model"
	services := map[string]string{} // name: /v1/models at its ClusterIP
	for _, name := range []string{"sim", "sim-all"} {
		svc, err := c.Client().CoreV1().Services(metav1.NamespaceDefault).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{
				Selector:                 deployment.Spec.Selector.MatchLabels,
				Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
				PublishNotReadyAddresses: name == "sim-all",
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		services[name] = "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/v1/models"
	}
	begin := time.Now()
	if models := getModels(t, services["sim"]); !strings.Contains(models, `"sim-model"`) {
		t.Fatalf("/v1/models through the ClusterIP = %s, want the served model sim-model", models)
	}
	t.Logf("The engine answered through the Service's ClusterIP %s after the Service was created", time.Since(begin).Round(100*time.Millisecond))

	unready := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sim-unready", Namespace: metav1.NamespaceDefault, Labels: deployment.Spec.Template.Labels},
		Spec:       *deployment.Spec.Template.Spec.DeepCopy(),
	}
	engine := &unready.Spec.Containers[0]
	engine.Args = []string{"--port=" + strconv.Itoa(int(port)), "--model=" + unreadyModel, "--served-model-name=" + unreadyModel, "--force-dummy-tokenizer"}
	engine.ReadinessProbe.HTTPGet.Path = "/never-ready" // 404
	if _, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, unready, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.poll(ctx, "pod sim-unready to run", func(ctx context.Context) (bool, error) {
		p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, unready.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		unready = p
		running := len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
		return running && p.Status.PodIP != "", nil
	}); err != nil {
		t.Fatal(err)
	}
	// It would answer, were it asked.
	if models := getModels(t, "http://"+net.JoinHostPort(unready.Status.PodIP, strconv.Itoa(int(port)))+"/v1/models"); !strings.Contains(models, unreadyModel) {
		t.Fatalf("/v1/models of pod sim-unready = %s, want %s", models, unreadyModel)
	}
	// kube-proxy writes the new endpoint within a second or two.
	calls, deadline := 0, time.Now().Add(20*time.Second)
	for ; !strings.Contains(getModels(t, services["sim-all"]), unreadyModel); calls++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in 20s through Service sim-all, which publishes pods that are not ready, never reached pod sim-unready", calls)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p, err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, unready.Name, metav1.GetOptions{}); err != nil || podReady(p) {
		t.Fatalf("pod sim-unready: %v, ready %t; want it running and not ready", err, err == nil && podReady(p))
	}
	for i := range 20 {
		if models := getModels(t, services["sim"]); !strings.Contains(models, `"sim-model"`) {
			t.Fatalf("call %d through the ClusterIP of Service sim answered %s: it reached a pod that is not ready", i+1, models)
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
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

// getModels GETs url, the engine's model list, a few times at most, each on
// a new connection (so each call through a ClusterIP picks an endpoint).
func getModels(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
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
// itself, bridges, cgroups, shim socket folders, changed sysctls, files or
// new folders in the host folders the kubelet and libcni share, and
// iptables and nfacct objects that were not in netfilterBefore.
func realNodeLeftovers(procs []Process, nodes []RealNode, clusterDir string, sysctlsBefore map[string]string, hostDirsBefore map[string]bool, netfilterBefore []string) []string {
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
	netfilterAfter, err := hostNetfilterState()
	if err != nil {
		problems = append(problems, err.Error())
	}
	for _, line := range netfilterAfter {
		if !slices.Contains(netfilterBefore, line) {
			problems = append(problems, "left behind: "+line)
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

// hostNetfilterState lists the tables, chains and rules (without counters)
// of the host's iptables of both families, and the nfacct counters of
// kube-proxy that exist: what a kube-proxy adds.
func hostNetfilterState() ([]string, error) {
	tables, err := hostTables()
	var lines []string
	for _, t := range tables {
		for _, c := range t.chains {
			lines = append(lines, t.id()+" :"+c.name+" "+c.policy)
		}
		for _, rule := range t.rules {
			lines = append(lines, t.id()+" "+rule)
		}
	}
	for _, counter := range existingCounters() {
		lines = append(lines, "nfacct counter "+counter)
	}
	return lines, err
}

// dumpRealNodeLogs logs the end of every real node's kubelet and containerd
// logs, and the pods' states, for a failed test.
func dumpRealNodeLogs(t *testing.T, c *Cluster) {
	t.Helper()
	for _, n := range c.RealNodes() {
		for _, name := range []string{containerdBinary, kubeletBinary, kubeProxyBinary} {
			path := filepath.Join(c.LogsDir(), n.Name, name+".log")
			if _, err := os.Stat(path); err != nil {
				continue // kube-proxy runs on one node only
			}
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
