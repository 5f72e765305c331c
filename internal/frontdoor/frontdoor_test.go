package frontdoor

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestATenantHoldsItsShareOnly(t *testing.T) {
	q := NewQuota("requests", 100, 0.5, 0.25)
	take := func(ns, model string, n int) int {
		h := q.Hold(types.NamespacedName{Namespace: ns, Name: model})
		got := 0
		for range n {
			if h.Grow(1) != "" {
				break
			}
			got++
		}
		return got
	}
	if got := take("a", "x", 40); got != 25 {
		t.Errorf("model a/x took %d, want its share 25", got)
	}
	if got := take("a", "y", 40); got != 25 {
		t.Errorf("model a/y took %d, want 25", got)
	}
	if got := take("a", "z", 10); got != 0 {
		t.Errorf("a third model of namespace a took %d past the namespace's share of 50", got)
	}
	if got := take("b", "x", 10); got != 10 {
		t.Errorf("namespace b took %d of 10 while a held its share", got)
	}
	// A namespace's address counts against the namespace, then the model it names.
	if take("c", "m", 10) != 10 {
		t.Fatal("model c/m refused")
	}
	h := q.Hold(types.NamespacedName{Namespace: "c"})
	if h.Grow(20) != "" {
		t.Fatal("namespace c refused")
	}
	if refusal := h.ToModel("m"); refusal == "" || !strings.Contains(refusal, "c/m") {
		t.Errorf("20 moved to model c/m, which holds 10 of its share of 25: %q", refusal)
	}
	if refusal := h.ToModel("n"); refusal != "" {
		t.Errorf("20 refused for model c/n: %s", refusal)
	}
	h.Release()
	if used(q) != 70 || q.byModel[types.NamespacedName{Namespace: "c", Name: "n"}] != 0 {
		t.Errorf("%d held after the release, want 70", q.used)
	}
}

// TestATrickledBodyHoldsWhatArrived: 32 clients that declare 8 MiB and send
// a few bytes hold a chunk each, not 8 MiB: the others' bodies still fit.
func TestATrickledBodyHoldsWhatArrived(t *testing.T) {
	limits := BodyLimits{MaxBytes: 8 << 20, ReadTimeout: 5 * time.Second,
		Bytes: NewQuota("bytes of request bodies", 96<<20, 0.5, 0.25), Count: NewQuota("request bodies", 1024, 0.5, 0.25)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, status, msg := ReadBody(w, r, types.NamespacedName{Namespace: r.URL.Query().Get("ns"), Name: "m"}, limits)
		defer body.Release()
		if status != 0 {
			http.Error(w, msg, status)
			return
		}
		_, _ = fmt.Fprint(w, len(body.Data))
	}))
	defer srv.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 32 {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = fmt.Fprintf(c, "POST /?ns=a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{\"model\":\"m\",", 8<<20)
	}
	deadline := time.Now().Add(5 * time.Second)
	for used(limits.Count) < 32 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := used(limits.Count); n != 32 {
		t.Errorf("%d of 32 trickled bodies are being read: the others were refused for what they declared", n)
	}
	if held := used(limits.Bytes); held > 32*bodyChunk {
		t.Errorf("32 trickled bodies hold %d MiB", held>>20)
	}
	for _, ns := range []string{"a", "b"} {
		resp, err := http.Post(srv.URL+"/?ns="+ns, "application/json", bytes.NewReader(make([]byte, 4<<20)))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(got) != fmt.Sprint(4<<20) {
			t.Errorf("a 4 MiB body in namespace %s beside the trickles: %d %s", ns, resp.StatusCode, got)
		}
	}
}

// used is what the quota holds in all.
func used(q *Quota) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.used
}
