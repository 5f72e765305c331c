package main

// Stand-ins for vLLM's multi-node-serving.sh and for the Ray CLI it runs, not
// Ray: they play how a group's members find each other, wait for each other
// and fail, so that a LeaderWorkerSet group on real nodes starts, waits and
// restarts as one with vLLM would, and no more. No GPU work is shared: the
// leader's engine is the simulator alone, and a worker only holds its place
// in the cluster.
//
// multi-node-serving.sh (vLLM's examples/online_serving, as the operator
// runs it from the vllm-openai image) is followed line by line:
//   - leader --ray_cluster_size=N: `ray start --head --port=6379`, then every
//     5 s counts the cluster's live nodes (head included) until they are
//     exactly N, then exits 0; after ray_init_timeout (300 s) tries it says
//     "Waiting for all ray workers to be active timed out." and exits 1.
//   - worker --ray_address=A: `ray start --address=A:6379 --block`; when that
//     exits non-zero (the address does not resolve, nothing listens, or the
//     head went away), "Waiting until the ray worker is active...", 5 s, and
//     again, until the same bound; then "Ray worker starts timeout" and 1.
//
// ray (the CLI) is played for what the script runs:
//   - `ray start --head --port=P`: starts the head in the background (as
//     Ray's GCS does), which serves on P until the container ends, and returns
//     once it listens. --block serves in the foreground.
//   - `ray start --address=HOST:P --block`: resolves HOST (with the pod's
//     resolv.conf, so through the cluster DNS), connects to the head, joins,
//     and holds the connection until the head closes it or stops answering
//     (TCP keep-alive every 3 s, 5 probes: about Ray's health check of a 3 s
//     period and 5 misses); then it exits 1. Ray's worker would wait another
//     60 s for the head to come back before it gives up; this one does not.
//
// The head counts a member from its join until its connection ends; the
// leader's wait reads that count. The wire is a line of text each way,
// nothing of Ray's protocol.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// rayPort is the Ray head's port, the script's default.
	rayPort = 6379
	// rayInitTimeout is the script's bound: it tries every 5 s while
	// i < ray_init_timeout, i counting 5 a try.
	rayInitTimeout = 300
	// joinTimeout bounds each step of a join: resolving the head's name,
	// connecting, and its answer.
	joinTimeout = 10 * time.Second
)

// keepAlive notices a head or member that stopped answering (a node gone
// without closing its connections).
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 3 * time.Second, Interval: 3 * time.Second, Count: 5}

// scriptEnv is what multiNodeServing runs with: where it writes, how long it
// waits between tries, how it runs the ray CLI and counts the live nodes.
type scriptEnv struct {
	out    io.Writer
	period time.Duration
	ray    func(args ...string) int
	nodes  func(port int) (int, error)
}

// newScriptEnv runs the ray CLI found in PATH, as the script does.
func newScriptEnv(out io.Writer) scriptEnv {
	return scriptEnv{
		out:    out,
		period: 5 * time.Second,
		ray: func(args ...string) int {
			path, err := exec.LookPath("ray")
			if err != nil {
				fmt.Fprintf(out, "%s: line 1: ray: command not found\n", multiNodeScript)
				return 127
			}
			return runChild(path, append([]string{"ray"}, args...))
		},
		nodes: func(port int) (int, error) { return liveNodes(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))) },
	}
}

