package localcluster

import (
	"fmt"
	"os"
	"regexp"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Well-known names on the simulated nodes.
const (
	// GPUResource is the extended resource of NVIDIA GPUs, as the NVIDIA device
	// plugin reports it in a node's capacity and allocatable.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// GPUProductLabel holds the GPU model of a node, as NVIDIA GPU feature
	// discovery sets it (e.g. NVIDIA-A100-SXM4-80GB).
	GPUProductLabel = "nvidia.com/gpu.product"
	// GPUCountLabel holds the number of GPUs of a node, as GPU feature discovery sets it.
	GPUCountLabel = "nvidia.com/gpu.count"
	// GPUTaintKey is the key of the NoSchedule taint on every GPU node (no value),
	// so that only pods that tolerate it land there.
	GPUTaintKey = "nvidia.com/gpu"
	// NodePoolLabel holds the name of the pool a simulated node belongs to.
	NodePoolLabel = "localcluster.aiinference.io/pool"
	// KwokNodeAnnotation marks the nodes that kwok simulates; kwok manages exactly
	// the nodes with this annotation set to "fake".
	KwokNodeAnnotation = "kwok.x-k8s.io/node"
	// KwokTypeLabel is the label "type: kwok" that kwok's own examples put on its nodes.
	KwokTypeLabel = "type"
)

// NodePool describes a group of identical simulated nodes. Nodes are named
// <Name>-<index>, with the index counting from 0.
type NodePool struct {
	// Name is the pool name and the prefix of its node names: a lowercase DNS label.
	Name string `json:"name"`
	// Count is the number of nodes.
	Count int `json:"count"`
	// GPUProduct is the GPU model (the nvidia.com/gpu.product label); empty for
	// CPU-only nodes.
	GPUProduct string `json:"gpuProduct,omitempty"`
	// GPUCount is the number of GPUs per node; 0 for CPU-only nodes.
	GPUCount int `json:"gpuCount,omitempty"`
	// CPU is the CPU capacity per node, e.g. "96".
	CPU resource.Quantity `json:"cpu"`
	// Memory is the memory capacity per node, e.g. "1Ti".
	Memory resource.Quantity `json:"memory"`
	// Pods is the pod capacity per node; 0 means 110, the kubelet's default.
	Pods int `json:"pods,omitempty"`
	// Labels are extra node labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Real nodes run a kubelet, containerd and runc on this host instead of being
	// simulated by kwok; their pods run for real. Their CPU and memory are the
	// host's, so CPU and Memory stay empty. Needs root and cgroup v1
	// (CheckRealNodeHost).
	Real bool `json:"real,omitempty"`
}

// NodePoolList is the file format of a node pool description
// (config/localcluster/nodepool.yaml).
type NodePoolList struct {
	Pools []NodePool `json:"pools"`
}

// The GPU products of the default pool.
const (
	GPUProductH100 = "NVIDIA-H100-80GB-HBM3"
	GPUProductA100 = "NVIDIA-A100-SXM4-80GB"
	GPUProductL4   = "NVIDIA-L4"
)

// DefaultNodePools is the default simulated cluster: two 8x H100 nodes, two 8x
// A100 nodes, four 1x L4 nodes and two CPU-only nodes. It is the same as
// config/localcluster/nodepool.yaml (a test keeps them equal).
func DefaultNodePools() []NodePool {
	return []NodePool{
		{Name: "h100", Count: 2, GPUProduct: GPUProductH100, GPUCount: 8,
			CPU: resource.MustParse("208"), Memory: resource.MustParse("1800Gi")},
		{Name: "a100", Count: 2, GPUProduct: GPUProductA100, GPUCount: 8,
			CPU: resource.MustParse("96"), Memory: resource.MustParse("1360Gi")},
		{Name: "l4", Count: 4, GPUProduct: GPUProductL4, GPUCount: 1,
			CPU: resource.MustParse("16"), Memory: resource.MustParse("64Gi")},
		{Name: "cpu", Count: 2,
			CPU: resource.MustParse("32"), Memory: resource.MustParse("128Gi")},
	}
}

// LoadNodePools reads a node pool description (YAML or JSON) and validates it.
func LoadNodePools(path string) ([]NodePool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pools, err := ParseNodePools(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pools, nil
}

// ParseNodePools parses a node pool description (YAML or JSON) and validates it.
// Unknown fields are errors, so a misspelt field is not silently ignored.
func ParseNodePools(data []byte) ([]NodePool, error) {
	var list NodePoolList
	if err := yaml.UnmarshalStrict(data, &list); err != nil {
		return nil, err
	}
	if err := ValidateNodePools(list.Pools); err != nil {
		return nil, err
	}
	return list.Pools, nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidateNodePools checks that every pool is well formed and that pool names are unique.
func ValidateNodePools(pools []NodePool) error {
	seen := map[string]bool{}
	for i, p := range pools {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("pools[%d]: %w", i, err)
		}
		if seen[p.Name] {
			return fmt.Errorf("pools[%d]: duplicate pool name %q", i, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Validate checks one pool.
func (p NodePool) Validate() error {
	// Node names are <name>-<index>; keep them within a DNS label (63 characters).
	if !dnsLabel.MatchString(p.Name) || len(p.Name) > 50 {
		return fmt.Errorf("name %q: must be a lowercase DNS label of at most 50 characters", p.Name)
	}
	if p.Count < 0 {
		return fmt.Errorf("pool %s: count must not be negative", p.Name)
	}
	if p.GPUCount < 0 {
		return fmt.Errorf("pool %s: gpuCount must not be negative", p.Name)
	}
	if (p.GPUProduct == "") != (p.GPUCount == 0) {
		return fmt.Errorf("pool %s: gpuProduct and gpuCount go together (both set for GPU nodes, both empty for CPU-only nodes)", p.Name)
	}
	if p.Real && (!p.CPU.IsZero() || !p.Memory.IsZero()) {
		return fmt.Errorf("pool %s: a real node has the host's cpu and memory: leave cpu and memory empty", p.Name)
	}
	if !p.Real && (p.CPU.Sign() <= 0 || p.Memory.Sign() <= 0) {
		return fmt.Errorf("pool %s: cpu and memory must be positive", p.Name)
	}
	if p.Pods < 0 {
		return fmt.Errorf("pool %s: pods must not be negative", p.Name)
	}
	return nil
}

// NodeName is the name of the pool's node with the given index.
func (p NodePool) NodeName(index int) string { return p.Name + "-" + strconv.Itoa(index) }

// Node builds the simulated node of the pool with the given index: labels,
// the kwok annotation, the GPU taint, and capacity and allocatable in its status
// (kwok keeps the status it finds and adds conditions and addresses).
func (p NodePool) Node(index int) *corev1.Node {
	name := p.NodeName(index)
	labels := map[string]string{
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		KwokTypeLabel:            "kwok",
		NodePoolLabel:            p.Name,
	}
	for k, v := range p.Labels {
		labels[k] = v
	}
	pods := p.Pods
	if pods == 0 {
		pods = 110
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    p.CPU.DeepCopy(),
		corev1.ResourceMemory: p.Memory.DeepCopy(),
		corev1.ResourcePods:   *resource.NewQuantity(int64(pods), resource.DecimalSI),
	}
	var taints []corev1.Taint
	if p.GPUCount > 0 {
		labels[GPUProductLabel] = p.GPUProduct
		labels[GPUCountLabel] = strconv.Itoa(p.GPUCount)
		capacity[GPUResource] = *resource.NewQuantity(int64(p.GPUCount), resource.DecimalSI)
		taints = append(taints, corev1.Taint{Key: GPUTaintKey, Effect: corev1.TaintEffectNoSchedule})
	}
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: labels,
			Annotations: map[string]string{
				KwokNodeAnnotation: "fake",
				// As kwok's examples do: the controller-manager's ttl controller is off.
				"node.alpha.kubernetes.io/ttl": "0",
			},
		},
		Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Phase:       corev1.NodeRunning,
		},
	}
}

// Nodes builds every node of the pools, in order.
func Nodes(pools []NodePool) []*corev1.Node {
	var nodes []*corev1.Node
	for _, p := range pools {
		for i := range p.Count {
			nodes = append(nodes, p.Node(i))
		}
	}
	return nodes
}
