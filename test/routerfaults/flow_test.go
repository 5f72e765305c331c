package routerfaults

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/routerfaults/world"
	"github.com/aiinference/operator/test/routingbench"
)

// Flow control under overload, on four simulators: a tenant at its share
// beside one that floods, and sheddable beside critical requests. Both need
// the router's fair queues and shedding (spec.routing.tenantHeader,
// priority, objectives).
const (
	// flowTenantHeader is the model's spec.routing.tenantHeader.
	flowTenantHeader = "X-Tenant"
	// flowWindow is how long each run's requests keep starting.
	flowWindow = 8 * time.Second
	// flowTimeout bounds each request: one not answered by then counts in
	// the TTFT figures as taking flowTimeout.
	flowTimeout = 10 * time.Second
	// flowMinTokens and flowSpreadTokens make the answers' lengths: from 16
	// to 112 tokens, 64 on average, at the profile's 12 ms a token (twice
	// that at a full batch). Answers of one length would end together,
	// batch by batch, and a request would wait for a whole batch to end,
	// which a chat workload's answers of every length do not make it do.
	flowMinTokens    = 16
	flowSpreadTokens = 97
	// flowFlood is how many times its share the flooding tenant sends.
	flowFlood = 10
	// ratioTarget bounds b's TTFT p90 beside the flood over b's alone.
	ratioTarget = 1.2
)

// flowModel is the model on the simulators with fair queues by tenant and
// two objectives: batch (Sheddable) and interactive (Critical).
func flowModel(sims []*routingbench.Sim) world.Model {
	var eps []world.Endpoint
	for _, s := range sims {
		eps = append(eps, SimEndpoint(s))
	}
	m := NewModel("flow", "chat", SimModel, eps...)
	// As a user who sets the engine's batch would: the router holds
	// requests from the first one that finds every batch full.
	m.Object.Spec.Engine.Args = []string{"--max-num-seqs", strconv.Itoa(Profile.MaxNumSeqs)}
	m.Object.Spec.Routing = &servingv1.RoutingSpec{
		Enabled:      true,
		TenantHeader: flowTenantHeader,
		Objectives: []servingv1.RoutingObjective{
			{Name: "batch", Priority: servingv1.PrioritySheddable},
			{Name: "interactive", Priority: servingv1.PriorityCritical},
		},
	}
	return m
}

// flowRequest is one short chat (a prompt shorter than a prefix block: it
// goes to the least loaded replica) from tenant, naming objective if set.
func flowRequest(p *RouterProc, host, tenant, objective string, i int) Request {
	h := http.Header{flowTenantHeader: {tenant}}
	if objective != "" {
		h.Set(servingv1.ObjectiveHeader, objective)
	}
	return Request{URL: p.URL, Host: host, Header: h, Timeout: flowTimeout,
		Body: ChatBody(SimModel, flowMinTokens+i*37%flowSpreadTokens, fmt.Sprintf("Tenant %s, request %d: say something.", tenant, i))}
}

