package main

import (
	"fmt"
	"io"
	"net/http/httptest"
	"sort"
	"strings"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/aiinference/operator/test/tracingtest"
)

// traceReceiver is the OTLP receiver a -trace run sends the operator's
// reconcile traces to; startTraceReceiver starts a new one per N.
type traceReceiver struct {
	*tracingtest.Receiver
	server *httptest.Server
}

func startTraceReceiver() *traceReceiver {
	recv := &tracingtest.Receiver{}
	return &traceReceiver{Receiver: recv, server: httptest.NewServer(recv)}
}

// operatorArgs are the operator's flags that send it traces here.
func (t *traceReceiver) operatorArgs() []string {
	return []string{"--otlp-endpoint=" + strings.TrimPrefix(t.server.URL, "http://"), "--otlp-insecure"}
}

func (t *traceReceiver) stop() { t.server.Close() }

// stepTime is one step's time in a set of reconciles.
type stepTime struct {
	name       string
	slow, all  time.Duration // in all the slowest reconciles, in all reconciles
	slowRuns   int           // how many of the slowest reconciles ran it
	slowWrites int           // how many of those runs wrote (created, updated or written)
	allRuns    int
}

// summarizeTraces writes where the slowest 1% of the reconciles (those at or
// above the p99) spent their time, step by step, beside all reconciles. Steps
// of one pass may run side by side (the ConfigMap and the Service), so their
// times can add up to more than the pass's.
func summarizeTraces(w io.Writer, n int, spans []*tracepb.Span) {
	roots := map[string]*tracepb.Span{}
	var rootList []*tracepb.Span
	for _, s := range spans {
		if s.Name == "Reconcile" && len(s.ParentSpanId) == 0 {
			roots[string(s.TraceId)] = s
			rootList = append(rootList, s)
		}
	}
	if len(rootList) == 0 {
		fmt.Fprintf(w, "N=%d: no reconcile traces received\n", n)
		return
	}
	sort.Slice(rootList, func(i, j int) bool { return spanTime(rootList[i]) > spanTime(rootList[j]) })
	slowCount := max(1, len(rootList)/100)
	slow := map[string]bool{}
	var slowTotal time.Duration
	for _, s := range rootList[:slowCount] {
		slow[string(s.TraceId)] = true
		slowTotal += spanTime(s)
	}
	steps := map[string]*stepTime{}
	for _, s := range spans {
		if roots[string(s.TraceId)] == nil || len(s.ParentSpanId) == 0 {
			continue
		}
		st := steps[s.Name]
		if st == nil {
			st = &stepTime{name: s.Name}
			steps[s.Name] = st
		}
		st.all += spanTime(s)
		st.allRuns++
		if slow[string(s.TraceId)] {
			st.slow += spanTime(s)
			st.slowRuns++
			if wrote(s) {
				st.slowWrites++
			}
		}
	}
	list := make([]*stepTime, 0, len(steps))
	for _, st := range steps {
		list = append(list, st)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].slow > list[j].slow })
	fmt.Fprintf(w, "\nN=%d: %d reconciles traced; the slowest %d (>= %s) took %s on average:\n", n, len(rootList), slowCount,
		spanTime(rootList[slowCount-1]).Round(time.Millisecond), (slowTotal / time.Duration(slowCount)).Round(time.Millisecond))
	fmt.Fprintf(w, "%-20s %22s %14s %12s %22s\n", "step", "slowest 1%: mean", "ran in", "wrote in", "all reconciles: mean")
	for _, st := range list {
		fmt.Fprintf(w, "%-20s %22s %13.0f%% %11.0f%% %22s\n", st.name,
			(st.slow / time.Duration(slowCount)).Round(100*time.Microsecond), 100*float64(st.slowRuns)/float64(slowCount),
			100*float64(st.slowWrites)/float64(slowCount), (st.all / time.Duration(len(rootList))).Round(100*time.Microsecond))
	}
}

func spanTime(s *tracepb.Span) time.Duration {
	return time.Duration(s.EndTimeUnixNano - s.StartTimeUnixNano)
}

// wrote tells whether a step's span says it wrote to the API server.
func wrote(s *tracepb.Span) bool {
	for _, kv := range s.Attributes {
		if kv.Key == "decision" {
			switch kv.Value.GetStringValue() {
			case "created", "updated", "written":
				return true
			}
		}
	}
	return false
}
