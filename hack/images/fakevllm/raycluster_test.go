package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startHead serves a head on a free loopback port until the test ends.
func startHead(t *testing.T, out io.Writer) (*rayHead, int) {
	t.Helper()
	ln, err := (&net.ListenConfig{KeepAliveConfig: keepAlive}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	head := newRayHead(ln, out)
	go head.serve()
	t.Cleanup(head.close)
	return head, ln.Addr().(*net.TCPAddr).Port
}

// testEnv runs the ray CLI in this process (the head is started by the test,
// so `ray start --head` only checks it listens), with tries 10 ms apart.
func testEnv(out io.Writer) scriptEnv {
	return scriptEnv{
		out:    out,
		period: 10 * time.Millisecond,
		ray: func(args ...string) int {
			for _, a := range args {
				if a == "--head" {
					return 0
				}
			}
			return rayMain(args, out, out)
		},
		nodes: func(port int) (int, error) { return liveNodes(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))) },
	}
}

// The leader waits for its workers, then lets the engine start.
func TestLeaderWaitsForItsWorkers(t *testing.T) {
	var log syncBuffer
	head, port := startHead(t, &log)
	done := make(chan int, 1)
	go func() {
		done <- multiNodeServing([]string{"leader", "--ray_cluster_size=2", "--ray_port=" + strconv.Itoa(port)}, testEnv(&log))
	}()
	select {
	case code := <-done:
		t.Fatalf("the leader went on with no worker (exit %d): %s", code, log.String())
	case <-time.After(200 * time.Millisecond):
	}
	joined := make(chan struct{})
	go joinHead(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &log, &log, joined)
	<-joined
	if code := <-done; code != 0 {
		t.Fatalf("leader exit %d once a worker joined: %s", code, log.String())
	}
	if got := head.alive(); got != 2 {
		t.Errorf("the head counts %d nodes, want itself and the worker", got)
	}
	if !strings.Contains(log.String(), "All ray workers are active") {
		t.Errorf("log: %s", log.String())
	}
}

// A leader whose workers never come gives up after ray_init_timeout tries.
func TestLeaderGivesUpWithoutItsWorkers(t *testing.T) {
	var log syncBuffer
	_, port := startHead(t, &log)
	code := multiNodeServing([]string{"leader", "--ray_cluster_size=2", "--ray_port=" + strconv.Itoa(port), "--ray_init_timeout=15"}, testEnv(&log))
	if code != 1 || strings.Count(log.String(), "Wait for all ray workers to be active. 1/2 is active") != 3 ||
		!strings.Contains(log.String(), "Waiting for all ray workers to be active timed out.") {
		t.Fatalf("exit %d, log:\n%s\nwant 3 tries and exit 1", code, log.String())
	}
}

// A worker whose leader's name does not resolve tries again, then exits 1.
func TestWorkerThatCannotResolveItsLeaderGivesUp(t *testing.T) {
	var log syncBuffer
	code := multiNodeServing([]string{"worker", "--ray_address=no-such-leader.invalid", "--ray_init_timeout=10"}, testEnv(&log))
	if code != 1 || strings.Count(log.String(), "cannot resolve the Ray head's address no-such-leader.invalid") != 2 ||
		!strings.Contains(log.String(), "Ray worker starts timeout, head address: no-such-leader.invalid:6379") {
		t.Fatalf("exit %d, log:\n%s\nwant 2 tries and exit 1", code, log.String())
	}
}

// A worker holds its place until its leader goes; then it tries to join
// again, and exits 1 when it cannot.
func TestWorkerWhoseLeaderGoesExitsNonZero(t *testing.T) {
	var log syncBuffer
	head, port := startHead(t, &log)
	done := make(chan int, 1)
	go func() {
		done <- multiNodeServing([]string{"worker", "--ray_address=127.0.0.1", "--ray_port=" + strconv.Itoa(port), "--ray_init_timeout=10"}, testEnv(&log))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for head.alive() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not join: %s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case code := <-done:
		t.Fatalf("the worker exited (%d) while its leader runs: %s", code, log.String())
	case <-time.After(200 * time.Millisecond):
	}
	head.close()
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(log.String(), "is gone") || !strings.Contains(log.String(), "Ray worker starts timeout") {
			t.Fatalf("exit %d, log:\n%s", code, log.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the worker outlived its leader: %s", log.String())
	}
}

func TestMultiNodeServingRefusesWhatTheScriptRefuses(t *testing.T) {
	for _, args := range [][]string{{"leader"}, {"worker"}, {"serve"}, {}} {
		var log syncBuffer
		if code := multiNodeServing(args, testEnv(&log)); code != 1 {
			t.Errorf("multi-node-serving.sh %q: exit %d, want 1 (%s)", args, code, log.String())
		}
	}
}
