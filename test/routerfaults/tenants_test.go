package routerfaults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiinference/operator/test/routerfaults/world"
)

// TestTenantTrickleLocksOutNoOtherTenant: 32 connections from namespace a
// to its model declare bodies of 8 MiB and send a few bytes a second (each
// connection again as soon as the router drops it) for longer than the
// router's body read timeout; meanwhile a client in namespace b calls its
// own model. Its success share must stay what it is alone: 100%.
func TestTenantTrickleLocksOutNoOtherTenant(t *testing.T) {
	const (
		conns     = 32
		declared  = maxBody
		chunk     = 8 // bytes a connection sends each second
		bRate     = 4 // b's requests a second
		bTimeout  = 5 * time.Second
		aloneRuns = 8
	)
	window := BodyReadTimeout + 2*time.Second
	engineA, engineB := StartQuickEngine(t, "quick-a"), StartQuickEngine(t, "quick-b")
	modelA := NewModel("a", "chat", "chat", engineA.Endpoint())
	modelB := NewModel("b", "assist", "assist", engineB.Endpoint())
	p := StartRouter(t, CaseTrickle, &world.File{
		Models:  []world.Model{modelA, modelB},
		Clients: map[string]string{ClientA: "a", ClientB: "b"},
	})
	say("%s: %s; Go memory limit %s", CaseTrickle, p.Limit, MiB(p.GoLimit))

	clientB := ClientFrom(ClientB)
	sendB := func(tally *Tally) {
		tally.Add(Send(t.Context(), clientB, Request{URL: p.URL, Host: HostOf(modelB), Body: ChatBody("assist", 4, "hello"), Timeout: bTimeout}))
	}
	var alone Tally
	for range aloneRuns {
		sendB(&alone)
		time.Sleep(time.Second / bRate)
	}

	// The trickle.
	ctx, cancel := context.WithTimeout(t.Context(), window)
	defer cancel()
	var bodyBytes, connections atomic.Int64
	var answersMu sync.Mutex
	answers := map[string]int{}
	var trickle sync.WaitGroup
	var connected sync.WaitGroup
	connected.Add(conns)
	for i := range conns {
		trickle.Go(func() {
			first := true
			for ctx.Err() == nil {
				c, err := DialRaw(ClientA, p.Addr)
				if err == nil {
					connections.Add(1)
					err = c.WriteHead(HostOf(modelA), "/v1/chat/completions", declared)
				}
				if first {
					connected.Done()
					first = false
				}
				for err == nil && ctx.Err() == nil {
					var n int
					n, err = fmt.Fprintf(c.Conn, "%0*d", chunk, i)
					bodyBytes.Add(int64(n))
					if err == nil {
						select {
						case <-ctx.Done():
						case <-time.After(time.Second):
						}
						// An answer (408, 429) ends the connection's use.
						_ = c.Conn.SetReadDeadline(time.Now().Add(time.Millisecond))
						if line, rerr := bufio.NewReader(c.Conn).ReadString('\n'); strings.HasPrefix(line, "HTTP/1.1 ") {
							answersMu.Lock()
							answers[strings.TrimSpace(line)]++
							answersMu.Unlock()
							err = fmt.Errorf("answered")
						} else if rerr != nil && !isTimeout(rerr) {
							err = rerr
						}
					}
				}
				if c != nil {
					_ = c.Conn.Close()
				}
				// Not faster than a connection every 200ms each.
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		})
	}
	connected.Wait()
	time.Sleep(500 * time.Millisecond)
	var beside Tally
	OpenLoop(ctx, bRate, int((window-time.Second).Seconds()*bRate), func(int) { sendB(&beside) })
	cancel()
	trickle.Wait()

	answersMu.Lock()
	var seen []string
	for line, n := range answers {
		seen = append(seen, fmt.Sprintf("%q x%d", line, n))
	}
	answersMu.Unlock()
	Line(os.Stdout, CaseTrickle, "b's requests to b/assist: alone %s, success %s; beside the trickle %s, success %s, TTFT p50 %s p90 %s; the trickle: %d connections from namespace a to a/chat (%d at a time, each declaring %d bytes) sent %d bytes of body in all over %s, the router answered them %v; %s",
		alone.String(), Pct(alone.Share(alone.OK)), beside.String(), Pct(beside.Share(beside.OK)),
		Dur(beside.TTFT(0.5, bTimeout)), Dur(beside.TTFT(0.9, bTimeout)),
		connections.Load(), conns, declared, bodyBytes.Load(), window, seen, Memory(p))
	met := beside.Sent > 0 && beside.OK == beside.Sent
	Record(Figure{Case: CaseTrickle, What: "b's success share beside a's trickle", Value: fmt.Sprintf("%s (%d of %d)", Pct(beside.Share(beside.OK)), beside.OK, beside.Sent),
		Beside: fmt.Sprintf("alone %s (%d of %d)", Pct(alone.Share(alone.OK)), alone.OK, alone.Sent), Target: "100%", Met: met})
	if !met {
		t.Errorf("%s: beside a's trickle, %d of b's %d requests succeeded (%s); alone %d of %d (first failure beside: %s)",
			CaseTrickle, beside.OK, beside.Sent, beside.String(), alone.OK, alone.Sent, beside.FirstFailure)
	}
	if alone.OK != alone.Sent {
		t.Errorf("%s: alone, only %d of b's %d requests succeeded: the peer is broken (%s)", CaseTrickle, alone.OK, alone.Sent, alone.FirstFailure)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
