package router

import (
	"slices"
	"testing"
	"time"
)

// releaseAll lets go, n times, the next request of q, and names the tenants
// of the requests released, in order.
func releaseAll(t *testing.T, q *flowQueue, all []*waiter, n int) []string {
	t.Helper()
	var order []string
	for range n {
		q.release(func() bool { return false })
		for _, w := range all {
			select {
			case <-w.ready:
				order = append(order, w.tenant)
				w.ready = make(chan struct{}) // seen
				q.sent()
			default:
			}
		}
	}
	return order
}

// TestTheFlowQueueServesTenantsInTurnAndCriticalFirst: a tenant that queues
// ten requests beside one that queues two gets every other release, not ten
// first; Critical ones go before any Standard one.
func TestTheFlowQueueServesTenantsInTurnAndCriticalFirst(t *testing.T) {
	q := &flowQueue{max: 100}
	var all []*waiter
	add := func(tenant string, band int) {
		w := &waiter{tenant: tenant, band: band, ready: make(chan struct{})}
		if _, ok := q.enqueue(w); !ok {
			t.Fatalf("no room for %s", tenant)
		}
		all = append(all, w)
	}
	for range 10 {
		add("flood", bandStandard)
	}
	add("calm", bandStandard)
	add("calm", bandStandard)
	add("urgent", bandCritical)
	order := releaseAll(t, q, all, 6)
	want := []string{"urgent", "flood", "calm", "flood", "calm", "flood"}
	if !slices.Equal(order, want) {
		t.Errorf("released %v, want %v", order, want)
	}
}

// TestATenantServedLessOfLateGoesFirst: a tenant that was let go six times
// while alone waits behind one that comes later with two requests, which
// both go before its next; minutes later its usage is forgotten.
func TestATenantServedLessOfLateGoesFirst(t *testing.T) {
	now := time.Unix(0, 0)
	q := &flowQueue{max: 100, now: func() time.Time { return now }}
	var all []*waiter
	add := func(tenant string) {
		w := &waiter{tenant: tenant, band: bandStandard, ready: make(chan struct{})}
		if _, ok := q.enqueue(w); !ok {
			t.Fatalf("no room for %s", tenant)
		}
		all = append(all, w)
	}
	for range 10 {
		add("flood")
	}
	releaseAll(t, q, all, 6)
	add("calm")
	add("calm")
	if order, want := releaseAll(t, q, all, 3), []string{"calm", "calm", "flood"}; !slices.Equal(order, want) {
		t.Errorf("released %v, want %v", order, want)
	}
	now = now.Add(10 * time.Minute)
	add("late")
	releaseAll(t, q, all, 1)
	if _, ok := q.usage["calm"]; ok || len(q.usage) > 2 {
		t.Errorf("usage kept %v ten minutes on, want only the tenants queued or just served", q.usage)
	}
}

// TestAFullFlowQueueShedsTheLongestTenantsNewest: full, the queue makes room
// for a tenant with fewer requests by shedding the newest of the longest
// tenant queue, and for a Critical request by shedding a Standard one; a
// request of the longest queue itself finds no room.
func TestAFullFlowQueueShedsTheLongestTenantsNewest(t *testing.T) {
	q := &flowQueue{max: 4}
	var flood []*waiter
	for range 4 {
		w := &waiter{tenant: "flood", band: bandStandard, ready: make(chan struct{})}
		q.enqueue(w)
		flood = append(flood, w)
	}
	if _, ok := q.enqueue(&waiter{tenant: "flood", band: bandStandard, ready: make(chan struct{})}); ok {
		t.Error("the longest tenant found room in a full queue")
	}
	shed, ok := q.enqueue(&waiter{tenant: "calm", band: bandStandard, ready: make(chan struct{})})
	if !ok || shed != flood[3] || !shed.shed {
		t.Errorf("a calm tenant's request: ok %v, shed %+v; want the flood's newest shed", ok, shed)
	}
	shed, ok = q.enqueue(&waiter{tenant: "flood", band: bandCritical, ready: make(chan struct{})})
	if !ok || shed != flood[2] {
		t.Errorf("a Critical request: ok %v, shed %+v; want the flood's newest Standard one shed", ok, shed)
	}
	if q.length() != 4 {
		t.Errorf("%d queued, want 4", q.length())
	}
}
