package localcluster

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// processExited is what down waits for: a live process has not exited; one
// that ended has, as a zombie not yet reaped and once reaped; and a process id
// another program holds tells nothing of the one asked about.
func TestProcessExited(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	pid := sleep.Process.Pid
	if processExited(pid, "sleep") {
		t.Fatal("a live sleep counts as exited")
	}
	if !processExited(os.Getpid(), "sleep") {
		t.Error("another program's process counts as the sleep")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie.
	if !waitExited(pid, "sleep", 5*time.Second) {
		t.Error("a killed sleep, a zombie, does not count as exited")
	}
	_ = sleep.Wait()
	if !processExited(pid, "sleep") {
		t.Error("a reaped sleep does not count as exited")
	}
}
