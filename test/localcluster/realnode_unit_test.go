package localcluster

import (
	"archive/tar"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestRealPoolValidation(t *testing.T) {
	for _, tc := range []struct {
		name, file, wantErr string
	}{
		{name: "real GPU pool", file: "pools:\n- {name: real, count: 1, real: true, gpuProduct: NVIDIA-L4, gpuCount: 2}\n"},
		{name: "real pool with cpu", file: "pools:\n- {name: real, count: 1, real: true, cpu: '4'}\n", wantErr: "leave cpu and memory empty"},
		{name: "simulated pool without cpu", file: "pools:\n- {name: sim, count: 1}\n", wantErr: "cpu and memory must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNodePools([]byte(tc.file))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ParseNodePools: %v, want error %q", err, tc.wantErr)
			}
		})
	}
}

func TestNodeLabelsFlag(t *testing.T) {
	pool := NodePool{Name: "real", Count: 1, Real: true, GPUProduct: GPUProductL4, GPUCount: 2, Labels: map[string]string{"zone": "a"}}
	// No kwok type label, no kubernetes.io labels (the kubelet sets those), sorted.
	want := "localcluster.aiinference.io/pool=real,nvidia.com/gpu.count=2,nvidia.com/gpu.product=NVIDIA-L4,zone=a"
	if got := nodeLabelsFlag(pool, 0); got != want {
		t.Fatalf("nodeLabelsFlag = %q, want %q", got, want)
	}
}

func TestKubeletConfigTaintsGPUNodes(t *testing.T) {
	node := RealNode{Name: "real-0", Dir: "/c/nodes/real-0", ContainerdSocket: "/c/nodes/real-0/containerd.sock", CgroupRoot: "/localcluster-1"}
	for _, tc := range []struct {
		gpus       int
		wantTaints int
	}{{gpus: 2, wantTaints: 1}, {gpus: 0, wantTaints: 0}} {
		data, err := kubeletConfigYAML(node, NodePool{Name: "real", Real: true, GPUCount: tc.gpus}, net.ParseIP("192.0.2.2"), 10250, "/c/pki/ca.crt")
		if err != nil {
			t.Fatal(err)
		}
		var config struct {
			CgroupRoot         string              `json:"cgroupRoot"`
			FailCgroupV1       *bool               `json:"failCgroupV1"`
			OOMScoreAdj        *int                `json:"oomScoreAdj"`
			RegisterWithTaints []map[string]string `json:"registerWithTaints"`
		}
		if err := yaml.Unmarshal(data, &config); err != nil {
			t.Fatal(err)
		}
		if config.CgroupRoot != node.CgroupRoot || config.FailCgroupV1 == nil || *config.FailCgroupV1 || config.OOMScoreAdj == nil || *config.OOMScoreAdj != 0 {
			t.Errorf("kubelet config for %d GPUs:\n%s", tc.gpus, data)
		}
		if len(config.RegisterWithTaints) != tc.wantTaints {
			t.Errorf("%d GPUs: taints %v, want %d", tc.gpus, config.RegisterWithTaints, tc.wantTaints)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	if got := unescapeMountPath(`/tmp/a\040b\011c`); got != "/tmp/a b\tc" {
		t.Fatalf("unescapeMountPath = %q", got)
	}
}

func TestLoadImageArchives(t *testing.T) {
	dir := t.TempDir()
	writeTar := func(name string, files map[string]string) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tw := tar.NewWriter(f)
		for path, content := range files {
			if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: int64(len(content))}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(content)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	writeTar("pause.tar", map[string]string{
		"layer.tar.gz":  strings.Repeat("x", 10000),
		"manifest.json": `[{"Config":"c","RepoTags":["localcluster.local/pause:abc"],"Layers":["layer.tar.gz"]}]`,
	})
	archives, err := LoadImageArchives(dir)
	if err != nil {
		t.Fatal(err)
	}
	pause, err := FindImage(archives, PauseImage)
	if err != nil || pause.Ref != "localcluster.local/pause:abc" {
		t.Fatalf("pause image: %+v, %v", pause, err)
	}

	writeTar("broken.tar", map[string]string{"manifest.json": `[{"RepoTags":[]}]`})
	if _, err := LoadImageArchives(dir); err == nil || !strings.Contains(err.Error(), "broken.tar") {
		t.Fatalf("an archive without a tag: %v, want an error naming it", err)
	}
}

// The kubelet gives pods the kube-dns Service as their nameserver, in the
// Service range, with the cluster domain CoreDNS serves.
func TestKubeletConfigPointsPodsAtTheClusterDNS(t *testing.T) {
	node := RealNode{Name: "real-0", Dir: "/c/nodes/real-0", ContainerdSocket: "/c/nodes/real-0/containerd.sock", CgroupRoot: "/localcluster-1"}
	data, err := kubeletConfigYAML(node, NodePool{Name: "real", Real: true}, net.ParseIP("192.0.2.2"), 10250, "/c/pki/ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		ClusterDNS    []string `json:"clusterDNS"`
		ClusterDomain string   `json:"clusterDomain"`
	}
	if err := yaml.Unmarshal(data, &config); err != nil {
		t.Fatal(err)
	}
	if len(config.ClusterDNS) != 1 || config.ClusterDNS[0] != ClusterDNSIP || config.ClusterDomain != ClusterDomain {
		t.Errorf("kubelet config: clusterDNS %v, clusterDomain %q; want [%s] and %s", config.ClusterDNS, config.ClusterDomain, ClusterDNSIP, ClusterDomain)
	}
	_, services, _ := net.ParseCIDR(serviceClusterIPRange)
	if !services.Contains(net.ParseIP(ClusterDNSIP)) || ClusterDNSIP == serviceClusterIP {
		t.Errorf("the kube-dns ClusterIP %s must be in %s and not the kubernetes Service's %s", ClusterDNSIP, serviceClusterIPRange, serviceClusterIP)
	}
}

func TestCorefileServesTheClusterOnTheBridge(t *testing.T) {
	got := corefileFor(net.ParseIP("10.245.1.1"), 40053, "127.0.0.1:1", "127.0.0.1:2", "/c/coredns/kubeconfig")
	for _, want := range []string{
		".:40053 {", "bind 10.245.1.1", "health 127.0.0.1:1", "ready 127.0.0.1:2",
		"kubernetes cluster.local in-addr.arpa ip6.arpa {", "kubeconfig /c/coredns/kubeconfig " + contextName,
		"forward . /etc/resolv.conf",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Corefile has no %q:\n%s", want, got)
		}
	}
}

func TestBridgeGateway(t *testing.T) {
	ip, err := bridgeGateway(RealNode{PodCIDR: "10.245.3.0/24"})
	if err != nil || !ip.Equal(net.ParseIP("10.245.3.1")) {
		t.Fatalf("bridgeGateway(10.245.3.0/24) = %v, %v; want 10.245.3.1", ip, err)
	}
}
