// Package adapteragent is the adapter agent (`model-loader adapters`): a
// sidecar beside an engine that loads LoRA adapters at run time (vLLM). It
// fetches each adapter of its set into the cache volume with the model loader
// (verified and resumable, as the model), asks the engine to load it, unloads
// the adapters that left the set, retries a failed adapter with the model's
// back-off up to its bound, and reports where each stands. See
// loadspec.AdapterSet for the contract with the operator.
package adapteragent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
)

// passInterval is how often the agent compares the engine's adapters with its
// set: it notices an engine restarted in place (which lost its adapters) and
// a retry that fell due.
const passInterval = 2 * time.Second

// Agent keeps one engine's adapters in line with a set.
type Agent struct {
	log    *slog.Logger
	engine *vllmAPI
	// dir is the cache volume's adapter folder: every destination is inside it.
	dir string
	// fetch fetches one adapter's files; the loader, but for tests.
	fetch func(ctx context.Context, cfg loadspec.Config) (loadspec.Summary, error)
	// wake starts a pass at once (a new set).
	wake chan struct{}

	mu  sync.Mutex
	set loadspec.AdapterSet
	// adapters are the set's adapters' states, by name.
	adapters map[string]*adapter
	// initial are the names of the set the pod started with; ready once each
	// was tried.
	initial []string
}

// adapter is one adapter's state in this pod.
type adapter struct {
	spec     loadspec.Adapter
	state    servingv1.AdapterState
	fetched  *loadspec.Summary
	fetching bool
	attempts int
	failure  *loadspec.Failure
	failedAt time.Time
	retryAt  time.Time
	loadedAt time.Time
	tried    bool
}

// New returns an agent for the engine at engineURL, with the adapter folder
// dir and the set the pod started with.
func New(log *slog.Logger, engineURL, dir string, initial loadspec.AdapterSet, fetch func(context.Context, loadspec.Config) (loadspec.Summary, error)) (*Agent, error) {
	a := &Agent{log: log, engine: newVLLMAPI(engineURL), dir: filepath.Clean(dir), fetch: fetch, wake: make(chan struct{}, 1), adapters: map[string]*adapter{}}
	if err := a.Set(initial); err != nil {
		return nil, err
	}
	for _, ad := range initial.Adapters {
		a.initial = append(a.initial, ad.Name)
	}
	return a, nil
}

// Set replaces the set. An adapter whose configuration is unchanged keeps its
// state (and its failed attempts); a changed one starts afresh.
func (a *Agent) Set(set loadspec.AdapterSet) error {
	if err := a.check(set); err != nil {
		return err
	}
	a.mu.Lock()
	next := map[string]*adapter{}
	for _, ad := range set.Adapters {
		if old := a.adapters[ad.Name]; old != nil && sameConfig(old.spec, ad) {
			next[ad.Name] = old
			continue
		}
		next[ad.Name] = &adapter{spec: ad, state: servingv1.AdapterFetching}
	}
	a.set, a.adapters = set, next
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

func sameConfig(a, b loadspec.Adapter) bool { return reflect.DeepEqual(a, b) }

// check refuses a set that would write outside the adapter folder or name an
// adapter twice: whoever sends a set decides what the pod fetches, so the
// agent trusts it no further than it must.
func (a *Agent) check(set loadspec.AdapterSet) error {
	seen := map[string]bool{}
	for _, ad := range set.Adapters {
		if ad.Name == "" || seen[ad.Name] {
			return fmt.Errorf("adapter name %q is empty or given twice", ad.Name)
		}
		seen[ad.Name] = true
		rel, err := filepath.Rel(a.dir, filepath.Clean(ad.Load.Dest))
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") || !filepath.IsAbs(ad.Load.Dest) {
			return fmt.Errorf("adapter %s: destination %q is not inside %s", ad.Name, ad.Load.Dest, a.dir)
		}
	}
	if set.MaxAttempts < 1 {
		return errors.New("maxAttempts must be at least 1")
	}
	return nil
}

// Ready tells whether every adapter of the set the pod started with was tried
// once: loaded, or failed (a failed adapter never keeps a replica out of
// service).
func (a *Agent) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, name := range a.initial {
		if ad := a.adapters[name]; ad != nil && !ad.tried {
			return false
		}
	}
	return true
}

// Report is where each adapter of the set stands.
func (a *Agent) Report() loadspec.AdapterReport {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := loadspec.AdapterReport{Revision: a.set.Revision, Adapters: []loadspec.AdapterReplica{}}
	for _, spec := range a.set.Adapters {
		ad := a.adapters[spec.Name]
		r.Adapters = append(r.Adapters, loadspec.AdapterReplica{
			Name: spec.Name, State: string(ad.state), Path: spec.Load.Dest, Attempts: ad.attempts,
			Failure: ad.failure, FailedAt: ad.failedAt, Retrying: ad.failure != nil && !ad.retryAt.IsZero(), RetryAt: ad.retryAt,
			Fetch: ad.fetched, LoadedAt: ad.loadedAt,
		})
	}
	return r
}

// Run makes passes until ctx ends.
func (a *Agent) Run(ctx context.Context) {
	tick := time.NewTicker(passInterval)
	defer tick.Stop()
	for {
		a.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.wake:
		}
	}
}

