package localcluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
)

// kube-proxy routes the cluster's Service ClusterIPs on this host, for the
// host itself and for the pods of the real nodes (whose traffic leaves through
// the host's network namespace): in iptables mode it writes KUBE-* chains into
// the host's netfilter tables that DNAT a ClusterIP to one of the Service's
// ready endpoints.
//
// A cluster runs one kube-proxy, as its first real node, not one per real
// node: all real nodes share the host's network namespace, and two
// kube-proxies writing the same KUBE-* chains fight over them (each deletes
// the service chains it has not seen yet, which the other just wrote). For the
// same reason only one local cluster on the host runs kube-proxy at a time: it
// holds a host-wide lock while its kube-proxy's rules are there; another
// cluster waits for it a while, then starts its kube-proxy once it is free.
//
// Teardown removes the KUBE-* chains that were not there before kube-proxy
// started, and the rules that jump to them (kube-proxy --cleanup would leave
// the KUBE-FIREWALL chain it shares with the kubelet), then the tables that
// iptables-nft made for them, when empty, and the nfacct counters it made.
// kube-proxy changes no sysctl with the settings below; those it could change
// are in hostSysctls, recorded and restored like the kubelet's.

// kubeProxyBinary is in the real node binaries' folder (hack/tools/build.sh node).
const kubeProxyBinary = "kube-proxy"

// kubeProxyLockAddr is the host-wide lock of kube-proxy's rules: an abstract
// unix socket, held while it is bound. The kernel frees it when its process
// dies, it leaves no file behind, and it belongs to the network namespace,
// which is exactly the reach of the rules.
var kubeProxyLockAddr = "@localcluster-kube-proxy" // a variable for a test

// KubeProxyHost is what a cluster's kube-proxy changed on the host.
type KubeProxyHost struct {
	// Node is the real node that kube-proxy runs as.
	Node string `json:"node"`
	// ChainsBefore are the KUBE-* chains that were in the host's tables before
	// it started, as "iptables-save TABLE CHAIN", and TablesBefore the tables,
	// as "iptables-save TABLE"; teardown keeps them.
	ChainsBefore []string `json:"chainsBefore"`
	TablesBefore []string `json:"tablesBefore"`
	// CountersBefore are those of kubeProxyCounters that existed then.
	CountersBefore []string `json:"countersBefore"`
}

// checkIPTables reports a missing command that kube-proxy runs (iptables)
// or that its teardown does (nft, which deletes the tables iptables-nft made).
func checkIPTables() error {
	for _, cmd := range []string{"iptables", "iptables-save", "iptables-restore", "nft"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return &MissingPackagesError{Command: cmd, Why: "kube-proxy routes Service ClusterIPs with iptables",
				Packages: []string{"iptables", "nftables"}}
		}
	}
	return nil
}

// MissingPackagesError is a host that could run real nodes but lacks a
// command of a Debian package, which hack/tools/build.sh node-packages (and
// node) installs as root with apt-get.
type MissingPackagesError struct {
	// Command is the command not found, Why what needs it.
	Command, Why string
	// Packages are the Debian packages to install.
	Packages []string
}

func (e *MissingPackagesError) Error() string {
	return fmt.Sprintf("real nodes need %s (%s): apt-get install %s, which hack/tools/build.sh node-packages does as root",
		e.Command, e.Why, strings.Join(e.Packages, " "))
}

// kubeProxyLockWait is how long a cluster's first real node waits for another
// cluster's kube-proxy to stop (a test's cluster lives a minute or so) before
// the cluster goes on without one and starts it once the lock frees.
const kubeProxyLockWait = 90 * time.Second

// kubeProxyState is the kube-proxy of a cluster, guarded by Cluster.mu.
type kubeProxyState struct {
	// lock is the host's kube-proxy lock while the cluster holds it.
	lock io.Closer
	// done is nil until the first real node starts, and closed once kube-proxy
	// runs or cannot start (err says why).
	done chan struct{}
	err  error
}