// TestFlowControl: the saturating rate of the four simulators (a closed
// loop that keeps every batch full), then tenant b alone at its share (half
// that rate), then b at its share beside tenant a at ten times its own,
// then sheddable and critical requests each at the saturating rate.
//
// Its figures are timings on four simulators that share two cores with
// the router and the clients: beside the other packages of make test they
// are noise, so it runs under make bench-router-faults (ROUTERFAULTS_FLOW=1).
// The mechanisms are tested in internal/router (TestSheddableIsShedBeforeCritical,
// TestTheFlowQueueServesTenantsInTurnAndCriticalFirst).
func TestFlowControl(t *testing.T) {
	if os.Getenv("ROUTERFAULTS_FLOW") == "" {
		t.Skip("timing figures on simulators: make bench-router-faults runs them (ROUTERFAULTS_FLOW=1)")
	}
	sims := StartSims(t, 4)
	m := flowModel(sims)
	host := HostOf(m)
	w := &world.File{Models: []world.Model{m}}
	client := ClientFrom(ClientA)
	ctx := t.Context()
	idle := func(before string) {
		t.Helper()
		if err := WaitIdle(ctx, sims, 60*time.Second); err != nil {
			t.Fatalf("before %s: %v", before, err)
		}
	}

	// The saturating rate.
	p := StartRouter(t, CaseSaturation, w)
	workers := len(sims)*Profile.MaxNumSeqs + 4
	var satTally Tally
	var sent atomic.Int64
	saturation := ClosedLoop(ctx, workers, 6*time.Second, func() bool {
		r := Send(ctx, client, flowRequest(p, host, "b", "", int(sent.Add(1))))
		satTally.Add(r)
		return r.Outcome == OK
	})
	Line(os.Stdout, CaseSaturation, "%.1f requests/s answered by %d closed-loop clients (%d sims x --max-num-seqs %d, +4); %s; TTFT p50 %s p90 %s",
		saturation, workers, len(sims), Profile.MaxNumSeqs, satTally.String(), Dur(satTally.TTFT(0.5, flowTimeout)), Dur(satTally.TTFT(0.9, flowTimeout)))
	p.Stop()
	if saturation < 2 {
		t.Fatalf("the simulators answered %.1f requests/s: too few to measure against (first failure: %s)", saturation, satTally.FirstFailure)
	}
	share := saturation / 2

	t.Run("TenantBesideAFlood", func(t *testing.T) {
		idle(CaseAlone)
		p := StartRouter(t, CaseAlone, w)
		var alone Tally
		OpenLoop(ctx, share, int(share*flowWindow.Seconds()), func(i int) {
			alone.Add(Send(ctx, client, flowRequest(p, host, "b", "", i)))
		})
		p.Stop()
		aloneP90 := alone.TTFT(0.9, flowTimeout)
		Line(os.Stdout, CaseAlone, "b alone at its share %.1f/s for %s: %s, TTFT p50 %s p90 %s",
			share, flowWindow, alone.String(), Dur(alone.TTFT(0.5, flowTimeout)), Dur(aloneP90))

		idle(CaseFlood)
		p = StartRouter(t, CaseFlood, w)
		var a, b Tally
		done := make(chan struct{})
		go func() {
			defer close(done)
			OpenLoop(ctx, flowFlood*share, int(flowFlood*share*flowWindow.Seconds()), func(i int) {
				a.Add(Send(ctx, client, flowRequest(p, host, "a", "", i)))
			})
		}()
		OpenLoop(ctx, share, int(share*flowWindow.Seconds()), func(i int) {
			b.Add(Send(ctx, client, flowRequest(p, host, "b", "", i)))
		})
		<-done
		besideP90 := b.TTFT(0.9, flowTimeout)
		ratio := float64(besideP90) / float64(max(aloneP90, time.Millisecond))
		Line(os.Stdout, CaseFlood, "b at its share %.1f/s: %s, TTFT p50 %s p90 %s (%.2fx alone); a at %dx its share, %.1f/s: %s, TTFT p90 %s; %s",
			share, b.String(), Dur(b.TTFT(0.5, flowTimeout)), Dur(besideP90), ratio,
			flowFlood, flowFlood*share, a.String(), Dur(a.TTFT(0.9, flowTimeout)), Memory(p))
		met := ratio <= ratioTarget && alone.OK > 0
		Record(Figure{Case: CaseFlood, What: fmt.Sprintf("b's TTFT p90 beside a at %dx", flowFlood), Value: fmt.Sprintf("%s (%.2fx)", Dur(besideP90), ratio),
			Beside: "alone " + Dur(aloneP90), Target: fmt.Sprintf("<= %.1fx alone", ratioTarget), Met: met})
		// The target is a figure to meet, not met yet (docs/router.md says
		// why); what must hold is that b loses nothing to the flood and is
		// answered well within its timeout, where without the fair queues
		// b's p90 is the timeout and half its requests are lost.
		if b.OK != b.Sent || besideP90 > flowTimeout/2 {
			t.Errorf("%s: beside a flooding at %dx its share, b got %s with TTFT p90 %s (%.2fx its %s alone); want every request answered within %s",
				CaseFlood, flowFlood, b.String(), Dur(besideP90), ratio, Dur(aloneP90), flowTimeout/2)
		}
	})

	t.Run("SheddableBeforeCritical", func(t *testing.T) {
		idle(CasePriorities)
		p := StartRouter(t, CasePriorities, w)
		var sheddable, critical Tally
		done := make(chan struct{})
		go func() {
			defer close(done)
			OpenLoop(ctx, saturation, int(saturation*flowWindow.Seconds()), func(i int) {
				sheddable.Add(Send(ctx, client, flowRequest(p, host, "c", "batch", i)))
			})
		}()
		OpenLoop(ctx, saturation, int(saturation*flowWindow.Seconds()), func(i int) {
			critical.Add(Send(ctx, client, flowRequest(p, host, "c", "interactive", i)))
		})
		<-done
		Line(os.Stdout, CasePriorities, "each at %.1f/s (twice the saturating rate in all): sheddable (objective batch): %s, 429 %s, TTFT p90 %s; critical (objective interactive): %s, 429 %s, TTFT p90 %s; %s",
			saturation, sheddable.String(), Pct(sheddable.Share(sheddable.Refused)), Dur(sheddable.TTFT(0.9, flowTimeout)),
			critical.String(), Pct(critical.Share(critical.Refused)), Dur(critical.TTFT(0.9, flowTimeout)), Memory(p))
		met := sheddable.Refused > 0 && critical.Refused == 0
		Record(Figure{Case: CasePriorities, What: "answered 429: sheddable", Value: Pct(sheddable.Share(sheddable.Refused)),
			Beside: "critical " + Pct(critical.Share(critical.Refused)), Target: "sheddable shed, critical not", Met: met})
		if !met {
			t.Errorf("%s: at twice the saturating rate, %d of %d sheddable requests and %d of %d critical ones were answered 429; target: sheddable shed before critical (sheddable %s; critical %s)",
				CasePriorities, sheddable.Refused, sheddable.Sent, critical.Refused, critical.Sent, sheddable.String(), critical.String())
		}
	})
}
