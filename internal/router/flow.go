package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

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
// releases the highest band first and, within a band, the tenant that was
// served least of late: each release adds one to its tenant's count, which
// halves every usageHalfLife. A tenant that floods the model waits behind its
// own requests, and one within its share finds its request let go at the next
// room, where turns in order would make it wait behind the flood's turn and
// cap it at an even split. Full, it makes room for a request by shedding the
// newest of the lowest band's longest tenant queue, when that is lower in
// priority or longer than the newcomer's own tenant queue: the longest queue
// pays for the overload.
type flowQueue struct {
	max int
	// now is the clock of the tenants' usage (time.Now unless a test sets it).
	now func() time.Time

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
	// usage is each tenant's releases of late, decayed; tenants whose usage
	// decayed to nothing are forgotten, so it holds no more than the tenants
	// served in the last minutes.
	usage map[string]tenantUsage
	// pruned is when usage was last swept of the forgotten.
	pruned time.Time
}

// usageHalfLife is how fast a tenant's past releases stop counting against
// it: long enough to span the bursts of a tenant within its share, short
// enough that yesterday's flood does not keep a tenant behind today.
const usageHalfLife = 10 * time.Second

// tenantUsage is a tenant's decayed release count as of at.
type tenantUsage struct {
	count float64
	at    time.Time
}

func (u tenantUsage) asOf(now time.Time) float64 {
	return u.count * math.Exp2(-now.Sub(u.at).Seconds()/usageHalfLife.Seconds())
}

type flowBand struct {
	// tenants are the queues with requests, in the order they came.
	tenants []*tenantQueue
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
// highest band's tenant served least of late. It releases one at a time: the
// released request is sent (sent) before the next is weighed, so that the
// room it takes counts; else a burst of releases would fill the engines'
// queues before any reading showed it.
func (q *flowQueue) release(saturated func() bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == 0 || q.released || saturated() {
		return
	}
	now := time.Now()
	if q.now != nil {
		now = q.now()
	}
	for i := range q.band {
		b := &q.band[i]
		var next *tenantQueue
		least := math.Inf(1)
		for _, t := range b.tenants {
			if u := q.usage[t.name].asOf(now); u < least {
				next, least = t, u
			}
		}
		if next == nil {
			continue
		}
		w := next.waiters[0]
		q.remove(w)
		q.released = true
		q.served(w.tenant, least, now)
		close(w.ready)
		return
	}
}

// forgottenUsage is the decayed count below which a tenant not queued is
// forgotten: a count it reaches some minutes after its last release.
const forgottenUsage = 1.0 / 64

// served counts a release against tenant, whose usage was before, and,
// once every half-life, forgets the tenants whose usage decayed to nothing.
func (q *flowQueue) served(tenant string, before float64, now time.Time) {
	if q.usage == nil {
		q.usage = map[string]tenantUsage{}
	}
	q.usage[tenant] = tenantUsage{count: before + 1, at: now}
	if now.Sub(q.pruned) < usageHalfLife {
		return
	}
	q.pruned = now
	for name, u := range q.usage {
		if u.asOf(now) < forgottenUsage && q.band[bandCritical].queue(name) == nil && q.band[bandStandard].queue(name) == nil {
			delete(q.usage, name)
		}
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
