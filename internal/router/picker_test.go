package router

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func endpoints(n int) []Endpoint {
	var out []Endpoint
	for i := range n {
		out = append(out, Endpoint{Name: fmt.Sprintf("chat-7d9f8c6b5-%03d", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)})
	}
	return out
}

func prompt(tenant, conversation, turns int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "system prompt of tenant %d: %s", tenant, strings.Repeat("be helpful and brief. ", 40))
	for t := range turns {
		fmt.Fprintf(&b, "conversation %d turn %d: %s", conversation, t, strings.Repeat("a question with some words in it. ", 10))
	}
	return []byte(b.String())
}

// Two routers that share nothing send every prefix to the same replica.
func TestTwoPickersAgreeWhereAPrefixGoes(t *testing.T) {
	eps := endpoints(5)
	a, b := NewPicker(PickerOptions{}), NewPicker(PickerOptions{})
	// b has seen a replica come and go; it must not change b's choices.
	w, _ := b.Pick(append(endpoints(6)[5:], eps...), nil, "warm-up")
	b.Done(w.Endpoint.Name)
	used := map[string]int{}
	for tenant := range 200 {
		blocks := blockHashes(prompt(tenant, 0, 1), 256)
		pa, _ := a.Pick(eps, blocks, "")
		pb, _ := b.Pick(eps, blocks, "")
		a.Done(pa.Endpoint.Name)
		b.Done(pb.Endpoint.Name)
		if pa.Endpoint.Name != pb.Endpoint.Name {
			t.Fatalf("tenant %d: router a picked %s (%s), router b %s (%s)", tenant, pa.Endpoint.Name, pa.Reason, pb.Endpoint.Name, pb.Reason)
		}
		used[pa.Endpoint.Name]++
	}
	if len(used) != len(eps) {
		t.Errorf("200 prefixes went to %d of %d replicas: %v", len(used), len(eps), used)
	}
}

// A prefix seen before goes back to where it went; its share of blocks held is reported.
func TestAPrefixGoesBackWhereItWent(t *testing.T) {
	eps := endpoints(4)
	p := NewPicker(PickerOptions{})
	first, _ := p.Pick(eps, blockHashes(prompt(1, 1, 1), 256), "")
	p.Done(first.Endpoint.Name)
	if first.Reason != ReasonHash || first.HitBlocks != 0 {
		t.Fatalf("first request: %+v, want reason hash and no block held", first)
	}
	next := blockHashes(prompt(1, 1, 2), 256)
	second, _ := p.Pick(eps, next, "")
	p.Done(second.Endpoint.Name)
	if second.Endpoint.Name != first.Endpoint.Name || second.Reason != ReasonPrefix {
		t.Fatalf("the next turn went to %s (%s), want %s (prefix)", second.Endpoint.Name, second.Reason, first.Endpoint.Name)
	}
	if want := len(blockHashes(prompt(1, 1, 1), 256)); second.HitBlocks != want {
		t.Errorf("the next turn holds %d blocks there, want %d", second.HitBlocks, want)
	}
}

// A hot prefix spills to the next replica on the ring once its owner is past
// the bound, and comes back when the owner's load falls.
func TestAHotPrefixSpillsPastTheBound(t *testing.T) {
	eps := endpoints(4)
	p := NewPicker(PickerOptions{LoadFactor: 1.25, MinBound: 1})
	blocks := blockHashes(prompt(7, 0, 0), 256)
	picks := map[string]int{}
	var owner string
	reasons := map[string]int{}
	for i := range 40 {
		pk, _ := p.Pick(eps, blocks, "")
		if i == 0 {
			owner = pk.Endpoint.Name
		}
		picks[pk.Endpoint.Name]++
		reasons[pk.Reason]++
	}
	// In flight: 40 over 4 replicas, bound ceil(1.25*(39+1)/4) = 13.
	if picks[owner] > 13 {
		t.Errorf("the owner %s carries %d requests in flight, more than the bound 13: %v", owner, picks[owner], picks)
	}
	if reasons[ReasonSpill] == 0 {
		t.Errorf("no request spilled: %v", reasons)
	}
	for name, n := range picks {
		for range n {
			p.Done(name)
		}
	}
	pk, _ := p.Pick(eps, blocks, "")
	if pk.Endpoint.Name != owner && p.index.held(blocks, pk.Endpoint.Name) == 0 {
		t.Errorf("with no load the prefix went to %s, which neither owns nor holds it", pk.Endpoint.Name)
	}
}

