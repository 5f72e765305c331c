package routerfaults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aiinference/operator/test/routerfaults/world"
)

// The faults' traffic: 80 streaming chats at 20 a second, every other one
// hash-routed (a conversation's long system prompt, the same in each of its
// requests, so the router sends it where its prefix is) and the rest
// load-routed (a prompt shorter than one prefix block: the least loaded
// replica), each with a client timeout of 3 s.
const (
	faultRequests      = 80
	faultRate          = 20
	faultTimeout       = 3 * time.Second
	faultConversations = 8
	faultMaxTokens     = 16
)

// faultTally is one run's requests of each kind.
type faultTally struct {
	hash, load Tally
}

func (f *faultTally) notOK() (int, int) {
	return f.hash.Sent + f.load.Sent - f.hash.OK - f.load.OK, f.hash.Sent + f.load.Sent
}

// conversationPrompt is conversation c's system prompt: about 3,600 bytes,
// 14 prefix blocks of the router's 256.
func conversationPrompt(c int) string {
	words := strings.Fields("model replica cache prefix token request latency batch queue server cluster node pod service route policy tenant prompt answer question")
	var b strings.Builder
	fmt.Fprintf(&b, "You are the assistant of conversation %d.", c)
	for i := range 600 {
		b.WriteByte(' ')
		b.WriteString(words[(i*7+c*3)%len(words)])
	}
	return b.String()
}

// sendFaultTraffic sends the faults' traffic to the router.
func sendFaultTraffic(ctx context.Context, p *RouterProc, host string) *faultTally {
	var out faultTally
	client := ClientFrom(ClientA)
	prompts := make([]string, faultConversations)
	for c := range prompts {
		prompts[c] = conversationPrompt(c)
	}
	OpenLoop(ctx, faultRate, faultRequests, func(i int) {
		if i%2 == 0 {
			c := (i / 2) % faultConversations
			body := ChatBody(SimModel, faultMaxTokens, prompts[c], fmt.Sprintf("Question %d of conversation %d: what is cached?", i/2/faultConversations, c))
			out.hash.Add(Send(ctx, client, Request{URL: p.URL, Host: host, Body: body, Timeout: faultTimeout}))
			return
		}
		body := ChatBody(SimModel, faultMaxTokens, fmt.Sprintf("Say hello %d.", i))
		out.load.Add(Send(ctx, client, Request{URL: p.URL, Host: host, Body: body, Timeout: faultTimeout}))
	})
	return &out
}

// TestFaultyReplicas: four replicas, once all healthy (the peer), once with
// one that answers 500 at once, once with one that takes connections and
// never answers; the same traffic each time, through a fresh router.
func TestFaultyReplicas(t *testing.T) {
	sims := StartSims(t, 4)
	fail := StartFastFailEngine(t, "fail")
	silent := StartSilentEngine(t, "silent")
	// The replicas are named by their place, so that the same prefixes hash
	// to the same place in every run.
	replica := func(i int, addr string) world.Endpoint {
		return world.Endpoint{Name: fmt.Sprintf("replica-%d", i), Addr: addr}
	}
	healthy := func(n int) []world.Endpoint {
		var eps []world.Endpoint
		for i := range n {
			eps = append(eps, replica(i, sims[i].Addr))
		}
		return eps
	}
	runs := []struct {
		name string
		eps  []world.Endpoint
	}{
		{CaseAllHealthy, healthy(4)},
		{CaseFastFail, append(healthy(3), replica(3, fail.Addr))},
		{CaseSilent, append(healthy(3), replica(3, silent.Addr))},
	}
	got := map[string]*faultTally{}
	for _, run := range runs {
		if err := WaitIdle(t.Context(), sims, 30*time.Second); err != nil {
			t.Fatalf("before %s: %v", run.name, err)
		}
		m := NewModel("faults", "chat", SimModel, run.eps...)
		p := StartRouter(t, run.name, &world.File{Models: []world.Model{m}})
		f := sendFaultTraffic(t.Context(), p, HostOf(m))
		got[run.name] = f
		bad, all := f.notOK()
		Line(os.Stdout, run.name, "not ok %d of %d (%s); hash-routed: %s, TTFT p50 %s p90 %s; load-routed: %s, TTFT p50 %s p90 %s; %s",
			bad, all, Pct(float64(bad)/float64(max(all, 1))),
			f.hash.String(), Dur(f.hash.TTFT(0.5, faultTimeout)), Dur(f.hash.TTFT(0.9, faultTimeout)),
			f.load.String(), Dur(f.load.TTFT(0.5, faultTimeout)), Dur(f.load.TTFT(0.9, faultTimeout)), Memory(p))
		if f.hash.FirstFailure != "" || f.load.FirstFailure != "" {
			say("%s: first failures: hash-routed %q; load-routed %q", run.name, f.hash.FirstFailure, f.load.FirstFailure)
		}
		p.Stop()
	}
	say("faults: the fast-failing replica took %d requests, the silent one %d connections", fail.Requests.Load(), silent.Accepted.Load())

	peer := got[CaseAllHealthy]
	if bad, all := peer.notOK(); bad > 0 {
		t.Errorf("%s: %d of %d requests not ok with every replica healthy: the peer is broken (first: %s %s)", CaseAllHealthy, bad, all, peer.hash.FirstFailure, peer.load.FirstFailure)
	}
	failedShare := func(tl *Tally) string {
		return fmt.Sprintf("%s (%d of %d)", Pct(tl.Share(tl.Sent-tl.OK)), tl.Sent-tl.OK, tl.Sent)
	}
	ff := got[CaseFastFail]
	Record(Figure{Case: CaseFastFail, What: "failed, load-routed", Value: failedShare(&ff.load), Beside: "all healthy " + failedShare(&peer.load),
		Target: "<= 1% of all", Met: ff.load.Share(ff.load.Sent-ff.load.OK) <= 0.01})
	Record(Figure{Case: CaseFastFail, What: "failed, hash-routed", Value: failedShare(&ff.hash), Beside: "all healthy " + failedShare(&peer.hash),
		Target: "<= 1% of all", Met: ff.hash.Share(ff.hash.Sent-ff.hash.OK) <= 0.01})
	if bad, all := ff.notOK(); float64(bad) > 0.01*float64(all) {
		t.Errorf("%s: %d of %d requests failed with one fast-failing replica of four (load-routed %s, hash-routed %s); target at most 1%%",
			CaseFastFail, bad, all, failedShare(&ff.load), failedShare(&ff.hash))
	}
	si := got[CaseSilent]
	lost := si.hash.Lost + si.load.Lost
	Record(Figure{Case: CaseSilent, What: fmt.Sprintf("lost at a %s client timeout", faultTimeout),
		Value:  fmt.Sprintf("%d of %d (hash %d, load %d)", lost, si.hash.Sent+si.load.Sent, si.hash.Lost, si.load.Lost),
		Beside: fmt.Sprintf("all healthy %d", peer.hash.Lost+peer.load.Lost), Target: "0", Met: lost == 0})
	if lost > 0 {
		t.Errorf("%s: %d of %d requests lost to the silent replica (hash-routed %d, load-routed %d); target 0", CaseSilent, lost, si.hash.Sent+si.load.Sent, si.hash.Lost, si.load.Lost)
	}
}
