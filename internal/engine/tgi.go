package engine

import "strconv"

// tgi is Hugging Face's Text Generation Inference.
type tgi struct{}

func (tgi) DefaultImage() string  { return "ghcr.io/huggingface/text-generation-inference:3.3.4" }
func (tgi) DefaultPort() int32    { return 8080 }
func (tgi) Command() []string     { return nil }
func (tgi) ReadinessPath() string { return "/health" }
func (tgi) LivenessPath() string  { return "/health" }

func (tgi) Args(p Params) []string {
	return []string{
		"--model-id", p.ModelPath,
		"--port", strconv.Itoa(int(p.Port)),
		"--num-shard", strconv.Itoa(int(p.TensorParallel)),
	}
}
