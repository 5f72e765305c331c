// Command coredns is CoreDNS v1.15.0 with only the plugins the local
// cluster's Corefile names (test/localcluster/dns.go): CoreDNS's own main
// (coredns.go in its module), which imports every plugin through
// core/plugin, with the list cut down to these. Its Directives order (the
// order plugins run in) is CoreDNS's own, in core/dnsserver; a plugin named
// there but not imported here is refused in a Corefile as unknown.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
