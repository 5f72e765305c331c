package routingbench

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/aiinference/operator/internal/router"
)

// TestCompareRouting sends one prefix-heavy chat workload to four simulators
// round robin, then through the router (fresh simulators each time, so both
// start with empty caches), and prints the figures side by side.
func TestCompareRouting(t *testing.T) {
	const replicas = 4
	profile := H100Llama8B
	convs := Generate(WorkloadOptions{Seed: 1})
	run := RunOptions{Rate: 4, MaxConcurrent: 32}
	ctx := context.Background()

	measure := func(name string, sims []*Sim, targets []string) Summary {
		before, err := ReadAll(ctx, sims)
		if err != nil {
			t.Fatal(err)
		}
		run.Targets = targets
		res := Run(ctx, convs, run)
		after, err := ReadAll(ctx, sims)
		if err != nil {
			t.Fatal(err)
		}
		if res.Failed > 0 {
			t.Errorf("%s: %d of %d requests failed, first: %s", name, res.Failed, res.Requests, res.FirstError)
		}
		return Summarize(name, res, after.Sub(before))
	}

	sims := StartSims(t, replicas, profile)
	var direct []string
	for _, s := range sims {
		direct = append(direct, "http://"+s.Addr)
	}
	roundRobin := measure("round robin", sims, direct)
	for _, s := range sims {
		s.Stop()
	}

	sims = StartSims(t, replicas, profile)
	rt := router.New(router.Options{}, NewFixedDirectory("bench", "chat", sims), router.NetworkPolicyCheck{}, nil, logr.Discard())
	url := ServeRouter(t, rt)
	routed := measure("router", sims, []string{url})

	PrintTable(os.Stdout, "Workload: 6 tenants x 6 conversations x 3 turns, system prompt 1200 words, turn 120 words, 24 output tokens, 4 conversations/s; "+
		"4 replicas of "+profile.String(), roundRobin, routed)
	if routed.HitShare <= roundRobin.HitShare {
		t.Errorf("the router's prefix hit share %.1f%% is not above round robin's %.1f%%", 100*routed.HitShare, 100*roundRobin.HitShare)
	}
}
