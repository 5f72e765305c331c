package engine

import "strconv"

// vllm is vLLM's OpenAI-compatible server.
type vllm struct{}

func (vllm) DefaultImage() string  { return "vllm/vllm-openai:v0.11.0" }
func (vllm) DefaultPort() int32    { return 8000 }
func (vllm) Command() []string     { return nil }
func (vllm) ReadinessPath() string { return "/health" }
func (vllm) LivenessPath() string  { return "/health" }

func (vllm) Args(p Params) []string {
	return []string{
		"--model", p.ModelPath,
		"--served-model-name", p.ServedName,
		"--port", strconv.Itoa(int(p.Port)),
		"--tensor-parallel-size", strconv.Itoa(int(p.TensorParallel)),
	}
}
