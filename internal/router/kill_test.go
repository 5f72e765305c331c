package router_test

import (
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

	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// shot is one request of a load and what its client saw.
type shot struct {
	n      int
	url    string
	stream bool
	// start and end are when it was sent and when it ended.
	start, end time.Time
	status     int
	// endpoint is the replica the router names on the answer (router.EndpointHeader).
	endpoint string
	// closed tells an answer that closed its connection (Connection: close).
	closed bool
	// session is the request's X-Session-ID, if any.
	session string
	// err is what went wrong: no answer, an answer that broke off, or not a whole completion.
	err error
}

func (s shot) ok() bool { return s.err == nil }

func (s shot) String() string {
	kind := "non-streaming"
	if s.stream {
		kind = "streaming"
	}
	return fmt.Sprintf("request %d (%s, to %s, endpoint %q, HTTP %d): %v", s.n, kind, s.url, s.endpoint, s.status, s.err)
}

// kind is a request of the load: streamed or not, and its answer's length.
type kind struct {
	stream    bool
	maxTokens int
}

// load sends requests at a steady rate for a while, each to the URL to(n)
// names when it is sent, with the kind of(n); what each client saw, once all ended.
func load(t *testing.T, perSecond int, d time.Duration, to func(n int) string, of func(n int) kind) []shot {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	count := int(d.Seconds() * float64(perSecond))
	shots := make([]shot, count)
	var wg sync.WaitGroup
	begin := time.Now()
	for n := range count {
		time.Sleep(time.Until(begin.Add(time.Duration(n) * time.Second / time.Duration(perSecond))))
		k := of(n)
		shots[n] = shot{n: n, url: to(n), stream: k.stream, start: time.Now()}
		wg.Go(func() {
			s := &shots[n]
			// Prompts longer than a block, each its own first block: they
			// spread over the replicas by the hash ring.
			prompt := fmt.Sprintf("request %d: %s", n, strings.Repeat("tell me about the weather ", 12))
			s.err = send(client, s, completion(prompt, k.maxTokens, k.stream))
			s.end = time.Now()
		})
	}
	wg.Wait()
	return shots
}

// send sends one request and reads its whole answer.
func send(client *http.Client, s *shot, body string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.session != "" {
		req.Header.Set(router.DefaultSessionHeader, s.session)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	s.status, s.endpoint, s.closed = resp.StatusCode, resp.Header.Get(router.EndpointHeader), resp.Close
	answer, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("the answer broke off after %d bytes: %w", len(answer), err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, answer)
	case s.stream:
		if !strings.Contains(string(answer), "data: [DONE]") {
			return fmt.Errorf("a stream without [DONE]: %q", answer)
		}
	default:
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.Unmarshal(answer, &c); err != nil || len(c.Choices) == 0 {
			return fmt.Errorf("not a completion: %q", answer)
		}
	}
	return nil
}

// A replica killed under load (SIGKILL: its node failed, or it ran out of
// memory) fails only the streams it was answering: those whose answer had
// begun. A request it held but had not begun to answer (its connection breaks
// before any byte) is sent again to another replica; one picked for it after
// it died, before the directory drops it as the EndpointSlice would, has its
// connection refused and goes to another; every request after the kill is
// answered in full. Besides the load, two long requests are pinned on the
// replica before it is killed (by a session the ring gives it): a stream it
// has begun, which must break off, and an answer in one piece it has not
// begun, which must come whole from another replica.
func TestKillingAReplicaFailsOnlyTheAnswersItHadBegun(t *testing.T) {
	profile := fast
	profile.InterTokenLatency = 10 * time.Millisecond
	sims := routingbench.StartSims(t, 3, profile)
	url, dir, reg := routerFor(t, router.Options{}, sims...)
	victim := sims[1]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	// A session the hash ring gives the victim: a prompt shorter than a
	// block goes to its session's owner.
	session := ""
	for i := 0; session == "" && i < 100; i++ {
		probe := shot{url: url, session: fmt.Sprintf("session-%d", i)}
		if err := send(client, &probe, completion("which replica?", 1, false)); err != nil {
			t.Fatal(err)
		}
		if probe.endpoint == victim.Name {
			session = probe.session
		}
	}
	if session == "" {
		t.Fatalf("no session of 100 goes to %s", victim.Name)
	}
	// 300 tokens: 3 s, well past the kill.
	pinned := []shot{{n: -1, url: url, session: session, stream: true}, {n: -2, url: url, session: session}}
	var pinnedDone sync.WaitGroup
	for i := range pinned {
		pinned[i].start = time.Now()
		pinnedDone.Go(func() {
			p := &pinned[i]
			p.err = send(client, p, completion("a long answer, please", 300, p.stream))
			p.end = time.Now()
		})
	}

	var killAt, killedAt time.Time
	var refusedBeforeDrop, brokenAtKill float64
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		time.Sleep(1500 * time.Millisecond)
		killAt = time.Now()
		victim.Kill()
		killedAt = time.Now()
		// The EndpointSlice drops the dead pod a moment later.
		time.Sleep(500 * time.Millisecond)
		errs := func(kind string) float64 {
			return metric(t, reg, "aiinference_router_upstream_errors_total", map[string]string{"endpoint": victim.Name, "kind": kind})
		}
		refusedBeforeDrop, brokenAtKill = errs("refused"), errs("broken")
		dir.SetSims([]*routingbench.Sim{sims[0], sims[2]})
	}()
	// 30 requests a second for 4 s, streams and answers in one piece of 40
	// tokens (0.4 s): each replica holds some of each at any time.
	shots := load(t, 30, 4*time.Second, func(int) string { return url }, func(n int) kind {
		return kind{stream: n%2 == 0, maxTokens: 40}
	})
	<-killed
	pinnedDone.Wait()

	var held, failed, after int
	for _, s := range append(shots, pinned...) {
		// Held by the victim when it died: it was answering (it named
		// itself) and the request was still open.
		wasHeld := s.endpoint == victim.Name && s.status == http.StatusOK && s.start.Before(killedAt) && s.end.After(killAt)
		if wasHeld {
			held++
		}
		if s.start.After(killedAt) {
			after++
		}
		if s.ok() {
			continue
		}
		failed++
		if !wasHeld {
			t.Errorf("%s; only an answer the killed replica had begun may fail", s)
		}
	}
	t.Logf("%d requests, %d after the kill; %d answers the killed replica had begun were open at the kill, %d failed; "+
		"%d requests it held unanswered were sent again, %d picked for it once dead were refused",
		len(shots)+len(pinned), after, held, failed, int(brokenAtKill), int(refusedBeforeDrop))
	if stream := pinned[0]; stream.ok() || stream.endpoint != victim.Name {
		t.Errorf("the stream pinned on the killed replica: endpoint %q, error %v; want a stream it had begun, broken off", stream.endpoint, stream.err)
	}
	if whole := pinned[1]; !whole.ok() || whole.endpoint == victim.Name {
		t.Errorf("the answer in one piece pinned on the killed replica: endpoint %q, error %v; want it whole from another replica", whole.endpoint, whole.err)
	}
	if brokenAtKill == 0 || refusedBeforeDrop == 0 {
		t.Error("no request held unanswered by the killed replica was sent again, or none picked for it once dead was refused: the test proves nothing of that")
	}
}

