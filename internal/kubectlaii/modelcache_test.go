package kubectlaii

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// nodeReport writes a node's model cache report as the node's cache plugin does.
func nodeReport(t *testing.T, ns, node, data string) {
	t.Helper()
	must(t, k8s.Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model-cache-" + node, Labels: map[string]string{nodecachespec.StateLabel: node}},
		Data:       map[string]string{nodecachespec.StateKey: data},
	}))
}

func reportJSON(t *testing.T, node string, entries ...nodecachespec.Entry) string {
	t.Helper()
	data, err := json.Marshal(nodecachespec.Report{Node: node, BudgetBytes: 100e9, UsedBytes: 20_379_869_184, Entries: entries})
	must(t, err)
	return string(data)
}

// TestModelCache: status reads which nodes hold the model from the nodes'
// reports (size, state, pods, last use) and says what each pod finds on its
// node; a user who may not list ConfigMaps gets status.modelCache and is told
// which permission is missing. cache lists every node's copies and budget.
func TestModelCache(t *testing.T) {
	ns, plugin := namespace(t, "aii-cache"), namespace(t, "aii-cache-plugin")
	now := time.Now()
	entry := func(key string, bytes int64, complete bool, pods int, ago time.Duration) nodecachespec.Entry {
		return nodecachespec.Entry{Key: key, Namespace: ns, Source: "s3://models/llama/", Endpoint: "http://minio.storage:9000",
			Bytes: bytes, Complete: complete, Pods: pods, LastUsed: now.Add(-ago).UTC().Format(time.RFC3339Nano)}
	}
	nodeReport(t, plugin, "cache-a", reportJSON(t, "cache-a", entry("k1", 17_179_869_184, true, 1, 20*time.Minute), entry("k2", 3_200_000_000, true, 0, 3*time.Hour)))
	nodeReport(t, plugin, "cache-b", reportJSON(t, "cache-b", entry("k1", 3_200_000_000, false, 1, 45*time.Minute)))
	nodeReport(t, plugin, "cache-bad", "{not json")

	obj := inference(ns, "llm")
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	onNode := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	}
	setup(t, obj, servingv1.AIInferenceStatus{Phase: servingv1.PhaseLoading, Ready: "0/3", Conditions: ready(servingv1.ReasonLoading, "loading"),
		ModelCache: &servingv1.ModelCacheStatus{Key: "k1", CompleteNodes: 1, Nodes: []servingv1.NodeModelCopy{
			{Node: "cache-a", Complete: true, Bytes: 17_179_869_184, Pods: 1}, {Node: "cache-b", Pods: 1}}}},
		onNode("llm-a", "cache-a"), onNode("llm-b", "cache-b"), onNode("llm-c", "cache-c"))

	out := aii(t, "status", "llm", "-n", ns)
	expectAll(t, out,
		"Model cache: 1 of 2 nodes hold a complete copy (nodes labelled model-cache.aiinference.io/k1)",
		"cache-a  complete     17.2 GB  1     20m ago",
		"cache-b  in progress  3.2 GB   1     45m ago",
		"Pod llm-a on cache-a: the node's complete copy",
		"Pod llm-b on cache-b: the node's copy in progress",
		"Pod llm-c on cache-c: no copy on its node")
	if strings.Contains(out, "3h ago") {
		t.Errorf("status shows another model's copy:\n%s", out)
	}

	// Without the right to list ConfigMaps: status.modelCache, and why.
	out, err := aiiAs(t, viewerKubeconfig, "status", "llm", "-n", ns)
	must(t, err)
	expectAll(t, out,
		"The nodes' reports were not read, you may not list configmaps in all namespaces",
		"from status.modelCache",
		"cache-a  complete     17.2 GB  1     -",
		"cache-b  in progress  -        1     -",
		"Pod llm-b on cache-b: the node's copy in progress")

	out = aii(t, "cache")
	expectAll(t, out,
		"cache-a  aii-cache  s3://models/llama/  17.2 GB  complete     1     20m ago",
		"cache-a  aii-cache  s3://models/llama/  3.2 GB   complete     0     3h ago",
		"cache-b  aii-cache  s3://models/llama/  3.2 GB   in progress  1     45m ago",
		"cache-a  2       20.4 GB  100.0 GB")
	var list map[string]any
	must(t, json.Unmarshal([]byte(aii(t, "cache", "-o", "json")), &list))
	if list["kind"] != "ModelCacheList" || len(list["nodes"].([]any)) != 2 {
		t.Errorf("cache -o json: %v", list)
	}
	if _, err := aiiAs(t, viewerKubeconfig, "cache"); err == nil || !strings.Contains(err.Error(), "you may not list configmaps in all namespaces") {
		t.Errorf("cache without the right to list ConfigMaps: %v", err)
	}
}
