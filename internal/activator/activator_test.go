package activator

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aiinference/operator/internal/frontdoor"
)

var model = types.NamespacedName{Namespace: "ml", Name: "llm"}

// stubResolver stands in for the cluster: models whose backend appears when
// the test sets it, and clients refused when the test says so.
type stubResolver struct {
	mu       sync.Mutex
	backend  string
	refused  bool
	admitted []types.NamespacedName
}

func (s *stubResolver) Admit(_ context.Context, key types.NamespacedName, _ net.IP) (bool, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.admitted = append(s.admitted, key)
	return !s.refused, "the network policy of " + key.String() + " does not let this client in", nil
}

func (s *stubResolver) Readmit(ctx context.Context, key types.NamespacedName, ip net.IP) (bool, string, error) {
	return s.Admit(ctx, key, ip)
}

func (s *stubResolver) Backend(context.Context, types.NamespacedName) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend, nil
}

func (s *stubResolver) set(backend string) {
	s.mu.Lock()
	s.backend = backend
	s.mu.Unlock()
}

// start runs an activator with the model's port open, and says its URL.
func start(t *testing.T, opts Options) (*Activator, *stubResolver, string, *atomic.Int32) {
	t.Helper()
	res := &stubResolver{}
	woken := &atomic.Int32{}
	opts.BindAddress = "127.0.0.1:0"
	a := New(opts, res, func(types.NamespacedName) { woken.Add(1) }, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, res, open(t, a, model), woken
}

func open(t *testing.T, a *Activator, key types.NamespacedName) string {
	t.Helper()
	port, err := a.Open(key)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

func send(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Host = "llm.ml.svc:8000"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(data)
}

// An engine that echoes the request's path and body.
func engine(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "served "+r.URL.Path+" "+string(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestAHeldRequestIsServedOnceAReplicaServes(t *testing.T) {
	a, res, url, woken := start(t, Options{})
	backend := engine(t)
	go func() {
		for a.Held(model) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		res.set(backend)
	}()
	begin := time.Now()
	resp, body := send(t, url, `{"model":"llm","prompt":"hi"}`)
	if resp.StatusCode != http.StatusOK || body != `served /v1/completions {"model":"llm","prompt":"hi"}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if waited := time.Since(begin); waited < 300*time.Millisecond {
		t.Errorf("answered after %s, before the replica served", waited)
	}
	// The handler lets go of the request once the proxy returns, which may be
	// just after the client has read the whole answer.
	deadline := time.Now().Add(time.Second)
	for a.Held(model) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if woken.Load() != 1 || a.Held(model) != 0 {
		t.Errorf("woken %d times, %d still held", woken.Load(), a.Held(model))
	}
}

func TestPastTheBoundARequestIsRefusedAtOnce(t *testing.T) {
	a, _, url, _ := start(t, Options{MaxHeld: 2, Timeout: 2 * time.Second})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { send(t, url, "{}") })
	}
	for a.Held(model) < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	begin := time.Now()
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || time.Since(begin) > 500*time.Millisecond {
		t.Errorf("the third request: %d (Retry-After %q) after %s: %s", resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(begin), body)
	}
	wg.Wait()
}

func TestNoReplicaInTimeIsA503WithRetryAfter(t *testing.T) {
	_, _, url, _ := start(t, Options{Timeout: 300 * time.Millisecond})
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "no replica of ml/llm served within 300ms") {
		t.Errorf("got %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// The operator stops while requests wait: they are answered at once.
func TestStoppingAnswersWhatIsHeld(t *testing.T) {
	a, _, url, _ := start(t, Options{})
	go func() {
		for a.Held(model) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		a.Stop()
	}()
	begin := time.Now()
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "the operator is stopping") || time.Since(begin) > 2*time.Second {
		t.Errorf("got %d after %s: %s", resp.StatusCode, time.Since(begin), body)
	}
}

// The port a request comes on names its model: a Host header naming another
// model (another namespace's, by name, FQDN or ClusterIP) reaches nothing else.
// A model whose port is closed (a replica serves, or it no longer goes to zero)
// takes no new request there.
func TestThePortNamesTheModelNotTheHost(t *testing.T) {
	a, res, url, _ := start(t, Options{Timeout: 200 * time.Millisecond})
	victim := types.NamespacedName{Namespace: "victim", Name: "secret"}
	for _, host := range []string{"secret", "secret.victim", "secret.victim.svc.cluster.local:8000", "10.96.0.77", "10.96.0.77:8000"} {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader("{}"))
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	res.mu.Lock()
	for _, key := range res.admitted {
		if key != model {
			t.Errorf("a request on %s's port was taken for %s", model, key)
		}
	}
	res.mu.Unlock()
	if a.Held(victim) != 0 {
		t.Errorf("held for %s", victim)
	}
	a.Close(model)
	if _, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader("{}")); err == nil {
		t.Errorf("the closed port still takes requests")
	}
}

// A client the model's network policy does not let in is refused, not held,
// and wakes nothing.
func TestAClientThePolicyRefusesIsNotHeld(t *testing.T) {
	a, res, url, woken := start(t, Options{})
	res.refused = true
	resp, body := send(t, url, "{}")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "network policy") {
		t.Errorf("got %d: %s", resp.StatusCode, body)
	}
	if woken.Load() != 0 || a.Held(model) != 0 {
		t.Errorf("woken %d times, %d held", woken.Load(), a.Held(model))
	}
}

// A streaming client gets its headers at once and comments while it waits,
// then the replica's events.
func TestAStreamingClientIsKeptAliveWhileItWaits(t *testing.T) {
	a, res, url, _ := start(t, Options{Keepalive: 100 * time.Millisecond})
	backend := engine(t)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"llm","stream":true}`))
	req.Host = "llm"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(resp.Body)
	comments := 0
	for lines.Scan() && comments < 3 {
		if strings.HasPrefix(lines.Text(), ":") {
			comments++
		}
	}
	if a.Held(model) != 1 {
		t.Fatalf("held %d", a.Held(model))
	}
	res.set(backend)
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), `served /v1/completions {"model":"llm","stream":true}`) {
		t.Errorf("after the comments: %q", rest)
	}
}

