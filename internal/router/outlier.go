package router

import (
	"math"
	"time"
)

// OutlierOptions tune the passive outlier detection of a model's replicas,
// as Envoy's: a replica whose answers fail ConsecutiveFailures times in a
// row (a 5xx, a refused or broken connection, no headers in time) is taken
// out of the picking for BaseEjection, twice as long each time it is taken
// out again, up to MaxEjection. Then one trial request at a time goes to it,
// and the first that succeeds brings it back. At most MaxEjectedShare of a
// model's replicas are out at once (at least one): a model whose replicas
// all fail is not left with none to try.
type OutlierOptions struct {
	ConsecutiveFailures int
	BaseEjection        time.Duration
	MaxEjection         time.Duration
	MaxEjectedShare     float64
}

func (o OutlierOptions) withDefaults() OutlierOptions {
	if o.ConsecutiveFailures <= 0 {
		o.ConsecutiveFailures = 5
	}
	if o.BaseEjection <= 0 {
		o.BaseEjection = 10 * time.Second
	}
	if o.MaxEjection <= 0 {
		o.MaxEjection = 5 * time.Minute
	}
	if o.MaxEjectedShare <= 0 || o.MaxEjectedShare > 1 {
		o.MaxEjectedShare = 0.5
	}
	return o
}

// failurePenalty is what each failure in a row adds to a replica's load
// score: a replica that fails at once carries no requests, and must not look
// the least loaded for it.
const failurePenalty = 16

// health is what the picker knows of a replica's answers.
type health struct {
	// failures in a row since its last success.
	failures int
	// ejections in a row: each makes the next ejection twice as long.
	ejections int
	// ejectedUntil is when its ejection ends; zero when it is in.
	ejectedUntil time.Time
	// trial is set while the one request of its probation is out.
	trial bool
	// restoredAt is when it last came back: its ejections in a row are
	// forgotten once it has answered for MaxEjection since.
	restoredAt time.Time
}

// HealthChange is what an answer changed in a replica's standing.
type HealthChange int

const (
	// Unchanged: it stays in, or out.
	Unchanged HealthChange = iota
	// Ejected: it is out of the picking.
	Ejected
	// Restored: its trial request succeeded; it is back.
	Restored
)

// out tells a replica the picker must not pick now: ejected, or on trial with
// its trial request out. Call with p.mu held.
func (p *Picker) out(name string) bool {
	h := p.health[name]
	if h == nil || h.ejectedUntil.IsZero() {
		return false
	}
	return p.now().Before(h.ejectedUntil) || h.trial
}

// usable are the candidates the picker may pick; all of them when every one
// is out (a guess beats no answer). Call with p.mu held.
func (p *Picker) usable(candidates []Endpoint) []Endpoint {
	return keepOrAll(candidates, func(name string) bool { return !p.out(name) })
}

