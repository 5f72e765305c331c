package e2e

import (
	"cmp"
	"slices"
	"sync"
	"testing"
	"time"
)

// room is the real nodes' room for pods, shared by tests that run at once. It
// lets in the waiting test that holds the most pod-seconds first, and any
// smaller one that fits while a bigger one waits for more room: with tests let
// in as they asked (a FIFO), the longest test could start last and the room
// stand half empty behind a test that needs two pods, 129 s in the median
// against 115 s for these tests (a simulation of the measured hold times).
type room struct {
	mu      sync.Mutex
	free    int64
	waiters []*roomWaiter
	// opens is when the room first lets tests in: the tests that start together
	// all ask within it, so the heaviest goes first even at the start.
	opens time.Time
}

type roomWaiter struct {
	pods   int64
	weight time.Duration // the pod-seconds it is expected to hold
	ready  chan struct{}
}

// roomGathering is how long the room waits, from the first ask, before it lets
// anyone in.
const roomGathering = time.Second

func newRoom(pods int64) *room { return &room{free: pods} }

// acquire waits until pods fit and it is this test's turn; weight is the
// pod-seconds the test is expected to hold.
func (r *room) acquire(pods int64, weight time.Duration) {
	w := &roomWaiter{pods: pods, weight: weight, ready: make(chan struct{})}
	r.mu.Lock()
	r.waiters = append(r.waiters, w)
	if r.opens.IsZero() {
		r.opens = time.Now().Add(roomGathering)
		time.AfterFunc(roomGathering, func() {
			r.mu.Lock()
			r.letIn()
			r.mu.Unlock()
		})
	} else {
		r.letIn()
	}
	r.mu.Unlock()
	<-w.ready
}

func (r *room) release(pods int64) {
	r.mu.Lock()
	r.free += pods
	r.letIn()
	r.mu.Unlock()
}

// letIn lets in, heaviest first, every waiter that fits; r.mu is held.
func (r *room) letIn() {
	if time.Now().Before(r.opens) {
		return
	}
	slices.SortStableFunc(r.waiters, func(a, b *roomWaiter) int { return cmp.Compare(b.weight, a.weight) })
	waiting := r.waiters[:0]
	for _, w := range r.waiters {
		if w.pods <= r.free {
			r.free -= w.pods
			close(w.ready)
		} else {
			waiting = append(waiting, w)
		}
	}
	r.waiters = waiting
}

// TestRoomLetsTheHeaviestInFirst: of the tests that ask together, the heaviest
// goes first; a small one fills room a bigger one cannot use yet.
func TestRoomLetsTheHeaviestInFirst(t *testing.T) {
	t.Parallel() // it needs no cluster, and must not hold back the tests that do
	r := newRoom(3)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	ask := func(name string, pods int64, weight time.Duration) {
		wg.Go(func() {
			r.acquire(pods, weight)
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		})
	}
	ask("light", 1, time.Second)
	ask("heavy", 2, time.Minute)
	ask("middle", 2, 30*time.Second)
	time.Sleep(roomGathering / 2) // all three ask within the gathering
	ask("small", 1, 5*time.Second)
	let := func(want ...string) {
		t.Helper()
		time.Sleep(roomGathering)
		mu.Lock()
		got := slices.Sorted(slices.Values(order))
		mu.Unlock()
		if slices.Sort(want); !slices.Equal(got, want) {
			t.Fatalf("let in %v, want %v", got, want)
		}
	}
	// heavy (2 of 3) first; middle does not fit the 1 left, small does.
	let("heavy", "small")
	r.release(2) // heavy is done: middle fits now, and goes before light
	let("heavy", "small", "middle")
	r.release(1) // small is done: light fits
	wg.Wait()
	let("heavy", "small", "middle", "light")
}
