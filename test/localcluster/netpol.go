package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cluster's NetworkPolicy implementation on its real nodes: kube-router's
// network policy controller (its firewall alone: no routing, no service
// proxy), built by hack/tools/build.sh netpol and run on the host as the
// cluster's first real node, beside kube-proxy.
//
// Why not sigs.k8s.io/kube-network-policies (v0.8.0): it sends the first
// packet of each connection to user space with nftables' queue expression,
// which this host's kernel lacks (CONFIG_NFT_QUEUE is not set, no modules to
// load): its one nftables batch (table, sets, chains and the queue rules) is
// refused with "No such file or directory", so it writes no rule and every
// packet passes. kube-router enforces with iptables (through iptables-nft) and
// ipsets, which this kernel has, and was written for a bridge CNI: it sends a
// pod's traffic through the pod's own chain whether it is routed (another
// node's pods, Service traffic after kube-proxy's DNAT, the host) or switched
// on the bridge (bridge-nf-call-iptables, which the bridge's netfilter sets).
//
// Every real node of a cluster shares the host's network namespace and its
// node address (the kubelets' --node-ip), and kube-router takes the pods whose
// hostIP is its node's address as its own: so one kube-router, as the first
// real node, enforces the policies of every real node's pods, as one
// kube-proxy routes their Services. It rewrites the host's filter table, so it
// runs only in the cluster that runs the host's kube-proxy (which holds the
// host's kube-proxy lock): no other cluster's kube-proxy or kube-router writes
// the table meanwhile, and kube-proxy's teardown, which removes every KUBE-*
// chain it did not find, cannot remove another cluster's policies.
//
// Traffic from the host to a pod of its node (the kubelet's probes, a gateway
// or an operator that runs on the host) is let in whatever the policies say:
// kube-router's first rule for a pod accepts a source address of the host
// (--src-type LOCAL), as the NetworkPolicy API leaves traffic from a pod's
// node to the implementation and most let it in.

// kubeRouterBinary is in the folder hack/tools/build.sh netpol prints.
const kubeRouterBinary = "kube-router"

// kubeRouterChainPrefixes name kube-router's chains: its top-level chains
// (jumped to from INPUT, FORWARD and OUTPUT), one per policy and one per pod.
var kubeRouterChainPrefixes = []string{"KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-"}

// kubeRouterIPSetPrefixes name kube-router's ipsets: a policy's source and
// destination pods and address blocks.
var kubeRouterIPSetPrefixes = []string{"KUBE-SRC-", "KUBE-DST-"}

// kubeRouterUser is the user of kube-router's client certificate, bound to
// the ClusterRole kubeRouterRole.
const (
	kubeRouterUser = "system:kube-router"
	kubeRouterRole = "localcluster:kube-router"
)

// NetworkPolicyOptions configure StartNetworkPolicy. The zero value is the default.
type NetworkPolicyOptions struct {
	// BinDir holds kube-router. Empty: hack/tools/build.sh netpol builds it or
	// finds it in its cache.
	BinDir string
	// RepoRoot is the repository checkout, for the build. Empty: the cluster's
	// or FindRepoRoot from the working directory.
	RepoRoot string
}

// NetworkPolicyAgent is the cluster's running NetworkPolicy implementation.
type NetworkPolicyAgent struct {
	// Node is the real node it runs as; it enforces the policies of every real
	// node's pods (they share the host's network namespace and node address).
	Node string `json:"node"`
	// Log is kube-router's log.
	Log string `json:"log"`
}

// NetworkPolicyHost is what the cluster's NetworkPolicy agent changed on the
// host: kube-router's chains in the host's tables, the rules that jump to them,
// and its ipsets. Teardown removes those that were not there before it started.
type NetworkPolicyHost struct {
	// ChainsBefore are kube-router's chains that were there before, as
	// "iptables-save TABLE CHAIN", and IPSetsBefore its ipsets.
	ChainsBefore []string `json:"chainsBefore"`
	IPSetsBefore []string `json:"ipsetsBefore"`
}

// NetworkPolicy is the cluster's NetworkPolicy agent, nil until
// StartNetworkPolicy has started it.
func (c *Cluster) NetworkPolicy() *NetworkPolicyAgent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.real.netPolicy
}