// podListener is a router pod's listening socket; when its process exits,
// every connection it accepted closes with it.
type podListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *podListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *podListener) exit() {
	_ = l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}

// routerPod serves a router as a pod's process does: sigterm ends Serve's
// context, and once Serve returns the process exits (exited is closed,
// exitedAt set).
type routerPod struct {
	url      string
	sigterm  context.CancelFunc
	exited   chan struct{}
	exitedAt time.Time
}

func startRouterPod(t *testing.T, rt *router.Router) *routerPod {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl := &podListener{Listener: l}
	ctx, cancel := context.WithCancel(context.Background())
	p := &routerPod{url: "http://" + l.Addr().String(), sigterm: cancel, exited: make(chan struct{})}
	go func() {
		_ = rt.Serve(ctx, pl)
		p.exitedAt = time.Now()
		pl.exit()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cancel()
		_ = l.Close()
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			t.Error("the router did not stop within 15 s")
		}
	})
	return p
}

// Two router pods share the load and nothing else. One is stopped under load
// (SIGTERM, as a rollout or a scale-down does): for its drain delay it still
// answers the requests that reach it while its endpoint leaves the Service,
// each on a connection it then closes; it finishes what it holds, streams
// included, within its shutdown bound, and cuts only what is still open then.
// Every request to the other router is answered.
func TestStoppingARouterFailsOnlyWhatItHeldPastItsBound(t *testing.T) {
	sims := routingbench.StartSims(t, 3, fast)
	dir := routingbench.NewFixedDirectory("team-a", "chat", sims)
	const drainDelay, shutdownTimeout = 500 * time.Millisecond, time.Second
	stopped := startRouterPod(t, router.New(router.Options{DrainDelay: drainDelay, ShutdownTimeout: shutdownTimeout},
		dir, router.NetworkPolicyCheck{}, router.NewMetrics(prometheus.NewRegistry()), logr.Discard()))
	other := startRouterPod(t, router.New(router.Options{}, dir, router.NetworkPolicyCheck{}, router.NewMetrics(prometheus.NewRegistry()), logr.Discard()))

	var mu sync.Mutex
	var stopAt, goneAt time.Time
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		time.Sleep(1500 * time.Millisecond)
		mu.Lock()
		stopAt = time.Now()
		mu.Unlock()
		stopped.sigterm()
		// Its endpoint leaves the Service a moment later: new requests go to the other.
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		goneAt = time.Now()
		mu.Unlock()
	}()
	// 30 requests a second for 3 s, every other to each router while both
	// are in the Service: streams of 400 tokens (2 s and more, past the
	// shutdown bound), streams of 30 tokens, answers of 20 tokens in one piece.
	shots := load(t, 30, 3*time.Second, func(n int) string {
		mu.Lock()
		defer mu.Unlock()
		if n%2 == 0 && goneAt.IsZero() {
			return stopped.url
		}
		return other.url
	}, func(n int) kind {
		switch n % 3 {
		case 0:
			return kind{stream: true, maxTokens: 400}
		case 1:
			return kind{stream: true, maxTokens: 30}
		}
		return kind{maxTokens: 20}
	})
	<-gone
	select {
	case <-stopped.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the stopped router's Serve did not return")
	}

	bound := stopAt.Add(drainDelay + shutdownTimeout)
	// Slack for a loaded machine: the bound only has to hold well before the long streams' end.
	if took := stopped.exitedAt.Sub(stopAt); took < drainDelay || took > drainDelay+shutdownTimeout+3*time.Second {
		t.Errorf("the stopped router exited %s after the stop; want its drain delay and at most its shutdown timeout (%s, %s)", took, drainDelay, shutdownTimeout)
	}
	var drained, inDelay, cut, toOther int
	for _, s := range shots {
		switch {
		case s.url == other.url:
			toOther++
			if !s.ok() {
				t.Errorf("%s; every request to the router that was not stopped must be answered", s)
			}
			continue
		case s.start.After(stopAt):
			inDelay++
			if s.status != 0 && !s.closed {
				t.Errorf("request %d, sent to the stopped router in its drain delay, was answered on a connection left open", s.n)
			}
		case s.end.After(stopAt):
			drained++
		}
		if s.ok() {
			continue
		}
		cut++
		// Held past the bound: sent before the listener closed and still open when the bound ran out.
		if !s.start.Before(stopAt.Add(drainDelay)) || s.end.Before(bound) {
			t.Errorf("%s (sent %s after the stop, ended %s after it); only a request still in flight at the bound (%s) may fail",
				s, s.start.Sub(stopAt).Round(time.Millisecond), s.end.Sub(stopAt).Round(time.Millisecond), drainDelay+shutdownTimeout)
		}
	}
	t.Logf("%d requests to the other router; to the stopped one: %d in flight at the stop, %d sent in its drain delay, %d cut at its bound; it exited %s after the stop",
		toOther, drained, inDelay, cut, stopped.exitedAt.Sub(stopAt).Round(time.Millisecond))
	if drained == 0 || inDelay == 0 {
		t.Error("no request was in flight on the stopped router at the stop, or none reached it in its drain delay: the test proves nothing")
	}
	if cut == 0 {
		t.Error("no stream outlived the shutdown bound: the bound is not shown to hold")
	}
}
