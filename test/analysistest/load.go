package analysistest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Pod is a simulated model-server pod: a simulator with an HTTP-metrics proxy in
// front, under a namespace and pod name that Prometheus labels its series with.
type Pod struct {
	Namespace, Name string
	// Addr is the proxy: send requests here, and Prometheus scrapes it.
	Addr string
	// Sim is the simulator behind it, to change while it runs.
	Sim *Sim
}

// PodSpec names a pod to start and configures its simulator.
type PodSpec struct {
	Namespace, Name string
	Sim             SimOptions
}

// StartPod starts a simulator and its HTTP-metrics proxy.
func StartPod(t testing.TB, namespace, name string, opts SimOptions) *Pod {
	t.Helper()
	return StartPods(t, PodSpec{Namespace: namespace, Name: name, Sim: opts})[0]
}

// StartPods starts the simulators of several pods at once, with their proxies,
// and waits until every simulator answers.
func StartPods(t testing.TB, specs ...PodSpec) []*Pod {
	t.Helper()
	sims := make([]*Sim, 0, len(specs))
	for _, spec := range specs {
		sims = append(sims, launchSim(t, spec.Sim))
	}
	pods := make([]*Pod, 0, len(specs))
	for i, spec := range specs {
		sims[i].waitHealthy(t) // its address is known once it serves
		proxy := StartHTTPMetricsProxy(t, sims[i].Addr)
		pods = append(pods, &Pod{Namespace: spec.Namespace, Name: spec.Name, Addr: proxy.Addr, Sim: sims[i]})
	}
	return pods
}

// TargetsOf are the scrape targets of pods.
func TargetsOf(pods ...*Pod) []ScrapeTarget {
	out := make([]ScrapeTarget, 0, len(pods))
	for _, p := range pods {
		out = append(out, ScrapeTarget{Addr: p.Addr, Namespace: p.Namespace, Pod: p.Name})
	}
	return out
}

// Prompt is what the load sends: echo mode answers it back, eight tokens, so
// each request has seven inter-token latencies.
const Prompt = "one two three four five six seven eight"

// Load sends completions to pods at a steady rate until stopped.
type Load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// ok and failed count the answers: 2xx and the rest (or no answer).
	ok, failed atomic.Int64
}

// StartLoad sends perPodPerSecond completions a second to each pod, each request
// on its own so a slow pod does not slow the rate, until Stop or the test's end.
func StartLoad(t testing.TB, perPodPerSecond float64, pods ...*Pod) *Load {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cancel: cancel}
	client := &http.Client{Timeout: 10 * time.Second}
	every := time.Duration(float64(time.Second) / perPodPerSecond)
	for _, p := range pods {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			// At most this many requests in flight per pod: a stuck pod does not
			// pile up goroutines.
			inflight := make(chan struct{}, 64)
			var reqs sync.WaitGroup
			defer reqs.Wait()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				select {
				case inflight <- struct{}{}:
				default:
					l.failed.Add(1)
					continue
				}
				reqs.Add(1)
				go func() {
					defer reqs.Done()
					defer func() { <-inflight }()
					if complete(ctx, client, p) == nil {
						l.ok.Add(1)
					} else if ctx.Err() == nil {
						l.failed.Add(1)
					}
				}()
			}
		}()
	}
	t.Cleanup(l.Stop)
	return l
}

// Stop stops sending and waits for the requests in flight.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}

// Counts are the requests answered with 2xx, and the others.
func (l *Load) Counts() (ok, failed int64) { return l.ok.Load(), l.failed.Load() }

// Send sends n completions to a pod, one after the other, and returns how many
// were answered with 2xx.
func Send(t testing.TB, pod *Pod, n int) int {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	ok := 0
	for range n {
		if complete(context.Background(), client, pod) == nil {
			ok++
		}
	}
	return ok
}

// complete sends one completion to a pod.
func complete(ctx context.Context, client *http.Client, pod *Pod) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":16}`, pod.Sim.Model, Prompt)
	code, out, err := post(ctx, client, "http://"+pod.Addr+"/v1/completions", body)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return fmt.Errorf("%d %.200s", code, out)
	}
	return nil
}
