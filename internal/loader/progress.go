package loader

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// ProgressBoard publishes the progress of the current attempt: runOnce posts its
// run on it, and Handler serves what it holds.
type ProgressBoard struct {
	current atomic.Pointer[run]
}

func (b *ProgressBoard) post(l *run) {
	if b != nil {
		b.current.Store(l)
	}
}

// Snapshot is the progress of the current attempt; Stage "waiting" before one starts.
func (b *ProgressBoard) Snapshot() loadspec.Progress {
	l := b.current.Load()
	if l == nil {
		return loadspec.Progress{Stage: "waiting", ETASeconds: -1}
	}
	return l.progress(time.Now())
}

func (l *run) progress(now time.Time) loadspec.Progress {
	l.mu.Lock()
	p := loadspec.Progress{Stage: l.stage, Total: l.total, Files: len(l.objs), FilesDone: len(l.done), Checks: maps.Clone(l.checks)}
	l.mu.Unlock()
	p.Bytes, p.Fetched = l.present.Load(), l.fetched.Load()
	p.Retries, p.Stalls = l.retries.Load(), l.stalls.Load()
	elapsed := now.Sub(l.start).Seconds()
	p.ElapsedSeconds = round(elapsed, 1)
	p.ETASeconds = -1
	if elapsed > 0 {
		p.RateBytesPerSecond = round(float64(p.Fetched)/elapsed, 0)
	}
	if p.RateBytesPerSecond > 0 {
		p.ETASeconds = round(float64(p.Total-p.Bytes)/p.RateBytesPerSecond, 0)
	}
	if p.Stage == "done" {
		p.ETASeconds = 0
	}
	return p
}

// Handler serves the progress as JSON (loadspec.ProgressPath) and as Prometheus
// metrics (/metrics).
func (b *ProgressBoard) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+loadspec.ProgressPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(b.Snapshot())
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		p := b.Snapshot()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		for _, m := range []struct {
			name, typ, help string
			v               float64
		}{
			{"model_loader_bytes", "gauge", "Bytes of the model on disk (kept, resumed or written by this attempt).", float64(p.Bytes)},
			{"model_loader_total_bytes", "gauge", "Size of the model being loaded.", float64(p.Total)},
			{"model_loader_fetched_bytes", "gauge", "Bytes this attempt downloaded.", float64(p.Fetched)},
			{"model_loader_files", "gauge", "Files of the model.", float64(p.Files)},
			{"model_loader_files_done", "gauge", "Files written and checked.", float64(p.FilesDone)},
			{"model_loader_download_rate_bytes_per_second", "gauge", "Average download rate of this attempt.", p.RateBytesPerSecond},
			{"model_loader_retried_requests", "gauge", "Requests of this attempt retried after a transient error.", float64(p.Retries)},
			{"model_loader_stalled_requests", "gauge", "Requests of this attempt cut by the stall watchdog.", float64(p.Stalls)},
		} {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %g\n", m.name, m.help, m.name, m.typ, m.name, m.v)
		}
	})
	return mux
}
