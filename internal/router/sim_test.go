package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/aiinference/operator/internal/ingresspolicy"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// fast is a simulator profile for behaviour tests: short latencies, a cache
// large enough for every prompt.
var fast = routingbench.Profile{Name: "fast", PrefillOverhead: 5 * time.Millisecond, PrefillPerToken: 10 * time.Microsecond,
	InterTokenLatency: 5 * time.Millisecond, MaxNumSeqs: 16, KVCacheBlocks: 4096}

// routerFor serves a router in front of the sims; its URL, directory and registry.
func routerFor(t *testing.T, opts router.Options, sims ...*routingbench.Sim) (string, *routingbench.FixedDirectory, *prometheus.Registry) {
	t.Helper()
	dir := routingbench.NewFixedDirectory("team-a", "chat", sims)
	reg := prometheus.NewRegistry()
	rt := router.New(opts, dir, router.NetworkPolicyCheck{}, router.NewMetrics(reg), logr.Discard())
	return routingbench.ServeRouter(t, rt), dir, reg
}

func completion(prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": routingbench.Model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream, "ignore_eos": true})
	return string(b)
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// metric sums the router's series of a metric whose labels include want.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// A streamed answer reaches the client chunk by chunk, as the engine sends it.
func TestStreamingPassesThroughUnbuffered(t *testing.T) {
	slow := fast
	slow.InterTokenLatency = 100 * time.Millisecond
	sim := routingbench.StartSim(t, "sim-0", slow)
	url, _, _ := routerFor(t, router.Options{}, sim)

	begin := time.Now()
	resp := post(t, context.Background(), url, completion("tell me a story", 20, true))
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	scanner := bufio.NewScanner(resp.Body)
	var first time.Duration
	chunks := 0
	for scanner.Scan() {
		if strings.HasPrefix(scanner.Text(), "data: {") {
			if chunks == 0 {
				first = time.Since(begin)
			}
			chunks++
		}
	}
	total := time.Since(begin)
	if chunks < 10 {
		t.Fatalf("%d chunks, want about 20", chunks)
	}
	// 20 tokens at 100 ms: about 2 s in all; the first must not wait for the rest.
	if first > total/3 {
		t.Errorf("the first chunk came after %s of %s: the answer was buffered", first, total)
	}
}

// A client that goes away ends the request to the replica: the router
// closes its connection to the engine at once. (The simulator keeps
// generating a request whose client left, as its running gauge shows, so the
// connection is watched instead, by a relay in front of the simulator.)
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	slow := fast
	slow.InterTokenLatency = 50 * time.Millisecond
	sim := routingbench.StartSim(t, "sim-0", slow)
	relay := startRelay(t, sim.Addr)
	url, dir, reg := routerFor(t, router.Options{})
	dir.SetEndpoints([]router.Endpoint{{Name: "sim-0", Addr: relay.addr}})

	// Not streamed: no byte comes back for 20 s, so only the client's going
	// away can end the request sooner.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completion("a long answer please", 400, false)))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		errs <- err
	}()
	waitFor(t, func() bool { return relay.open() == 1 }, "the router connects to the replica")
	time.Sleep(300 * time.Millisecond)
	cancel()
	if err := <-errs; err == nil {
		t.Fatal("the request ended before its client went away")
	}
	gone := time.Now()
	for relay.open() != 0 {
		if time.Since(gone) > 5*time.Second {
			t.Fatal("the router still holds its connection to the replica 5 s after the client went away (the answer takes 20 s)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the router closed its connection to the replica %s after the client went away", time.Since(gone).Round(time.Millisecond))
	waitFor(t, func() bool {
		return metric(t, reg, "aiinference_router_in_flight_requests", map[string]string{"endpoint": "sim-0"}) == 0
	}, "the router counts no request in flight")
}

// relay passes TCP connections on to a server and counts those open.
type relay struct {
	addr string
	mu   sync.Mutex
	n    int
}

func (r *relay) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func startRelay(t *testing.T, to string) *relay {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	r := &relay{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp4", to)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			r.n++
			r.mu.Unlock()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
			go func() {
				_, _ = io.Copy(out, in) // ends when the router closes its side
				_ = out.Close()
				r.mu.Lock()
				r.n--
				r.mu.Unlock()
			}()
		}
	}()
	return r
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A replica that refuses connections costs no request: each is sent to
// another before any byte reaches the client.
func TestRefusedConnectionIsTriedOnAnother(t *testing.T) {
	sim := routingbench.StartSim(t, "sim-0", fast)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	_ = l.Close() // nothing listens there: connections are refused
	url, dir, reg := routerFor(t, router.Options{}, sim)
	dir.SetEndpoints([]router.Endpoint{{Name: "dead-0", Addr: deadAddr}, routingbench.EndpointOf(sim)})

	for i := range 20 {
		resp := post(t, context.Background(), url, completion(fmt.Sprintf("question %d: %s", i, strings.Repeat("words ", 100)), 4, false))
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: HTTP %d: %s", i, resp.StatusCode, b)
		}
	}
	if refused := metric(t, reg, "aiinference_router_upstream_errors_total", map[string]string{"endpoint": "dead-0", "kind": "refused"}); refused == 0 {
		t.Error("no request was picked for the dead replica: the test proves nothing")
	}
	if retries := metric(t, reg, "aiinference_router_picks_total", map[string]string{"endpoint": "sim-0", "reason": router.ReasonRetry}); retries == 0 {
		t.Error("no pick with reason retry")
	}
}

