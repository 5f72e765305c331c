package engine

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/warmup"
)

// triton is NVIDIA Triton Inference Server. The model folder is its model
// repository: the model source must hold one folder per Triton model
// (<name>/config.pbtxt and <name>/<version>/...), and clients name the model by
// that folder, not by spec.model.name. Tensor parallelism is set per model in its
// config.pbtxt, so gpu.count only sizes the GPU request.
//
// Checked against Triton server v2.54.0 (release 25.01, the version of
// DefaultImage; commit 8da6a4f8) and core r25.01:
//
//   - server src/command_line_parser.cc: --model-repository (alias
//     --model-store), --http-port (default 8000), --http-address (default
//     0.0.0.0, so not passed), --strict-readiness (default true), and the gRPC
//     (8001) and metrics (8002) ports it also opens.
//
//   - server src/http_server.cc: GET /v2/health/live and /v2/health/ready (200, or
//     400 when not live or ready). With strict readiness, ready means every model
//     in the repository is loaded (and warmed up when its config.pbtxt has
//     model_warmup, docs/user_guide/model_configuration.md "Model Warmup").
//
//   - core src/filesystem/implementations/local.h: the repository is scanned for
//     folders only, so the loader's marker file at its root is ignored.
//
//   - tritonserver serves no OpenAI-style completions (that is the separate,
//     beta python/openai frontend), and its generate extension
//     (/v2/models/<name>/generate) takes the inputs each model's config names.
//
//   - server build.py and docker/: the image's PATH has /opt/tritonserver/bin, and
//     its entrypoint (/opt/nvidia/nvidia_entrypoint.sh) prints banners and driver
//     and shared-memory checks before it execs its arguments; Command runs
//     tritonserver directly, without them.
type triton struct{}

func (triton) DefaultImage() string  { return "nvcr.io/nvidia/tritonserver:25.01-py3" }
func (triton) DefaultPort() int32    { return 8000 }
func (triton) Command() []string     { return []string{"tritonserver"} }
func (triton) ReadinessPath() string { return "/v2/health/ready" }
func (triton) LivenessPath() string  { return "/v2/health/live" }

// ReservedPorts: gRPC and metrics, which tritonserver opens besides HTTP.
func (triton) ReservedPorts() []int32 { return []int32{8001, 8002} }

// WarmupAPI: none. tritonserver serves no completions API, and Triton warms its
// models itself before /v2/health/ready (model_warmup in config.pbtxt).
func (triton) WarmupAPI() warmup.API { return "" }

func (triton) Args(p Params) []string {
	return []string{
		"--model-repository=" + p.ModelPath,
		"--http-port=" + strconv.Itoa(int(p.Port)),
	}
}

// AdapterLoading: none. Triton's vLLM backend reads adapters only from its
// model repository (multi_lora.json beside model.json); admission refuses
// spec.adapters for Triton.
func (triton) AdapterLoading() AdapterLoading { return AdaptersUnsupported }

func (triton) Env(Params) []corev1.EnvVar { return nil }

// MetricsPort: tritonserver serves /metrics on its own port.
func (triton) MetricsPort() int32 { return 8002 }

// Concurrency: Triton's batching is in each model's config.pbtxt, not in
// its arguments.
func (triton) Concurrency(servingv1.EngineSpec) int { return 0 }

// SignalMetrics: Triton's pending requests, per model; it exports no gauge of
// running requests nor of KV-cache use (a TensorRT-LLM backend's own metrics
// are the backend's, not Triton's).
func (triton) SignalMetrics(s servingv1.AutoscalingSignal) []string {
	if s == servingv1.SignalQueueDepth {
		return []string{"nv_inference_pending_request_count"}
	}
	return nil
}
