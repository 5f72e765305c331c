package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/autoscale"
	"github.com/aiinference/operator/internal/engine"
)

// forgetAfter is how long a model with no request keeps its picker (and its
// prefix index) and its replicas are read.
const forgetAfter = 10 * time.Minute

// saturatedScrapes is how many times more often the replicas of a model
// whose requests wait for room are read: the fair queues release requests by
// the engines' queues, and a reading a second old lets a flood fill them
// first (llm-d reads its engines every 50 ms).
const saturatedScrapes = 10

// scrapeEngines reads the load of every replica of the models routed to
// lately, each interval, and of the models whose requests wait for room ten
// times as often, until ctx ends; models idle for forgetAfter are forgotten.
func (rt *Router) scrapeEngines(ctx context.Context) {
	tick := time.NewTicker(rt.opts.ScrapeInterval)
	defer tick.Stop()
	fast := time.NewTicker(max(rt.opts.ScrapeInterval/saturatedScrapes, 20*time.Millisecond))
	defer fast.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			rt.scrapeOnce(ctx, false)
		case <-fast.C:
			rt.scrapeOnce(ctx, true)
		}
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
func (rt *Router) scrapeOnce(ctx context.Context, waitingOnly bool) {
	var jobs []scrapeJob
	var models []*modelState
	rt.mu.Lock()
	for key, s := range rt.models {
		if s.waiting == 0 && s.sending == 0 && s.flow.length() == 0 && time.Since(s.lastUsed) > forgetAfter {
			delete(rt.models, key)
			continue
		}
		if waitingOnly && s.flow.length() == 0 {
			continue
		}
		models = append(models, s)
		for _, ep := range s.endpoints {
			jobs = append(jobs, scrapeJob{picker: s.picker, ep: ep, engine: s.engine})
		}
	}
	rt.mu.Unlock()
	sem := make(chan struct{}, rt.opts.ScrapeParallel)
	var wg sync.WaitGroup
	for _, job := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			readCtx, cancel := context.WithTimeout(ctx, rt.opts.ScrapeInterval)
			defer cancel()
			load, err := readEngineLoad(readCtx, job.engine, job.ep.MetricsURL, rt.opts.MaxScrapeBytes)
			if err != nil {
				rt.log.V(1).Info("Reading a replica's load", "endpoint", job.ep.Name, "error", err.Error())
				return
			}
			job.picker.SetEngineLoad(job.ep.Name, load)
		})
	}
	wg.Wait()
	for _, s := range models {
		rt.kick(s) // the readings may show room for what waits
	}
}

var loadSignals = []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalRunningRequests, servingv1.SignalKVCacheUtilization}

// readEngineLoad reads the queue, the running requests and the KV-cache use
// that an engine exports (those it does not export read 0), reading at most
// maxBytes of its /metrics and keeping only those series.
func readEngineLoad(ctx context.Context, engineType servingv1.EngineType, url string, maxBytes int64) (EngineLoad, error) {
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
	names := []string{loraInfoMetric}
	for _, s := range wanted {
		names = append(names, eng.SignalMetrics(s)...)
	}
	families, err := autoscale.ScrapeFamiliesOf(ctx, url, maxBytes, names)
	if err != nil {
		return EngineLoad{}, err
	}
	signals, err := autoscale.SignalsOf(families, url, wanted, eng.SignalMetrics)
	if err != nil {
		return EngineLoad{}, err
	}
	return EngineLoad{
		Waiting:      signals[servingv1.SignalQueueDepth],
		Running:      signals[servingv1.SignalRunningRequests],
		KVCacheUsage: signals[servingv1.SignalKVCacheUtilization],
		Adapters:     adapterActivity(families[loraInfoMetric]),
		At:           time.Now(),
	}, nil
}

// loraInfoMetric is vLLM's gauge of its LoRA adapters (vllm/v1/metrics/
// loggers.py; llm-d-inference-sim exports it too): one series per state seen,
// labels running_lora_adapters and waiting_lora_adapters (comma-separated
// names) and max_lora, whose value is the time it was set. Series of earlier
// states stay, so the latest (the largest value) is the engine's state now.
const loraInfoMetric = "vllm:lora_requests_info"

// adapterActivity reads the latest series of vllm:lora_requests_info; Known
// is false without one. Series set within the same clock tick (the simulator
// sets whole seconds) tie, and the adapters of each count as active: one of
// them is the state now.
func adapterActivity(f *dto.MetricFamily) AdapterActivity {
	if len(f.GetMetric()) == 0 {
		return AdapterActivity{}
	}
	latest := math.Inf(-1)
	for _, m := range f.GetMetric() {
		latest = max(latest, m.GetGauge().GetValue())
	}
	out := AdapterActivity{Known: true}
	for _, m := range f.GetMetric() {
		if m.GetGauge().GetValue() == latest {
			out.add(m)
		}
	}
	slices.Sort(out.Active)
	return out
}

// add takes one series' adapters and max_lora.
func (out *AdapterActivity) add(m *dto.Metric) {
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "running_lora_adapters", "waiting_lora_adapters":
			for name := range strings.SplitSeq(l.GetValue(), ",") {
				if name = strings.TrimSpace(name); name != "" && !slices.Contains(out.Active, name) {
					out.Active = append(out.Active, name)
				}
			}
		case "max_lora":
			out.Max, _ = strconv.Atoi(l.GetValue())
		}
	}
}
