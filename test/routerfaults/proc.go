// Package routerfaults reproduces the attacks and faults the router must
// survive, against the real router run as its own process (routerproc)
// under a real memory limit, and measures each: the router's peak RSS
// against the limit, the requests answered, refused, failed and lost, and
// the time to first token where it matters. Engines are fakes on loopback
// (slow, fast-failing, silent, with huge /metrics or huge response
// headers) and, for healthy replicas, real llm-d-inference-sim processes
// (test/routingbench). `make bench-router-faults` prints the figures as a
// table; each test asserts the router's targets.
package routerfaults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aiinference/operator/test/routerfaults/world"
	"github.com/aiinference/operator/test/testutil"
)

// MemoryLimit is the router's memory limit in the chart (512Mi): the cgroup
// limit the router runs under here.
const MemoryLimit = 512 << 20

// fallbackGoMemLimit is GOMEMLIMIT where no memory cgroup can be made: what
// automemlimit would set from MemoryLimit (router: 80%).
const fallbackGoMemLimit = "410MiB"

// harnessFlags come before each case's router flags (which may override
// them): the router stops at once, as nothing is left to drain.
var harnessFlags = []string{"--drain-delay=1ms", "--shutdown-timeout=2s"}

// extraFlagsEnv names router flags added to every case (space-separated),
// after the case's own: for trying a flag without editing caseFlags.
const extraFlagsEnv = "ROUTERFAULTS_ROUTER_FLAGS"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// routerBinary is routerproc, built once per run from this repository.
func routerBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := testutil.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "routerfaults-"); err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, "routerproc"), "./test/routerfaults/routerproc")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./test/routerfaults/routerproc: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "routerproc")
}

// RouterProc is one case's router process.
type RouterProc struct {
	// Addr is host:port of its requests; URL is http://Addr.
	Addr, URL string
	// Limit says how the memory limit is set: a cgroup (the kernel kills a
	// router over it) or, failing that, only GOMEMLIMIT.
	Limit string
	// GoLimit is the Go memory limit the router logged (automemlimit), 0
	// when it logged none.
	GoLimit int64

	cmd     *exec.Cmd
	done    chan struct{}
	cgroup  string
	log     string
	hwm     atomic.Int64
	cpu     atomic.Int64
	stopped atomic.Bool
}

var cgroupSeq atomic.Int64

