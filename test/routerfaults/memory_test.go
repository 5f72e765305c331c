package routerfaults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiinference/operator/test/routerfaults/world"
)

// maxBody is the router's default --max-body-bytes: each case's bodies are
// as large as the router takes.
const maxBody = 8 << 20

// waitUntil polls cond every 100ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// checkMemory asserts the memory target and prints the case's line.
func checkMemory(t *testing.T, name string, p *RouterProc, tally *Tally, extra string) {
	t.Helper()
	Line(os.Stdout, name, "%s, limit %s (%s, Go limit %s); %s%s", Memory(p), MiB(MemoryLimit), p.Limit, MiB(p.GoLimit), tally, extra)
	if !MemoryFigure(name, p) {
		t.Errorf("%s: %s, the limit is %s", name, Memory(p), MiB(MemoryLimit))
	}
	if tally.Lost > 0 {
		t.Errorf("%s: %d of %d requests lost (first: %s)", name, tally.Lost, tally.Sent, tally.FirstFailure)
	}
}

// TestMemoryRefusedBodies: a body of {} messages costs the router the
// memory of its decoding before any policy check, so that a client the
// policy refuses costs as much as one it admits.
func TestMemoryRefusedBodies(t *testing.T) {
	engine := StartQuickEngine(t, "quick-0")
	admitted := NewModel("mem", "chat", "chat", engine.Endpoint())
	refused := NewModel("mem", "locked", "chat", engine.Endpoint())
	refused.Deny = true
	p := StartRouter(t, CaseRefusedBodies, &world.File{Models: []world.Model{admitted, refused}})
	say("%s: %s; Go memory limit %s", CaseRefusedBodies, p.Limit, MiB(p.GoLimit))

	body := EmptyMessagesBody("chat", maxBody)
	client := ClientFrom(ClientA)
	// Any answer of the router counts (ok): 403 for the refused, and for the
	// admitted whatever the router or the replica makes of millions of
	// empty messages; only an answer that never comes is lost.
	var all, refusedTally, admittedTally Tally
	send := func(tally *Tally, host string) {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				r := Send(t.Context(), client, Request{URL: p.URL, Host: host, Body: body, Timeout: 90 * time.Second})
				if r.Outcome == Failed && r.Status != 0 && r.Status < 500 {
					r.Outcome = OK
				}
				tally.Add(r)
				all.Add(r)
			})
		}
		wg.Wait()
	}
	send(&refusedTally, HostOf(refused))
	afterRefused := p.PeakRSS()
	send(&admittedTally, HostOf(admitted))
	checkMemory(t, CaseRefusedBodies, p, &all, fmt.Sprintf("; 2 bodies of %s of {} messages to a model whose policy refuses the client: %s, peak after them %s; then 2 to one that admits it: %s",
		MiB(int64(len(body))), refusedTally.String(), MiB(afterRefused), admittedTally.String()))
}

// TestMemoryHeldBodies: 32 ordinary chats of 8 MiB at once, all held by a
// replica that is slow to answer, with the router's default bounds.
func TestMemoryHeldBodies(t *testing.T) {
	const n = 32
	slow := StartSlowEngine(t, "slow-0")
	m := NewModel("mem", "chat", "chat", slow.Endpoint())
	p := StartRouter(t, CaseHeldBodies, &world.File{Models: []world.Model{m}})
	say("%s: %s; Go memory limit %s", CaseHeldBodies, p.Limit, MiB(p.GoLimit))

	body := LongChatBody("chat", maxBody-1024)
	client := ClientFrom(ClientA)
	held, release := context.WithCancel(t.Context())
	defer release()
	var tally Tally
	var answered atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r := Send(t.Context(), client, Request{URL: p.URL, Host: HostOf(m), Body: body, Timeout: 2 * time.Minute, HeldBy: held})
			if r.Outcome != Held {
				answered.Add(1)
			}
			tally.Add(r)
		})
	}
	// Every request is at the replica or answered, or the router is gone.
	waitUntil(90*time.Second, func() bool { return slow.Requests.Load()+answered.Load() >= n || p.Exited() })
	p.Settle(30 * time.Second)
	peak := p.PeakRSS()
	release()
	wg.Wait()
	checkMemory(t, CaseHeldBodies, p, &tally, fmt.Sprintf("; %d chats of %.1f MiB each, %d of them reached the slow replica (peak read then: %s)",
		n, float64(len(body))/(1<<20), slow.Requests.Load(), MiB(peak)))
}

