package nodecache

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aiinference/operator/internal/nodecachespec"
)

// fieldManager owns the node's cache labels and its ConfigMap.
const fieldManager = "aiinference-model-cache"

// reporter tells the cluster what the node holds: a ConfigMap per node (read
// by the operator for its status and by `kubectl aii`), a label per complete
// copy on the Node (for the pods' preferred node affinity), and an event on
// each pod saying what its volume gave it.
type reporter struct {
	client    client.Client
	node      string
	namespace string
	store     *Store
	metrics   *metrics
	log       *slog.Logger
	kick      chan struct{}
	last      string
}

// report is one pass; writes only what changed since the last.
func (r *reporter) report(ctx context.Context) error {
	entries, err := r.store.Entries()
	if err != nil {
		return err
	}
	rep := nodecachespec.Report{Node: r.node, BudgetBytes: r.store.Budget, Entries: entries}
	for _, e := range entries {
		rep.UsedBytes += e.Bytes
	}
	r.metrics.observe(rep)
	body, err := boundedReport(rep, maxReportBytes)
	if err != nil {
		return err
	}
	if string(body) == r.last {
		return nil
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{
			"name": "model-cache-" + r.node, "namespace": r.namespace,
			"labels": map[string]any{nodecachespec.StateLabel: r.node},
		},
		"data": map[string]any{nodecachespec.StateKey: string(body)},
	}}
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(cm), client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the node's report: %w", err)
	}
	labels := map[string]any{}
	for _, e := range entries {
		if e.Complete {
			labels[nodecachespec.NodeLabel(e.Key)] = "true"
		}
	}
	// Applied whole: a label the plugin no longer sets (an evicted copy) is removed.
	node := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": r.node, "labels": labels},
	}}
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(node), client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("labelling the node: %w", err)
	}
	r.last = string(body)
	return nil
}

// maxReportBytes bounds the report: a ConfigMap holds at most 1 MiB, and a
// report the API server refuses would leave every namespace's copies on the
// node unreported.
const maxReportBytes = 768 << 10

// boundedReport is the report's JSON, within max bytes: when the copies do not
// all fit, the ones in use, then the complete ones, then the most recently used
// are kept, and the report says how many it left out.
func boundedReport(rep nodecachespec.Report, max int) ([]byte, error) {
	body, err := json.Marshal(rep)
	if err != nil || len(body) <= max {
		return body, err
	}
	byValue := slices.Clone(rep.Entries)
	sort.SliceStable(byValue, func(i, j int) bool {
		a, b := byValue[i], byValue[j]
		if (a.Pods > 0) != (b.Pods > 0) {
			return a.Pods > 0
		}
		if a.Complete != b.Complete {
			return a.Complete
		}
		return a.LastUsed > b.LastUsed
	})
	// Room for the rest of the report, with the count of those left out.
	rest := rep
	rest.Entries, rest.Omitted = nil, len(rep.Entries)
	head, err := json.Marshal(rest)
	if err != nil {
		return nil, err
	}
	room := max - len(head)
	keep := map[string]bool{}
	for _, e := range byValue {
		b, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		if len(b)+1 > room { // and a comma
			break
		}
		room -= len(b) + 1
		keep[e.Key] = true
	}
	rest.Entries = nil
	for _, e := range rep.Entries { // in the report's own order
		if keep[e.Key] {
			rest.Entries = append(rest.Entries, e)
		}
	}
	rest.Omitted = len(rep.Entries) - len(rest.Entries)
	return json.Marshal(rest)
}

// run reports at once when kicked, and every interval in case a loader
// completed a copy (which the plugin does not see happen).
func (r *reporter) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.report(ctx); err != nil {
			r.log.Error("Reporting the node's copies", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

func (r *reporter) changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// podEvent tells the pod what its model cache volume is.
func (r *reporter) podEvent(ctx context.Context, req Request, p Published) {
	var reason, msg string
	switch p.Outcome {
	case OutcomeComplete:
		reason, msg = "ModelCacheComplete", fmt.Sprintf("Node %s holds a complete copy of %s: the loader checks it against the store and downloads nothing that is unchanged", r.node, req.Source)
	case OutcomeShared:
		reason, msg = "ModelCacheShared", fmt.Sprintf("Node %s holds a copy of %s in progress: the loader resumes it, or waits while another pod's loader writes it", r.node, req.Source)
	case OutcomeNew:
		reason, msg = "ModelCacheNew", fmt.Sprintf("Node %s holds no copy of %s: this pod's loader downloads it into the node's cache", r.node, req.Source)
	case OutcomeOverBudget:
		reason, msg = "ModelCacheOverBudget", fmt.Sprintf("The model (%d bytes) does not fit node %s's cache budget (%d bytes) beside the copies pods use: this pod loads into a folder of its own, removed with it", req.SizeBytes, r.node, r.store.Budget)
	}
	if len(p.Evicted) > 0 {
		msg += fmt.Sprintf(" (evicted %d unused copies to make room)", len(p.Evicted))
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: req.Pod + "." + rand.String(10), Namespace: req.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: req.Namespace, Name: req.Pod},
		Reason:         reason, Message: msg, Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "model-cache", Host: r.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := r.client.Create(ctx, ev); err != nil {
		r.log.Error("Recording the pod's event", "pod", req.Namespace+"/"+req.Pod, "error", err)
	}
	r.changed()
}