// While no replica serves, requests wait (the autoscaler reads how many);
// past the bound they are refused at once with Retry-After; once a replica
// serves, those that waited are answered.
func TestRequestsWaitForAReplicaWithinTheBound(t *testing.T) {
	sim := routingbench.StartSim(t, "sim-0", fast)
	url, dir, reg := routerFor(t, router.Options{MaxWaiting: 2, HoldTimeout: 20 * time.Second, Poll: 20 * time.Millisecond})
	dir.SetEndpoints(nil)

	codes := make(chan int, 2)
	for i := range 2 {
		go func() {
			resp := post(t, context.Background(), url, completion(fmt.Sprintf("held %d", i), 4, false))
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitFor(t, func() bool {
		return metric(t, reg, "aiinference_router_waiting_requests", map[string]string{"name": "chat"}) == 2
	}, "two requests wait")
	resp := post(t, context.Background(), url, completion("one too many", 4, false))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("past the bound: HTTP %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	dir.SetSims([]*routingbench.Sim{sim})
	for range 2 {
		select {
		case code := <-codes:
			if code != http.StatusOK {
				t.Errorf("a held request was answered %d, want 200 once a replica serves", code)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a held request was not answered 10 s after a replica served")
		}
	}
}

// Requests that share a long prefix meet on one simulator, which counts the
// hits; sent round robin the same requests spread over all three.
func TestASharedPrefixLandsOnOneReplica(t *testing.T) {
	sims := routingbench.StartSims(t, 3, fast)
	url, _, reg := routerFor(t, router.Options{}, sims...)
	system := "You are a support assistant. " + strings.Repeat("Answer from the manual, kindly and briefly. ", 60)
	ctx := context.Background()
	for i := range 12 {
		resp := post(t, ctx, url, completion(fmt.Sprintf("%sQuestion %d: why?", system, i), 4, false))
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
		}
	}
	served := 0
	var hits, queries float64
	for _, s := range sims {
		c, err := s.ReadCounters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.Requests > 0 {
			served++
		}
		hits += c.PrefixHits
		queries += c.PrefixQueries
	}
	if served != 1 {
		t.Errorf("12 requests sharing a prefix were served by %d simulators, want 1", served)
	}
	if share := hits / queries; share < 0.8 {
		t.Errorf("the simulators' prefix hit share is %.2f, want at least 0.8 (11 of 12 requests find the prefix)", share)
	}
	estimated := metric(t, reg, "aiinference_router_prefix_hit_blocks_total", nil) / metric(t, reg, "aiinference_router_prefix_blocks_total", nil)
	t.Logf("prefix hit share: simulators %.2f, router's estimate %.2f", hits/queries, estimated)
}

// The router lets through only the clients a model's spec.networkPolicy
// lets reach its pods, as the NetworkPolicy would: the test's client (at
// 127.0.0.1) is a pod labelled role=frontend of namespace team-a.
func TestTheRouterAppliesTheModelsNetworkPolicy(t *testing.T) {
	sim := routingbench.StartSim(t, "sim-0", fast)
	dir := routingbench.NewFixedDirectory("team-a", "chat", []*routingbench.Sim{sim})
	clientPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "frontend", Labels: map[string]string{"role": "frontend"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{corev1.LabelMetadataName: "team-a"}}}
	pods := fake.NewClientBuilder().WithObjects(clientPod, ns).WithIndex(&corev1.Pod{}, "status.podIP", func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Status.PodIP}
	}).Build()
	rt := router.New(router.Options{}, dir, router.NetworkPolicyCheck{Clients: ingresspolicy.Lookup{Reader: pods}}, nil, logr.Discard())
	url := routingbench.ServeRouter(t, rt)
	for _, tc := range []struct {
		name string
		from []networkingv1.NetworkPolicyPeer
		want int
	}{
		{"no peer", nil, http.StatusForbidden},
		{"another role", []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "admin"}}}}, http.StatusForbidden},
		{"another namespace, any pod", []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "team-b"}}}}, http.StatusForbidden},
		{"the client's role", []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "frontend"}}}}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir.EnableNetworkPolicy(tc.from...)
			before, _ := sim.ReadCounters(context.Background())
			resp := post(t, context.Background(), url, completion("let me in", 4, false))
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("HTTP %d, want %d", resp.StatusCode, tc.want)
			}
			// The simulator counts a request a moment after it answers: wait
			// for the one let through, and as long for one that must not come.
			want := 0.0
			if tc.want == http.StatusOK {
				want = 1
			}
			var served float64
			for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				after, _ := sim.ReadCounters(context.Background())
				if served = after.Requests - before.Requests; want == 1 && served == 1 {
					break
				}
			}
			if served != want {
				t.Errorf("the simulator served %v requests, want %v", served, want)
			}
		})
	}
}

