package kubectlaii

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/internal/units"
)

// ModelCacheReport is the node cache's copies of one model (cache.type Node).
type ModelCacheReport struct {
	// Key names the copies; nodes with a complete one carry the label
	// model-cache.aiinference.io/<key>.
	Key string `json:"key,omitempty"`
	// From is "reports" (the nodes' reports, read directly) or "status"
	// (status.modelCache, when the reports cannot be read).
	From string `json:"from"`
	// Unread says why the reports could not be read; empty when they were.
	Unread         string       `json:"unread,omitempty"`
	Copies         []CopyReport `json:"copies"`
	CompleteNodes  int32        `json:"completeNodes"`
	NodesNotListed int32        `json:"nodesNotListed,omitempty"`
	// Pods says what each pod of the model finds on its node.
	Pods []PodCopyReport `json:"pods,omitempty"`
}

// CopyReport is one node's copy of a model.
type CopyReport struct {
	Node      string `json:"node"`
	Namespace string `json:"namespace,omitempty"`
	Source    string `json:"source,omitempty"`
	Complete  bool   `json:"complete"`
	// Bytes is the copy's size on the node's disk; 0 when unknown (a copy in
	// progress, read from status).
	Bytes int64 `json:"bytes"`
	Pods  int   `json:"pods"`
	// LastUsed is when a pod last mounted or unmounted it (RFC 3339); only
	// the reports have it.
	LastUsed string `json:"lastUsed,omitempty"`
	// Idle is how long ago that was, for display; "-" when unknown.
	Idle string `json:"idle"`
}

// PodCopyReport is what a pod's node holds of its model.
type PodCopyReport struct {
	Pod     string `json:"pod"`
	Node    string `json:"node"`
	Outcome string `json:"outcome"`
}

// reportsPermission is what reading the nodes' reports takes.
const reportsPermission = "list configmaps in all namespaces (the nodes' model cache reports, labelled " + nodecachespec.StateLabel + ")"

// readNodeReports reads every node's model cache report with the user's own
// permissions, sorted by node; a report that cannot be decoded is left out.
func (e *env) readNodeReports() ([]nodecachespec.Report, error) {
	cms := &corev1.ConfigMapList{}
	if err := e.c.List(e.ctx, cms, client.HasLabels{nodecachespec.StateLabel}); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("you may not %s: %w", reportsPermission, err)
		}
		return nil, fmt.Errorf("listing the nodes' model cache reports: %w", err)
	}
	var reports []nodecachespec.Report
	for _, cm := range cms.Items {
		var rep nodecachespec.Report
		if json.Unmarshal([]byte(cm.Data[nodecachespec.StateKey]), &rep) == nil && rep.Node != "" {
			reports = append(reports, rep)
		}
	}
	slices.SortFunc(reports, func(a, b nodecachespec.Report) int { return cmp.Compare(a.Node, b.Node) })
	return reports, nil
}

// onNodeCache is true for a model on the node-local model cache.
func onNodeCache(obj *servingv1.AIInference) bool {
	return obj.Spec.Cache != nil && obj.Spec.Cache.Type == servingv1.CacheNode
}

// modelCacheReport is the model's copies from the nodes' reports, or from
// status.modelCache when they could not be read (unread says why).
func modelCacheReport(v *view, now time.Time) *ModelCacheReport {
	st := v.obj.Status.ModelCache
	r := &ModelCacheReport{From: "reports"}
	if st != nil {
		r.Key = st.Key
	}
	switch {
	case v.reportsErr != nil:
		r.From, r.Unread = "status", v.reportsErr.Error()
	case st == nil:
		r.From, r.Unread = "status", "the operator has not named the model's copies yet (status.modelCache)"
	}
	if r.From == "status" {
		if st != nil {
			r.CompleteNodes, r.NodesNotListed = st.CompleteNodes, st.NodesNotListed
			for _, c := range st.Nodes {
				r.Copies = append(r.Copies, CopyReport{Node: c.Node, Complete: c.Complete, Bytes: c.Bytes, Pods: int(c.Pods), Idle: "-"})
			}
		}
	} else {
		for _, rep := range v.reports {
			for _, e := range rep.Entries {
				if e.Key == r.Key {
					r.Copies = append(r.Copies, copyOf(rep.Node, e, now))
					if e.Complete {
						r.CompleteNodes++
					}
				}
			}
		}
	}
	for _, p := range v.pods {
		if p.Spec.NodeName != "" {
			r.Pods = append(r.Pods, PodCopyReport{Pod: p.Name, Node: p.Spec.NodeName, Outcome: podOutcome(r.Copies, p.Spec.NodeName)})
		}
	}
	return r
}

