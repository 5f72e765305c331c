package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/aiinference/operator/test/localcluster"
)

// The command as a user runs it: up (detached), up again, status, kubeconfig,
// down, and nothing left running afterwards.
func TestUpStatusDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "localcluster")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	stateDir := filepath.Join(tmp, "state")
	root, err := localcluster.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, append(args, "--state-dir", stateDir)...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		code := 0
		if exitErr, ok := err.(*exec.ExitError); ok {
			code = exitErr.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return string(out), code
	}
	// Whatever happens, stop what this test started.
	t.Cleanup(func() { run("down") })

	// A smaller pool than the default: this test is about the command.
	nodes := filepath.Join(tmp, "nodes.yaml")
	if err := os.WriteFile(nodes, []byte("pools:\n- {name: l4, count: 1, gpuProduct: NVIDIA-L4, gpuCount: 1, cpu: '16', memory: 64Gi}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run("up", "--kubelet-delay-scale", "-1"); code == 0 || !strings.Contains(out, "must be a positive number") {
		t.Errorf("up with a negative kubelet delay scale: exit %d\n%s", code, out)
	}
	if out, code := run("up", "--nodes", nodes, "--kubelet-delay-scale", "0.5"); code != 0 || !strings.Contains(out, "export KUBECONFIG=") {
		t.Fatalf("up: exit %d\n%s", code, out)
	}
	state, err := localcluster.ReadState(stateDir)
	if err != nil || !state.Running() || !state.Ready || len(state.Processes) != 5 {
		t.Fatalf("state after up: %+v, %v", state, err)
	}
	stages, err := os.ReadFile(filepath.Join(filepath.Dir(state.Kubeconfig), "kwok-stages.yaml"))
	if err != nil || !strings.Contains(string(stages), "pod-create.yaml, delays x0.5") {
		t.Errorf("kwok's stages do not have the kubelet delay scale of up: %v", err)
	}

	if out, code := run("up"); code != 0 || !strings.Contains(out, "already running") {
		t.Errorf("second up: exit %d\n%s", code, out)
	}
	if out, code := run("status"); code != 0 || !strings.Contains(out, "1 of 1 Ready") {
		t.Errorf("status: exit %d\n%s", code, out)
	}
	out, code := run("kubeconfig")
	if code != 0 || strings.TrimSpace(out) != state.Kubeconfig {
		t.Errorf("kubeconfig: exit %d, printed %q, want %q", code, out, state.Kubeconfig)
	}
	if _, err := os.Stat(state.Kubeconfig); err != nil {
		t.Errorf("kubeconfig file: %v", err)
	}

	if out, code := run("down"); code != 0 || !strings.Contains(out, "stopped") {
		t.Errorf("down: exit %d\n%s", code, out)
	}
	for _, p := range append(state.Processes, localcluster.Process{Name: "supervisor", PID: state.SupervisorPID}) {
		// Signal 0 checks for existence; a zombie waiting for its reaper is gone for our purposes.
		if err := syscall.Kill(p.PID, 0); err == nil && !isZombie(p.PID) {
			t.Errorf("%s (pid %d) still runs after down", p.Name, p.PID)
		}
	}
	if _, err := os.Stat(filepath.Join(stateDir, "cluster")); !os.IsNotExist(err) {
		t.Errorf("cluster directory after down: %v", err)
	}
	if out, code := run("status"); code != 1 || !strings.Contains(out, "not running") {
		t.Errorf("status after down: exit %d\n%s", code, out)
	}
	if out, code := run("down"); code != 0 || !strings.Contains(out, "not running") {
		t.Errorf("second down: exit %d\n%s", code, out)
	}
	if _, code := run("kubeconfig"); code != 1 {
		t.Errorf("kubeconfig after down: exit %d, want 1", code)
	}
}

func isZombie(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
