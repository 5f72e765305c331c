package loader

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

func TestRetriesThroughFaultyProxy(t *testing.T) {
	needServer(t)
	// The first 40 ranged GETs go wrong in turn: 503 SlowDown, a reset connection, a
	// body cut in the middle, a late answer; then everything passes.
	faults := []fault{answer503, resetConn, cutBody, delayHeaders}
	proxy := newFaultProxy(srv.Endpoint, func(n int) fault {
		if n > 40 {
			return passThrough
		}
		return faults[n%len(faults)]
	})
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	o := testOptions("s3://models/mp/llama", dest)
	o.S3.Endpoint = proxy.URL()
	o.PartSizeBytes = 2 << 20
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, dest)
	for _, f := range faults {
		if proxy.count(f) == 0 {
			t.Errorf("fault %d never injected", f)
		}
	}
	// Every fault but the delay costs a retry, except that Go's transport itself
	// resends a GET whose reused connection was reset before any answer.
	least := proxy.count(answer503) + proxy.count(cutBody)
	if most := least + proxy.count(resetConn); s.Retries < least || s.Retries > most {
		t.Errorf("summary says %d retries; the proxy broke %d requests, %d of them resets", s.Retries, most, proxy.count(resetConn))
	}
	if !s.Verified || s.Bytes != treeBytes {
		t.Errorf("summary %+v", s)
	}
}

func TestStallDetected(t *testing.T) {
	needServer(t)
	// The first two ranged GETs send a third of their body, then nothing.
	proxy := newFaultProxy(srv.Endpoint, func(n int) fault {
		if n <= 2 {
			return stallBody
		}
		return passThrough
	})
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "model")
	o := testOptions("s3://models/single/llama", dest)
	o.S3.Endpoint = proxy.URL()
	stall := time.Second
	o.StallTimeout.Duration = stall
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, dest)
	gaps := proxy.stalls()
	if len(gaps) != 2 || s.Stalls != 2 {
		t.Fatalf("proxy saw %d stalls end, summary says %d; want 2", len(gaps), s.Stalls)
	}
	for _, g := range gaps {
		// From the last byte sent to the loader dropping the request.
		if g > stall+time.Second {
			t.Errorf("stall detected after %s; want within the stall timeout (%s) and a little", g, stall)
		}
	}
}

func TestOverallTimeout(t *testing.T) {
	needServer(t)
	// Every ranged GET stalls, and the stall watchdog is slower than the timeout.
	proxy := newFaultProxy(srv.Endpoint, func(int) fault { return stallBody })
	defer proxy.Close()
	o := testOptions("s3://models/single/llama", filepath.Join(t.TempDir(), "model"))
	o.S3.Endpoint = proxy.URL()
	o.StallTimeout.Duration = time.Minute
	o.Timeout.Duration = 2 * time.Second
	start := time.Now()
	s, err := runInProcess(t, o)
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("timed out after %s; want about 2s", took)
	}
	if ExitCode(err) != loadspec.ExitRetryable || s.Failure == nil || s.Failure.Reason != loadspec.ReasonTimeout || !s.Failure.Retryable {
		t.Errorf("error %v, failure %+v: want a retryable Timeout", err, s.Failure)
	}
}