// StartRouter starts routerproc on the world with the case's router flags
// (caseFlags[name]) and waits until it listens. It stops, and its cgroup
// goes, when the test ends.
func StartRouter(t testing.TB, name string, w *world.File) *RouterProc {
	t.Helper()
	flags, ok := caseFlags[name]
	if !ok {
		t.Fatalf("case %q has no entry in caseFlags", name)
	}
	bin := routerBinary(t)
	dir := t.TempDir()
	data, err := json.MarshalIndent(w, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	worldPath := filepath.Join(dir, "world.json")
	if err := os.WriteFile(worldPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--world=" + worldPath, "--"}
	args = append(args, harnessFlags...)
	args = append(args, flags...)
	args = append(args, strings.Fields(os.Getenv(extraFlagsEnv))...)

	p := &RouterProc{done: make(chan struct{}), log: filepath.Join(dir, "router.log")}
	env := withoutEnv(os.Environ(), "GOMEMLIMIT")
	cg, why := makeCgroup(fmt.Sprintf("routerfaults-%d-%d", os.Getpid(), cgroupSeq.Add(1)), MemoryLimit)
	if cg != "" {
		// Born in the cgroup: the shell joins it and execs the router, so
		// that automemlimit reads the limit and every page is charged.
		p.cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`, "sh", cg, bin}, args...)...)
		p.cgroup = cg
		p.Limit = fmt.Sprintf("memory cgroup %s, limit %d MiB", cg, MemoryLimit>>20)
	} else {
		p.cmd = exec.Command(bin, args...)
		env = append(env, "GOMEMLIMIT="+fallbackGoMemLimit)
		p.Limit = fmt.Sprintf("no memory cgroup (%s): GOMEMLIMIT=%s only, no kernel limit", why, fallbackGoMemLimit)
	}
	p.cmd.Env = env
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = logFile
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		removeCgroup(cg)
		t.Fatalf("starting routerproc: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		removeCgroup(p.cgroup)
		if t.Failed() || p.OOMKilled() {
			out, _ := os.ReadFile(p.log)
			t.Logf("router log (end):\n%s", tail(out, 3000))
		}
	})
	addr := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			addr <- strings.TrimSpace(s.Text())
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			<-p.done
			out, _ := os.ReadFile(p.log)
			t.Fatalf("routerproc exited before listening: %s\n%s", p.cmd.ProcessState, tail(out, 3000))
		}
		p.Addr, p.URL = a, "http://"+a
	case <-time.After(60 * time.Second):
		t.Fatal("routerproc printed no address within 60s")
	}
	out, _ := os.ReadFile(p.log)
	if m := goLimitLog.FindSubmatch(out); m != nil {
		p.GoLimit, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	go p.sample()
	return p
}

// goLimitLog is router.SetMemoryLimit's log line (zap's JSON).
var goLimitLog = regexp.MustCompile(`"msg":"Go memory limit","bytes":(\d+)`)

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// sample reads VmHWM every 100ms while the router runs: a router the kernel
// kills leaves no /proc entry to read at the end.
func (p *RouterProc) sample() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p.readHWM()
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
	}
}

func (p *RouterProc) readHWM() {
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)); err == nil {
		// After the command's name (in parentheses), from field 3 on: utime
		// and stime are fields 14 and 15, in clock ticks (100 a second).
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 12 {
				utime, _ := strconv.ParseInt(f[11], 10, 64)
				stime, _ := strconv.ParseInt(f[12], 10, 64)
				p.cpu.Store(utime + stime)
			}
		}
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				for {
					old := p.hwm.Load()
					if kb<<10 <= old || p.hwm.CompareAndSwap(old, kb<<10) {
						break
					}
				}
			}
		}
	}
}

// PeakRSS is the router's peak resident memory so far (VmHWM), in bytes;
// for a router that died, the last reading before it did.
func (p *RouterProc) PeakRSS() int64 {
	p.readHWM()
	return p.hwm.Load()
}

// rss is the router's resident memory now (VmRSS), 0 once it has exited.
func (p *RouterProc) rss() int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Settle waits until the router's resident memory has stayed within 8 MiB
// for 2 s (it has taken in what the case sends it), or it has exited, at
// most timeout; false when it did not settle.
func (p *RouterProc) Settle(timeout time.Duration) bool {
	const window, tick = 2 * time.Second, 250 * time.Millisecond
	deadline := time.Now().Add(timeout)
	var seen []int64
	for time.Now().Before(deadline) {
		if p.Exited() {
			return true
		}
		seen = append(seen, p.rss())
		if n := int(window / tick); len(seen) > n {
			last := seen[len(seen)-n-1:]
			if slices.Max(last)-slices.Min(last) < 8<<20 {
				return true
			}
		}
		time.Sleep(tick)
	}
	return false
}

// CPU is the router's CPU time so far (user and system); for a router
// that died, the last reading before it did.
func (p *RouterProc) CPU() time.Duration {
	p.readHWM()
	return time.Duration(p.cpu.Load()) * 10 * time.Millisecond
}

// CgroupPeak is the cgroup's peak usage (memory.max_usage_in_bytes: the
// router's pages and its page cache), 0 without a cgroup.
func (p *RouterProc) CgroupPeak() int64 {
	if p.cgroup == "" {
		return 0
	}
	data, err := os.ReadFile(filepath.Join(p.cgroup, "memory.max_usage_in_bytes"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// Exited tells whether the router has exited (it is not stopped by the
// harness until the test ends, so an exit is a crash or a kill).
func (p *RouterProc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// OOMKilled tells whether the kernel killed the router for its memory
// cgroup's limit.
func (p *RouterProc) OOMKilled() bool {
	if p.cgroup == "" || !p.Exited() || p.stopped.Load() && p.cmd.ProcessState.Success() {
		return false
	}
	data, err := os.ReadFile(filepath.Join(p.cgroup, "memory.oom_control"))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
			return true
		}
	}
	return false
}

// State says how the router stands: running, OOM-killed, or how it exited.
func (p *RouterProc) State() string {
	switch {
	case !p.Exited():
		return "running"
	case p.OOMKilled():
		return "OOM-killed"
	default:
		return "exited: " + p.cmd.ProcessState.String()
	}
}

// Stop ends the router: SIGTERM, then SIGKILL after 10s.
func (p *RouterProc) Stop() {
	if p.Exited() {
		return
	}
	p.stopped.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// memoryHierarchy is the mount point of the cgroup v1 memory hierarchy, ""
// when there is none (cgroup v2, or none mounted).
func memoryHierarchy() string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		// ... mount-point ... - fstype source super-options
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != "cgroup" {
			continue
		}
		for opt := range strings.SplitSeq(g[2], ",") {
			if opt == "memory" {
				return f[4]
			}
		}
	}
	return ""
}

// makeCgroup makes a memory cgroup with the limit at the top of the v1
// memory hierarchy; "" and why not when it cannot (not root, cgroup v2).
func makeCgroup(name string, limit int64) (dir, why string) {
	if os.Geteuid() != 0 {
		return "", "not root"
	}
	h := memoryHierarchy()
	if h == "" {
		return "", "no cgroup v1 memory hierarchy"
	}
	removeStaleCgroups(h)
	dir = filepath.Join(h, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err.Error()
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(dir)
		return "", err.Error()
	}
	return dir, ""
}

var staleOnce sync.Once

// removeStaleCgroups removes, once per run, the empty cgroups of earlier
// runs whose process is gone (one killed before its cleanup).
func removeStaleCgroups(hierarchy string) {
	staleOnce.Do(func() {
		dirs, _ := filepath.Glob(filepath.Join(hierarchy, "routerfaults-*-*"))
		for _, dir := range dirs {
			pid := strings.Split(filepath.Base(dir), "-")[1]
			if _, err := os.Stat(filepath.Join("/proc", pid)); os.IsNotExist(err) {
				_ = os.Remove(dir) // fails, harmlessly, while a process is in it
			}
		}
	})
}

// removeCgroup removes the cgroup once its processes are gone (a cgroup
// whose last process has just died stays busy a moment).
func removeCgroup(dir string) {
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "routerfaults: could not remove cgroup %s\n", dir)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cleanBuild removes routerproc's build folder (TestMain, at the end).
func cleanBuild() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}
