package router

import (
	"cmp"
	"container/list"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/aiinference/operator/internal/autoscale"
)

// Endpoint is one serving replica of a model.
type Endpoint struct {
	// Name is the pod's name: the key on the hash ring, the same in every router.
	Name string
	// Addr is host:port of the engine's HTTP port.
	Addr string
	// MetricsURL is the engine's Prometheus /metrics.
	MetricsURL string
	// Track is the pod's serving.aiinference.io/track: stable or canary.
	Track string
}

// Reasons a replica was picked, in order of weight.
const (
	// ReasonPrefix: this router sent the longest prefix of the prompt there before.
	ReasonPrefix = autoscale.RouterPrefixReason
	// ReasonHash: the owner of the prompt's first block on the hash ring.
	ReasonHash = "hash"
	// ReasonSpill: the owner was past the load bound; the next on the ring.
	ReasonSpill = "spill"
	// ReasonAdapter: no cached prefix to follow, and the request's LoRA
	// adapter is active (running or waiting) in this replica's engine, as its
	// vllm:lora_requests_info says: the adapter is in the GPU there.
	ReasonAdapter = "adapter"
	// ReasonSession: the session header's owner on the hash ring.
	ReasonSession = "session"
	// ReasonLoad: no prefix or session to follow; the least loaded replica.
	ReasonLoad = "load"
	// ReasonRetry: the replica picked first refused the connection.
	ReasonRetry = "retry"
)

// Reasons lists every pick reason, for metrics and docs.
var Reasons = []string{ReasonPrefix, ReasonAdapter, ReasonHash, ReasonSpill, ReasonSession, ReasonLoad, ReasonRetry}

// EngineLoad is what a replica's engine says of its load.
type EngineLoad struct {
	Waiting, Running, KVCacheUsage float64
	// Adapters is where the engine's LoRA adapters stand.
	Adapters AdapterActivity
	// At is when it was read; a reading older than staleAfter counts for nothing.
	At time.Time
}

// AdapterActivity is what an engine's vllm:lora_requests_info says, in its
// latest series: the LoRA adapters that have requests running
// (running_lora_adapters) or waiting (waiting_lora_adapters) there, which are
// in its GPU, and how many adapters it runs in one batch (max_lora).
type AdapterActivity struct {
	// Known is false when the engine exports no such series.
	Known bool
	// Active are the adapters running or waiting.
	Active []string
	// Max is max_lora; 0 when not given.
	Max int
}

// has reports whether adapter is active.
func (a AdapterActivity) has(adapter string) bool { return slices.Contains(a.Active, adapter) }

// room reports whether one more adapter can become active without another
// leaving the GPU.
func (a AdapterActivity) room() bool { return a.Known && a.Max > 0 && len(a.Active) < a.Max }

// PickerOptions tune a picker.
type PickerOptions struct {
	// LoadFactor bounds a replica's load at LoadFactor times the mean (plus one
	// request). Default 1.25.
	LoadFactor float64
	// MinBound is a load no replica is past: an engine runs many requests in
	// a batch, and spilling a prefix at low load costs its cache hits for
	// nothing. Default 4.
	MinBound int
	// VirtualNodes is how many points each replica has on the ring. Default 128.
	VirtualNodes int
	// IndexBlocks bounds the blocks the prefix index remembers. Default 65536.
	IndexBlocks int
	// StaleAfter is how long an engine's reading counts. Default 5s.
	StaleAfter time.Duration
	// Outliers tune when a failing replica is taken out of the picking.
	Outliers OutlierOptions
	// Saturation says when a replica is saturated.
	Saturation SaturationOptions
}

func (o PickerOptions) withDefaults() PickerOptions {
	if o.LoadFactor <= 1 {
		o.LoadFactor = 1.25
	}
	if o.MinBound <= 0 {
		o.MinBound = 4
	}
	if o.VirtualNodes <= 0 {
		o.VirtualNodes = 128
	}
	if o.IndexBlocks <= 0 {
		o.IndexBlocks = 1 << 16
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = 5 * time.Second
	}
	o.Outliers = o.Outliers.withDefaults()
	o.Saturation = o.Saturation.withDefaults()
	return o
}

