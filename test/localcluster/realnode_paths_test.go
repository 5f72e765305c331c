package localcluster

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// A unix socket's path may have 107 bytes (sun_path, 108 with its NUL). The
// demo's cluster lives under the user's cache folder, deep enough that the
// kubelet's root under it put the node cache's registration socket at 113
// bytes (bind: invalid argument). Every socket a real node makes stays short
// however deep the cluster's folder is.
func TestRealNodeSocketPathsStayShort(t *testing.T) {
	_, subnet, _ := net.ParseCIDR("10.244.0.0/24")
	deep := filepath.Join("/home/a-user-with-a-long-name/.cache", strings.Repeat("nested/", 20), "aiinference-operator/localcluster/nodes")
	n := newRealNode(deep, "real-0", subnet)
	for _, socket := range []string{
		filepath.Join(n.KubeletDir, "plugins_registry", "model-cache-reg.sock"),
		filepath.Join(n.KubeletDir, "pod-resources", "kubelet.sock"),
		filepath.Join(n.KubeletDir, "device-plugins", "kubelet.sock"),
		n.ContainerdSocket + ".ttrpc",
		filepath.Join(n.ShimSocketDir, "model-cache.sock"),
		filepath.Join(n.ShimSocketDir, strings.Repeat("s", 64)), // a shim's socket: a sha256 in hex
	} {
		if len(socket) > 107 {
			t.Errorf("%s: %d bytes, more than a socket path may have", socket, len(socket))
		}
	}
	if other := newRealNode(filepath.Join(deep, "other"), "real-0", subnet); other.KubeletDir == n.KubeletDir {
		t.Errorf("two clusters' nodes share %s", n.KubeletDir)
	}
}
