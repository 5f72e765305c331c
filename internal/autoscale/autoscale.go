// Package autoscale decides an AIInference's replica count from the load
// signals its engines export: it reads them from each pod's /metrics,
// recommends a count per target, and stabilizes the recommendations over time
// as the Horizontal Pod Autoscaler does (the lowest over the scale-up window,
// the highest over the scale-down window). It holds no state of its own.
package autoscale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/outbound"
)

// Signals are the signal values of one pod, or their sums over pods.
type Signals map[servingv1.AutoscalingSignal]float64

// Wanted are the signals the spec has targets for, in a fixed order.
func Wanted(a *servingv1.AutoscalingSpec) []servingv1.AutoscalingSignal {
	var out []servingv1.AutoscalingSignal
	for _, s := range []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalKVCacheUtilization, servingv1.SignalRunningRequests} {
		if target(a, s) > 0 {
			out = append(out, s)
		}
	}
	return out
}

func target(a *servingv1.AutoscalingSpec, s servingv1.AutoscalingSignal) int32 {
	var t *int32
	switch s {
	case servingv1.SignalQueueDepth:
		t = a.Targets.QueueDepth
	case servingv1.SignalKVCacheUtilization:
		t = a.Targets.KVCacheUtilization
	case servingv1.SignalRunningRequests:
		t = a.Targets.RunningRequests
	}
	if t == nil {
		return 0
	}
	return *t
}

// maxMetricsBytes bounds what one scrape reads: an engine's /metrics is tens
// of kilobytes.
const maxMetricsBytes = 4 << 20

// Scrape reads the wanted signals from one pod's /metrics. metrics names, per
// signal, the gauges that carry it (the first one present counts); a gauge's
// series are summed (vLLM labels them by model). An answer other than 200 is
// an error that says its status code alone. A signal missing, NaN or
// infinite is an error: the caller must not scale on it.
func Scrape(ctx context.Context, url string, wanted []servingv1.AutoscalingSignal, metrics func(servingv1.AutoscalingSignal) []string) (Signals, error) {
	families, err := fetch(ctx, url)
	if err != nil {
		return nil, err
	}
	return SignalsOf(families, url, wanted, metrics)
}

// SignalsOf are the wanted signals of a /metrics read from url, as Scrape
// reads them.
func SignalsOf(families map[string]*dto.MetricFamily, url string, wanted []servingv1.AutoscalingSignal, metrics func(servingv1.AutoscalingSignal) []string) (Signals, error) {
	out := Signals{}
	for _, s := range wanted {
		names := metrics(s)
		v, found := 0.0, false
		for _, name := range names {
			if f := families[name]; f != nil && len(f.GetMetric()) > 0 {
				v, found = sum(f, nil), true
				break
			}
		}
		switch {
		case !found:
			return nil, fmt.Errorf("%s exports no %s (looked for %s)", url, s, strings.Join(names, ", "))
		case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
			return nil, fmt.Errorf("%s reads %v at %s", s, v, url)
		}
		out[s] = v
	}
	return out, nil
}

// The router's series the operator reads (internal/router exports them).
const (
	// RouterWaitingMetric is the gauge of the requests per model (labels
	// namespace and name) that wait for a serving replica: traffic the
	// engines have not seen yet.
	RouterWaitingMetric = "aiinference_router_waiting_requests"
	// RouterPicksMetric counts the replicas picked, per model, endpoint (the
	// pod's name) and reason.
	RouterPicksMetric = "aiinference_router_picks_total"
	// RouterPrefixReason is the pick reason of a request sent to the replica
	// that holds its prompt's prefix.
	RouterPrefixReason = "prefix"
)

// RouterReading is what one router pod says of one model.
type RouterReading struct {
	// Waiting is how many of its requests wait in the router.
	Waiting float64
	// PrefixPicks counts, per pod name, the requests sent there because the
	// pod holds their prefix, since the router started.
	PrefixPicks map[string]float64
}