// zeros is a body of n bytes that costs the client no memory.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), z.n)
	clear(p[:n])
	z.n -= n
	return int(n), nil
}

// heapBytes is the memory the heap's live and not yet swept objects take.
func heapBytes() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

// The attack of issue 35: 110 clients POST 8 MB each, at once, to a model at
// zero. The bodies held stay within the model's share of MaxHeldBytes (the
// rest are cut as their bytes pass it), and the memory is given back once
// the clients leave.
// Before the bound (each body read in full, then the queue's count checked),
// the heap grew by 880 MB.
func TestManyHeavyBodiesStayWithinTheBound(t *testing.T) {
	a, _, url, _ := start(t, Options{Timeout: 3 * time.Second})
	const clients, size = 110, 8 << 20
	runtime.GC()
	base := heapBytes()
	var peak atomic.Uint64
	sampling := make(chan struct{})
	go func() {
		for {
			select {
			case <-sampling:
				return
			case <-time.After(2 * time.Millisecond):
				if h := heapBytes(); h > peak.Load() {
					peak.Store(h)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	var held, refused atomic.Int32
	for range clients {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", &zeros{n: size})
			req.ContentLength = size
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				refused.Add(1) // the server answered and closed before the body was sent
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusTooManyRequests:
				refused.Add(1)
			case http.StatusServiceUnavailable:
				held.Add(1) // held until the timeout: no replica came
			}
		})
	}
	wg.Wait()
	close(sampling)
	grew := int64(peak.Load()) - int64(base)
	t.Logf("%d held, %d refused; the heap grew by %d MB at its peak", held.Load(), refused.Load(), grew>>20)
	if grew > 2*DefaultMaxHeldBytes {
		t.Errorf("the heap grew by %d MB for the bodies, over twice the bound of %d MB", grew>>20, DefaultMaxHeldBytes>>20)
	}
	if max := int32(DefaultMaxHeldBytes * DefaultModelShare / size); held.Load() > max || held.Load()+refused.Load() != clients {
		t.Errorf("%d held (at most %d fit), %d refused, of %d", held.Load(), max, refused.Load(), clients)
	}
	requests, bytes := reservedAfterAWhile(a)
	runtime.GC()
	if after := int64(heapBytes()) - int64(base); after > 16<<20 || requests != 0 || bytes != 0 {
		t.Errorf("after the clients left the heap is %d MB over where it began, %d requests and %d bytes still reserved", after>>20, requests, bytes)
	}
}

// A client that trickles its body is cut after BodyTimeout, and what it held
// is given back.
func TestATrickledBodyIsCut(t *testing.T) {
	a, _, url, _ := start(t, Options{BodyTimeout: 300 * time.Millisecond})
	body, trickle := io.Pipe()
	go func() {
		for range 100 {
			if _, err := trickle.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = trickle.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", body)
	req.ContentLength = 100
	begin := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("got %d", resp.StatusCode)
		}
	}
	_ = body.CloseWithError(io.ErrClosedPipe)
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("the trickled body was read for %s", took)
	}
	if requests, bytes := reservedAfterAWhile(a); requests != 0 || bytes != 0 {
		t.Errorf("%d requests, %d bytes still reserved", requests, bytes)
	}
}