// Only candidates are picked: a replica not ready (left out by the caller) is
// never chosen, even where the prefix was sent before, and none is picked
// from an empty set.
func TestOnlyCandidatesArePicked(t *testing.T) {
	eps := endpoints(3)
	p := NewPicker(PickerOptions{})
	blocks := blockHashes(prompt(3, 3, 3), 256)
	first, _ := p.Pick(eps, blocks, "")
	p.Done(first.Endpoint.Name)
	var rest []Endpoint
	for _, e := range eps {
		if e.Name != first.Endpoint.Name {
			rest = append(rest, e)
		}
	}
	for range 20 {
		pk, _ := p.Pick(rest, blocks, "s")
		p.Done(pk.Endpoint.Name)
		if pk.Endpoint.Name == first.Endpoint.Name {
			t.Fatalf("picked %s, which is not ready", pk.Endpoint.Name)
		}
	}
	if _, ok := p.Pick(nil, blocks, ""); ok {
		t.Error("picked a replica out of none")
	}
}

// With no prefix, a session header keeps a client on one replica; with
// neither, the least loaded by the engine's own queue wins.
func TestSessionThenEngineLoad(t *testing.T) {
	eps := endpoints(3)
	p := NewPicker(PickerOptions{})
	s1, _ := p.Pick(eps, nil, "user-42")
	p.Done(s1.Endpoint.Name)
	s2, _ := p.Pick(eps, nil, "user-42")
	p.Done(s2.Endpoint.Name)
	if s1.Reason != ReasonSession || s1.Endpoint.Name != s2.Endpoint.Name {
		t.Errorf("session picks %+v then %+v, want the same replica by session", s1, s2)
	}
	now := time.Now()
	p.SetEngineLoad(eps[0].Name, EngineLoad{Waiting: 5, Running: 8, At: now})
	p.SetEngineLoad(eps[1].Name, EngineLoad{Running: 2, KVCacheUsage: 0.9, At: now})
	p.SetEngineLoad(eps[2].Name, EngineLoad{Running: 3, KVCacheUsage: 0.1, At: now})
	for range 3 {
		pk, _ := p.Pick(eps, nil, "")
		p.Done(pk.Endpoint.Name)
		if pk.Reason != ReasonLoad || pk.Endpoint.Name != eps[2].Name {
			t.Errorf("picked %s (%s), want %s: no queue and the emptiest KV cache", pk.Endpoint.Name, pk.Reason, eps[2].Name)
		}
	}
}

func TestBlockHashesChain(t *testing.T) {
	a := blockHashes([]byte(strings.Repeat("x", 1000)+"tail one"), 256)
	b := blockHashes([]byte(strings.Repeat("x", 1000)+"tail two, longer than the other one, with a third of a block more text to it......"), 256)
	if len(a) != 3 || len(b) != 4 {
		t.Fatalf("blocks: %d and %d, want 3 and 4 (whole blocks only)", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("block %d differs for the same text", i)
		}
	}
	if a[1] == a[2] || a[0] == a[1] {
		t.Error("equal blocks at different places hash alike: the chain is missing")
	}
}

// A replica whose engine was seen to run 4 at once is saturated as soon as
// this router has 4 there, before any reading shows them; the engine's
// readings count the other routers' requests too.
func TestAReplicaIsSaturatedAtItsBatch(t *testing.T) {
	p := NewPicker(PickerOptions{})
	eps := endpoints(1)
	name := eps[0].Name
	if p.Saturated(eps) {
		t.Fatal("saturated before any reading")
	}
	p.SetEngineLoad(name, EngineLoad{Running: 4, Waiting: 2, At: time.Now()})
	if !p.Saturated(eps) {
		t.Fatal("not saturated with a queue behind its batch")
	}
	p.SetEngineLoad(name, EngineLoad{At: time.Now()})
	for i := range 4 {
		if p.Saturated(eps) {
			t.Fatalf("saturated with %d of its batch of 4 sent", i)
		}
		if _, ok := p.Pick(eps, nil, ""); !ok {
			t.Fatal("nothing picked")
		}
	}
	if !p.Saturated(eps) {
		t.Fatal("not saturated with its batch of 4 sent and no reading since")
	}
	p.Done(name)
	if p.Saturated(eps) {
		t.Fatal("saturated with 3 of its batch of 4 in flight")
	}
	p.SetEngineLoad(name, EngineLoad{Running: 4, At: time.Now()}) // another router's requests
	if !p.Saturated(eps) {
		t.Fatal("not saturated with a reading of its whole batch running")
	}
}
