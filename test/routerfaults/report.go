package routerfaults

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// The figures: each case prints a line of its own as it ends, and records
// its headline figures beside their peers (the limit, the figure alone, the
// figure with every replica healthy) for the table TestMain prints at the
// end. Lines start with "routerfaults", which `make bench-router-faults`
// keeps.

// Figure is one headline figure of a case, beside its peer.
type Figure struct {
	Case, What, Value, Beside, Target string
	Met                               bool
}

var (
	figuresMu sync.Mutex
	figures   []Figure
)

// Record keeps a figure for the table and returns whether it met its target.
func Record(f Figure) bool {
	figuresMu.Lock()
	defer figuresMu.Unlock()
	figures = append(figures, f)
	return f.Met
}

// PrintTable prints the recorded figures.
func PrintTable(w io.Writer) {
	figuresMu.Lock()
	defer figuresMu.Unlock()
	if len(figures) == 0 {
		return
	}
	rows := [][]string{{"case", "figure", "value", "beside", "target", "met"}}
	for _, f := range figures {
		met := "yes"
		if !f.Met {
			met = "NO"
		}
		rows = append(rows, []string{f.Case, f.What, f.Value, f.Beside, f.Target, met})
	}
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	_, _ = fmt.Fprintln(w, "routerfaults table:")
	for _, r := range rows {
		var b strings.Builder
		b.WriteString("routerfaults |")
		for i, c := range r {
			fmt.Fprintf(&b, " %-*s |", widths[i], c)
		}
		_, _ = fmt.Fprintln(w, b.String())
	}
}

// Line prints a case's figures on one line.
func Line(w io.Writer, name string, format string, args ...any) {
	_, _ = fmt.Fprintf(w, "routerfaults figure: %s: %s\n", name, fmt.Sprintf(format, args...))
}

// MiB is bytes in MiB, for the report.
func MiB(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// Memory is a router's peak resident memory for the report: VmHWM, and
// how the router stands (OOM-killed).
func Memory(p *RouterProc) string {
	s := "peak RSS " + MiB(p.PeakRSS())
	if cg := p.CgroupPeak(); cg > 0 {
		s += fmt.Sprintf(" (cgroup peak %s)", MiB(cg))
	}
	s += ", CPU " + Dur(p.CPU())
	if p.Exited() {
		s += ", " + p.State()
	}
	return s
}

// MemoryFigure records a case's peak RSS against the limit: met when the
// router is alive and its peak below the limit.
func MemoryFigure(name string, p *RouterProc) bool {
	value := MiB(p.PeakRSS())
	if p.Exited() {
		value += " (" + p.State() + ")"
	}
	return Record(Figure{Case: name, What: "peak RSS", Value: value, Beside: "limit " + MiB(MemoryLimit),
		Target: "under the limit, alive", Met: !p.Exited() && p.PeakRSS() < MemoryLimit})
}

// Pct is a share as a percentage.
func Pct(share float64) string { return fmt.Sprintf("%.1f%%", 100*share) }

// Dur is a duration rounded for the report.
func Dur(d time.Duration) string {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// say prints a note of the harness (how the limit is set, a skip's reason)
// among the figures.
func say(format string, args ...any) {
	fmt.Printf("routerfaults: "+format+"\n", args...)
}