// reservedAfterAWhile is what the activator holds for the model once the
// handlers of the requests answered have returned (within a second).
func reservedAfterAWhile(a *Activator) (requests int, bytes int64) {
	for range 100 {
		requests, bytes = int(heldOf(a, a.requests, model)), heldOf(a, a.bodyBytes, model)
		if requests == 0 && bytes == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return requests, bytes
}

// heldOf is what key holds of q, one of a's quotas, while no other model
// holds any: its share less what it may still take, found by taking and
// giving back (the quota tells no more).
func heldOf(a *Activator, q *frontdoor.Quota, key types.NamespacedName) int64 {
	total := int64(a.opts.MaxHeldTotal)
	if q == a.bodyBytes {
		total = a.opts.MaxHeldBytes
	}
	share := max(1, int64(float64(total)*a.opts.ModelShare))
	free, most := int64(0), share
	for free < most {
		n := (free + most + 1) / 2
		h := q.Hold(key)
		if h.Grow(n) == "" {
			free = n
		} else {
			most = n - 1
		}
		h.Release()
	}
	return share - free
}

// answer is what a client sent in the background got.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

// post sends a request in the background; its answer comes on the channel.
func post(url, body string) <-chan answer {
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			got <- answer{err: err}
			return
		}
		data, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		got <- answer{status: resp.StatusCode, header: resp.Header, body: string(data)}
	}()
	return got
}

// countingEngine is an engine that counts the requests it saw.
func countingEngine(t *testing.T) (string, *atomic.Int32) {
	seen := &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		body, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "served "+r.URL.Path+" "+string(body))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), seen
}

