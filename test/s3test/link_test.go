package s3test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The link holds each response back by its latency, passes one stream at most its
// per-connection rate, and all streams together at most the aggregate rate,
// leaving the bytes as they were.
func TestLinkShapesResponses(t *testing.T) {
	const size = 1 << 20
	body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}))
	defer backend.Close()
	shape := LinkShape{Latency: 40 * time.Millisecond, PerConnection: 2e6, Aggregate: 4e6}
	link, err := NewLink(backend.URL, shape)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()

	// fetch downloads n responses at once and returns when the first headers came
	// and when the last body ended, from the start.
	fetch := func(n int) (firstHeaders, all time.Duration) {
		start := time.Now()
		var mu sync.Mutex
		firstHeaders = time.Hour
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(link.URL())
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				mu.Lock()
				firstHeaders = min(firstHeaders, time.Since(start))
				mu.Unlock()
				got, err := io.ReadAll(resp.Body)
				if err != nil || !bytes.Equal(got, body) {
					t.Errorf("body of %d bytes (%v), want the server's %d", len(got), err, len(body))
				}
			}()
		}
		wg.Wait()
		return firstHeaders, time.Since(start)
	}

	// Each bucket starts with up to a chunk of bytes in it (see newLimiter).
	burst := float64(linkChunk)
	for _, tc := range []struct {
		name    string
		streams int
		want    time.Duration // at the caps
	}{
		// One stream: its own cap binds (2 MB/s).
		{"one stream", 1, shape.Latency + time.Duration((size-burst)/shape.PerConnection*float64(time.Second))},
		// Four streams could take 8 MB/s: the aggregate cap (4 MB/s) binds.
		{"four streams", 4, shape.Latency + time.Duration((4*size-burst)/shape.Aggregate*float64(time.Second))},
	} {
		headers, all := fetch(tc.streams)
		if headers < shape.Latency {
			t.Errorf("%s: first headers after %s, want at least the latency %s", tc.name, headers, shape.Latency)
		}
		// Slower is allowed on a busy machine, within reason; faster is not.
		if all < tc.want*95/100 || all > 2*tc.want {
			t.Errorf("%s: took %s, want about %s", tc.name, all, tc.want)
		}
		t.Logf("%s: first headers after %s, all bodies after %s (about %s at the caps)", tc.name, headers, all, tc.want)
	}
}
