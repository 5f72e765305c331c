package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// nodeReport writes a node's model cache report as the node's cache plugin
// does: a ConfigMap labelled with the node, the report as JSON.
func nodeReport(g *WithT, ns, node string, entries ...nodecachespec.Entry) {
	data, err := json.Marshal(nodecachespec.Report{Node: node, BudgetBytes: 100e9, Entries: entries})
	g.Expect(err).NotTo(HaveOccurred())
	writeReport(g, ns, node, string(data))
}

func writeReport(g *WithT, ns, node, data string) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model-cache-" + node, Labels: map[string]string{nodecachespec.StateLabel: node}}}
	g.Eventually(func() error {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(cm), cm)
		cm.Data = map[string]string{nodecachespec.StateKey: data}
		if err != nil {
			return k8s.Create(context.Background(), cm)
		}
		return k8s.Update(context.Background(), cm)
	}).WithTimeout(waitTimeout).Should(Succeed())
}

// TestModelCacheStatusFollowsTheNodesReports: status.modelCache lists the
// nodes whose reports hold a copy of the model (by its key: namespace, source
// and endpoint), follows the reports as they change, skips a report it cannot
// read, and writes nothing when a report changes nothing it shows (a copy's
// last use, the growing size of a copy in progress, another model's copy).
func TestModelCacheStatusFollowsTheNodesReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, obj, key := startInference(t, "cached", func(o *servingv1.AIInference) {
		o.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CacheNode}
	})
	ns := key.Namespace
	// The plugin's namespace; node names of this test's own.
	plugin := newNamespace(t)
	nodeA, nodeB, nodeC, nodeD := plugin+"-a", plugin+"-b", plugin+"-c", plugin+"-d"
	s3 := obj.Spec.Model.Source.S3
	copyKey := nodecachespec.Key(ns, "s3://"+s3.Bucket+"/"+s3.Prefix, s3.Endpoint)
	ours := func(bytes int64, complete bool, pods int, lastUsed string) nodecachespec.Entry {
		return nodecachespec.Entry{Key: copyKey, Namespace: ns, Source: "s3://" + s3.Bucket + "/" + s3.Prefix, Endpoint: s3.Endpoint,
			Bytes: bytes, Complete: complete, Pods: pods, LastUsed: lastUsed}
	}
	// The same source in another namespace is another copy.
	other := nodecachespec.Entry{Key: nodecachespec.Key("elsewhere", "s3://"+s3.Bucket+"/"+s3.Prefix, s3.Endpoint), Namespace: "elsewhere",
		Source: "s3://" + s3.Bucket + "/" + s3.Prefix, Bytes: 5e9, Complete: true, LastUsed: "2026-12-05T08:00:00Z"}

	nodeReport(g, plugin, nodeA, other, ours(17_179_869_184, true, 2, "2026-12-05T08:00:00Z"))
	nodeReport(g, plugin, nodeB, ours(3_200_000_000, false, 1, "2026-12-05T08:01:00Z"))
	want := &servingv1.ModelCacheStatus{Key: copyKey, CompleteNodes: 1, Nodes: []servingv1.NodeModelCopy{
		{Node: nodeA, Complete: true, Bytes: 17_179_869_184, Pods: 2},
		{Node: nodeB, Complete: false, Pods: 1},
	}}
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ModelCache).To(Equal(want))
	})

	// Settled: the same reports, then a change of what status does not show.
	var rv string
	g.Eventually(func() bool {
		before := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, key, before)).To(Succeed())
		time.Sleep(time.Second)
		after := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, key, after)).To(Succeed())
		rv = after.ResourceVersion
		return before.ResourceVersion == rv
	}).WithTimeout(waitTimeout).Should(BeTrue())
	unchanged := func(why string) {
		g.Consistently(func() string {
			now := &servingv1.AIInference{}
			g.Expect(k8s.Get(ctx, key, now)).To(Succeed())
			return now.ResourceVersion
		}).WithTimeout(2*time.Second).Should(Equal(rv), why)
	}
	reconciles := reconcilesOf(ns)
	nodeReport(g, plugin, nodeA, other, ours(17_179_869_184, true, 2, "2026-12-05T09:30:00Z"))
	g.Eventually(func() int64 { return reconcilesOf(ns) }).WithTimeout(waitTimeout).Should(BeNumerically(">", reconciles), "the copy's report brings a reconcile")
	unchanged("a new last use of the copy rewrote the status")
	reconciles = reconcilesOf(ns)
	nodeReport(g, plugin, nodeB, ours(6_400_000_000, false, 1, "2026-12-05T08:01:00Z"))
	g.Eventually(func() int64 { return reconcilesOf(ns) }).WithTimeout(waitTimeout).Should(BeNumerically(">", reconciles))
	unchanged("a copy in progress that grew rewrote the status")
	nodeReport(g, plugin, nodeC, other)
	unchanged("another model's copy rewrote the status")

	// A report that cannot be read is skipped; the others still count.
	writeReport(g, plugin, nodeD, "{not json")
	nodeReport(g, plugin, nodeC, other, ours(17_179_869_184, true, 0, "2026-12-05T09:31:00Z"))
	want.CompleteNodes = 2
	want.Nodes = append(want.Nodes, servingv1.NodeModelCopy{Node: nodeC, Complete: true, Bytes: 17_179_869_184})
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ModelCache).To(Equal(want))
		g.Expect(readyCondition(obj).Reason).NotTo(Equal(servingv1.ReasonReconcileError))
	})

	// Evicted from node B: the report no longer names it.
	nodeReport(g, plugin, nodeB)
	want.Nodes = []servingv1.NodeModelCopy{want.Nodes[0], want.Nodes[2]}
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ModelCache).To(Equal(want))
	})

	// Off the node cache, the field goes.
	updateObject(g, key, func(fresh *servingv1.AIInference) { fresh.Spec.Cache = nil })
	eventually(t, g, key, waitTimeout, func(g Gomega, obj *servingv1.AIInference) {
		g.Expect(obj.Status.ObservedGeneration).To(Equal(obj.Generation))
		g.Expect(obj.Status.ModelCache).To(BeNil())
	})
}