// startKubeProxy starts the cluster's kube-proxy as node, the cluster's
// first real node, and waits until it has written its rules. While another
// local cluster runs kube-proxy it waits up to kubeProxyLockWait, then leaves
// it to start in the background once the lock frees (WaitKubeProxy waits for
// that). It does nothing for the later real nodes. c.real.mu is held.
func (c *Cluster) startKubeProxy(ctx context.Context, node RealNode) error {
	c.mu.Lock()
	first := c.real.kubeProxy.done == nil
	if first {
		c.real.kubeProxy.done = make(chan struct{})
	}
	c.mu.Unlock()
	if !first {
		return nil
	}
	// Within the start's own time: half of what is left of it at most, so that
	// a start slowed by a loaded host goes on without kube-proxy rather than
	// fail (seen: 1.5 min to the real node beside a running e2e suite, then
	// the start's 3 min ran out in this wait).
	wait := kubeProxyLockWait
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline)/2)
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	lock, err := takeKubeProxyLock(waitCtx, c.progress)
	cancel()
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(c.progress, "Going on without kube-proxy: %v. This cluster's Services route once it stops\n", err)
		go c.startKubeProxyLater(node)
		return nil
	}
	if err == nil {
		err = c.runKubeProxy(ctx, node, lock)
	}
	c.kubeProxyStarted(err)
	return err
}

// startKubeProxyLater starts the cluster's kube-proxy as node once it can
// take the host's kube-proxy lock, unless the cluster stops first.
func (c *Cluster) startKubeProxyLater(node RealNode) {
	for {
		c.mu.Lock()
		stopped := c.stopped
		c.mu.Unlock()
		if stopped {
			c.kubeProxyStarted(errors.New("the cluster stopped before kube-proxy could start"))
			return
		}
		lock, err := tryKubeProxyLock()
		if err == nil && lock == nil {
			time.Sleep(time.Second)
			continue
		}
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			c.real.mu.Lock()
			err = c.runKubeProxy(ctx, node, lock)
			c.real.mu.Unlock()
			cancel()
		}
		if err != nil {
			fmt.Fprintf(c.progress, "Starting kube-proxy: %v\n", err)
		}
		c.kubeProxyStarted(err)
		return
	}
}

// kubeProxyStarted tells WaitKubeProxy that kube-proxy runs (err nil) or cannot start.
func (c *Cluster) kubeProxyStarted(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.real.kubeProxy.err = err
	close(c.real.kubeProxy.done)
}

// WaitKubeProxy waits until the cluster's kube-proxy routes its Services'
// ClusterIPs on this host, or ctx ends. It runs once the first real node has
// started, unless another local cluster on the host ran one then: their rules
// are host-wide, so one cluster at a time runs one, and this cluster's starts
// when the other's stops. It returns an error if the cluster has no real
// node, or kube-proxy could not start.
func (c *Cluster) WaitKubeProxy(ctx context.Context) error {
	c.mu.Lock()
	done := c.real.kubeProxy.done
	c.mu.Unlock()
	if done == nil {
		return errors.New("kube-proxy runs with the real nodes, and the cluster has none")
	}
	select {
	case <-done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.real.kubeProxy.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the local cluster of %s to stop its kube-proxy, which holds the host's Service rules: %w",
			describeProcess(kubeProxyLockHolder()), ctx.Err())
	}
}

// runKubeProxy starts kube-proxy as node, the cluster holding the host's
// kube-proxy lock, and waits until it has written its rules. c.real.mu is held.
func (c *Cluster) runKubeProxy(ctx context.Context, node RealNode, lock io.Closer) error {
	chains, tables, err := kubeChains()
	if err != nil {
		lock.Close()
		return err
	}
	counters := existingCounters()
	// Recorded before kube-proxy starts, so that teardown undoes a half start
	// and releases the lock.
	c.mu.Lock()
	stopped := c.stopped
	if !stopped {
		c.real.kubeProxy.lock = lock
		c.real.host.KubeProxy = &KubeProxyHost{Node: node.Name, ChainsBefore: chains, TablesBefore: tables, CountersBefore: counters}
	}
	c.mu.Unlock()
	if stopped {
		lock.Close()
		return errors.New("cluster stopped while starting")
	}

	dir := filepath.Join(node.Dir, kubeProxyBinary)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// The bootstrap ClusterRoleBinding system:node-proxier grants this user
	// what kube-proxy reads.
	if err := c.writeClientKubeconfig(kubeconfig, "system:kube-proxy", ""); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	config, err := kubeProxyConfigYAML(kubeconfig, ports[0], ports[1])
	if err != nil {
		return err
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, config, 0o644); err != nil {
		return err
	}
	if err := c.startNodeProcess(filepath.Join(c.logsDir, node.Name), kubeProxyBinary,
		filepath.Join(c.real.options.BinDir, kubeProxyBinary),
		"--config="+configPath,
		"--hostname-override="+node.Name,
		// Each sync of the rules and how long it took, for when a Service does
		// not route: a failed sync is retried only after iptables.syncPeriod.
		"--v=2",
	); err != nil {
		return err
	}
	// /healthz answers 200 once the rules of the first sync are in.
	return c.waitHTTP(ctx, node.Name+" "+kubeProxyBinary, "http://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz", nil)
}

