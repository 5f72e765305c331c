package engine

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/internal/warmup"
)

// ollama is Ollama (llama.cpp on CPU), serving the one GGUF file of the
// model folder.
//
// Checked against Ollama v0.9.6, the version its image is built from
// (hack/tools/build.sh ollama):
//   - Ollama serves only the models of its own store (OLLAMA_MODELS), so the
//     image's entrypoint is cmd/ollama-start: it registers the model folder's
//     GGUF in a store on the pod's writable volume (a link, not a copy),
//     then execs `ollama serve` with OLLAMA_HOST, OLLAMA_NUM_PARALLEL,
//     OLLAMA_CONTEXT_LENGTH and OLLAMA_KEEP_ALIVE=-1 set from its flags.
//   - server/routes.go: GET / answers 200 once the server listens (the model
//     loads on the first request, which the warm-up gate sends); the OpenAI
//     API is /v1/completions, /v1/chat/completions and /v1/models.
//   - It exports no Prometheus metrics.
//   - llama.cpp takes as many threads as the host has cores, not the
//     container's CPU limit; on a limit of 1 CPU with 2 threads, decode ran
//     80 times slower, so ollama-start sets num_thread from the limit.
type ollama struct{}

func (ollama) DefaultImage() string   { return version.OllamaImage() }
func (ollama) DefaultPort() int32     { return 11434 }
func (ollama) Command() []string      { return []string{"/ollama-start"} }
func (ollama) ReadinessPath() string  { return "/" }
func (ollama) LivenessPath() string   { return "/" }
func (ollama) ReservedPorts() []int32 { return nil }
func (ollama) MetricsPort() int32     { return 0 }

// WarmupAPI: POST /v1/completions, which loads the model.
func (ollama) WarmupAPI() warmup.API { return warmup.APIOpenAI }

// AdapterLoading: Ollama takes an adapter only into a model built with it.
func (ollama) AdapterLoading() AdapterLoading { return AdaptersUnsupported }

func (ollama) Args(p Params) []string {
	return []string{
		"--model-dir", p.ModelPath,
		"--name", p.ServedName,
		"--port", strconv.Itoa(int(p.Port)),
		"--parallel", strconv.Itoa(int(p.Ollama.Parallel)),
		"--context-length", strconv.Itoa(int(p.Ollama.ContextLength)),
		"--threads", strconv.Itoa(int(p.CPUs)),
	}
}

func (ollama) Env(Params) []corev1.EnvVar { return nil }

// Concurrency: its parallel slots.
func (ollama) Concurrency(spec servingv1.EngineSpec) int {
	return int(spec.OllamaSettings().Parallel)
}

// SignalMetrics: none; Ollama exports no /metrics.
func (ollama) SignalMetrics(servingv1.AutoscalingSignal) []string { return nil }
