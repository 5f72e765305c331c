package localcluster

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestDefaultNodePoolsMatchConfigFile(t *testing.T) {
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := LoadNodePools(filepath.Join(root, "config", "localcluster", "nodepool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Compare the nodes they make: quantities compare by value there ("96" == "96.0").
	if got, want := Nodes(fromFile), Nodes(DefaultNodePools()); !reflect.DeepEqual(nodeSummaries(got), nodeSummaries(want)) {
		t.Errorf("config/localcluster/nodepool.yaml and DefaultNodePools differ:\nfile:    %v\ndefault: %v", nodeSummaries(got), nodeSummaries(want))
	}
}

func TestDefaultNodePools(t *testing.T) {
	nodes := Nodes(DefaultNodePools())
	gpus := map[string]int64{} // product -> total GPUs
	count := map[string]int{}  // product -> nodes
	for _, n := range nodes {
		product := n.Labels[GPUProductLabel]
		count[product]++
		q := n.Status.Capacity[GPUResource]
		gpus[product] += q.Value()
	}
	wantCount := map[string]int{GPUProductH100: 2, GPUProductA100: 2, GPUProductL4: 4, "": 2}
	wantGPUs := map[string]int64{GPUProductH100: 16, GPUProductA100: 16, GPUProductL4: 4, "": 0}
	if !reflect.DeepEqual(count, wantCount) {
		t.Errorf("nodes per product = %v, want %v", count, wantCount)
	}
	if !reflect.DeepEqual(gpus, wantGPUs) {
		t.Errorf("GPUs per product = %v, want %v", gpus, wantGPUs)
	}
}

func TestNodeFromPool(t *testing.T) {
	tests := []struct {
		name       string
		pool       NodePool
		index      int
		wantName   string
		wantGPUs   string // "" when no nvidia.com/gpu resource
		wantTaints []corev1.Taint
		wantPods   string
	}{
		{
			name:       "GPU node",
			pool:       NodePool{Name: "a100", Count: 2, GPUProduct: GPUProductA100, GPUCount: 8, CPU: resource.MustParse("96"), Memory: resource.MustParse("1Ti")},
			index:      1,
			wantName:   "a100-1",
			wantGPUs:   "8",
			wantTaints: []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}},
			wantPods:   "110",
		},
		{
			name:     "CPU-only node with a pod limit",
			pool:     NodePool{Name: "cpu", Count: 1, CPU: resource.MustParse("32"), Memory: resource.MustParse("128Gi"), Pods: 20},
			index:    0,
			wantName: "cpu-0",
			wantPods: "20",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.pool.Node(tt.index)
			if n.Name != tt.wantName {
				t.Errorf("name = %q, want %q", n.Name, tt.wantName)
			}
			if got := n.Annotations["kwok.x-k8s.io/node"]; got != "fake" {
				t.Errorf("kwok annotation = %q, want fake", got)
			}
			if got := n.Labels["type"]; got != "kwok" {
				t.Errorf("type label = %q, want kwok", got)
			}
			if got := n.Labels[NodePoolLabel]; got != tt.pool.Name {
				t.Errorf("pool label = %q, want %q", got, tt.pool.Name)
			}
			if got := n.Labels["kubernetes.io/hostname"]; got != tt.wantName {
				t.Errorf("hostname label = %q, want %q", got, tt.wantName)
			}
			if !reflect.DeepEqual(n.Spec.Taints, tt.wantTaints) {
				t.Errorf("taints = %v, want %v", n.Spec.Taints, tt.wantTaints)
			}
			for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
				gpu, ok := list["nvidia.com/gpu"]
				switch {
				case tt.wantGPUs == "" && ok:
					t.Errorf("nvidia.com/gpu = %s on a CPU-only node", gpu.String())
				case tt.wantGPUs != "" && gpu.String() != tt.wantGPUs:
					t.Errorf("nvidia.com/gpu = %s, want %s", gpu.String(), tt.wantGPUs)
				}
				if got := list[corev1.ResourcePods]; got.String() != tt.wantPods {
					t.Errorf("pods = %s, want %s", got.String(), tt.wantPods)
				}
				if !list[corev1.ResourceCPU].Equal(tt.pool.CPU) || !list[corev1.ResourceMemory].Equal(tt.pool.Memory) {
					t.Errorf("cpu/memory = %v, want %s/%s", list, tt.pool.CPU.String(), tt.pool.Memory.String())
				}
			}
			product, hasProduct := n.Labels[GPUProductLabel]
			if hasProduct != (tt.pool.GPUProduct != "") || product != tt.pool.GPUProduct {
				t.Errorf("gpu product label = %q (set %v), want %q", product, hasProduct, tt.pool.GPUProduct)
			}
		})
	}
}

func TestNodeDoesNotAliasPool(t *testing.T) {
	pool := NodePool{Name: "x", Count: 1, CPU: resource.MustParse("1"), Memory: resource.MustParse("1Gi"), Labels: map[string]string{"a": "b"}}
	n := pool.Node(0)
	n.Labels["a"] = "changed"
	q := n.Status.Capacity[corev1.ResourceCPU]
	q.Add(resource.MustParse("5"))
	if pool.Labels["a"] != "b" || pool.CPU.String() != "1" {
		t.Errorf("changing the node changed the pool: %+v", pool)
	}
}

func TestParseNodePools(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    int    // number of nodes
		wantErr string // substring; "" for no error
	}{
		{name: "valid", yaml: "pools:\n- {name: l4, count: 3, gpuProduct: NVIDIA-L4, gpuCount: 1, cpu: '16', memory: 64Gi}\n- {name: cpu, count: 1, cpu: 4, memory: 8Gi}\n", want: 4},
		{name: "unknown field", yaml: "pools:\n- {name: l4, count: 1, gpus: 1, cpu: '16', memory: 64Gi}\n", wantErr: "unknown field"},
		{name: "product without count", yaml: "pools:\n- {name: l4, count: 1, gpuProduct: NVIDIA-L4, cpu: '16', memory: 64Gi}\n", wantErr: "go together"},
		{name: "bad name", yaml: "pools:\n- {name: L4_nodes, count: 1, cpu: '16', memory: 64Gi}\n", wantErr: "DNS label"},
		{name: "duplicate", yaml: "pools:\n- {name: a, count: 1, cpu: 1, memory: 1Gi}\n- {name: a, count: 1, cpu: 1, memory: 1Gi}\n", wantErr: "duplicate"},
		{name: "no memory", yaml: "pools:\n- {name: a, count: 1, cpu: 1}\n", wantErr: "positive"},
		{name: "negative count", yaml: "pools:\n- {name: a, count: -1, cpu: 1, memory: 1Gi}\n", wantErr: "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pools, err := ParseNodePools([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := len(Nodes(pools)); got != tt.want {
				t.Errorf("%d nodes, want %d", got, tt.want)
			}
		})
	}
}

// nodeSummaries renders the parts of nodes that a pool decides, comparably.
func nodeSummaries(nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		gpu := n.Status.Capacity[GPUResource]
		out = append(out, strings.Join([]string{n.Name, n.Labels[GPUProductLabel], gpu.String(),
			n.Status.Capacity.Cpu().String(), n.Status.Capacity.Memory().String(), n.Status.Capacity.Pods().String()}, "/"))
	}
	return out
}