// Picker picks a replica of one model for each request. Safe for concurrent use.
type Picker struct {
	opts PickerOptions
	now  func() time.Time

	mu sync.Mutex
	// ring is the sorted points of the replicas on it, onRing their names.
	ring   []ringPoint
	onRing map[string]bool
	// inFlight counts the requests this router has sent to each replica and
	// not seen end.
	inFlight map[string]int
	engine   map[string]EngineLoad
	// sinceReading counts, per replica, the requests sent there since its
	// engine's last reading, less those that ended.
	sinceReading map[string]int
	// batch is, per replica, how many requests its engine ran at its last
	// reading with a queue: the most it runs at once.
	batch map[string]float64
	// concurrency is how many requests the model's spec tells its engine to
	// run at once (0 when it does not say): the batch of a replica before a
	// reading showed it.
	concurrency int
	health      map[string]*health
	index       prefixIndex
	// turn rotates the start of the least-loaded search, to spread ties.
	turn int
}

type ringPoint struct {
	hash uint64
	name string
}

// NewPicker makes a picker.
func NewPicker(opts PickerOptions) *Picker {
	opts = opts.withDefaults()
	return &Picker{opts: opts, now: time.Now, inFlight: map[string]int{}, onRing: map[string]bool{}, engine: map[string]EngineLoad{},
		sinceReading: map[string]int{}, batch: map[string]float64{}, health: map[string]*health{},
		index: prefixIndex{max: opts.IndexBlocks, entries: map[uint64]*list.Element{}, order: list.New()}}
}

// Pick is a decision: the replica, why, and how many of the prompt's blocks
// the router believes it holds.
type Pick struct {
	Endpoint  Endpoint
	Reason    string
	HitBlocks int
}

// Pick chooses among the candidates (the ready replicas of the serving
// revision, less those that refused the request, less those taken out for
// failing) for a prompt of the given block hashes and session key, and counts
// the request in flight there until Done. ok is false when there is no
// candidate.
func (p *Picker) Pick(candidates []Endpoint, blocks []uint64, session string) (Pick, bool) {
	return p.PickForAdapter(candidates, blocks, session, "")
}