// TestMemoryHugeMetrics: 16 replicas whose /metrics are 4 MiB each, scraped
// every second for 10 s.
func TestMemoryHugeMetrics(t *testing.T) {
	const replicas, size, window = 16, 4 << 20, 10 * time.Second
	metrics := HugeMetrics(size)
	var eps []world.Endpoint
	for i := range replicas {
		eps = append(eps, StartHugeMetricsEngine(t, fmt.Sprintf("metrics-%02d", i), metrics).Endpoint())
	}
	m := NewModel("mem", "chat", "chat", eps...)
	p := StartRouter(t, CaseHugeMetrics, &world.File{Models: []world.Model{m}})
	say("%s: %s; Go memory limit %s", CaseHugeMetrics, p.Limit, MiB(p.GoLimit))

	// A request a second keeps the model among those the router scrapes.
	client := ClientFrom(ClientA)
	var tally Tally
	for begin := time.Now(); time.Since(begin) < window && !p.Exited(); time.Sleep(time.Second) {
		tally.Add(Send(t.Context(), client, Request{URL: p.URL, Host: HostOf(m), Body: ChatBody("chat", 4, "hello"), Timeout: 5 * time.Second}))
	}
	checkMemory(t, CaseHugeMetrics, p, &tally, fmt.Sprintf("; %d replicas with /metrics of %d bytes each, scraped every second for %s",
		replicas, len(metrics), window))
	if tally.OK < tally.Sent {
		t.Errorf("%s: %d of %d requests not answered in full (first: %s)", CaseHugeMetrics, tally.Sent-tally.OK, tally.Sent, tally.FirstFailure)
	}
}

// TestMemoryHugeHeaders: 64 answers whose response headers are 8.8 MiB,
// to clients that send the request and never read.
func TestMemoryHugeHeaders(t *testing.T) {
	const n, engines = 64, 4
	size := 88 << 20 / 10 // 8.8 MiB
	headers := HugeHeaders(size)
	var fakes []*FakeEngine
	var eps []world.Endpoint
	for i := range engines {
		f := StartHugeHeadersEngine(t, fmt.Sprintf("headers-%d", i), headers)
		fakes = append(fakes, f)
		eps = append(eps, f.Endpoint())
	}
	m := NewModel("mem", "chat", "chat", eps...)
	p := StartRouter(t, CaseHugeHeaders, &world.File{Models: []world.Model{m}})
	say("%s: %s; Go memory limit %s", CaseHugeHeaders, p.Limit, MiB(p.GoLimit))

	body, _ := json.Marshal(map[string]any{"model": "chat", "messages": []map[string]string{{"role": "user", "content": "hello"}}, "max_tokens": 4})
	var clients []*RawClient
	defer func() {
		for _, c := range clients {
			_ = c.Conn.Close()
		}
	}()
	var tally Tally
	for range n {
		c, err := DialRaw(ClientA, p.Addr)
		if err != nil {
			tally.Add(Result{Outcome: Lost, Why: err.Error()})
			continue
		}
		clients = append(clients, c)
		if err := c.WriteHead(HostOf(m), "/v1/chat/completions", int64(len(body))); err != nil {
			tally.Add(Result{Outcome: Lost, Why: err.Error()})
			continue
		}
		if _, err := c.Conn.Write(body); err != nil {
			tally.Add(Result{Outcome: Lost, Why: err.Error()})
		}
	}
	served := func() int64 {
		total := int64(0)
		for _, f := range fakes {
			total += f.Requests.Load()
		}
		return total
	}
	waitUntil(60*time.Second, func() bool { return served() >= int64(len(clients)) || p.Exited() })
	// The router reads each answer's headers and writes them to a client
	// that does not read.
	p.Settle(30 * time.Second)
	peak := p.PeakRSS()
	// Now read what each client got: the start of an answer (held by the
	// client), or a closed connection with none (lost).
	for _, c := range clients {
		_ = c.Conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c.Conn).ReadString('\n')
		switch {
		case strings.HasPrefix(line, "HTTP/1.1 "):
			var code int
			_, _ = fmt.Sscanf(line, "HTTP/1.1 %d", &code)
			r := Result{Outcome: Held, Status: code}
			if code == http.StatusTooManyRequests {
				r.Outcome = Refused
			} else if code/100 != 2 {
				r.Outcome, r.Why = Failed, strings.TrimSpace(line)
			}
			tally.Add(r)
		default:
			tally.Add(Result{Outcome: Lost, Why: fmt.Sprintf("no answer: %v", err)})
		}
	}
	checkMemory(t, CaseHugeHeaders, p, &tally, fmt.Sprintf("; %d answers with %s of headers (%d bytes) to clients that do not read, %d served by the replicas (peak read then: %s); held = the answer began",
		n, fmt.Sprintf("%.1f MiB", float64(size)/(1<<20)), size, served(), MiB(peak)))
}
