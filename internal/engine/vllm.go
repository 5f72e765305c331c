package engine

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/warmup"
)

// vllm is vLLM's OpenAI-compatible server.
//
// Checked against vLLM v0.11.0 (commit b8b302cd, the version of DefaultImage):
//   - docker/Dockerfile: the vllm-openai image's entrypoint is
//     `python3 -m vllm.entrypoints.openai.api_server`, so Args are its flags and
//     Command stays nil.
//   - vllm/engine/arg_utils.py: --model, --served-model-name (one or more names),
//     --tensor-parallel-size (alias -tp).
//   - vllm/entrypoints/openai/cli_args.py: --port (default 8000), --host (default
//     None, which run_server in api_server.py binds as "", every address: the
//     kubelet's probes on the pod IP and the warm-up gate on 127.0.0.1 both reach
//     it, so no --host is passed).
//   - vllm/entrypoints/openai/api_server.py: GET /health answers 200 once the
//     server listens (after the engine is built) and 503 once the engine died;
//     GET /v1/models, POST /v1/completions.
type vllm struct{}

func (vllm) DefaultImage() string  { return "vllm/vllm-openai:v0.11.0" }
func (vllm) DefaultPort() int32    { return 8000 }
func (vllm) Command() []string     { return nil }
func (vllm) ReadinessPath() string { return "/health" }
func (vllm) LivenessPath() string  { return "/health" }

// ReservedPorts: metrics are served on the HTTP port (/metrics).
func (vllm) ReservedPorts() []int32 { return nil }

// WarmupAPI: POST /v1/completions (api_server.py).
func (vllm) WarmupAPI() warmup.API { return warmup.APIOpenAI }

// Args pass --tensor-parallel-size only above its default of 1, so that a server
// that speaks vLLM's API without sharding (the local cluster's simulator) starts
// with the arguments of a one-GPU replica.
func (vllm) Args(p Params) []string {
	args := []string{
		"--model", p.ModelPath,
		"--served-model-name", p.ServedName,
		"--port", strconv.Itoa(int(p.Port)),
	}
	if p.TensorParallel > 1 {
		args = append(args, "--tensor-parallel-size", strconv.Itoa(int(p.TensorParallel)))
	}
	if p.Nodes > 1 {
		// docs/serving/parallelism_scaling.md: the GPUs of a node in tensor
		// parallel, the nodes in pipeline parallel, over a Ray cluster.
		args = append(args, "--pipeline-parallel-size", strconv.Itoa(int(p.Nodes)), "--distributed-executor-backend", "ray")
	}
	if len(p.Adapters) > 0 {
		// Only whether there are adapters is in the arguments: which ones is
		// the adapter agent's, so that a change rolls no pod.
		args = append(args, "--enable-lora")
	}
	return args
}

// vllmMultiNodeScript is the helper the vllm-openai image carries for a Ray
// cluster over several nodes (examples/online_serving/multi-node-serving.sh,
// at /vllm-workspace in the image), which vLLM's docs
// (docs/deployment/frameworks/lws.md) run under LeaderWorkerSet: `leader`
// starts Ray's head on port 6379 and returns once --ray_cluster_size nodes
// have joined; `worker` joins the head at --ray_address and blocks.
const vllmMultiNodeScript = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"

// LeaderCommand starts Ray's head, waits for the group's workers, then runs
// the OpenAI server with Args and the user's arguments ("$@"), as the image's
// entrypoint would.
func (vllm) LeaderCommand() []string {
	return []string{"/bin/bash", "-c",
		`bash ` + vllmMultiNodeScript + ` leader --ray_cluster_size="$LWS_GROUP_SIZE" && exec python3 -m vllm.entrypoints.openai.api_server "$@"`,
		"vllm-leader"}
}

// WorkerCommand joins the leader's Ray cluster.
func (vllm) WorkerCommand() []string {
	return []string{"/bin/bash", "-c", `exec bash ` + vllmMultiNodeScript + ` worker --ray_address="$LWS_LEADER_ADDRESS"`}
}

// AdapterLoading: at run time, through POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter, which vllm/entrypoints/openai/api_server.py serves
// only with VLLM_ALLOW_RUNTIME_LORA_UPDATING set (vllm/envs.py reads "true" or
// "1", case-insensitive).
func (vllm) AdapterLoading() AdapterLoading { return AdaptersAtRunTime }

func (vllm) Env(p Params) []corev1.EnvVar {
	if len(p.Adapters) == 0 {
		return nil
	}
	return []corev1.EnvVar{{Name: "VLLM_ALLOW_RUNTIME_LORA_UPDATING", Value: "True"}}
}

// MetricsPort: /metrics is on the HTTP port.
func (vllm) MetricsPort() int32 { return 0 }

// Concurrency: --max-num-seqs bounds the sequences in a batch; its default
// depends on the GPU and vLLM's version, so without it the router learns.
func (vllm) Concurrency(spec servingv1.EngineSpec) int { return flagInt(spec.Args, "--max-num-seqs") }

// SignalMetrics: vllm:kv_cache_usage_perc is a fraction (0-1) despite its
// name; before vLLM 0.10 it was vllm:gpu_cache_usage_perc.
func (vllm) SignalMetrics(s servingv1.AutoscalingSignal) []string {
	return map[servingv1.AutoscalingSignal][]string{
		servingv1.SignalQueueDepth:         {"vllm:num_requests_waiting"},
		servingv1.SignalRunningRequests:    {"vllm:num_requests_running"},
		servingv1.SignalKVCacheUtilization: {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
	}[s]
}