// waitFor polls cond for up to two seconds.
func waitFor(cond func() bool) bool {
	for range 200 {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// 32 clients declare 8 MiB bodies for one model and trickle them. Their
// bodies are counted as their bytes arrive: they hold a chunk each, not the
// 8 MiB they declared, and a request for another namespace's model is held
// and served beside them. Before (the declared length reserved at once), 8
// of them took the 64 MiB bound, 24 were refused, and so was the other model.
func TestTrickledBodiesDoNotLockOutAnotherNamespace(t *testing.T) {
	a, res, url, _ := start(t, Options{})
	other := types.NamespacedName{Namespace: "other", Name: "m"}
	otherURL := open(t, a, other)
	runtime.GC()
	base := heapBytes()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 32 {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: llm\r\nContent-Length: %d\r\n\r\n{\"model\":\"llm\",", 8<<20)
	}
	if !waitFor(func() bool { return heldOf(a, a.bodies, model) == 32 }) {
		t.Errorf("%d of 32 trickled bodies are being read", heldOf(a, a.bodies, model))
	}
	if held := heldOf(a, a.bodyBytes, model); held > 32*64<<10 {
		t.Errorf("32 trickled bodies are counted as %d KiB, %d KiB each", held>>10, held/32>>10)
	}
	answered := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if n, _ := c.Read(make([]byte, 1)); n > 0 {
			answered++
		}
	}
	if answered != 0 {
		t.Errorf("%d of 32 trickled requests were answered (refused) before their body came", answered)
	}
	runtime.GC()
	if grew := int64(heapBytes()) - int64(base); grew > 32*128<<10 {
		t.Errorf("32 trickled bodies hold %d KiB, %d KiB each", grew>>10, grew/32>>10)
	}
	backend, seen := countingEngine(t)
	got := post(otherURL, `{"model":"m"}`)
	if !waitFor(func() bool { return a.Held(other) == 1 }) {
		t.Errorf("the request for %s is not held", other)
	}
	res.set(backend)
	select {
	case ans := <-got:
		if ans.err != nil || ans.status != http.StatusOK || ans.body != `served /v1/completions {"model":"m"}` || seen.Load() != 1 {
			t.Errorf("the request for %s beside the trickles: %d %q %v", other, ans.status, ans.body, ans.err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the request for %s was not answered", other)
	}
}

// One namespace's models hold at most the namespace's share of the requests
// held (half of MaxHeldTotal), one model a quarter: another namespace's
// requests are still held. Before, ml's models took all 8 slots.
func TestANamespaceHoldsItsShareOfTheHeldRequests(t *testing.T) {
	a, _, _, _ := start(t, Options{MaxHeldTotal: 8, Timeout: 10 * time.Second})
	var answers []<-chan answer
	defer func() {
		a.Stop()
		for _, got := range answers {
			<-got
		}
	}()
	refused := 0
	// send sends n requests for key and waits until each is held or answered.
	send := func(key types.NamespacedName, n int) {
		url := open(t, a, key)
		for range n {
			held := a.Held(key)
			got := post(url, "{}")
			ok := waitFor(func() bool {
				if a.Held(key) > held {
					answers = append(answers, got)
					return true
				}
				select {
				case ans := <-got:
					if ans.status != http.StatusTooManyRequests || ans.header.Get("Retry-After") == "" {
						t.Errorf("a request for %s past the bound: %d %q %v", key, ans.status, ans.body, ans.err)
					}
					refused++
					return true
				default:
					return false
				}
			})
			if !ok {
				t.Fatalf("a request for %s was neither held nor answered", key)
			}
		}
	}
	mlA, mlB, mlC := types.NamespacedName{Namespace: "ml", Name: "a"}, types.NamespacedName{Namespace: "ml", Name: "b"}, types.NamespacedName{Namespace: "ml", Name: "c"}
	x := types.NamespacedName{Namespace: "other", Name: "x"}
	send(mlA, 3)
	send(mlB, 3)
	send(mlC, 1)
	send(x, 2)
	if a.Held(mlA) != 2 || a.Held(mlB) != 2 || a.Held(mlC) != 0 || a.Held(x) != 2 || refused != 3 {
		t.Errorf("held ml/a %d, ml/b %d, ml/c %d (want 2, 2, 0: a model's share 2, the namespace's 4), other/x %d (want 2); %d refused (want 3)",
			a.Held(mlA), a.Held(mlB), a.Held(mlC), a.Held(x), refused)
	}
}

// A request held while its model was at zero is checked against the model's
// policy again when a replica comes: a client the policy refuses now is
// answered 403 (an error event in a stream already begun), and the replica
// never sees the request. Before, it was passed on.
func TestAHeldRequestIsCheckedAgainWhenAReplicaComes(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"plain", `{"model":"llm"}`},
		{"streaming", `{"model":"llm","stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, res, url, _ := start(t, Options{Keepalive: 50 * time.Millisecond})
			backend, seen := countingEngine(t)
			got := post(url, tc.body)
			if !waitFor(func() bool { return a.Held(model) == 1 }) {
				t.Fatal("the request is not held")
			}
			res.mu.Lock()
			res.refused = true
			res.mu.Unlock()
			res.set(backend)
			ans := <-got
			switch {
			case ans.err != nil:
				t.Fatal(ans.err)
			case tc.name == "plain" && (ans.status != http.StatusForbidden || !strings.Contains(ans.body, "network policy")):
				t.Errorf("got %d: %s", ans.status, ans.body)
			case tc.name == "streaming" && !strings.Contains(ans.body, `"code":403`):
				t.Errorf("the stream: %q", ans.body)
			}
			if seen.Load() != 0 {
				t.Errorf("the replica saw %d requests", seen.Load())
			}
		})
	}
}

// A held body is let go once the replica's answer begins: a long answer
// (a stream of tokens) holds a request of the bounds, not its body.
func TestTheBodyIsLetGoOnceTheAnswerBegins(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"plain", `{"model":"llm","prompt":"` + strings.Repeat("x", 100<<10) + `"}`},
		{"streaming", `{"model":"llm","stream":true,"prompt":"` + strings.Repeat("x", 100<<10) + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, res, url, _ := start(t, Options{})
			finish := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: first\n\n")
				w.(http.Flusher).Flush()
				<-finish
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			}))
			defer srv.Close()
			defer close(finish)
			res.set(strings.TrimPrefix(srv.URL, "http://"))
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			lines := bufio.NewScanner(resp.Body)
			for lines.Scan() && lines.Text() != "data: first" {
			}
			if requests, bodies, bytes := heldOf(a, a.requests, model), heldOf(a, a.bodies, model), heldOf(a, a.bodyBytes, model); requests != 1 || bodies != 0 || bytes != 0 {
				t.Errorf("while the answer streams: %d requests, %d bodies of %d bytes held (want 1, 0, 0)", requests, bodies, bytes)
			}
		})
	}
}