// keepOrAll are the candidates keep says yes to; all of them when it says
// yes to none.
func keepOrAll(candidates []Endpoint, keep func(name string) bool) []Endpoint {
	kept := make([]Endpoint, 0, len(candidates))
	for _, e := range candidates {
		if keep(e.Name) {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return candidates
	}
	return kept
}

// picked marks a trial request out to a replica whose ejection ended. Call
// with p.mu held.
func (p *Picker) picked(name string) {
	if h := p.health[name]; h != nil && !h.ejectedUntil.IsZero() {
		h.trial = true
	}
}

// Report records how a request sent to a replica ended: ok when it
// answered (any answer but a 5xx), not ok when it failed before or with its
// answer's headers. replicas is how many the model has, for the share that
// may be out at once. The change, and for an ejection its length, say what
// to tell.
func (p *Picker) Report(name string, ok bool, replicas int) (HealthChange, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.health[name]
	if h == nil {
		if ok {
			return Unchanged, 0
		}
		h = &health{}
		p.health[name] = h
	}
	wasOut := !h.ejectedUntil.IsZero()
	h.trial = false
	if ok {
		h.failures = 0
		if wasOut {
			h.ejectedUntil, h.restoredAt = time.Time{}, p.now()
			return Restored, 0
		}
		if p.now().Sub(h.restoredAt) >= p.opts.Outliers.MaxEjection {
			h.ejections = 0
		}
		return Unchanged, 0
	}
	h.failures++
	if !wasOut && (h.failures < p.opts.Outliers.ConsecutiveFailures || p.ejected()+1 > p.maxEjected(replicas)) {
		return Unchanged, 0
	}
	// A failed trial, or one failure too many: out, for longer each time.
	d := time.Duration(float64(p.opts.Outliers.BaseEjection) * math.Pow(2, float64(h.ejections)))
	d = min(d, p.opts.Outliers.MaxEjection)
	h.ejections++
	h.ejectedUntil = p.now().Add(d)
	if wasOut {
		return Unchanged, d
	}
	return Ejected, d
}

// ejected counts the replicas out now. Call with p.mu held.
func (p *Picker) ejected() int {
	n := 0
	for _, h := range p.health {
		if !h.ejectedUntil.IsZero() {
			n++
		}
	}
	return n
}

func (p *Picker) maxEjected(replicas int) int {
	return max(1, int(float64(replicas)*p.opts.Outliers.MaxEjectedShare))
}

// Ejected lists the replicas out of the picking now, ejected or on trial.
func (p *Picker) Ejected() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for name, h := range p.health {
		if !h.ejectedUntil.IsZero() {
			out = append(out, name)
		}
	}
	return out
}

// SaturationOptions say when a replica is saturated. Once the model's spec
// or a reading with a queue has shown how many requests its engine runs at
// once (its batch), a replica that carries its batch is saturated: the router keeps the rest in
// its fair queues rather than in the engine's, where they would wait in
// arrival order, whoever sent them. Before that, as llm-d's saturation
// detector does: its engine queues QueueThreshold requests or more. And
// always when its KV cache is KVCacheThreshold full or more. Readings count
// while younger than the picker's StaleAfter; a replica without a fresh
// reading or a known batch is not saturated: the router does not hold
// requests back on what it cannot see.
type SaturationOptions struct {
	QueueThreshold   float64
	KVCacheThreshold float64
}

func (o SaturationOptions) withDefaults() SaturationOptions {
	if o.QueueThreshold <= 0 {
		o.QueueThreshold = 5
	}
	if o.KVCacheThreshold <= 0 || o.KVCacheThreshold > 1 {
		o.KVCacheThreshold = 0.8
	}
	return o
}

// Saturated tells whether every replica the picker may pick among the
// candidates is saturated: a request sent now would wait in an engine's
// queue.
func (p *Picker) Saturated(candidates []Endpoint) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := p.usable(candidates)
	if len(in) == 0 {
		return false
	}
	for _, e := range in {
		if !p.saturated(e.Name) {
			return false
		}
	}
	return true
}

// Unsaturated are the candidates that are not saturated; all of them when
// every one is. A request the fair queues released goes to one with room.
func (p *Picker) Unsaturated(candidates []Endpoint) []Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return keepOrAll(candidates, func(name string) bool { return !p.saturated(name) })
}

// saturated weighs what a replica carries: the requests this router has
// there now, which it knows at once and exactly, or, by its engine's last
// reading, what the engine ran and queued plus what was sent there since,
// less what ended (which counts the other routers' requests, a reading late).
func (p *Picker) saturated(name string) bool {
	r, ok := p.engine[name]
	fresh := ok && p.now().Sub(r.At) < p.opts.StaleAfter
	if fresh && r.KVCacheUsage >= p.opts.Saturation.KVCacheThreshold {
		return true
	}
	since := float64(p.sinceReading[name])
	batch, ok := p.batch[name]
	if !ok && p.concurrency > 0 {
		batch, ok = float64(p.concurrency), true
	}
	if ok {
		carried := float64(p.inFlight[name])
		if fresh {
			carried = max(carried, r.Running+r.Waiting+since)
		}
		return carried >= batch
	}
	return fresh && r.Waiting > 0 && r.Waiting+since >= p.opts.Saturation.QueueThreshold
}
