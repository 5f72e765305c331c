package localcluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cgroupFSRoot is where the cgroup hierarchies are mounted.
const cgroupFSRoot = "/sys/fs/cgroup"

// CheckRealNodeHost reports why this host cannot run a real node, naming the
// missing piece: real nodes need root and cgroup v1 hierarchies (the setup
// verified so far) and the overlay filesystem. Callers that can do without real
// nodes fall back to simulated ones when it returns an error.
func CheckRealNodeHost() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("real nodes need root (containerd, runc and the kubelet create namespaces, mounts and cgroups), but this runs as uid %d", uid)
	}
	if _, err := os.Stat(filepath.Join(cgroupFSRoot, "cgroup.controllers")); err == nil {
		return fmt.Errorf("%s is a cgroup v2 hierarchy; real nodes are set up for cgroup v1 hierarchies only so far", cgroupFSRoot)
	}
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, want := range []string{"cpu", "memory", "pids", "cpuset"} {
		if !slices.Contains(hierarchies, filepath.Join(cgroupFSRoot, want)) {
			return fmt.Errorf("real nodes need the cgroup v1 %s hierarchy at %s", want, filepath.Join(cgroupFSRoot, want))
		}
	}
	filesystems, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	if !strings.Contains(string(filesystems), "\toverlay\n") {
		return errors.New("real nodes need the overlay filesystem (containerd's snapshotter): modprobe overlay")
	}
	return checkIPTables()
}

// cgroupHierarchies lists the mount points of the cgroup hierarchies under
// cgroupFSRoot: the v1 ones and, on a hybrid host, the unified one, in all of
// which the kubelet and runc create their folders.
func cgroupHierarchies() ([]string, error) {
	mounts, err := mountPoints(func(fsType string) bool { return fsType == "cgroup" || fsType == "cgroup2" })
	if err != nil {
		return nil, err
	}
	mounts = slices.DeleteFunc(mounts, func(m string) bool { return filepath.Dir(m) != cgroupFSRoot })
	if len(mounts) == 0 {
		return nil, fmt.Errorf("real nodes need cgroups, and no cgroup hierarchy is mounted under %s", cgroupFSRoot)
	}
	return mounts, nil
}

// mountPoints lists the mount points of this mount namespace whose filesystem
// type keep accepts, from /proc/self/mountinfo.
func mountPoints(keep func(fsType string) bool) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if keep(fields[sep+1]) {
			out = append(out, unescapeMountPath(fields[4]))
		}
	}
	return out, s.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMountPath(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// createCgroup creates the cgroup path (e.g. /localcluster-x) in every
// hierarchy. A new cpuset cgroup has no CPUs and no memory nodes until they are
// copied from its parent, and nothing can run in it before.
func createCgroup(hierarchies []string, path string) error {
	for _, h := range hierarchies {
		dir := filepath.Join(h, path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			value, err := os.ReadFile(filepath.Join(filepath.Dir(dir), file))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, file), value, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, file), err)
			}
		}
	}
	return nil
}

// joinCgroup moves the process pid into the cgroup path of every hierarchy;
// the processes it starts later are born there.
func joinCgroup(hierarchies []string, path string, pid int) error {
	for _, h := range hierarchies {
		if err := os.WriteFile(filepath.Join(h, path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving pid %d into cgroup %s: %w", pid, filepath.Join(h, path), err)
		}
	}
	return nil
}

// cgroupPIDs lists the processes in the cgroup path and below it, in every hierarchy.
func cgroupPIDs(hierarchies []string, path string) []int {
	var pids []int
	for _, h := range hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, path), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil //nolint:nilerr // a folder that went away meanwhile
			}
			data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil //nolint:nilerr // as above
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killCgroup sends SIGKILL to every process in the cgroup path and below it
// until none is left or timeout passes. The processes are the node's own:
// containerd moved itself there before starting any shim, and the kubelet puts
// every container there.
func killCgroup(hierarchies []string, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPIDs(hierarchies, path)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still run in cgroup %s", pids, path)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroup removes the cgroup path and every cgroup below it, in every
// hierarchy, deepest first. A cgroup whose last process has just died can stay
// busy a moment, so it retries until timeout.
func removeCgroup(hierarchies []string, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, h := range hierarchies {
			var dirs []string
			_ = filepath.WalkDir(filepath.Join(h, path), func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
					left = append(left, dirs[i])
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cannot remove cgroups %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unmountUnder unmounts every mount point at or below each of dirs, deepest
// first: the containers' root filesystems, the kubelet's volumes and the
// network namespaces that containerd bind-mounts under its state folder.
func unmountUnder(dirs ...string) error {
	mounts, err := mountPoints(func(string) bool { return true })
	if err != nil {
		return err
	}
	var under []string
	for _, m := range mounts {
		for _, d := range dirs {
			if m == d || strings.HasPrefix(m, d+"/") {
				under = append(under, m)
			}
		}
	}
	// Deeper mount points first; the same point can be mounted more than once.
	slices.SortFunc(under, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, m := range under {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountPoints(func(string) bool { return true })
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(mounts, func(m string) bool { return m != dir && !strings.HasPrefix(m, dir+"/") }), nil
}

// createBridge creates the bridge link called name with the first address of
// subnet (the pods' gateway, as host-local IPAM picks it) and sets it up, as
// the CNI bridge plugin would at the first pod. Doing it at node start takes
// the subnet at once, so the next node (of this cluster or another) sees it
// taken; the plugin then finds the bridge as it wants it.
func createBridge(name string, subnet *net.IPNet) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := bridgeIoctl(fd, unix.SIOCBRADDBR, name); err != nil {
		return fmt.Errorf("creating bridge %s: %w", name, err)
	}
	gateway := slices.Clone(subnet.IP.To4())
	gateway[3]++
	for _, set := range []struct {
		request uint
		value   net.IP
	}{{unix.SIOCSIFADDR, gateway}, {unix.SIOCSIFNETMASK, net.IP(subnet.Mask)}} {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(set.value.To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, set.request, ifr); err != nil {
			return fmt.Errorf("setting address %s/%d on %s: %w", gateway, maskBits(subnet), name, err)
		}
	}
	return setLinkUp(fd, name, true)
}

func maskBits(n *net.IPNet) int {
	ones, _ := n.Mask.Size()
	return ones
}

// deleteBridge deletes the bridge link called name, if it exists, as
// `ip link delete` would: down first, then the bridge ioctl that removes it.
func deleteBridge(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil //nolint:nilerr // no such link: nothing to delete
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := setLinkUp(fd, name, false); err != nil {
		return err
	}
	if err := bridgeIoctl(fd, unix.SIOCBRDELBR, name); err != nil {
		return fmt.Errorf("deleting bridge %s: %w", name, err)
	}
	return nil
}

// setLinkUp sets the link called name up or down.
func setLinkUp(fd int, name string, up bool) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading the flags of %s: %w", name, err)
	}
	flags := ifr.Uint16() &^ unix.IFF_UP
	if up {
		flags |= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting %s up=%t: %w", name, up, err)
	}
	return nil
}

// bridgeIoctl calls the bridge ioctls that take a bare interface name.
func bridgeIoctl(fd int, request uintptr, name string) error {
	var cname [unix.IFNAMSIZ]byte
	copy(cname[:], name)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), request, uintptr(unsafe.Pointer(&cname[0]))); errno != 0 {
		return errno
	}
	return nil
}

// hostSysctls are the host settings a real node changes: the kubelet sets the
// first six at start (its kernel tunables), the bridge CNI plugin turns on IP
// forwarding. kube-proxy would set the rest with its default settings (its
// configuration turns that off). Teardown puts back the values from before.
var hostSysctls = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}