func copyOf(node string, e nodecachespec.Entry, now time.Time) CopyReport {
	return CopyReport{Node: node, Namespace: e.Namespace, Source: e.Source, Complete: e.Complete, Bytes: e.Bytes, Pods: e.Pods,
		LastUsed: e.LastUsed, Idle: idle(e.LastUsed, now)}
}

// podOutcome is what a pod finds on its node, as the node cache's outcomes
// (its events ModelCacheComplete, ModelCacheShared, ModelCacheOverBudget) say.
func podOutcome(copies []CopyReport, node string) string {
	for _, c := range copies {
		if c.Node != node {
			continue
		}
		if c.Complete {
			return "the node's complete copy: its loader checks it and downloads nothing unchanged"
		}
		return "the node's copy in progress: its loader resumes it, or waits while another pod's writes it"
	}
	return "no copy on its node: the model did not fit the node's cache budget (a folder of the pod's own), or the node has not reported it yet"
}

// idle is how long ago an RFC 3339 time was; "-" when unknown.
func idle(at string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

// copyState is a copy's state in words.
func copyState(complete bool) string {
	if complete {
		return "complete"
	}
	return "in progress"
}

// copySize is a copy's size; "-" when unknown.
func copySize(bytes int64) string {
	if bytes == 0 {
		return "-"
	}
	return units.Bytes(bytes)
}

func writeModelCache(out io.Writer, r *ModelCacheReport) {
	fmt.Fprintf(out, "Model cache: %d of %d nodes hold a complete copy", r.CompleteNodes, int32(len(r.Copies))+r.NodesNotListed)
	if r.Key != "" {
		fmt.Fprintf(out, " (nodes labelled %s)", nodecachespec.NodeLabel(r.Key))
	}
	fmt.Fprintln(out)
	if r.Unread != "" {
		fmt.Fprintf(out, "  The nodes' reports were not read, %s; from status.modelCache (no last use):\n", r.Unread)
	}
	if len(r.Copies) > 0 {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tCOPY\tSIZE\tPODS\tLAST USED")
		for _, c := range r.Copies {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", c.Node, copyState(c.Complete), copySize(c.Bytes), c.Pods, c.Idle)
		}
		_ = tw.Flush()
	}
	if r.NodesNotListed > 0 {
		fmt.Fprintf(out, "  and %d more nodes that status.modelCache does not list\n", r.NodesNotListed)
	}
	for _, p := range r.Pods {
		fmt.Fprintf(out, "  Pod %s on %s: %s\n", p.Pod, p.Node, p.Outcome)
	}
	fmt.Fprintln(out)
}

// NodeCacheReport is one node's model cache, as its report says.
type NodeCacheReport struct {
	Node        string       `json:"node"`
	UsedBytes   int64        `json:"usedBytes"`
	BudgetBytes int64        `json:"budgetBytes"`
	Copies      []CopyReport `json:"copies"`
}

// cache lists every node's copies from the nodes' reports.
func (e *env) cache() error {
	reports, err := e.readNodeReports()
	if err != nil {
		return err
	}
	nodes, now := []NodeCacheReport{}, time.Now()
	for _, rep := range reports {
		n := NodeCacheReport{Node: rep.Node, UsedBytes: rep.UsedBytes, BudgetBytes: rep.BudgetBytes, Copies: []CopyReport{}}
		for _, e := range rep.Entries {
			n.Copies = append(n.Copies, copyOf(rep.Node, e, now))
		}
		nodes = append(nodes, n)
	}
	if done, err := e.printStructured("ModelCacheList", map[string]any{"nodes": nodes}); done {
		return err
	}
	writeNodeCaches(e.out, nodes)
	return nil
}

func writeNodeCaches(out io.Writer, nodes []NodeCacheReport) {
	if len(nodes) == 0 {
		fmt.Fprintln(out, "No node reports a model cache.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNAMESPACE\tSOURCE\tSIZE\tCOPY\tPODS\tLAST USED")
	for _, n := range nodes {
		for _, c := range n.Copies {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Node, c.Namespace, c.Source, units.Bytes(c.Bytes), copyState(c.Complete), c.Pods, c.Idle)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCOPIES\tUSED\tBUDGET")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", n.Node, len(n.Copies), units.Bytes(n.UsedBytes), units.Bytes(n.BudgetBytes))
	}
	_ = tw.Flush()
}
