package localcluster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one running component: a binary in its own process group, its
// output in a log file.
type process struct {
	name    string // component name, also the log file's base name
	cmd     *exec.Cmd
	logPath string
	env     []string      // added to the environment; a restart adds it again
	done    chan struct{} // closed when the process has exited and been reaped
	err     error         // exit error; read only after done is closed
}

// startProcess starts binary with args in its own process group, with env
// added to the environment, and stdout and stderr going to logsDir/<name>.log. The process gets SIGKILL if the thread that
// started it dies, so a killed test binary or supervisor does not leave it behind.
func startProcess(name, binary string, args, env []string, logsDir string) (*process, error) {
	logPath := filepath.Join(logsDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	fmt.Fprintf(logFile, "# %s %s\n", binary, shellQuote(args))

	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, env: env, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id, which is also the process group id.
func (p *process) PID() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes how the process ended, with the end of its log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited (%v); end of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 30))
}

// stop sends SIGTERM to the process group, waits up to grace for the process to
// end, then sends SIGKILL to the group and waits for the whole group to die.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		// The leader is gone; children it may have left in the group get killed too.
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		waitGroupGone(p.PID(), 5*time.Second)
		return
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// Whatever is left in the group (the leader or anything it started).
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
	waitGroupGone(p.PID(), 5*time.Second)
}

// waitGroupGone waits up to timeout until no process of the group pgid is
// alive: SIGKILL is sent at once, but a busy machine takes a moment to end the
// killed processes. Zombies do not count: they hold nothing and wait for their
// new parent to reap them.
func waitGroupGone(pgid int, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); groupAlive(pgid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}

// groupAlive reports whether a process of the group pgid is alive, from /proc.
func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		_, fields, ok := procStat(e.Name()) // false: gone meanwhile
		if ok && len(fields) > 2 && fields[0] != "Z" && fields[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// KillProcessGroup ends a process group that this package started in an earlier
// run (known only by its id): SIGTERM, up to grace to end, then SIGKILL. It only
// signals pid when /proc says its executable's base name is wantExe, so a
// recycled process id is left alone. It reports whether anything was signalled.
func KillProcessGroup(pid int, wantExe string, grace time.Duration) bool {
	if pid <= 0 || !processIs(pid, wantExe) {
		return false
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	if !waitExited(pid, wantExe, grace) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		waitExited(pid, wantExe, 5*time.Second)
	}
	return true
}

// waitExited waits up to timeout for processExited and reports whether it came.
func waitExited(pid int, exe string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); !processExited(pid, exe); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// processExited reports whether the process exe that had pid has ended: pid is
// gone, a zombie, or another program's. An ending process gives back its memory,
// and with it the command line processIs reads, before it becomes a zombie; in
// between it still runs (its files and sockets are still open), for long on a
// loaded machine, so this reads the name in /proc/PID/stat, which stays.
func processExited(pid int, exe string) bool {
	comm, fields, ok := procStat(strconv.Itoa(pid))
	// comm is the executable's name, cut to 15 bytes.
	return !ok || comm != exe[:min(len(exe), 15)] || fields[0] == "Z"
}

// procStat reads /proc/PID/stat, "pid (comm) state ppid pgrp ...": the
// process's name and the fields after it, state first. ok is false when the
// process is gone.
func procStat(pid string) (comm string, fields []string, ok bool) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", nil, false
	}
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	fields = strings.Fields(string(stat[end+1:]))
	return string(stat[open+1 : end]), fields, len(fields) > 0
}

// processIs reports whether pid is a live (not zombie) process whose first
// argument has the base name exe.
func processIs(pid int, exe string) bool {
	if _, fields, ok := procStat(strconv.Itoa(pid)); !ok || fields[0] == "Z" {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(cmdline) == 0 {
		return false
	}
	argv0 := string(cmdline)
	if i := bytes.IndexByte(cmdline, 0); i >= 0 {
		argv0 = string(cmdline[:i])
	}
	return filepath.Base(argv0) == exe
}

// freePorts returns n distinct free ports.
func freePorts(n int) ([]int, error) {
	// Hold all listeners open until every port is chosen, so no port repeats.
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("finding a free port"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	end := len(data)
	for end > 0 && data[end-1] == '\n' {
		end--
	}
	start, lines := end, 0
	for start > 0 {
		if data[start-1] == '\n' {
			lines++
			if lines == n {
				break
			}
		}
		start--
	}
	return string(data[start:end])
}

func shellQuote(args []string) string {
	out := ""
	for i, a := range args {
		if i > 0 {
			out += " "
		}
		out += strconv.Quote(a)
	}
	return out
}