// ScrapeRouter reads from one router pod's /metrics what it holds and where
// it sent the model's requests. A router that has seen none of the model's
// requests exports no series for it (none at all before its first): zeros.
func ScrapeRouter(ctx context.Context, url, namespace, name string) (RouterReading, error) {
	out := RouterReading{PrefixPicks: map[string]float64{}}
	families, err := fetch(ctx, url)
	if err != nil {
		return out, err
	}
	model := map[string]string{"namespace": namespace, "name": name}
	if f := families[RouterWaitingMetric]; f != nil {
		out.Waiting = sum(f, model)
	}
	if math.IsNaN(out.Waiting) || math.IsInf(out.Waiting, 0) || out.Waiting < 0 {
		return out, fmt.Errorf("%s reads %v at %s", RouterWaitingMetric, out.Waiting, url)
	}
	prefix := map[string]string{"namespace": namespace, "name": name, "reason": RouterPrefixReason}
	if f := families[RouterPicksMetric]; f != nil {
		for _, m := range f.GetMetric() {
			if !hasLabels(m, prefix) {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					out.PrefixPicks[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// fetch reads and parses one /metrics.
func fetch(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	body, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = body.Close() }()
	return parse(url, io.LimitReader(body, maxMetricsBytes))
}

// get asks a pod for its /metrics.
func get(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// The pod is the user's: its answer may point anywhere (a redirect is not
	// followed) and hold anything (none of it goes into an error, which the
	// caller shows in status).
	resp, err := outbound.Client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("GET %s answered HTTP %d", url, resp.StatusCode)
	}
	return resp.Body, nil
}

func parse(url string, text io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(text)
	if err != nil {
		return nil, fmt.Errorf("GET %s: the answer is not Prometheus text", url)
	}
	return families, nil
}

// Bounds of ScrapeFamiliesOf: a line longer than maxLineBytes is skipped, and
// the kept lines of the named families are at most maxKeptBytes.
const (
	maxLineBytes = 16 << 10
	maxKeptBytes = 256 << 10
)

// ScrapeFamiliesOf reads from one pod's /metrics the named families alone:
// it reads at most maxBytes of the answer, a line at a time, and parses only
// the lines of those families, so that a /metrics of any size (a user's
// engine may export anything) costs the reader no more than the series it
// wants.
func ScrapeFamiliesOf(ctx context.Context, url string, maxBytes int64, names []string) (map[string]*dto.MetricFamily, error) {
	body, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = body.Close() }()
	in := bufio.NewReaderSize(io.LimitReader(body, maxBytes), 4<<10)
	var kept bytes.Buffer
	var line []byte
	for {
		chunk, isPrefix, err := in.ReadLine()
		if len(line)+len(chunk) <= maxLineBytes {
			line = append(line, chunk...)
		} else {
			line = append(line[:0], 0) // too long: kept by no name
		}
		if err == nil && isPrefix {
			continue
		}
		if familyOf(line, names) {
			if kept.Len()+len(line) > maxKeptBytes {
				return nil, fmt.Errorf("GET %s: the series of %s are over %d bytes", url, strings.Join(names, ", "), maxKeptBytes)
			}
			kept.Write(line)
			kept.WriteByte('\n')
		}
		line = line[:0]
		if err != nil {
			break
		}
	}
	return parse(url, &kept)
}

// familyOf tells whether a line of Prometheus text (a sample, or its family's
// HELP or TYPE comment) belongs to one of the named families.
func familyOf(line []byte, names []string) bool {
	rest := line
	if c, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
		rest = c
	} else if c, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
		rest = c
	}
	for _, n := range names {
		if r, ok := bytes.CutPrefix(rest, []byte(n)); ok && len(r) > 0 && (r[0] == ' ' || r[0] == '{' || r[0] == '\t') {
			return true
		}
	}
	return false
}

