// Package analysistest runs the real components a canary analysis reads, for
// tests: llm-d-inference-sim model servers (vLLM's OpenAI API and its vllm:*
// metrics), an HTTP-metrics proxy in front of each that counts responses by
// status as vLLM's API server does, a Prometheus server scraping them with the
// namespace and pod labels a PodMonitor gives, and a load driver.
//
// The binaries come from hack/tools/build.sh (sim; promtool, which installs
// Debian's prometheus package with the prometheus server), so they exist in CI;
// a test is skipped, saying why, only when they cannot be built.
//
//	pods := []*analysistest.Pod{
//		analysistest.StartPod(t, "ns", "chat-7d9f8c6b5-x2k4p", analysistest.SimOptions{}),
//		analysistest.StartPod(t, "ns", "chat-canary-5c8d7f9b6-q7w2e", analysistest.SimOptions{}),
//	}
//	prom := analysistest.StartPrometheus(t, analysistest.TargetsOf(pods...))
//	load := analysistest.StartLoad(t, 8, pods...)
//	// ... analysis.NewPrometheus(prom.URL, analysis.OperatorURL), analysis.Run(...)
package analysistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aiinference/operator/test/testutil"
	"github.com/aiinference/operator/test/testutil/freeport"
)

var (
	binOnce  sync.Once
	simBin   string
	promBin  string
	binError error
)

// binaries builds (first run) or finds llm-d-inference-sim and prometheus.
func binaries() (sim, prom string, err error) {
	binOnce.Do(func() {
		dir, err := testutil.BuildTools("sim")
		if err != nil {
			binError = fmt.Errorf("building llm-d-inference-sim: %w", err)
			return
		}
		simBin = filepath.Join(dir, "llm-d-inference-sim")
		// Debian's prometheus package holds promtool and the prometheus server.
		if dir, err := testutil.BuildTools("promtool"); err == nil {
			if p := filepath.Join(dir, "prometheus"); isExecutable(p) {
				promBin = p
			}
		}
		if promBin == "" {
			if promBin, err = exec.LookPath("prometheus"); err != nil {
				binError = fmt.Errorf("no prometheus server binary: hack/tools/build.sh promtool installs Debian's " +
					"prometheus package (as root), which has it")
			}
		}
	})
	return simBin, promBin, binError
}

// RequireBinaries skips the test, saying why, when the simulator or the
// Prometheus server cannot be built or found.
func RequireBinaries(t testing.TB) {
	t.Helper()
	if _, _, err := binaries(); err != nil {
		t.Skipf("analysis real-component test needs llm-d-inference-sim and prometheus: %v", err)
	}
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// server is a process serving HTTP on a loopback port it binds itself.
type server struct {
	name func(port string) string
	bin  string
	args func(port string) []string
	addr string // 127.0.0.1:PORT
	proc *process
}

// launchServer starts bin on a free loopback port, without waiting for it
// (see waitReady); name and args are the process's for a port.
func launchServer(t testing.TB, name func(port string) string, bin string, args func(port string) []string) *server {
	t.Helper()
	s := &server{name: name, bin: bin, args: args}
	s.launch(t)
	return s
}

func (s *server) launch(t testing.TB) {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.proc = startProcess(t, s.name(strconv.Itoa(port)), s.bin, s.args(strconv.Itoa(port))...)
}

// waitReady waits until GET path answers 200. A server whose port was taken
// before it bound it is started again on another port (see freeport).
func (s *server) waitReady(t testing.TB, path string, timeout time.Duration) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := waitHTTP(s.proc, "http://"+s.addr+path, timeout)
		if err == nil {
			return
		}
		if !freeport.Taken(err, "") || attempt == freeport.Attempts {
			t.Fatal(err)
		}
		t.Logf("%v: starting it on another port", err)
		s.launch(t)
	}
}

// process is a started binary with its output in a file, shown if the test fails.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}

	mu      sync.Mutex
	stopped bool
}

func startProcess(t testing.TB, name, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Logf("%s log (end):\n%s", name, out)
		}
	})
	return p
}

// Stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (p *process) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited says whether the process ended by itself.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitHTTP waits until GET url answers 200. A process that exits first fails
// it, with freeport.ErrTaken when its log says its port was taken.
func waitHTTP(p *process, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	var last string
	for time.Now().Before(deadline) {
		if p.exited() {
			out, _ := os.ReadFile(p.log)
			if freeport.Taken(nil, string(out)) {
				return fmt.Errorf("%s exited while starting: %w:\n%s", p.name, freeport.ErrTaken, out)
			}
			return fmt.Errorf("%s exited while starting:\n%s", p.name, out)
		}
		resp, err := client.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s did not answer 200 within %s (last: %s)", p.name, url, timeout, last)
}

// post sends a JSON body and returns the status and body.
func post(ctx context.Context, client *http.Client, url, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.String(), err
}
