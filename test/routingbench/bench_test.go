package routingbench

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/aiinference/operator/internal/router"
)

// The bench of `make bench-routing` (ROUTING_BENCH=1): a chat workload kept in
// testdata, sent at a sweep of rates from light to past saturation, round
// robin over the replicas (as a Service's kube-proxy spreads connections) and
// through the router, each on fresh simulators; the bound no routing can
// beat; and the router's own cost.

// benchEnv asks for the bench; without it the bench is skipped (it takes
// minutes and most of the machine).
const benchEnv = "ROUTING_BENCH"

var updateWorkload = flag.Bool("update-workload", false, "write testdata/chat-sweep.json from benchWorkload")

// TestBenchWorkloadIsCurrent keeps testdata/chat-sweep.json the generator's
// output (-update-workload rewrites it).
func TestBenchWorkloadIsCurrent(t *testing.T) {
	want, err := json.MarshalIndent(benchWorkload(), "", " ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *updateWorkload {
		if err := os.WriteFile(SweepFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(SweepFile)
	if err != nil {
		t.Fatalf("%v (go test ./test/routingbench -run TestBenchWorkloadIsCurrent -update-workload writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what the generator makes; rewrite it with -update-workload", SweepFile)
	}
}

// TestBenchRouting prints, side by side, round robin and the router at each
// rate of the sweep, the bound, and the router's cost.
func TestBenchRouting(t *testing.T) {
	if os.Getenv(benchEnv) != "1" {
		t.Skipf("set %s=1 (make bench-routing) to run the routing bench", benchEnv)
	}
	const replicas = 4
	profile := H100Llama8B
	points := LoadSweep(t, SweepFile)
	ctx := context.Background()
	out := os.Stdout

	measure := func(name string, sims []*Sim, targets []string, p SweepPoint) Summary {
		s, err := Measure(ctx, out, name, sims, RunOptions{Targets: targets}, p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	urls := func(sims []*Sim) []string {
		var u []string
		for _, s := range sims {
			u = append(u, "http://"+s.Addr)
		}
		return u
	}
	stop := func(sims []*Sim) {
		for _, s := range sims {
			s.Stop()
		}
	}

	fmt.Fprintf(out, "routing bench: %d replicas of %s\n", replicas, profile)
	PrintWorkload(out)

	// Round robin, then the router, each on fresh simulators through the
	// whole sweep (the caches carry from one rate to the next, as in a
	// cluster that keeps serving).
	sims := StartSims(t, replicas, profile)
	var roundRobin []Summary
	for _, p := range points {
		roundRobin = append(roundRobin, measure(fmt.Sprintf("round robin %.1f/s", p.Rate), sims, urls(sims), p))
	}
	stop(sims)
	sims = StartSims(t, replicas, profile)
	rt := router.New(router.Options{}, NewFixedDirectory("bench", "chat", sims), router.NetworkPolicyCheck{}, nil, logr.Discard())
	routerURL := ServeRouter(t, rt)
	var routed []Summary
	for _, p := range points {
		routed = append(routed, measure(fmt.Sprintf("router %.1f/s", p.Rate), sims, []string{routerURL}, p))
	}
	stop(sims)

	// The bound: one simulator with every request and the cache (and batch)
	// of all replicas together. Only its hit share counts.
	big := profile
	big.KVCacheBlocks *= replicas
	big.MaxNumSeqs *= replicas
	one := StartSims(t, 1, big)
	var bound []Summary
	for _, p := range points {
		bound = append(bound, measure(fmt.Sprintf("bound %.1f/s", p.Rate), one, urls(one), p))
	}
	stop(one)

	for i, p := range points {
		PrintTable(out, fmt.Sprintf("\nrouting figure: %.1f conversations/s (%d requests)", p.Rate, roundRobin[i].Requests), roundRobin[i], routed[i], bound[i])
	}
	saturating := AtSaturation(out, "round robin", points, roundRobin, routed, bound)
	for i := range points[:saturating] {
		if routed[i].Failed > 0 {
			t.Errorf("%.1f/s, below saturation: the router failed %d requests", points[i].Rate, routed[i].Failed)
		}
	}

	cost := measureRouterCost(t)
	fmt.Fprintf(out, "routing figure: the router's cost at low load (%d sequential one-token completions each way, simulator without latency): direct p50 %s p99 %s, through the router p50 %s p99 %s: added p50 %s (target 1ms), p99 %s (target 5ms)\n",
		cost.sequential, cost.direct.p50, cost.direct.p99, cost.routed.p50, cost.routed.p99, cost.routed.p50-cost.direct.p50, cost.routed.p99-cost.direct.p99)
	fmt.Fprintf(out, "routing figure: the router's throughput: %d requests by %d clients took %.2f CPU-s more through the router than direct: %.0f requests/s per router core; heap in use after them %.1f MiB\n",
		cost.burst, cost.clients, cost.routerCPU.Seconds(), float64(cost.burst)/max(cost.routerCPU.Seconds(), 1e-9), float64(cost.heap)/(1<<20))
}

type latencies struct{ p50, p99 time.Duration }

type routerCost struct {
	sequential, burst, clients int
	direct, routed             latencies
	routerCPU                  time.Duration
	heap                       uint64
}

// measureRouterCost times one-token completions to a simulator without
// latency, directly and through the router: one at a time for the latency the
// router adds, then many at once for the CPU it spends per request (this
// process's CPU time through the router less the same load sent direct: the
// load generator's share cancels out).
func measureRouterCost(t *testing.T) routerCost {
	c := routerCost{sequential: 500, burst: 4000, clients: 16}
	fast := Profile{Name: "no latency", MaxNumSeqs: 256, KVCacheBlocks: 1024, TimeFactorUnderLoad: 1}
	sims := StartSims(t, 1, fast)
	defer sims[0].Stop()
	rt := router.New(router.Options{}, NewFixedDirectory("bench", "cost", sims), router.NetworkPolicyCheck{}, nil, logr.Discard())
	routerURL := ServeRouter(t, rt)
	direct := "http://" + sims[0].Addr
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	body, _ := json.Marshal(map[string]any{"model": Model, "prompt": "How long does routing take?", "max_tokens": 1})
	send := func(base string) (time.Duration, error) {
		begin := time.Now()
		resp, err := client.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return time.Since(begin), nil
	}
	sequential := func(base string) latencies {
		var ds []time.Duration
		for range 50 { // warm the connections
			if _, err := send(base); err != nil {
				t.Fatal(err)
			}
		}
		for range c.sequential {
			d, err := send(base)
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return latencies{ds[len(ds)/2], ds[len(ds)*99/100]}
	}
	// Interleaved rounds, so a slower moment of the machine hits both alike.
	var d, r []latencies
	for range 3 {
		d = append(d, sequential(direct))
		r = append(r, sequential(routerURL))
	}
	c.direct, c.routed = medianOf(d), medianOf(r)

	burst := func(base string) time.Duration {
		cpuBefore := processCPU(t)
		var wg sync.WaitGroup
		per := c.burst / c.clients
		for range c.clients {
			wg.Go(func() {
				for range per {
					if _, err := send(base); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return processCPU(t) - cpuBefore
	}
	directCPU := burst(direct)
	routedCPU := burst(routerURL)
	c.routerCPU = routedCPU - directCPU
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	c.heap = m.HeapInuse
	return c
}

func medianOf(ls []latencies) latencies {
	p50s, p99s := make([]time.Duration, len(ls)), make([]time.Duration, len(ls))
	for i, l := range ls {
		p50s[i], p99s[i] = l.p50, l.p99
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	return latencies{p50s[len(ls)/2], p99s[len(ls)/2]}
}

// processCPU is this process's user and system CPU time so far.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