// pass compares the engine's adapters with the set once: it unloads those
// that left it, starts the fetches due, and loads what is fetched.
func (a *Agent) pass(ctx context.Context) {
	loaded, err := a.engine.loaded(ctx)
	engineUp := err == nil
	if !engineUp {
		// The fetches need no engine: they start while it warms up.
		a.log.Debug("Cannot list the engine's adapters yet", "error", err.Error())
	}
	a.mu.Lock()
	var unload []string
	for name := range loaded {
		if a.adapters[name] == nil {
			unload = append(unload, name)
		}
	}
	type loadJob struct {
		name, path, stale string
	}
	var loads []loadJob
	now := time.Now()
	for _, spec := range a.set.Adapters {
		ad := a.adapters[spec.Name]
		path, isLoaded := loaded[spec.Name]
		switch {
		case isLoaded && filepath.Clean(path) == filepath.Clean(spec.Load.Dest):
			if ad.state != servingv1.AdapterLoaded {
				ad.state, ad.loadedAt, ad.tried = servingv1.AdapterLoaded, now, true
				ad.failure, ad.retryAt = nil, time.Time{}
			}
		case ad.fetching, ad.failure != nil && (ad.retryAt.IsZero() || now.Before(ad.retryAt)):
			// Fetching, waiting for its retry, or given up.
		case ad.fetched == nil:
			ad.fetching, ad.state = true, servingv1.AdapterFetching
			go a.fetchOne(ctx, spec)
		case !engineUp:
			// Fetched; loaded once the engine answers.
		default:
			// Fetched and not loaded: new, or lost by an engine restarted in place.
			stale := ""
			if isLoaded {
				stale = spec.Name // another revision under the same name
			}
			ad.state = servingv1.AdapterLoading
			loads = append(loads, loadJob{spec.Name, spec.Load.Dest, stale})
		}
	}
	a.mu.Unlock()
	slices.Sort(unload)
	for _, name := range unload {
		a.log.Info("Unloading adapter", "adapter", name)
		if err := a.engine.unload(ctx, name); err != nil {
			a.log.Error("Unloading adapter failed", "adapter", name, "error", err.Error())
		}
	}
	for _, j := range loads {
		if j.stale != "" {
			if err := a.engine.unload(ctx, j.stale); err != nil {
				a.failed(j.name, &loadspec.Failure{Reason: loadspec.ReasonEngineRefused, Message: "unloading the earlier revision: " + err.Error(), Retryable: true})
				continue
			}
		}
		a.log.Info("Loading adapter", "adapter", j.name, "path", j.path)
		if err := a.engine.load(ctx, j.name, j.path); err != nil {
			var refused *engineError
			retryable := !errors.As(err, &refused) || refused.status >= 500
			a.failed(j.name, &loadspec.Failure{Reason: loadspec.ReasonEngineRefused, Message: err.Error(), Retryable: retryable})
			continue
		}
		a.mu.Lock()
		if ad := a.adapters[j.name]; ad != nil && ad.spec.Load.Dest == j.path {
			ad.state, ad.loadedAt, ad.tried = servingv1.AdapterLoaded, time.Now(), true
			ad.failure, ad.retryAt = nil, time.Time{}
		}
		a.mu.Unlock()
		a.log.Info("Loaded adapter", "adapter", j.name)
	}
}

// fetchOne fetches one adapter's files and wakes a pass to load them.
func (a *Agent) fetchOne(ctx context.Context, spec loadspec.Adapter) {
	a.log.Info("Fetching adapter", "adapter", spec.Name, "source", spec.Load.Source, "dest", spec.Load.Dest)
	summary, err := a.fetch(ctx, spec.Load)
	a.mu.Lock()
	ad := a.adapters[spec.Name]
	current := ad != nil && sameConfig(ad.spec, spec)
	if current {
		ad.fetching = false
		if err == nil {
			ad.fetched = &summary
		}
	}
	a.mu.Unlock()
	if !current {
		return
	}
	if err != nil {
		f := summary.Failure
		if f == nil {
			f = loader.FailureOf(err)
		}
		a.failed(spec.Name, f)
	} else {
		a.log.Info("Fetched adapter", "adapter", spec.Name, "files", summary.Files, "bytes", summary.Bytes, "verified", summary.Verified, "cacheHit", summary.CacheHit)
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// failed records a failed attempt and when the next one is due: with the
// model's back-off, up to the set's bound, and never for a permanent failure.
func (a *Agent) failed(name string, f *loadspec.Failure) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.adapters[name]
	if ad == nil {
		return
	}
	ad.attempts++
	ad.state, ad.failure, ad.failedAt, ad.tried = servingv1.AdapterFailed, f, time.Now(), true
	ad.retryAt = time.Time{}
	if f.Retryable && ad.attempts < a.set.MaxAttempts {
		ad.retryAt = ad.failedAt.Add(loadspec.RetryDelay(a.set.Backoff.Duration, ad.attempts))
	}
	if f.Reason != loadspec.ReasonEngineRefused {
		ad.fetched = nil
	}
	a.log.Error("Adapter failed", "adapter", name, "reason", f.Reason, "message", f.Message, "attempts", ad.attempts, "retryAt", ad.retryAt)
}