// PickForAdapter is Pick for a request that names a LoRA adapter (none when
// adapter is empty): without a cached prefix to follow, the candidates where
// the adapter is active go first (ReasonAdapter), then those with room for
// one more active adapter.
func (p *Picker) PickForAdapter(candidates []Endpoint, blocks []uint64, session, adapter string) (Pick, bool) {
	if len(candidates) == 0 {
		return Pick{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	candidates = p.usable(candidates)
	byName := make(map[string]Endpoint, len(candidates))
	for _, e := range candidates {
		byName[e.Name] = e
	}
	loads := make(map[string]float64, len(candidates))
	total := 0.0
	for name := range byName {
		loads[name] = p.load(name)
		total += loads[name]
	}
	bound := max(math.Ceil(p.opts.LoadFactor*(total+1)/float64(len(byName))), float64(p.opts.MinBound))
	under := func(name string) bool { return loads[name]+1 <= bound }

	pick := p.choose(byName, blocks, session, adapter, under)
	pick.HitBlocks = p.index.held(blocks, pick.Endpoint.Name)
	p.index.add(blocks, pick.Endpoint.Name)
	p.inFlight[pick.Endpoint.Name]++
	p.sinceReading[pick.Endpoint.Name]++
	p.picked(pick.Endpoint.Name)
	return pick, true
}

func (p *Picker) choose(byName map[string]Endpoint, blocks []uint64, session, adapter string, under func(string) bool) Pick {
	// The longest prefix this router sent before, where it went.
	for i := len(blocks) - 1; i >= 0; i-- {
		if name, ok := p.index.holder(blocks[i]); ok {
			if _, candidate := byName[name]; candidate && under(name) {
				return Pick{Endpoint: byName[name], Reason: ReasonPrefix}
			}
		}
	}
	// The ring: every router finds the same owner for the same key.
	var key uint64
	reason := ""
	switch {
	case len(blocks) > 0:
		key, reason = blocks[0], ReasonHash
	case session != "":
		key, reason = xxhash.Sum64String(session), ReasonSession
	}
	if adapter != "" {
		active, room := p.adapterTiers(byName, adapter, under)
		if len(active) > 0 {
			// Where the adapter is in the GPU: the first of them on the ring
			// from the key (the same in every router), else the least loaded.
			if reason != "" {
				p.buildRing(active)
				return Pick{Endpoint: active[p.walk(key, active)[0]], Reason: ReasonAdapter}
			}
			return Pick{Endpoint: active[p.leastLoaded(active)], Reason: ReasonAdapter}
		}
		if len(room) > 0 {
			// Loading it there swaps no other adapter out of the GPU.
			byName = room
		}
	}
	if reason != "" {
		p.buildRing(byName)
		for i, name := range p.walk(key, byName) {
			if under(name) {
				if i > 0 {
					reason = ReasonSpill
				}
				return Pick{Endpoint: byName[name], Reason: reason}
			}
		}
	}
	return Pick{Endpoint: byName[p.leastLoaded(byName)], Reason: ReasonLoad}
}

// adapterTiers are the candidates under the load bound where the adapter is
// active in the engine, and those where it is not but one more adapter fits
// (max_lora), by fresh engine readings.
func (p *Picker) adapterTiers(byName map[string]Endpoint, adapter string, under func(string) bool) (active, room map[string]Endpoint) {
	active, room = map[string]Endpoint{}, map[string]Endpoint{}
	for name, e := range byName {
		r, ok := p.engine[name]
		if !ok || p.now().Sub(r.At) >= p.opts.StaleAfter || !under(name) {
			continue
		}
		switch {
		case r.Adapters.has(adapter):
			active[name] = e
		case r.Adapters.room():
			room[name] = e
		}
	}
	return active, room
}

// load is the request count a replica carries: the larger of what this router
// has in flight there and what its engine runs and queues (which counts the
// other routers' requests too, a scrape late).
func (p *Picker) load(name string) float64 {
	own := float64(p.inFlight[name])
	if e, ok := p.engine[name]; ok && p.now().Sub(e.At) < p.opts.StaleAfter {
		return max(own, e.Waiting+e.Running)
	}
	return own
}

// score orders replicas by load, queue first: a waiting request pays the whole
// wait, a full KV cache evicts prefixes and preempts, a running one shares the
// batch; and a replica that failed its last answers is no light load.
func (p *Picker) score(name string) float64 {
	s := float64(p.inFlight[name])
	if h := p.health[name]; h != nil {
		s += failurePenalty * float64(h.failures)
	}
	if e, ok := p.engine[name]; ok && p.now().Sub(e.At) < p.opts.StaleAfter {
		s += 4*e.Waiting + 8*e.KVCacheUsage + e.Running
	}
	return s
}

func (p *Picker) leastLoaded(byName map[string]Endpoint) string {
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names)
	p.turn++
	best, bestScore := "", math.Inf(1)
	for i := range names {
		name := names[(p.turn+i)%len(names)]
		if s := p.score(name); s < bestScore {
			best, bestScore = name, s
		}
	}
	return best
}

// buildRing adds the replicas not yet on the ring. The ring keeps replicas
// that are not candidates now (walk skips them): the candidates' order from a
// key depends on their own points only, so a retry or a canary split moves no
// other key, and two routers that saw different replicas come and go agree.
func (p *Picker) buildRing(byName map[string]Endpoint) {
	added := false
	for name := range byName {
		if p.onRing[name] {
			continue
		}
		p.onRing[name], added = true, true
		for v := range p.opts.VirtualNodes {
			p.ring = append(p.ring, ringPoint{hash: xxhash.Sum64String(name + "#" + strconv.Itoa(v)), name: name})
		}
	}
	if added {
		slices.SortFunc(p.ring, func(a, b ringPoint) int { return cmp.Compare(a.hash, b.hash) })
	}
}

// walk lists the candidates in ring order from key: the owner first.
func (p *Picker) walk(key uint64, byName map[string]Endpoint) []string {
	start, _ := slices.BinarySearchFunc(p.ring, key, func(pt ringPoint, k uint64) int { return cmp.Compare(pt.hash, k) })
	var order []string
	seen := map[string]bool{}
	for i := range p.ring {
		name := p.ring[(start+i)%len(p.ring)].name
		if _, ok := byName[name]; ok && !seen[name] {
			seen[name] = true
			order = append(order, name)
			if len(order) == len(byName) {
				break
			}
		}
	}
	return order
}

// Done ends a request counted in flight at a replica.
func (p *Picker) Done(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[name]--; p.inFlight[name] <= 0 {
		delete(p.inFlight, name)
	}
	if _, ok := p.sinceReading[name]; ok {
		p.sinceReading[name]--
	}
}

// SetConcurrency records how many requests the model's spec tells each
// engine to run at once; 0 when it does not say.
func (p *Picker) SetConcurrency(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.concurrency = n
}

// InFlight is how many requests this router has at a replica now.
func (p *Picker) InFlight(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight[name]
}

// maxReading bounds an engine's counts: a replica's own /metrics may say
// anything, and a finite but huge count (1e308) would overflow the scores.
const maxReading = 1e6

// SetEngineLoad records a replica's engine reading, its counts clamped to
// [0, 1e6] and its KV-cache use to [0, 1].
func (p *Picker) SetEngineLoad(name string, l EngineLoad) {
	clamp := func(v, most float64) float64 {
		if !(v > 0) { // NaN too
			return 0
		}
		return min(v, most)
	}
	l.Waiting, l.Running, l.KVCacheUsage = clamp(l.Waiting, maxReading), clamp(l.Running, maxReading), clamp(l.KVCacheUsage, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.engine[name] = l
	p.sinceReading[name] = 0
	if l.Waiting > 0 && l.Running > 0 {
		p.batch[name] = l.Running
	}
}

// Forget drops what the picker holds of replicas no longer among names.
func (p *Picker) Forget(names []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name := range p.engine {
		if !slices.Contains(names, name) {
			delete(p.engine, name)
		}
	}
	for name := range p.onRing {
		if !slices.Contains(names, name) {
			delete(p.onRing, name)
		}
	}
	for name := range p.health {
		if !slices.Contains(names, name) {
			delete(p.health, name)
		}
	}
	for name := range p.sinceReading {
		if !slices.Contains(names, name) {
			delete(p.sinceReading, name)
			delete(p.batch, name)
		}
	}
	p.ring = slices.DeleteFunc(p.ring, func(pt ringPoint) bool { return !p.onRing[pt.name] })
}

// prefixIndex remembers, for the most recently sent blocks, the replica each
// went to last: the replica that most likely holds it in its KV cache. Its
// size is bounded; the least recently sent blocks are forgotten first, as an
// engine evicts them.
type prefixIndex struct {
	max     int
	entries map[uint64]*list.Element
	order   *list.List
}

type indexEntry struct {
	hash uint64
	name string
}

func (x *prefixIndex) holder(h uint64) (string, bool) {
	e, ok := x.entries[h]
	if !ok {
		return "", false
	}
	return e.Value.(*indexEntry).name, true
}

// held is how many leading blocks the index places at name.
func (x *prefixIndex) held(blocks []uint64, name string) int {
	for i := len(blocks) - 1; i >= 0; i-- {
		if n, ok := x.holder(blocks[i]); ok && n == name {
			return i + 1
		}
	}
	return 0
}

func (x *prefixIndex) add(blocks []uint64, name string) {
	for _, h := range blocks {
		if e, ok := x.entries[h]; ok {
			e.Value.(*indexEntry).name = name
			x.order.MoveToFront(e)
			continue
		}
		x.entries[h] = x.order.PushFront(&indexEntry{hash: h, name: name})
		if x.order.Len() > x.max {
			last := x.order.Back()
			x.order.Remove(last)
			delete(x.entries, last.Value.(*indexEntry).hash)
		}
	}
}