// multiNodeServing is multi-node-serving.sh SUBCOMMAND ARGS...; it returns
// the exit code.
func multiNodeServing(args []string, env scriptEnv) int {
	if len(args) == 0 {
		fmt.Fprintln(env.out, "unknown subcommand: ")
		return 1
	}
	subcommand, args := args[0], args[1:]
	port, timeout := strconv.Itoa(rayPort), rayInitTimeout
	var address, clusterSize string
	var params []string
	for _, a := range args {
		name, value, _ := strings.Cut(a, "=")
		switch {
		case name == "--ray_port":
			port = value
		case name == "--ray_init_timeout":
			n, err := strconv.Atoi(value)
			if err != nil {
				fmt.Fprintf(env.out, "%s: line 1: %s: integer expression expected\n", multiNodeScript, value)
				return 2
			}
			timeout = n
		case name == "--ray_address" && subcommand == "worker":
			address = value
		case name == "--ray_cluster_size" && subcommand == "leader":
			clusterSize = value
		default:
			params = append(params, a)
		}
	}
	switch subcommand {
	case "worker":
		if address == "" {
			fmt.Fprintln(env.out, "Error: Missing argument --ray_address")
			return 1
		}
		for i := 0; i < timeout; i += 5 {
			if env.ray(append([]string{"start", "--address=" + address + ":" + port, "--block"}, params...)...) == 0 {
				fmt.Fprintf(env.out, "Worker: Ray runtime started with head address %s:%s\n", address, port)
				return 0
			}
			fmt.Fprintln(env.out, "Waiting until the ray worker is active...")
			time.Sleep(env.period)
		}
		fmt.Fprintf(env.out, "Ray worker starts timeout, head address: %s:%s\n", address, port)
		return 1
	case "leader":
		if clusterSize == "" {
			fmt.Fprintln(env.out, "Error: Missing argument --ray_cluster_size")
			return 1
		}
		want, err := strconv.Atoi(clusterSize)
		if err != nil {
			fmt.Fprintf(env.out, "%s: line 1: %s: integer expression expected\n", multiNodeScript, clusterSize)
			return 2
		}
		portNumber, err := strconv.Atoi(port)
		if err != nil {
			fmt.Fprintf(env.out, "%s: line 1: %s: not a port\n", multiNodeScript, port)
			return 2
		}
		// As in the script, a failed start is not checked: the wait below fails.
		env.ray(append([]string{"start", "--head", "--port=" + port}, params...)...)
		for i := 0; i < timeout; i += 5 {
			active, err := env.nodes(portNumber)
			if err != nil {
				fmt.Fprintf(env.out, "Reading the Ray cluster's nodes: %v\n", err)
			}
			if active == want {
				fmt.Fprintln(env.out, "All ray workers are active and the ray cluster is initialized successfully.")
				return 0
			}
			fmt.Fprintf(env.out, "Wait for all ray workers to be active. %d/%d is active\n", active, want)
			time.Sleep(env.period)
		}
		fmt.Fprintln(env.out, "Waiting for all ray workers to be active timed out.")
		return 1
	default:
		fmt.Fprintf(env.out, "unknown subcommand: %s\n", subcommand)
		return 1
	}
}

