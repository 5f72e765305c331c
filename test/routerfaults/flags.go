package routerfaults

import "time"

// BodyReadTimeout is the router's --body-read-timeout in the tenants case:
// shorter than the binary's 30s, so that the case (a trickle that lasts it
// out) is short.
const BodyReadTimeout = 10 * time.Second

// caseFlags are the router flags of each case, after the harness's own
// (harnessFlags) and before ROUTERFAULTS_ROUTER_FLAGS; every case that
// starts a router has its entry. A flag the router does not know fails the
// case at start (router.ParseFlags).
var caseFlags = map[string][]string{
	// Memory: the binary's defaults, under the chart's limit.
	CaseRefusedBodies: nil,
	CaseHeldBodies:    nil,
	CaseHugeMetrics:   {"--scrape-interval=1s"},
	CaseHugeHeaders:   nil,
	// Tenants.
	CaseTrickle: {"--body-read-timeout=" + BodyReadTimeout.String()},
	// Faults: the same for the healthy peer as for each fault.
	// A 3 s client timeout needs the silent replica found well within it:
	// --stream-header-timeout is a second here (10 s by default).
	CaseAllHealthy: {"--stream-header-timeout=1s"},
	CaseFastFail:   {"--stream-header-timeout=1s"},
	CaseSilent:     {"--stream-header-timeout=1s"},
	// Flow control.
	CaseSaturation: nil,
	CaseAlone:      nil,
	CaseFlood:      nil,
	CasePriorities: nil,
}

// The cases, as they are named in the figures and in caseFlags.
const (
	CaseRefusedBodies = "memory/refused-bodies"
	CaseHeldBodies    = "memory/held-bodies"
	CaseHugeMetrics   = "memory/huge-metrics"
	CaseHugeHeaders   = "memory/huge-headers"
	CaseTrickle       = "tenants/trickle"
	CaseAllHealthy    = "faults/all-healthy"
	CaseFastFail      = "faults/fast-fail"
	CaseSilent        = "faults/silent"
	CaseSaturation    = "flow/saturation"
	CaseAlone         = "flow/tenant-alone"
	CaseFlood         = "flow/tenant-beside-flood"
	CasePriorities    = "flow/priorities"
)