// readSysctls reads the hostSysctls from /proc/sys, but for those this
// host's kernel does not have (conntrack's, while its module is not loaded).
func readSysctls() (map[string]string, error) {
	values := map[string]string{}
	for _, key := range hostSysctls {
		data, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		values[key] = strings.TrimSpace(string(data))
	}
	return values, nil
}

// writeSysctls writes values back into /proc/sys, where they differ.
func writeSysctls(values map[string]string) error {
	current, err := readSysctls()
	if err != nil {
		return err
	}
	var errs []error
	for key, value := range values {
		if current[key] == value {
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s=%s: %w", strings.ReplaceAll(key, "/", "."), value, err))
		}
	}
	return errors.Join(errs...)
}

// defaultRouteIPv4 is the IPv4 address of the interface of the default route,
// read from /proc/net/route (no packet is sent). The kubelet refuses a loopback
// node IP.
func defaultRouteIPv4() (net.IP, error) {
	data, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// Iface Destination Gateway Flags ...; the default route's destination is 0.
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[1] != "00000000" {
			continue
		}
		iface, err := net.InterfaceByName(fields[0])
		if err != nil {
			return nil, err
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if ipNet, ok := a.(*net.IPNet); ok && ipNet.IP.To4() != nil {
				return ipNet.IP.To4(), nil
			}
		}
	}
	return nil, errors.New("real nodes need a non-loopback node IP, and this host has no IPv4 default route")
}

// Host folders that real nodes write into outside their own folders, because
// the kubelet and libcni have them built in: the kubelet's device plugin
// socket, its links to the containers' logs, and libcni's cache of results
// (which the CNI DEL of a pod would clear, but teardown kills the pods).
const (
	devicePluginsDir = "/var/lib/kubelet/device-plugins"
	containerLogsDir = "/var/log/containers"
	cniResultsDir    = "/var/lib/cni/results"
)

// sharedHostDirs are those folders and their parents, deepest first.
var sharedHostDirs = []string{devicePluginsDir, "/var/lib/kubelet", containerLogsDir, cniResultsDir, "/var/lib/cni"}

// existingHostDirs reports which of sharedHostDirs exist.
func existingHostDirs() map[string]bool {
	exist := map[string]bool{}
	for _, d := range sharedHostDirs {
		_, err := os.Stat(d)
		exist[d] = err == nil
	}
	return exist
}

// cleanSharedHostDirs removes what the real nodes with folders under clusterDir
// left in sharedHostDirs: log links and CNI results that name those folders,
// and the kubelet's device plugin socket if no kubelet listens on it any more;
// then the folders that did not exist before (existedBefore), if empty.
func cleanSharedHostDirs(clusterDir string, existedBefore map[string]bool) error {
	var errs []error
	remove := func(path string) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	links, _ := os.ReadDir(containerLogsDir)
	for _, l := range links {
		path := filepath.Join(containerLogsDir, l.Name())
		if target, err := os.Readlink(path); err == nil && strings.HasPrefix(target, clusterDir+"/") {
			remove(path)
		}
	}
	results, _ := os.ReadDir(cniResultsDir)
	for _, r := range results {
		path := filepath.Join(cniResultsDir, r.Name())
		// A result records the pod's network namespace, under the node's folder.
		if data, err := os.ReadFile(path); err == nil && strings.Contains(string(data), clusterDir+"/") {
			remove(path)
		}
	}
	socket := filepath.Join(devicePluginsDir, "kubelet.sock")
	if conn, err := net.Dial("unix", socket); err == nil {
		conn.Close()
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		remove(socket)
	}
	for _, d := range sharedHostDirs {
		if !existedBefore[d] {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
