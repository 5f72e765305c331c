package aiinference

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/nodecachespec"
)

// observeModelCache reads, for a model on the node cache, which nodes hold a
// copy of it from the nodes' reports. A report that cannot be read is skipped;
// a list that fails keeps what the last pass said.
func (r *Reconciler) observeModelCache(ctx context.Context, s *scope) {
	if r.ModelCacheReports == nil || resolvedCache(s.obj).Type != servingv1.CacheNode {
		return
	}
	reports := &corev1.ConfigMapList{}
	if err := r.ModelCacheReports.List(ctx, reports); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the nodes' model cache reports")
		s.obs.modelCache = s.obj.Status.ModelCache
		return
	}
	s.obs.modelCache = modelCacheStatus(nodeCacheKey(s.obj), readNodeReports(reports.Items, func(cm *corev1.ConfigMap, err error) {
		ctrl.LoggerFrom(ctx).V(1).Info("Skipping a model cache report that cannot be read", "configMap", klog.KObj(cm), "error", err.Error())
	}))
}

// readNodeReports decodes the nodes' reports, in the order of their
// ConfigMaps' names, skipping (and telling skip) those that cannot be read.
func readNodeReports(cms []corev1.ConfigMap, skip func(*corev1.ConfigMap, error)) []nodecachespec.Report {
	slices.SortFunc(cms, func(a, b corev1.ConfigMap) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var reports []nodecachespec.Report
	for i := range cms {
		rep, err := readNodeReport(&cms[i])
		if err != nil {
			skip(&cms[i], err)
			continue
		}
		reports = append(reports, rep)
	}
	return reports
}

func readNodeReport(cm *corev1.ConfigMap) (nodecachespec.Report, error) {
	var rep nodecachespec.Report
	data, ok := cm.Data[nodecachespec.StateKey]
	if !ok {
		return rep, fmt.Errorf("no key %s", nodecachespec.StateKey)
	}
	if err := json.Unmarshal([]byte(data), &rep); err != nil {
		return rep, err
	}
	if rep.Node == "" {
		return rep, errors.New("the report names no node")
	}
	return rep, nil
}

// modelCacheStatus is status.modelCache: the copies under key, one per node,
// sorted by node. When more nodes hold one than the list has room for, complete
// copies are kept first and the rest are counted. A copy in progress carries no
// size, which grows with every report.
func modelCacheStatus(key string, reports []nodecachespec.Report) *servingv1.ModelCacheStatus {
	st := &servingv1.ModelCacheStatus{Key: key}
	seen := map[string]bool{}
	var copies []servingv1.NodeModelCopy
	for _, rep := range reports {
		for _, e := range rep.Entries {
			// A node reported twice (its plugin moved namespace) counts once.
			if e.Key != key || seen[rep.Node] {
				continue
			}
			seen[rep.Node] = true
			c := servingv1.NodeModelCopy{Node: rep.Node, Complete: e.Complete, Pods: int32(e.Pods)}
			if e.Complete {
				c.Bytes = e.Bytes
				st.CompleteNodes++
			}
			copies = append(copies, c)
		}
	}
	slices.SortFunc(copies, func(a, b servingv1.NodeModelCopy) int {
		if a.Complete != b.Complete {
			if a.Complete {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Node, b.Node)
	})
	if len(copies) > servingv1.MaxModelCacheNodes {
		st.NodesNotListed = int32(len(copies) - servingv1.MaxModelCacheNodes)
		copies = copies[:servingv1.MaxModelCacheNodes]
	}
	slices.SortFunc(copies, func(a, b servingv1.NodeModelCopy) int { return cmp.Compare(a.Node, b.Node) })
	st.Nodes = copies
	return st
}

// reportToInferences maps a node's report to the objects on the node cache
// whose copies it lists. On a change both the old and the new report are
// mapped, so an evicted copy reaches its object as well.
func (r *Reconciler) reportToInferences(ctx context.Context, cm *corev1.ConfigMap) []reconcile.Request {
	log := ctrl.LoggerFrom(ctx)
	rep, err := readNodeReport(cm)
	if err != nil {
		log.Info("Skipping a model cache report that cannot be read", "configMap", klog.KObj(cm), "error", err.Error())
		return nil
	}
	keysByNamespace := map[string]map[string]bool{}
	for _, e := range rep.Entries {
		if keysByNamespace[e.Namespace] == nil {
			keysByNamespace[e.Namespace] = map[string]bool{}
		}
		keysByNamespace[e.Namespace][e.Key] = true
	}
	var requests []reconcile.Request
	for ns, keys := range keysByNamespace {
		list := &servingv1.AIInferenceList{}
		if err := r.List(ctx, list, client.InNamespace(ns)); err != nil {
			log.Error(err, "Listing the AIInferences a model cache report names", "namespace", ns)
			continue
		}
		for i := range list.Items {
			obj := &list.Items[i]
			if resolvedCache(obj).Type == servingv1.CacheNode && keys[nodeCacheKey(obj)] {
				requests = append(requests, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}})
			}
		}
	}
	return requests
}