// sum adds the family's series whose labels hold every pair of want (nil:
// all of them).
func sum(f *dto.MetricFamily, want map[string]string) float64 {
	total := 0.0
	for _, m := range f.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		case m.Counter != nil:
			total += m.Counter.GetValue()
		}
	}
	return total
}

// tolerance is how far from its target a signal may be without a change, as
// the Horizontal Pod Autoscaler's 10%.
const tolerance = 0.1

// Recommend is the count the signals ask for now: for each target, the sum
// over the serving replicas divided by the target per replica (rounded up),
// or the current count when the mean is within the tolerance of the target;
// the largest of them, within the spec's bounds. serving is how many replicas
// the sums came from (at least 1).
func Recommend(a *servingv1.AutoscalingSpec, current, serving int32, sums Signals) (int32, []servingv1.SignalReading) {
	var readings []servingv1.SignalReading
	want := int32(0)
	for _, s := range Wanted(a) {
		t := float64(target(a, s))
		total := sums[s]
		if s == servingv1.SignalKVCacheUtilization {
			total *= 100 // the engines export a fraction; the target is in percent
		}
		perReplica := total / float64(serving)
		n := int32(math.Ceil(total / t))
		if math.Abs(perReplica/t-1) <= tolerance {
			n = current
		}
		readings = append(readings, servingv1.SignalReading{Signal: s, PerReplica: strconv.FormatFloat(perReplica, 'f', -1, 64), Target: int32(t), Replicas: n})
		want = max(want, n)
	}
	return min(max(want, a.Min()), a.MaxReplicas), readings
}

// Recommendation is one recommended count and when it was made.
type Recommendation struct {
	Time     time.Time
	Replicas int32
}

// History is an object's recommendations over the longer of its windows.
type History struct {
	// Since is the first recommendation this process made for the object: a
	// scale down needs a whole window of them.
	Since time.Time
	Recs  []Recommendation
}

// Add records a recommendation and forgets those older than keep.
func (h *History) Add(r Recommendation, keep time.Duration) {
	if h.Since.IsZero() {
		h.Since = r.Time
	}
	h.Recs = append(h.Recs, r)
	i := 0
	for i < len(h.Recs) && h.Recs[i].Time.Before(r.Time.Add(-keep)) {
		i++
	}
	h.Recs = h.Recs[i:]
}

// Stabilize is the count to run: up to the lowest recommendation over the
// scale-up window when all of them are above the current count, down to the
// highest over the scale-down window when all are below it, and the current
// count otherwise. Until the history spans the scale-down window (after a
// restart of the operator), it does not scale down.
func (h *History) Stabilize(now time.Time, current int32, up, down time.Duration) int32 {
	upRec, downRec := int32(math.MaxInt32), int32(0)
	for _, r := range h.Recs {
		if !r.Time.Before(now.Add(-up)) {
			upRec = min(upRec, r.Replicas)
		}
		if !r.Time.Before(now.Add(-down)) {
			downRec = max(downRec, r.Replicas)
		}
	}
	if now.Sub(h.Since) < down {
		downRec = max(downRec, current)
	}
	switch {
	case upRec != math.MaxInt32 && upRec > current:
		return upRec
	case downRec < current:
		return downRec
	}
	return current
}

// idleSignals tell whether a model is at work.
var idleSignals = []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalRunningRequests}

// WithIdleSignals adds to wanted the signals that tell whether a model is idle,
// those the engine exports (metrics says which).
func WithIdleSignals(wanted []servingv1.AutoscalingSignal, metrics func(servingv1.AutoscalingSignal) []string) []servingv1.AutoscalingSignal {
	out := append([]servingv1.AutoscalingSignal(nil), wanted...)
	for _, s := range idleSignals {
		if len(metrics(s)) > 0 && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// Idle is true when no request runs or waits, as far as the sums tell.
func Idle(sums Signals) bool {
	for _, s := range idleSignals {
		if sums[s] > 0 {
			return false
		}
	}
	return true
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	matched := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			matched++
		}
	}
	return matched == len(want)
}
