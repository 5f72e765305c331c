// Package operatorproc runs the operator binary as a host process against a
// local cluster, as a user would run it with `make run`: the end-to-end and
// the multi-cluster tests start, kill, stop and read the logs of operators
// through it.
package operatorproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aiinference/operator/test/testutil/freeport"
)

// Process is the operator binary running against a local cluster.
type Process struct {
	Name, Bin, Kubeconfig, LogPath, LoaderImage string
	ExtraArgs                                   []string // after the usual ones, so they win
	Env                                         []string // added to the test's environment

	mu      sync.Mutex
	cmd     *exec.Cmd
	logFile *os.File
}

// Start runs the operator, its output appended to LogPath.
func (o *Process) Start() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	logFile, err := os.OpenFile(o.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	port, err := freeport.Pick()
	if err != nil {
		logFile.Close()
		return err
	}
	cmd := exec.Command(o.Bin, "--leader-elect", "--leader-election-namespace=default",
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", port),
		"--loader-image="+o.LoaderImage)
	cmd.Args = append(cmd.Args, o.ExtraArgs...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+o.Kubeconfig), o.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting the operator %s: %w", o.Name, err)
	}
	o.cmd, o.logFile = cmd, logFile
	return nil
}

// Kill ends the operator at once, as a crash or an OOM kill would: no clean
// hand-over of the leader lease.
func (o *Process) Kill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd == nil {
		return
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
	_ = o.cmd.Wait()
	o.logFile.Close()
	o.cmd = nil
}

// Stop ends the operator as its pod's termination would (SIGTERM), and kills
// it after 30 s. A nil or stopped Process is left as it is.
func (o *Process) Stop() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd == nil {
		return
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = o.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	o.logFile.Close()
	o.cmd = nil
}

// LogTail is the last lines of the operator's log.
func (o *Process) LogTail(lines int) string { return o.LogLines("", lines) }

// LogLines is the last lines of the operator's log that name the namespace or
// are errors (every line when namespace is empty): what a failed test needs
// to see of a log that other tests also write to.
func (o *Process) LogLines(namespace string, lines int) string {
	f, err := os.Open(o.LogPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var all []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		if namespace == "" || strings.Contains(line, namespace) || strings.Contains(line, `"level":"error"`) {
			all = append(all, line)
		}
	}
	return strings.Join(all[max(len(all)-lines, 0):], "\n")
}
