package aiinference

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// More nodes hold a copy than status lists: the complete copies are kept, the
// rest counted, the list sorted by node; a node reported twice counts once.
func TestModelCacheStatusKeepsCompleteCopiesAndCountsTheRest(t *testing.T) {
	g := NewWithT(t)
	var reports []nodecachespec.Report
	for i := range 150 {
		reports = append(reports, nodecachespec.Report{Node: fmt.Sprintf("node-%03d", i), Entries: []nodecachespec.Entry{
			{Key: "other", Complete: true, Bytes: 1},
			{Key: "k", Complete: i%3 == 0, Bytes: 100, Pods: 1},
		}})
	}
	reports = append(reports, nodecachespec.Report{Node: "node-000", Entries: []nodecachespec.Entry{{Key: "k", Bytes: 5}}})

	st := modelCacheStatus("k", reports)
	g.Expect(st.Key).To(Equal("k"))
	g.Expect(st.CompleteNodes).To(BeEquivalentTo(50))
	g.Expect(st.Nodes).To(HaveLen(servingv1.MaxModelCacheNodes))
	g.Expect(st.NodesNotListed).To(BeEquivalentTo(50))
	complete := 0
	for i, c := range st.Nodes {
		if i > 0 {
			g.Expect(c.Node > st.Nodes[i-1].Node).To(BeTrue(), "sorted by node, each once")
		}
		if c.Complete {
			complete++
			g.Expect(c.Bytes).To(BeEquivalentTo(100))
		} else {
			g.Expect(c.Bytes).To(BeZero(), "a copy in progress has no size in status")
		}
	}
	g.Expect(complete).To(Equal(50), "every complete copy is listed")
	g.Expect(st.Nodes[0]).To(Equal(servingv1.NodeModelCopy{Node: "node-000", Complete: true, Bytes: 100, Pods: 1}))
}

func TestReadNodeReportsSkipsWhatCannotBeRead(t *testing.T) {
	g := NewWithT(t)
	cm := func(name, data string) corev1.ConfigMap {
		return corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "cache", Name: name}, Data: map[string]string{nodecachespec.StateKey: data}}
	}
	var skipped []string
	reports := readNodeReports([]corev1.ConfigMap{
		cm("model-cache-b", `{"node":"b","entries":[{"key":"k","complete":true}]}`),
		cm("model-cache-bad", `{"node":`),
		cm("model-cache-nameless", `{"entries":[]}`),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "cache", Name: "model-cache-empty"}},
		cm("model-cache-a", `{"node":"a","entries":[]}`),
	}, func(cm *corev1.ConfigMap, err error) { skipped = append(skipped, cm.Name) })
	g.Expect(reports).To(HaveLen(2))
	g.Expect(reports[0].Node).To(Equal("a"), "in the order of the ConfigMaps' names")
	g.Expect(skipped).To(ConsistOf("model-cache-bad", "model-cache-nameless", "model-cache-empty"))
}