// kubeProxyConfigYAML is kube-proxy's KubeProxyConfiguration. It has no field
// for the service CIDR: kube-proxy learns it from the API server.
func kubeProxyConfigYAML(kubeconfig string, healthzPort, metricsPort int) ([]byte, error) {
	config := map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"mode":             "iptables",
		"clientConnection": map[string]any{"kubeconfig": kubeconfig},
		// Loopback only, on ports nothing else of the host uses.
		"healthzBindAddress": "127.0.0.1:" + strconv.Itoa(healthzPort),
		"metricsBindAddress": "127.0.0.1:" + strconv.Itoa(metricsPort),
		// Every real node's pods, which need no masquerading to reach a ClusterIP.
		"clusterCIDR":       realPodSubnetPrefix + "0.0/16",
		"detectLocalMode":   "ClusterCIDR",
		"nodePortAddresses": []string{"primary"},
		"iptables": map[string]any{
			// NodePorts on 127.0.0.1 need net.ipv4.conf.all.route_localnet=1,
			// which would open loopback to the network.
			"localhostNodePorts": false,
			"syncPeriod":         "30s",
			"minSyncPeriod":      "1s",
		},
		// Leave the host's conntrack table as it is: its size and timeouts are
		// the host's sysctls, shared with all its other work.
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
		// Root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE in this VM).
		"oomScoreAdj": 0,
	}
	return yaml.Marshal(config)
}

