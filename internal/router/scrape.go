package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/autoscale"
	"github.com/aiinference/operator/internal/engine"
)

// forgetAfter is how long a model with no request keeps its picker (and its
// prefix index) and its replicas are read.
const forgetAfter = 10 * time.Minute

// scrapeParallel bounds the engines read at once.
const scrapeParallel = 16

// scrapeEngines reads the load of every replica of the models routed to
// lately, each interval, until ctx ends; models idle for forgetAfter are
// forgotten.
func (rt *Router) scrapeEngines(ctx context.Context) {
	tick := time.NewTicker(rt.opts.ScrapeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rt.scrapeOnce(ctx)
	}
}

type scrapeJob struct {
	picker *Picker
	ep     Endpoint
	engine servingv1.EngineType
}

// scrapeOnce reads every replica's load once, each read bounded by the
// interval (the engines are the users': autoscale.Scrape reads them with the
// client for such endpoints, which follows no redirect and bounds the answer).
func (rt *Router) scrapeOnce(ctx context.Context) {
	var jobs []scrapeJob
	rt.mu.Lock()
	for key, s := range rt.models {
		if s.waiting == 0 && time.Since(s.lastUsed) > forgetAfter {
			delete(rt.models, key)
			continue
		}
		for _, ep := range s.endpoints {
			jobs = append(jobs, scrapeJob{picker: s.picker, ep: ep, engine: s.engine})
		}
	}
	rt.mu.Unlock()
	sem := make(chan struct{}, scrapeParallel)
	var wg sync.WaitGroup
	for _, job := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			readCtx, cancel := context.WithTimeout(ctx, rt.opts.ScrapeInterval)
			defer cancel()
			load, err := readEngineLoad(readCtx, job.engine, job.ep.MetricsURL)
			if err != nil {
				rt.log.V(1).Info("Reading a replica's load", "endpoint", job.ep.Name, "error", err.Error())
				return
			}
			job.picker.SetEngineLoad(job.ep.Name, load)
		})
	}
	wg.Wait()
}

var loadSignals = []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalRunningRequests, servingv1.SignalKVCacheUtilization}

// readEngineLoad reads the queue, the running requests and the KV-cache use
// that an engine exports (those it does not export read 0).
func readEngineLoad(ctx context.Context, engineType servingv1.EngineType, url string) (EngineLoad, error) {
	if url == "" {
		return EngineLoad{}, errors.New("no /metrics address")
	}
	eng, err := engine.For(engineType)
	if err != nil {
		return EngineLoad{}, err
	}
	var wanted []servingv1.AutoscalingSignal
	for _, s := range loadSignals {
		if len(eng.SignalMetrics(s)) > 0 {
			wanted = append(wanted, s)
		}
	}
	if len(wanted) == 0 {
		return EngineLoad{}, fmt.Errorf("engine %s exports no load gauge", engineType)
	}
	signals, err := autoscale.Scrape(ctx, url, wanted, eng.SignalMetrics)
	if err != nil {
		return EngineLoad{}, err
	}
	return EngineLoad{
		Waiting:      signals[servingv1.SignalQueueDepth],
		Running:      signals[servingv1.SignalRunningRequests],
		KVCacheUsage: signals[servingv1.SignalKVCacheUtilization],
		At:           time.Now(),
	}, nil
}