// StartNetworkPolicy runs the cluster's NetworkPolicy implementation on the
// host for its real nodes (kube-router's firewall, see above) until the
// cluster stops, and returns once kube-router has written its chains. The
// cluster needs a real node, and its kube-proxy running (WaitKubeProxy: another
// cluster on the host may hold it for a while). A second call returns the
// running agent.
func (c *Cluster) StartNetworkPolicy(ctx context.Context, opts NetworkPolicyOptions) (*NetworkPolicyAgent, error) {
	if a := c.NetworkPolicy(); a != nil {
		return a, nil
	}
	nodes := c.RealNodes()
	if len(nodes) == 0 {
		return nil, errors.New("the NetworkPolicy agent enforces the policies of real nodes' pods, and the cluster has none")
	}
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, &MissingPackagesError{Command: "ipset", Why: "kube-router keeps the peers of NetworkPolicies in ipsets", Packages: []string{"ipset"}}
	}
	// The host's filter table is written by kube-proxy and kube-router alike:
	// only the cluster that holds the host's kube-proxy lock runs them.
	if err := c.WaitKubeProxy(ctx); err != nil {
		return nil, fmt.Errorf("the NetworkPolicy agent runs beside the cluster's kube-proxy: %w", err)
	}
	if opts.RepoRoot == "" {
		opts.RepoRoot = c.real.repoRoot
	}
	if opts.BinDir == "" {
		if opts.RepoRoot == "" {
			var err error
			if opts.RepoRoot, err = FindRepoRoot("."); err != nil {
				return nil, err
			}
		}
		var err error
		fmt.Fprintln(c.progress, "Finding or building kube-router (hack/tools/build.sh netpol)")
		if opts.BinDir, err = runBuildScript(ctx, opts.RepoRoot, "netpol", c.progress); err != nil {
			return nil, err
		}
	}
	binary := filepath.Join(opts.BinDir, kubeRouterBinary)
	if _, err := os.Stat(binary); err != nil {
		return nil, fmt.Errorf("the NetworkPolicy agent's binary: %w", err)
	}

	c.real.mu.Lock()
	defer c.real.mu.Unlock()
	if a := c.NetworkPolicy(); a != nil {
		return a, nil
	}
	if err := c.bindKubeRouter(ctx); err != nil {
		return nil, err
	}
	node := nodes[0]
	dir := filepath.Join(node.Dir, kubeRouterBinary)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.writeClientKubeconfig(kubeconfig, kubeRouterUser, ""); err != nil {
		return nil, err
	}
	chains, err := kubeRouterChains()
	if err != nil {
		return nil, err
	}
	sets, err := kubeRouterIPSets()
	if err != nil {
		return nil, err
	}
	// Recorded before kube-router starts, so that teardown undoes a half start.
	c.mu.Lock()
	stopped := c.stopped
	if !stopped {
		c.real.host.NetworkPolicy = &NetworkPolicyHost{ChainsBefore: chains, IPSetsBefore: sets}
	}
	c.mu.Unlock()
	if stopped {
		return nil, errors.New("cluster stopped while starting")
	}
	logsDir := filepath.Join(c.logsDir, node.Name)
	if err := c.startNodeProcess(logsDir, kubeRouterBinary, binary,
		"--kubeconfig="+kubeconfig,
		"--hostname-override="+node.Name,
		"--run-firewall=true",
		"--run-router=false",
		"--run-service-proxy=false",
		"--run-loadbalancer=false",
		"--enable-ipv4=true",
		"--enable-ipv6=false",
		"--service-cluster-ip-range="+serviceClusterIPRange,
		// No health or metrics server: they would listen on every address.
		"--health-port=0",
		"--metrics-port=0",
		// Each sync and how long it took.
		"--v=1",
	); err != nil {
		return nil, err
	}
	// Its top-level chains, jumped to from FORWARD, and the chain of the pods
	// no policy selects, are in once its first sync is.
	if err := c.poll(ctx, node.Name+" kube-router's first sync", func(context.Context) (bool, error) {
		rules, err := filterRules()
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(rules, func(r string) bool {
			return strings.HasPrefix(r, "-A FORWARD ") && strings.HasSuffix(r, "-j KUBE-ROUTER-FORWARD")
		}) && slices.ContainsFunc(rules, func(r string) bool { return strings.HasPrefix(r, "-A KUBE-NWPLCY-DEFAULT ") }), nil
	}); err != nil {
		return nil, err
	}
	a := &NetworkPolicyAgent{Node: node.Name, Log: filepath.Join(logsDir, kubeRouterBinary+".log")}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.real.netPolicy = a
	fmt.Fprintf(c.progress, "NetworkPolicy agent (kube-router) enforcing on the real nodes as %s\n", node.Name)
	return a, nil
}

// StopNetworkPolicy ends the cluster's NetworkPolicy agent, if it runs, and
// removes its chains and ipsets from the host: the real nodes' pods are no
// longer isolated. The cluster's stop does the same.
func (c *Cluster) StopNetworkPolicy() error {
	c.real.mu.Lock()
	defer c.real.mu.Unlock()
	c.mu.Lock()
	var agent *process
	c.procs = slices.DeleteFunc(c.procs, func(p *process) bool {
		if p.name == kubeRouterBinary {
			agent = p
			return true
		}
		return false
	})
	host := c.real.host.NetworkPolicy
	c.real.netPolicy, c.real.host.NetworkPolicy = nil, nil
	c.mu.Unlock()
	if agent != nil {
		fmt.Fprintf(c.progress, "Stopping %s (pid %d)\n", agent.name, agent.PID())
		agent.stop(10 * time.Second)
	}
	return tearDownNetworkPolicy(host, c.progress)
}

