package analysis

import (
	"strings"
	"time"

	"github.com/prometheus/common/model"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The placeholders of a query, the same for the built-in checks and the queries
// users write (spec.rollout.canary.steps[].analysis.checks[].query).
const (
	// SelectorPlaceholder is replaced by the label matchers of the pods judged.
	SelectorPlaceholder = "{{selector}}"
	// WindowPlaceholder is replaced by the run's window, a PromQL duration.
	WindowPlaceholder = "{{window}}"
)

// builtin is how one engine measures one built-in check. Value and Samples are
// query templates with the placeholders above.
type builtin struct {
	// Value gives one number for the pods of the selector.
	Value string
	// Samples counts the requests those pods finished in the window. Empty: the
	// engine's finished-request count (engineQueries.Finished).
	Samples string
	// Unit follows a value in messages ("s" for latencies).
	Unit string
	// Measures names what Value measures, for messages ("p95 time to first token").
	Measures string
	// NoData is said when Value returns nothing although requests were counted:
	// what the user may be missing.
	NoData string
	// Unavailable, when set, says that the engine exports no metric for the check
	// and what to use instead; Value is empty then.
	Unavailable string
}

// engineQueries are an engine's built-in checks.
type engineQueries struct {
	// Finished counts the requests the pods finished in the window: the sample
	// count of every check but ErrorRatio, and of user-written queries.
	Finished string
	Checks   map[servingv1.AnalysisMetric]builtin
}

// p95 is the 95th percentile of a Prometheus histogram over the window, summed
// over the selected pods.
func p95(histogram string) string {
	return "histogram_quantile(0.95, sum by (le) (rate(" + histogram + "_bucket{{{selector}}}[{{window}}])))"
}

// perPodMean is a gauge's mean over the window, summed within each pod (an engine
// may report it per model or per engine core) and averaged over the pods, so a
// canary of one pod compares with a stable set of several.
func perPodMean(gauge string) string {
	return "avg(sum by (namespace, pod) (avg_over_time(" + gauge + "{{{selector}}}[{{window}}])))"
}

// The metric names below were checked in each engine's source; docs/canary.md
// ("Analysis checks") lists them with where they come from.
//
// vLLM's HTTP metrics are those of its OpenAI API server, instrumented by
// prometheus-fastapi-instrumentator: http_requests_total{handler, method, status}
// with the status grouped as 2xx, 4xx, 5xx and the handler the route's path
// (/v1/completions, /v1/chat/completions, ...); health, metrics and similar
// routes are left out by vLLM. /v1/models is left out here too: gateways poll it.
const vllmInferenceRequests = `http_requests_total{{{selector}},handler=~"/v1/.+",handler!="/v1/models"`

var queries = map[servingv1.EngineType]engineQueries{
	servingv1.EngineVLLM: {
		Finished: "sum(increase(vllm:e2e_request_latency_seconds_count{{{selector}}}[{{window}}]))",
		Checks: map[servingv1.AnalysisMetric]builtin{
			servingv1.MetricErrorRatio: {
				Value: "(sum(rate(" + vllmInferenceRequests + `,status="5xx"}[{{window}}])) or vector(0))` +
					" / sum(rate(" + vllmInferenceRequests + "}[{{window}}]))",
				Samples:  "sum(increase(" + vllmInferenceRequests + "}[{{window}}]))",
				Measures: "error ratio (5xx responses of the OpenAI API)",
				NoData:   "vLLM's API server exports http_requests_total on the same /metrics as vllm:*",
			},
			servingv1.MetricTimeToFirstToken: {
				Value:    p95("vllm:time_to_first_token_seconds"),
				Unit:     "s",
				Measures: "p95 time to first token",
			},
			servingv1.MetricInterTokenLatency: {
				// vllm:inter_token_latency_seconds since vLLM 0.11; before, the same
				// histogram was vllm:time_per_output_token_seconds (hidden in 0.12,
				// removed in 0.13). The newer name wins when both are there.
				Value:    p95("vllm:inter_token_latency_seconds") + " or " + p95("vllm:time_per_output_token_seconds"),
				Unit:     "s",
				Measures: "p95 inter-token latency",
				NoData:   "requests that generate a single token have no inter-token latency",
			},
			servingv1.MetricEndToEndLatency: {
				Value:    p95("vllm:e2e_request_latency_seconds"),
				Unit:     "s",
				Measures: "p95 end-to-end latency",
			},
			servingv1.MetricQueueLength: {
				Value:    perPodMean("vllm:num_requests_waiting"),
				Measures: "mean waiting requests per pod",
			},
		},
	},
	servingv1.EngineTGI: {
		// Counted by the router for every successful request, with the latency
		// histograms below.
		Finished: "sum(increase(tgi_request_duration_count{{{selector}}}[{{window}}]))",
		Checks: map[servingv1.AnalysisMetric]builtin{
			servingv1.MetricErrorRatio: {
				// tgi_request_count counts every request the router takes;
				// tgi_request_failure{err} the failed ones. Server-side errors are
				// "generation" (424) and "incomplete" (500); "validation" and
				// "template" are the client's (422), "overloaded" is 429 and
				// "dropped" a client that went away.
				Value: `(sum(rate(tgi_request_failure{{{selector}},err=~"generation|incomplete"}[{{window}}])) or vector(0))` +
					" / sum(rate(tgi_request_count{{{selector}}}[{{window}}]))",
				Samples:  "sum(increase(tgi_request_count{{{selector}}}[{{window}}]))",
				Measures: "error ratio (failed generations)",
			},
			servingv1.MetricTimeToFirstToken: {
				Unavailable: "TGI exports no time-to-first-token metric (its router has tgi_request_queue_duration, " +
					"tgi_request_inference_duration and tgi_request_mean_time_per_token_duration); " +
					"write a query instead, e.g. on your gateway's time-to-first-token metric, or p95 of " +
					"tgi_request_queue_duration (the wait before prefill), or use EndToEndLatency",
			},
			servingv1.MetricInterTokenLatency: {
				// TGI's per-request mean time per token: inference time divided by
				// the generated tokens, so it includes the prefill.
				Value:    p95("tgi_request_mean_time_per_token_duration"),
				Unit:     "s",
				Measures: "p95 of the per-request mean time per token",
			},
			servingv1.MetricEndToEndLatency: {
				Value:    p95("tgi_request_duration"),
				Unit:     "s",
				Measures: "p95 end-to-end latency",
			},
			servingv1.MetricQueueLength: {
				Value:    perPodMean("tgi_queue_size"),
				Measures: "mean queued requests per pod",
			},
		},
	},
	servingv1.EngineTriton: {
		Finished: "sum(increase(nv_inference_request_success{{{selector}}}[{{window}}]))",
		Checks: map[servingv1.AnalysisMetric]builtin{
			servingv1.MetricErrorRatio: {
				// nv_inference_request_failure has a reason label (REJECTED,
				// CANCELED, BACKEND, OTHER) in recent Triton; a cancel is the
				// client's. Without the label, reason!="CANCELED" matches all.
				Value: `(sum(rate(nv_inference_request_failure{{{selector}},reason!="CANCELED"}[{{window}}])) or vector(0))` +
					" / ((sum(rate(nv_inference_request_success{{{selector}}}[{{window}}])) or vector(0))" +
					" + (sum(rate(nv_inference_request_failure{{{selector}}}[{{window}}])) or vector(0)))",
				Samples: "(sum(increase(nv_inference_request_success{{{selector}}}[{{window}}])) or vector(0))" +
					" + (sum(increase(nv_inference_request_failure{{{selector}}}[{{window}}])) or vector(0))",
				Measures: "error ratio (failed inference requests, cancels left out)",
			},
			servingv1.MetricTimeToFirstToken: {
				// In milliseconds. For a decoupled (streaming) model it is the time
				// to the first response; otherwise the whole request.
				Value:    p95("nv_inference_first_response_histogram_ms") + " / 1000",
				Unit:     "s",
				Measures: "p95 time to first response",
				NoData: "Triton exports nv_inference_first_response_histogram_ms only when started with " +
					"--metrics-config histogram_latencies=true",
			},
			servingv1.MetricInterTokenLatency: {
				Unavailable: "Triton exports no inter-token latency metric (nv_inference_* are per request); " +
					"write a query instead, e.g. on your gateway's or the backend's own metrics, or use " +
					"EndToEndLatency or TimeToFirstToken",
			},
			servingv1.MetricEndToEndLatency: {
				// Triton's latencies are cumulative counters unless summaries are
				// turned on, and summaries do not add up over pods: so this is the
				// mean, not the p95.
				Value: "sum(rate(nv_inference_request_duration_us{{{selector}}}[{{window}}]))" +
					" / sum(rate(nv_inference_request_success{{{selector}}}[{{window}}])) / 1e6",
				Unit:     "s",
				Measures: "mean request duration",
			},
			servingv1.MetricQueueLength: {
				Value:    perPodMean("nv_inference_pending_request_count"),
				Measures: "mean pending requests per pod",
			},
		},
	},
}

// Unsupported says why an engine cannot measure a built-in check, and what to use
// instead; "" when it can. Admission can refuse such a check with this message.
func Unsupported(engine servingv1.EngineType, metric servingv1.AnalysisMetric) string {
	eq, ok := queries[engine]
	if !ok {
		return "unknown engine type " + string(engine)
	}
	b, ok := eq.Checks[metric]
	if !ok {
		return "unknown analysis metric " + string(metric)
	}
	return b.Unavailable
}

// BuiltinQuery is the PromQL of a built-in check for an engine, with the
// placeholders {{selector}} and {{window}} still in; "" when the engine cannot
// measure it (see Unsupported).
func BuiltinQuery(engine servingv1.EngineType, metric servingv1.AnalysisMetric) string {
	return queries[engine].Checks[metric].Value
}

// SamplesQuery is the PromQL that counts the samples of a check (the requests
// finished in the window) for an engine, with the placeholders still in. metric
// is "" for a user-written query.
func SamplesQuery(engine servingv1.EngineType, metric servingv1.AnalysisMetric) string {
	eq := queries[engine]
	if s := eq.Checks[metric].Samples; s != "" {
		return s
	}
	return eq.Finished
}

// Expand fills a query's placeholders for a set of pods and a window.
func Expand(query string, target Target, window time.Duration) string {
	return strings.NewReplacer(
		SelectorPlaceholder, target.Selector,
		WindowPlaceholder, promDuration(window),
	).Replace(query)
}

// promDuration writes a duration as PromQL does ("1m", "30s", "1m30s").
func promDuration(d time.Duration) string {
	return model.Duration(d).String()
}
