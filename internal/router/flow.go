package router

import (
	"sync"
	"sync/atomic"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Bands of the flow queue, highest first: Sheddable requests are never
// queued (they are shed while the replicas are saturated).
const (
	bandCritical = iota
	bandStandard
	bands
)

func bandOf(p servingv1.RequestPriority) int {
	if p == servingv1.PriorityCritical {
		return bandCritical
	}
	return bandStandard
}

func priorityOf(band int) servingv1.RequestPriority {
	if band == bandCritical {
		return servingv1.PriorityCritical
	}
	return servingv1.PriorityStandard
}

// flowQueue holds a model's requests while every replica is saturated, as
// llm-d's flow control does: one queue per tenant in each priority band. It
// releases the highest band first and, within a band, the tenants in turn,
// one request each, so a tenant that floods the model waits behind its own
// requests. Full, it makes room for a request by shedding the newest of the
// lowest band's longest tenant queue, when that is lower in priority or
// longer than the newcomer's own tenant queue: the longest queue pays for
// the overload.
type flowQueue struct {
	max int

	mu     sync.Mutex
	band   [bands]flowBand
	queued int
	// size is queued, read without the lock: release holds it while it
	// asks the router whether the model is saturated, and the router asks
	// the queue's length under its own lock.
	size atomic.Int64
	// released is set from a release until the released request was sent
	// (or gave up): the next is weighed against the room that one took.
	released bool
}

type flowBand struct {
	// tenants are the queues with requests, in the order they are served.
	tenants []*tenantQueue
	next    int
}

type tenantQueue struct {
	name    string
	waiters []*waiter
}

// waiter is one queued request.
type waiter struct {
	tenant string
	band   int
	// ready is closed when the request is released or shed.
	ready chan struct{}
	// shed is set when it was shed to make room.
	shed bool
}

func (b *flowBand) queue(tenant string) *tenantQueue {
	for _, t := range b.tenants {
		if t.name == tenant {
			return t
		}
	}
	return nil
}

// enqueue queues w; the request shed to make room (nil for none); ok is
// false, with nothing changed, when w itself finds no room.
func (q *flowQueue) enqueue(w *waiter) (shed *waiter, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued >= q.max {
		if shed = q.victimFor(w); shed == nil {
			return nil, false
		}
		q.remove(shed)
		shed.shed = true
		close(shed.ready)
	}
	b := &q.band[w.band]
	t := b.queue(w.tenant)
	if t == nil {
		t = &tenantQueue{name: w.tenant}
		b.tenants = append(b.tenants, t)
	}
	t.waiters = append(t.waiters, w)
	q.queued++
	q.size.Store(int64(q.queued))
	return shed, true
}

// victimFor is the request to shed for w; nil when none is worse placed.
func (q *flowQueue) victimFor(w *waiter) *waiter {
	own := 0
	if t := q.band[w.band].queue(w.tenant); t != nil {
		own = len(t.waiters)
	}
	for b := bands - 1; b >= w.band; b-- {
		var longest *tenantQueue
		for _, t := range q.band[b].tenants {
			if longest == nil || len(t.waiters) > len(longest.waiters) {
				longest = t
			}
		}
		if longest == nil {
			continue
		}
		if b > w.band || len(longest.waiters) > own+1 {
			return longest.waiters[len(longest.waiters)-1]
		}
		return nil
	}
	return nil
}

// remove takes w out of its queue (released, shed or gone). Call with q.mu held.
func (q *flowQueue) remove(w *waiter) bool {
	b := &q.band[w.band]
	for i, t := range b.tenants {
		if t.name != w.tenant {
			continue
		}
		for j, x := range t.waiters {
			if x == w {
				t.waiters = append(t.waiters[:j], t.waiters[j+1:]...)
				q.queued--
				q.size.Store(int64(q.queued))
				if len(t.waiters) == 0 {
					b.tenants = append(b.tenants[:i], b.tenants[i+1:]...)
					if b.next > i {
						b.next--
					}
				}
				return true
			}
		}
	}
	return false
}

// leave takes a request that stops waiting out of the queue; false when it
// was released or shed meanwhile (its ready channel says which).
func (q *flowQueue) leave(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.remove(w)
}

// release lets the next request go while saturated says there is room: the
// highest band's next tenant in turn. It releases one at a time: the
// released request is sent (sent) before the next is weighed, so that the
// room it takes counts; else a burst of releases would fill the engines'
// queues before any reading showed it.
func (q *flowQueue) release(saturated func() bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == 0 || q.released || saturated() {
		return
	}
	for i := range q.band {
		b := &q.band[i]
		if len(b.tenants) == 0 {
			continue
		}
		b.next %= len(b.tenants)
		t := b.tenants[b.next]
		w := t.waiters[0]
		b.next++
		q.remove(w)
		q.released = true
		close(w.ready)
		return
	}
}

// sent tells that the request released last was sent to a replica, or gave
// up: the next may be weighed.
func (q *flowQueue) sent() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.released = false
}

// length is how many requests wait.
func (q *flowQueue) length() int { return int(q.size.Load()) }