// bindKubeRouter lets kube-router's user read what its firewall watches: pods,
// namespaces and NetworkPolicies, its node, and the Services and endpoints its
// informers list even with the service proxy off.
func (c *Cluster) bindKubeRouter(ctx context.Context) error {
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: kubeRouterRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes", "services", "endpoints"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: read},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: kubeRouterRole},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: kubeRouterRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubeRouterUser}}}
	if _, err := c.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the ClusterRole %s: %w", role.Name, err)
	}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// Enforces reports whether kube-router has written the NetworkPolicy named
// policy (in any namespace) into the chain of the pod at podIP: the pod's
// traffic is then judged by it. It reads the host's filter table.
func (a *NetworkPolicyAgent) Enforces(podIP, policy string) (bool, error) {
	rules, err := filterRules()
	if err != nil {
		return false, err
	}
	// "-A KUBE-ROUTER-FORWARD -d 10.245.1.5/32 -m comment --comment "..." -j KUBE-POD-FW-..."
	var podChains []string
	for _, r := range rules {
		fields := strings.Fields(r)
		if len(fields) > 2 && fields[1] == "KUBE-ROUTER-FORWARD" && slices.Contains(fields, podIP+"/32") &&
			strings.HasPrefix(fields[len(fields)-1], "KUBE-POD-FW-") {
			podChains = append(podChains, fields[len(fields)-1])
		}
	}
	return slices.ContainsFunc(rules, func(r string) bool {
		fields := strings.Fields(r)
		return len(fields) > 2 && slices.Contains(podChains, fields[1]) && strings.Contains(r, `"run through nw policy `+policy+`"`)
	}), nil
}

// filterRules are the rules of the host's IPv4 filter table, as iptables-save
// writes them.
func filterRules() ([]string, error) {
	dump, err := iptablesSave(iptablesFamilies[0].save)
	if err != nil {
		return nil, err
	}
	for _, t := range parseIPTablesSave(iptablesFamilies[0], dump) {
		if t.name == "filter" {
			return t.rules, nil
		}
	}
	return nil, nil
}

// isKubeRouterChain tells kube-router's chains by name.
func isKubeRouterChain(chain string) bool {
	return slices.ContainsFunc(kubeRouterChainPrefixes, func(p string) bool { return strings.HasPrefix(chain, p) })
}

// kubeRouterChains lists kube-router's chains in the host's tables, as
// "iptables-save TABLE CHAIN".
func kubeRouterChains() ([]string, error) {
	tables, err := hostTables()
	var chains []string
	for _, t := range tables {
		for _, ch := range t.chains {
			if isKubeRouterChain(ch.name) {
				chains = append(chains, t.id()+" "+ch.name)
			}
		}
	}
	return chains, err
}

// kubeRouterIPSets lists kube-router's ipsets.
func kubeRouterIPSets() ([]string, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, nil //nolint:nilerr // no ipset command, so no sets of kube-router's
	}
	out, err := exec.Command("ipset", "list", "-n").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ipset list -n: %w: %s", err, out)
	}
	var sets []string
	for _, name := range strings.Fields(string(out)) {
		// An IPv6 set's name is the IPv4 one's with "inet6:" before it.
		if slices.ContainsFunc(kubeRouterIPSetPrefixes, func(p string) bool {
			return strings.HasPrefix(strings.TrimPrefix(name, "inet6:"), p)
		}) {
			sets = append(sets, name)
		}
	}
	return sets, nil
}

// tearDownNetworkPolicy removes what the cluster's kube-router left on the
// host once it has ended: its chains that were not there before it started
// with the rules that jump to them, then its ipsets (which those rules
// used). Like kube-proxy's teardown, it leaves them to another cluster that
// has taken the host's kube-proxy lock meanwhile.
func tearDownNetworkPolicy(h *NetworkPolicyHost, progress io.Writer) error {
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
		fmt.Fprintf(progress, "Leaving kube-router's rules to the local cluster of %s\n", describeProcess(kubeProxyLockHolder()))
		return nil
	}
	var errs []error
	for _, f := range iptablesFamilies {
		dump, err := iptablesSave(f.save)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		script := removeChainsScript(parseIPTablesSave(f, dump), func(t iptablesTable, chain string) bool {
			return isKubeRouterChain(chain) && !slices.Contains(h.ChainsBefore, t.id()+" "+chain)
		})
		if script == "" {
			continue
		}
		cmd := exec.Command(f.restore, "--noflush", "--wait=5")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("removing kube-router's chains with %s: %w: %s\n%s", f.restore, err, out, script))
		}
	}
	sets, err := kubeRouterIPSets()
	errs = append(errs, err)
	for _, set := range sets {
		if slices.Contains(h.IPSetsBefore, set) {
			continue
		}
		if out, err := exec.Command("ipset", "destroy", set).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", set, err, out))
		}
	}
	if left, err := kubeRouterChains(); err != nil {
		errs = append(errs, err)
	} else if left = slices.DeleteFunc(left, func(c string) bool { return slices.Contains(h.ChainsBefore, c) }); len(left) > 0 {
		errs = append(errs, fmt.Errorf("kube-router's chains are still there: %v", left))
	}
	return errors.Join(errs...)
}