// rayMain is `ray ARGS...` for what multi-node-serving.sh runs; it returns
// the exit code.
func rayMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "start" {
		fmt.Fprintf(stderr, "ray: fake-vllm's Ray stand-in runs only `ray start`, not ray %s\n", strings.Join(args, " "))
		return 2
	}
	var head, block bool
	port, address := strconv.Itoa(rayPort), ""
	for _, a := range args[1:] {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--head":
			head = true
		case "--block":
			block = true
		case "--port":
			port = value
		case "--address":
			address = value
		default:
			fmt.Fprintf(stderr, "Error: No such option: %s (fake-vllm's Ray stand-in takes --head, --port, --address and --block)\n", name)
			return 2
		}
	}
	switch {
	case head && block:
		ln, err := (&net.ListenConfig{KeepAliveConfig: keepAlive}).Listen(context.Background(), "tcp", ":"+port)
		if err != nil {
			fmt.Fprintf(stderr, "Ray head: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "Ray head (fake-vllm's stand-in) listening on %s\n", ln.Addr())
		newRayHead(ln, stdout).serve()
		return 1
	case head:
		return startHeadInBackground(port, stdout, stderr)
	case address != "" && block:
		return joinHead(address, stdout, stderr, nil)
	default:
		fmt.Fprintln(stderr, "ray: fake-vllm's Ray stand-in starts a head (--head) or joins one (--address=HOST:PORT --block)")
		return 2
	}
}

// startHeadInBackground is `ray start --head`: it starts the head as a
// process of its own that outlives this one (the script's, and the shell's
// exec into the engine), and returns once it listens.
func startHeadInBackground(port string, stdout, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "ray:", err)
		return 1
	}
	cmd := &exec.Cmd{Path: self, Args: []string{"ray", "start", "--head", "--port=" + port, "--block"},
		Stdout: os.Stdout, Stderr: os.Stderr}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "ray: starting the head:", err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(joinTimeout)
	for time.Now().Before(deadline) {
		if _, err := liveNodes(net.JoinHostPort("127.0.0.1", port)); err == nil {
			fmt.Fprintf(stdout, "Ray runtime started: the head (fake-vllm's stand-in, pid %d) serves on port %s\n", cmd.Process.Pid, port)
			return 0
		}
		select {
		case err := <-exited:
			fmt.Fprintf(stderr, "ray: the head exited: %v\n", err)
			return 1
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Fprintf(stderr, "ray: the head does not listen on port %s after %s\n", port, joinTimeout)
	return 1
}

// joinHead is `ray start --address=HOST:PORT --block`: it joins the head and
// holds the connection; it returns 1 when it cannot join or once the head is
// gone. joined, if set, is closed once it has joined (for tests).
func joinHead(address string, stdout, stderr io.Writer, joined chan<- struct{}) int {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		fmt.Fprintf(stderr, "ray: --address=%s: %v\n", address, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "ray: cannot resolve the Ray head's address %s: %v\n", host, err)
		return 1
	}
	dialer := net.Dialer{Timeout: joinTimeout, KeepAliveConfig: keepAlive}
	conn, err := dialer.Dial("tcp", net.JoinHostPort(ips[0], port))
	if err != nil {
		fmt.Fprintf(stderr, "ray: cannot reach the Ray head at %s (%s): %v\n", address, ips[0], err)
		return 1
	}
	defer conn.Close()
	name, _ := os.Hostname()
	_ = conn.SetDeadline(time.Now().Add(joinTimeout))
	reader := bufio.NewReader(conn)
	if _, err := fmt.Fprintf(conn, "JOIN %s\n", name); err != nil {
		fmt.Fprintf(stderr, "ray: joining the Ray head at %s: %v\n", address, err)
		return 1
	}
	answer, err := reader.ReadString('\n')
	count, found := strings.CutPrefix(strings.TrimSpace(answer), "OK ")
	if err != nil || !found {
		fmt.Fprintf(stderr, "ray: joining the Ray head at %s: answer %q, %v\n", address, answer, err)
		return 1
	}
	_ = conn.SetDeadline(time.Time{})
	fmt.Fprintf(stdout, "Joined the Ray head at %s (%s) as node %s: %s nodes alive\n", address, conn.RemoteAddr(), name, count)
	if joined != nil {
		close(joined)
	}
	_, err = io.Copy(io.Discard, reader)
	if err == nil {
		err = io.EOF
	}
	fmt.Fprintf(stderr, "ray: the Ray head at %s is gone (%v): this node leaves the cluster\n", address, err)
	return 1
}

// liveNodes asks the head at addr how many nodes are alive, itself included.
func liveNodes(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, joinTimeout)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(joinTimeout))
	if _, err := fmt.Fprintln(conn, "STATUS"); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(line))
}

// rayHead is the head: it counts the members joined to it.
type rayHead struct {
	ln  net.Listener
	out io.Writer

	mu      sync.Mutex
	members map[net.Conn]string
	closed  bool
}

func newRayHead(ln net.Listener, out io.Writer) *rayHead {
	return &rayHead{ln: ln, out: out, members: map[net.Conn]string{}}
}

// serve answers joins and status until the listener closes.
func (h *rayHead) serve() {
	for {
		conn, err := h.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EINVAL) {
				fmt.Fprintf(h.out, "Ray head: %v\n", err)
			}
			return
		}
		go h.handle(conn)
	}
}

// alive is the head and its members.
func (h *rayHead) alive() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return 1 + len(h.members)
}

func (h *rayHead) handle(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(joinTimeout))
	reader := bufio.NewReader(conn)
	line, err := reader.ReadString('\n')
	if err != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	command, name, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch command {
	case "STATUS":
		fmt.Fprintf(conn, "%d\n", h.alive())
	case "JOIN":
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		h.members[conn] = name
		alive := 1 + len(h.members)
		h.mu.Unlock()
		fmt.Fprintf(h.out, "Ray head: node %s (%s) joined: %d nodes alive\n", name, conn.RemoteAddr(), alive)
		fmt.Fprintf(conn, "OK %d\n", alive)
		_, err := io.Copy(io.Discard, reader) // until the member leaves or stops answering
		h.mu.Lock()
		delete(h.members, conn)
		alive = 1 + len(h.members)
		h.mu.Unlock()
		fmt.Fprintf(h.out, "Ray head: node %s left (%s): %d nodes alive\n", name, endOf(err), alive)
	}
}

// close stops the head and drops its members, as a head that dies does.
func (h *rayHead) close() {
	h.ln.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for conn := range h.members {
		conn.Close()
	}
}

// endOf names how a connection ended.
func endOf(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}
