package engine

import (
	"slices"
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/internal/warmup"
)

// TestEngines pins each engine's command line, port and health paths. Each row
// was checked against the engine's source at the version of its default image;
// the comment above each engine's type (vllm.go, tgi.go, triton.go) names the
// files. Change a row only after checking the engine again.
func TestEngines(t *testing.T) {
	p := Params{ModelPath: "/models/model", ServedName: "llama", Port: 9001, TensorParallel: 4,
		Ollama: servingv1.OllamaSpec{Parallel: 4, ContextLength: 4096}, CPUs: 2}
	tests := []struct {
		engine      servingv1.EngineType
		image       string
		command     []string
		args        []string
		defaultPort int32
		reserved    []int32
		readiness   string
		liveness    string
		warmupAPI   warmup.API
	}{
		{
			// vLLM v0.11.0: docker/Dockerfile, vllm/engine/arg_utils.py,
			// vllm/entrypoints/openai/cli_args.py, vllm/entrypoints/openai/api_server.py.
			engine: servingv1.EngineVLLM, image: "vllm/vllm-openai:v0.11.0", command: nil,
			args:        []string{"--model", "/models/model", "--served-model-name", "llama", "--port", "9001", "--tensor-parallel-size", "4"},
			defaultPort: 8000, reserved: nil, readiness: "/health", liveness: "/health",
			warmupAPI: warmup.APIOpenAI,
		},
		{
			// text-generation-inference v3.3.4: Dockerfile, tgi-entrypoint.sh,
			// launcher/src/main.rs, router/src/server.rs.
			engine: servingv1.EngineTGI, image: "ghcr.io/huggingface/text-generation-inference:3.3.4", command: nil,
			args:        []string{"--model-id", "/models/model", "--hostname", "0.0.0.0", "--port", "9001", "--num-shard", "4"},
			defaultPort: 8080, reserved: []int32{9000}, readiness: "/health", liveness: "/health",
			warmupAPI: warmup.APITGI,
		},
		{
			// Triton server v2.54.0 (25.01): src/command_line_parser.cc,
			// src/http_server.cc, build.py; core r25.01 src/filesystem.
			engine: servingv1.EngineTriton, image: "nvcr.io/nvidia/tritonserver:25.01-py3", command: []string{"tritonserver"},
			args:        []string{"--model-repository=/models/model", "--http-port=9001"},
			defaultPort: 8000, reserved: []int32{8001, 8002}, readiness: "/v2/health/ready", liveness: "/v2/health/live",
			warmupAPI: "",
		},
		{
			// Ollama v0.9.6: server/routes.go, envconfig/config.go; the
			// entrypoint is cmd/ollama-start, which execs `ollama serve`.
			engine: servingv1.EngineOllama, image: "aiinference/ollama:" + version.Version, command: []string{"/ollama-start"},
			args: []string{"--model-dir", "/models/model", "--name", "llama", "--port", "9001",
				"--parallel", "4", "--context-length", "4096", "--threads", "2"},
			defaultPort: 11434, reserved: nil, readiness: "/", liveness: "/",
			warmupAPI: warmup.APIOpenAI,
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.engine), func(t *testing.T) {
			e, err := For(tt.engine)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.DefaultImage(); got != tt.image {
				t.Errorf("DefaultImage = %q, want %q", got, tt.image)
			}
			if got := e.Command(); !slices.Equal(got, tt.command) {
				t.Errorf("Command = %q, want %q", got, tt.command)
			}
			if got := e.Args(p); !slices.Equal(got, tt.args) {
				t.Errorf("Args = %q, want %q", got, tt.args)
			}
			if got := e.DefaultPort(); got != tt.defaultPort {
				t.Errorf("DefaultPort = %d, want %d", got, tt.defaultPort)
			}
			if got := e.ReservedPorts(); !slices.Equal(got, tt.reserved) {
				t.Errorf("ReservedPorts = %v, want %v", got, tt.reserved)
			}
			if slices.Contains(e.ReservedPorts(), e.DefaultPort()) {
				t.Errorf("the default port %d is one the engine reserves", e.DefaultPort())
			}
			if got := e.ReadinessPath(); got != tt.readiness {
				t.Errorf("ReadinessPath = %q, want %q", got, tt.readiness)
			}
			if got := e.LivenessPath(); got != tt.liveness {
				t.Errorf("LivenessPath = %q, want %q", got, tt.liveness)
			}
			if got := e.WarmupAPI(); got != tt.warmupAPI {
				t.Errorf("WarmupAPI = %q, want %q", got, tt.warmupAPI)
			}
			if slices.Contains(e.ReservedPorts(), warmup.Port) || e.DefaultPort() == warmup.Port {
				t.Errorf("the engine takes the warm-up gate's port %d", warmup.Port)
			}
		})
	}
	if _, err := For("SGLang"); err == nil {
		t.Error("For(unknown) returned no error")
	}
}

// The signals an engine exports no gauge for are the ones the CRD's rules
// refuse for it (the integration suite's TestInvalidSpecsAreRefusedWithAUsefulMessage).
func TestSignalsTheEnginesExport(t *testing.T) {
	refused := map[string]bool{"TGI KVCacheUtilization": true, "Triton KVCacheUtilization": true, "Triton RunningRequests": true}
	for _, e := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton} {
		eng, _ := For(e)
		for _, s := range []servingv1.AutoscalingSignal{servingv1.SignalQueueDepth, servingv1.SignalKVCacheUtilization, servingv1.SignalRunningRequests} {
			if none := len(eng.SignalMetrics(s)) == 0; none != refused[string(e)+" "+string(s)] {
				t.Errorf("%s %s: exports no gauge = %v, but admission refusing it = %v", e, s, none, refused[string(e)+" "+string(s)])
			}
		}
	}
}

func TestConcurrencyFromTheArguments(t *testing.T) {
	vllm, _ := For(servingv1.EngineVLLM)
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--max-num-seqs", "8"}, 8},
		{[]string{"--max-num-seqs=16", "--enforce-eager"}, 16},
		{[]string{"--max-num-seqs", "8", "--max-num-seqs", "32"}, 32},
		{[]string{"--max-num-seqs", "lots"}, 0},
		{[]string{"--max-num-seqs", "-3"}, 0},
		{[]string{"--max-num-seqs"}, 0},
	} {
		if got := vllm.Concurrency(servingv1.EngineSpec{Args: c.args}); got != c.want {
			t.Errorf("vLLM's concurrency of %q: %d, want %d", c.args, got, c.want)
		}
	}
}
