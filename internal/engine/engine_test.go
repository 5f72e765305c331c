package engine

import (
	"slices"
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
)

func TestEngines(t *testing.T) {
	p := Params{ModelPath: "/models/model", ServedName: "llama", Port: 9000, TensorParallel: 4}
	tests := []struct {
		engine      servingv1.EngineType
		wantArgs    []string
		readiness   string
		defaultPort int32
	}{
		{servingv1.EngineVLLM, []string{"--model", "/models/model", "--served-model-name", "llama", "--port", "9000", "--tensor-parallel-size", "4"}, "/health", 8000},
		{servingv1.EngineTGI, []string{"--model-id", "/models/model", "--port", "9000", "--num-shard", "4"}, "/health", 8080},
		{servingv1.EngineTriton, []string{"--model-repository=/models/model", "--http-port=9000"}, "/v2/health/ready", 8000},
	}
	for _, tt := range tests {
		t.Run(string(tt.engine), func(t *testing.T) {
			e, err := For(tt.engine)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.Args(p); !slices.Equal(got, tt.wantArgs) {
				t.Errorf("Args = %q, want %q", got, tt.wantArgs)
			}
			if e.ReadinessPath() != tt.readiness {
				t.Errorf("ReadinessPath = %q, want %q", e.ReadinessPath(), tt.readiness)
			}
			if e.DefaultPort() != tt.defaultPort {
				t.Errorf("DefaultPort = %d, want %d", e.DefaultPort(), tt.defaultPort)
			}
			if e.DefaultImage() == "" || e.LivenessPath() == "" {
				t.Error("engine lacks a default image or liveness path")
			}
		})
	}
	if _, err := For("Ollama"); err == nil {
		t.Error("For(unknown) returned no error")
	}
}
