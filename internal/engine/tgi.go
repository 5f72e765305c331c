package engine

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/warmup"
)

// tgi is Hugging Face's Text Generation Inference.
//
// Checked against text-generation-inference v3.3.4 (the version of DefaultImage):
//   - Dockerfile: the image's entrypoint, /tgi-entrypoint.sh, execs
//     `text-generation-launcher "$@"`, so Args are the launcher's flags and
//     Command stays nil. The image sets PORT=80, which --port overrides.
//   - launcher/src/main.rs: --model-id (a hub id or a local folder), --num-shard,
//     --port, --hostname, --prometheus-port (default 9000). Every flag also reads
//     an environment variable of its name, and --hostname reads HOSTNAME, which
//     the container runtime sets to the pod's name: the launcher would pass that
//     name to the router, and router/src/server.rs only falls back to 0.0.0.0
//     (with a warning) because a name does not parse as an IP address. The
//     operator passes --hostname 0.0.0.0, so the engine listens on every address
//     (the pod IP for the probes and the Service, 127.0.0.1 for the warm-up gate)
//     whatever the environment says.
//   - router/src/server.rs: GET /health (200, or 503 when the shards are
//     unhealthy), POST /generate, POST /v1/completions; the router only starts
//     once every shard has loaded the model.
type tgi struct{}

func (tgi) DefaultImage() string  { return "ghcr.io/huggingface/text-generation-inference:3.3.4" }
func (tgi) DefaultPort() int32    { return 8080 }
func (tgi) Command() []string     { return nil }
func (tgi) ReadinessPath() string { return "/health" }
func (tgi) LivenessPath() string  { return "/health" }

// ReservedPorts: the router's Prometheus endpoint (--prometheus-port).
func (tgi) ReservedPorts() []int32 { return []int32{9000} }

// WarmupAPI: POST /generate (router/src/server.rs).
func (tgi) WarmupAPI() warmup.API { return warmup.APITGI }

func (tgi) Args(p Params) []string {
	return []string{
		"--model-id", p.ModelPath,
		"--hostname", "0.0.0.0",
		"--port", strconv.Itoa(int(p.Port)),
		"--num-shard", strconv.Itoa(int(p.TensorParallel)),
	}
}

// AdapterLoading: at start. launcher/src/main.rs reads LORA_ADAPTERS, a
// comma-separated list of adapter ids or name=path pairs for local folders,
// and loads them with the model; TGI has no API to load one later.
func (tgi) AdapterLoading() AdapterLoading { return AdaptersAtStart }

func (tgi) Env(p Params) []corev1.EnvVar {
	if len(p.Adapters) == 0 {
		return nil
	}
	list := make([]string, 0, len(p.Adapters))
	for _, a := range p.Adapters {
		list = append(list, a.Name+"="+a.Path)
	}
	return []corev1.EnvVar{{Name: "LORA_ADAPTERS", Value: strings.Join(list, ",")}}
}

// MetricsPort: the router serves /metrics on its HTTP port too.
func (tgi) MetricsPort() int32 { return 0 }

// Concurrency: TGI batches by a token budget (--max-batch-total-tokens),
// not by a count of requests.
func (tgi) Concurrency(servingv1.EngineSpec) int { return 0 }

// SignalMetrics: the router's queue and the size of the batch it runs; TGI
// exports no KV-cache utilisation.
func (tgi) SignalMetrics(s servingv1.AutoscalingSignal) []string {
	return map[servingv1.AutoscalingSignal][]string{
		servingv1.SignalQueueDepth:      {"tgi_queue_size"},
		servingv1.SignalRunningRequests: {"tgi_batch_current_size"},
	}[s]
}