// Bodies are bounded before they are read: too large is 413, past the
// count of bodies held is 429, a body that trickles past the read timeout is 408.
func TestBodiesAreBounded(t *testing.T) {
	url, _, _ := routerFor(t, router.Options{MaxBodyBytes: 1 << 10, MaxBodies: 1, BodyReadTimeout: 300 * time.Millisecond, HoldTimeout: 200 * time.Millisecond})
	resp := post(t, context.Background(), url, completion(strings.Repeat("x", 2<<10), 4, false))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 KiB body over a 1 KiB bound: HTTP %d, want 413", resp.StatusCode)
	}

	// A slow body holds the only slot.
	host := strings.TrimPrefix(url, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, _ = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: chat\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	time.Sleep(50 * time.Millisecond)
	resp = post(t, context.Background(), url, completion("second", 4, false))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a second body while the only slot is held: HTTP %d, want 429 with Retry-After", resp.StatusCode)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the trickled body got no answer: %v", err)
	}
	if answer.StatusCode != http.StatusRequestTimeout {
		t.Errorf("a body not sent within the read timeout: HTTP %d, want 408", answer.StatusCode)
	}
	resp = post(t, context.Background(), url, completion("third", 4, false))
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		t.Errorf("the slot was not given back after the timeout: HTTP 429 %s", bytes.TrimSpace(b))
	}
}

// A streaming request that waits for a replica gets its headers and a
// comment at once, comments while it waits, then the replica's events.
func TestAStreamWaitingForAReplicaIsKeptAlive(t *testing.T) {
	sim := routingbench.StartSim(t, "sim-0", fast)
	url, dir, _ := routerFor(t, router.Options{HoldTimeout: 20 * time.Second, Poll: 20 * time.Millisecond, Keepalive: 100 * time.Millisecond})
	dir.SetEndpoints(nil)

	begin := time.Now()
	resp := post(t, context.Background(), url, completion("held while the model starts", 5, true))
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HTTP %d %q, want 200 text/event-stream at once", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if waited := time.Since(begin); waited > 2*time.Second {
		t.Errorf("headers after %s", waited)
	}
	reader := bufio.NewReader(resp.Body)
	comments := 0
	for comments < 3 {
		line, err := reader.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ":") {
			comments++
		}
	}
	dir.SetSims([]*routingbench.Sim{sim})
	rest, err := io.ReadAll(reader)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(rest), "data: {"); n < 5 || !strings.Contains(string(rest), "data: [DONE]") {
		t.Errorf("after the replica came, %d events and no [DONE]:\n%s", n, rest)
	}
}
