// Package frontdoor is what the request path's two front doors, the router
// and the activator, share to take a request: bounds of what they hold, in
// all, per namespace and per model, and a request body read within them as
// its bytes arrive.
package frontdoor

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Quota bounds one thing the router holds (bytes of request bodies, bodies
// being read or kept, requests in the router) in total, per namespace and per
// model, so that one tenant, or one tenant's slow engine, can take no more
// than its share and never lock the others out.
type Quota struct {
	// what names the thing, for the message of a refusal.
	what string
	// total, perNamespace and perModel are the bounds.
	total, perNamespace, perModel int64

	mu          sync.Mutex
	used        int64
	byNamespace map[string]int64
	byModel     map[types.NamespacedName]int64
}

// NewQuota bounds what at total, a namespace at namespaceShare of it and a
// model at modelShare of it.
func NewQuota(what string, total int64, namespaceShare, modelShare float64) *Quota {
	share := func(s float64) int64 { return max(1, int64(float64(total)*s)) }
	return &Quota{what: what, total: total, perNamespace: share(namespaceShare), perModel: share(modelShare),
		byNamespace: map[string]int64{}, byModel: map[types.NamespacedName]int64{}}
}

// take adds n for key (a model, or a namespace alone when key.Name is empty)
// when every bound it counts against keeps; else it takes nothing and says
// which bound is reached.
func (q *Quota) take(key types.NamespacedName, n int64) (refusal string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.used+n > q.total:
		return fmt.Sprintf("the router holds all the %s it may (%d)", q.what, q.total)
	case q.byNamespace[key.Namespace]+n > q.perNamespace:
		return fmt.Sprintf("namespace %s holds its share of the router's %s (%d)", key.Namespace, q.what, q.perNamespace)
	case key.Name != "" && q.byModel[key]+n > q.perModel:
		return fmt.Sprintf("%s holds its share of the router's %s (%d)", key, q.what, q.perModel)
	}
	q.used += n
	q.byNamespace[key.Namespace] += n
	if key.Name != "" {
		q.byModel[key] += n
	}
	return ""
}

// Hold is an empty holding of the quota for key (a model, or a namespace
// alone while the request has not named its model).
func (q *Quota) Hold(key types.NamespacedName) Holding { return Holding{q: q, key: key} }

// give returns n taken for key.
func (q *Quota) give(key types.NamespacedName, n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.used -= n
	if q.byNamespace[key.Namespace] -= n; q.byNamespace[key.Namespace] <= 0 {
		delete(q.byNamespace, key.Namespace)
	}
	if key.Name != "" {
		if q.byModel[key] -= n; q.byModel[key] <= 0 {
			delete(q.byModel, key)
		}
	}
}

// Holding is what one request holds of a quota, given back once.
type Holding struct {
	q   *Quota
	key types.NamespacedName
	n   int64
}

// Grow takes n more for the holding; the refusal when a bound is reached.
func (h *Holding) Grow(n int64) string {
	if refusal := h.q.take(h.key, n); refusal != "" {
		return refusal
	}
	h.n += n
	return ""
}

// ToModel counts the holding of a namespace against one of its models too,
// once the body named it: the refusal, with nothing changed, when the model
// is past its share.
func (h *Holding) ToModel(model string) string {
	if h.key.Name != "" {
		return ""
	}
	key := types.NamespacedName{Namespace: h.key.Namespace, Name: model}
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byModel[key]+h.n > q.perModel {
		return fmt.Sprintf("%s holds its share of the router's %s (%d)", key, q.what, q.perModel)
	}
	q.byModel[key] += h.n
	h.key = key
	return ""
}

// Release gives everything back; later calls do nothing.
func (h *Holding) Release() {
	if h.q != nil && h.n > 0 {
		h.q.give(h.key, h.n)
	}
	h.n = 0
}