// takeKubeProxyLock takes the host's kube-proxy lock, waiting while another
// process holds it, until ctx ends. Closing the listener releases it.
func takeKubeProxyLock(ctx context.Context, progress io.Writer) (net.Listener, error) {
	for said := false; ; said = true {
		l, err := tryKubeProxyLock()
		if l != nil || err != nil {
			return l, err
		}
		holder := describeProcess(kubeProxyLockHolder())
		if !said {
			fmt.Fprintf(progress, "Waiting for the local cluster of %s to stop its kube-proxy: its rules are host-wide, so one cluster at a time runs one\n", holder)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("another local cluster on this host (%s) runs kube-proxy: %w", holder, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// tryKubeProxyLock takes the host's kube-proxy lock if it is free; a nil
// listener if another process holds it.
func tryKubeProxyLock() (net.Listener, error) {
	l, err := net.Listen("unix", kubeProxyLockAddr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("taking the host's kube-proxy lock: %w", err)
	}
	// Whoever asks who holds the lock connects; let them go at once.
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	return l, nil
}

// kubeProxyLockHolder is the process id of the lock's holder, 0 if none.
func kubeProxyLockHolder() int {
	conn, err := net.Dial("unix", kubeProxyLockAddr)
	if err != nil {
		return 0
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	if err := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// describeProcess names pid and its command line, for a message.
func describeProcess(pid int) string {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if pid == 0 || err != nil {
		return "a process that has just ended"
	}
	return fmt.Sprintf("pid %d: %s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
}

// tearDownKubeProxy removes what the kube-proxy of h left on the host, once
// it has ended: the KUBE-* chains, tables and counters that were not there
// before it started. It leaves them to another cluster that has taken the
// lock meanwhile (its kube-proxy has made them its own), but not to this
// process: a cluster holds the lock until its teardown is done.
func tearDownKubeProxy(h *KubeProxyHost, progress io.Writer) error {
	if h == nil {
		return nil
	}
	lock, err := tryKubeProxyLock()
	switch {
	case err != nil:
		return err
	case lock != nil:
		defer lock.Close()
	case kubeProxyLockHolder() != os.Getpid():
		fmt.Fprintf(progress, "Leaving kube-proxy's rules to the local cluster of %s\n", describeProcess(kubeProxyLockHolder()))
		return nil
	}
	errs := []error{removeKubeChains(h.ChainsBefore, h.TablesBefore)}
	// The counters last, once no rule counts into them.
	for _, name := range existingCounters() {
		if !slices.Contains(h.CountersBefore, name) {
			if err := nfacctRequest(nfacctDel, name); err != nil {
				errs = append(errs, fmt.Errorf("deleting kube-proxy's nfacct counter %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// kubeProxyCounters are the nfacct counters kube-proxy creates for its
// metrics (packets dropped as invalid by conntrack, packets to NodePorts on
// localhost). They are the kernel's, named for the whole network namespace,
// and outlive kube-proxy.
var kubeProxyCounters = []string{"ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts"}

// existingCounters lists those of kubeProxyCounters that exist. A kernel
// without nfacct has none.
func existingCounters() []string {
	return slices.DeleteFunc(slices.Clone(kubeProxyCounters), func(name string) bool {
		return nfacctRequest(nfacctGet, name) != nil
	})
}

// nfacct message types and the name attribute (linux/netfilter/nfnetlink_acct.h).
const (
	nfacctGet      = 1
	nfacctDel      = 3
	nfacctAttrName = 1
)

// nfacctRequest sends one nfacct request about the counter name over
// netfilter's netlink socket, as the nfacct command would, and returns the
// kernel's answer: nil, or an errno (ENOENT: no such counter).
func nfacctRequest(msgType uint16, name string) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// nlmsghdr, nfgenmsg (family, version, resource id: zeros), then the name
	// attribute: length, type, the NUL-terminated name, padded to 4 bytes.
	attrLen := unix.SizeofRtAttr + len(name) + 1
	msg := make([]byte, unix.SizeofNlMsghdr+4+(attrLen+3)&^3)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], unix.NFNL_SUBSYS_ACCT<<8|msgType)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint16(msg[unix.SizeofNlMsghdr+4:], uint16(attrLen))
	binary.NativeEndian.PutUint16(msg[unix.SizeofNlMsghdr+6:], nfacctAttrName)
	copy(msg[unix.SizeofNlMsghdr+8:], name)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	// The counter's description (for a get), then the acknowledgement: an
	// error message whose errno is 0 for success.
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return syscall.Errno(errno)
				}
				return nil
			}
		}
	}
}

// iptablesFamilies are the commands that read and write the host's IPv4 and
// IPv6 tables (kube-proxy writes both where both work), and the nftables
// family of the tables that iptables-nft makes for them.
var iptablesFamilies = []iptablesFamily{
	{save: "iptables-save", restore: "iptables-restore", nft: "ip"},
	{save: "ip6tables-save", restore: "ip6tables-restore", nft: "ip6"},
}

type iptablesFamily struct{ save, restore, nft string }

// iptablesTable is one table of an iptables-save dump.
type iptablesTable struct {
	family iptablesFamily // whose save command dumped it
	name   string
	// nft tells that the table is an nftables table (iptables-nft), which
	// can be deleted, rather than one of the kernel's legacy tables.
	nft    bool
	chains []iptablesChain // in the order of the dump
	rules  []string        // "-A CHAIN ..." lines
}

// iptablesChain is a chain of a table; policy is "-" for a chain that is not
// a built-in one.
type iptablesChain struct{ name, policy string }

// id names the table as KubeProxyHost records it: "iptables-save nat".
func (t iptablesTable) id() string { return t.family.save + " " + t.name }

// empty reports whether the table holds nothing but built-in chains without
// rules that accept everything: what iptables-nft makes at its first use.
func (t iptablesTable) empty() bool {
	return len(t.rules) == 0 && !slices.ContainsFunc(t.chains, func(c iptablesChain) bool { return c.policy != "ACCEPT" })
}

// hostTables reads the host's tables of every family whose save command is
// installed.
func hostTables() ([]iptablesTable, error) {
	var tables []iptablesTable
	for _, f := range iptablesFamilies {
		dump, err := iptablesSave(f.save)
		if err != nil {
			return nil, err
		}
		tables = append(tables, parseIPTablesSave(f, dump)...)
	}
	return tables, nil
}

// kubeChains lists the KUBE-* chains in the host's tables, as
// "iptables-save TABLE CHAIN", and the tables, as "iptables-save TABLE".
func kubeChains() (chains, tables []string, err error) {
	all, err := hostTables()
	for _, t := range all {
		tables = append(tables, t.id())
		for _, c := range t.chains {
			if strings.HasPrefix(c.name, "KUBE-") {
				chains = append(chains, t.id()+" "+c.name)
			}
		}
	}
	return chains, tables, err
}

// removeKubeChains removes from the host's tables the KUBE-* chains that
// are not in chainsBefore (as kubeChains lists them) and the rules of other
// chains that jump to them, in one iptables-restore per family; then the
// tables iptables-nft made that are not in tablesBefore and hold nothing.
func removeKubeChains(chainsBefore, tablesBefore []string) error {
	var errs []error
	for _, f := range iptablesFamilies {
		dump, err := iptablesSave(f.save)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		script := removeKubeChainsScript(parseIPTablesSave(f, dump), chainsBefore)
		if script == "" {
			continue
		}
		cmd := exec.Command(f.restore, "--noflush", "--wait=5")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("removing kube-proxy's chains with %s: %w: %s\n%s", f.restore, err, out, script))
		}
	}
	tables, err := hostTables()
	errs = append(errs, err)
	for _, t := range tables {
		if !t.nft || slices.Contains(tablesBefore, t.id()) || !t.empty() {
			continue
		}
		if out, err := exec.Command("nft", "delete", "table", t.family.nft, t.name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting the empty table %s %s that iptables made for kube-proxy: %w: %s", t.family.nft, t.name, err, out))
		}
	}
	if left, _, err := kubeChains(); err != nil {
		errs = append(errs, err)
	} else if left = slices.DeleteFunc(left, func(c string) bool { return slices.Contains(chainsBefore, c) }); len(left) > 0 {
		errs = append(errs, fmt.Errorf("kube-proxy's chains are still there: %v", left))
	}
	return errors.Join(errs...)
}

// removeKubeChainsScript is the iptables-restore --noflush input that
// removes the KUBE-* chains of tables that are not in chainsBefore, and every
// rule that jumps to them: the chains are declared (which flushes them), the
// jumps to them from other chains deleted, then the chains deleted. Empty
// when there is nothing to remove.
func removeKubeChainsScript(tables []iptablesTable, chainsBefore []string) string {
	return removeChainsScript(tables, func(t iptablesTable, chain string) bool {
		return strings.HasPrefix(chain, "KUBE-") && !slices.Contains(chainsBefore, t.id()+" "+chain)
	})
}

// removeChainsScript is the iptables-restore --noflush input that removes the
// chains of tables that pick picks, and every rule that jumps to them, as
// removeKubeChainsScript does. Empty when there is nothing to remove.
func removeChainsScript(tables []iptablesTable, pick func(t iptablesTable, chain string) bool) string {
	var b strings.Builder
	for _, t := range tables {
		var remove []string
		for _, c := range t.chains {
			if pick(t, c.name) {
				remove = append(remove, c.name)
			}
		}
		if len(remove) == 0 {
			continue
		}
		b.WriteString("*" + t.name + "\n")
		for _, chain := range remove {
			b.WriteString(":" + chain + " - [0:0]\n")
		}
		for _, rule := range t.rules {
			// "-A CHAIN spec... -j TARGET ...": iptables-save writes one rule a line.
			fields := strings.Fields(rule)
			if len(fields) < 2 || slices.Contains(remove, fields[1]) {
				continue
			}
			for i := 2; i+1 < len(fields); i++ {
				if (fields[i] == "-j" || fields[i] == "-g") && slices.Contains(remove, fields[i+1]) {
					b.WriteString("-D" + strings.TrimPrefix(rule, "-A") + "\n")
					break
				}
			}
		}
		for _, chain := range remove {
			b.WriteString("-X " + chain + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// parseIPTablesSave reads a dump of family's save command.
func parseIPTablesSave(family iptablesFamily, dump []byte) []iptablesTable {
	var tables []iptablesTable
	nft := false
	for _, line := range strings.Split(string(dump), "\n") {
		switch {
		case strings.HasPrefix(line, "# Generated by "):
			// "# Generated by iptables-save v1.8.9 (nf_tables) on ..."
			nft = strings.Contains(line, "(nf_tables)")
		case strings.HasPrefix(line, "*"):
			tables = append(tables, iptablesTable{family: family, name: line[1:], nft: nft})
		case len(tables) == 0:
		case strings.HasPrefix(line, ":"):
			// ":CHAIN POLICY [packets:bytes]"
			if fields := strings.Fields(line[1:]); len(fields) >= 2 {
				t := &tables[len(tables)-1]
				t.chains = append(t.chains, iptablesChain{name: fields[0], policy: fields[1]})
			}
		case strings.HasPrefix(line, "-A "):
			t := &tables[len(tables)-1]
			t.rules = append(t.rules, line)
		}
	}
	return tables
}

// iptablesSave dumps the host's tables with the command save (iptables-save
// or ip6tables-save); nothing when that command is not installed.
func iptablesSave(save string) ([]byte, error) {
	if _, err := exec.LookPath(save); err != nil {
		return nil, nil //nolint:nilerr // no such family here, so no rules in it
	}
	var stderr bytes.Buffer
	cmd := exec.Command(save)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", save, err, stderr.String())
	}
	return out, nil
}
