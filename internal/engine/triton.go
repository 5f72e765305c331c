package engine

import "strconv"

// triton is NVIDIA Triton Inference Server; the model folder is its model repository,
// and parallelism is set per model in the repository's config.pbtxt.
type triton struct{}

func (triton) DefaultImage() string  { return "nvcr.io/nvidia/tritonserver:25.01-py3" }
func (triton) DefaultPort() int32    { return 8000 }
func (triton) Command() []string     { return []string{"tritonserver"} }
func (triton) ReadinessPath() string { return "/v2/health/ready" }
func (triton) LivenessPath() string  { return "/v2/health/live" }

func (triton) Args(p Params) []string {
	return []string{
		"--model-repository=" + p.ModelPath,
		"--http-port=" + strconv.Itoa(int(p.Port)),
	}
}
