// Command fake-vllm is a stand-in, not vLLM: the entrypoint of the local
// cluster's engine image, where llm-d-inference-sim plays vLLM on CPU. The
// operator passes an engine the arguments real vLLM needs; a few of them the
// simulator (v0.10.2) does not know and exits on ("unknown flag"), though it
// serves what they turn on, or they only matter on GPUs. fake-vllm drops
// exactly those (simOmits) and replaces itself with the simulator (exec, same
// process), which gets every other argument: an unknown flag still fails
// there, as vLLM would refuse it, and the simulator's own failures and exit
// codes are the pod's.
//
// A replica that spans nodes runs other entry points of the vllm-openai
// image (internal/engine/vllm.go): bash, vLLM's multi-node-serving.sh, the
// ray CLI and python3 -m vllm.entrypoints.openai.api_server. The image holds
// /bin/bash, /bash, /ray and /python3 as links to fake-vllm, which plays the
// one it is called as (bash.go, raycluster.go, and python3 here): stand-ins
// for exactly those command lines, each refusing any other.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// simulator is the program fake-vllm runs, beside it in the image.
const simulator = "llm-d-inference-sim"

// simOmits are vLLM's flags that the simulator lacks, each with whether it
// takes a value. Only these are dropped:
//   - --enable-lora: vLLM serves adapters only with it, which the operator
//     passes whenever spec.adapters is set; the simulator serves adapters
//     always (/v1/load_lora_adapter, --max-loras).
//   - --max-lora-rank N: the largest adapter rank vLLM sizes its buffers for
//     (docs/adapters.md's example); the simulator reads no adapter weights.
//   - --tensor-parallel-size N, --pipeline-parallel-size N and
//     --distributed-executor-backend ray: how vLLM spreads the model over
//     GPUs and nodes (the operator passes them from spec.gpu); the simulator
//     is one process with no GPU.
var simOmits = map[string]bool{
	"--enable-lora":                  false,
	"--max-lora-rank":                true,
	"--tensor-parallel-size":         true,
	"--pipeline-parallel-size":       true,
	"--distributed-executor-backend": true,
}

// simArgs are args without the flags of simOmits (as --flag, --flag=value or
// --flag value), in order.
func simArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		name, _, withValue := strings.Cut(args[i], "=")
		takesValue, omitted := simOmits[name]
		switch {
		case !omitted:
			out = append(out, args[i])
		case takesValue && !withValue && i+1 < len(args):
			i++ // the flag's value, the next argument
		}
	}
	return out
}

// vllmServer is the module python3 -m runs for vLLM's OpenAI server.
const vllmServer = "vllm.entrypoints.openai.api_server"

func main() {
	switch filepath.Base(os.Args[0]) {
	case "bash":
		os.Exit(bashMain(os.Args[1:], os.Stdout, os.Stderr))
	case "ray":
		os.Exit(rayMain(os.Args[1:], os.Stdout, os.Stderr))
	case "python3":
		if len(os.Args) < 3 || os.Args[1] != "-m" || os.Args[2] != vllmServer {
			fmt.Fprintf(os.Stderr, "python3: fake-vllm's python3 stand-in runs only -m %s, not python3 %s\n", vllmServer, strings.Join(os.Args[1:], " "))
			os.Exit(2)
		}
		runSimulator(os.Args[3:])
	default:
		runSimulator(os.Args[1:])
	}
}

// runSimulator replaces this process with the simulator, given args without
// the flags it lacks.
func runSimulator(args []string) {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-vllm:", err)
		os.Exit(1)
	}
	path := filepath.Join(filepath.Dir(self), simulator)
	argv := append([]string{path}, simArgs(args)...)
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "fake-vllm: running %s: %v\n", path, err)
	os.Exit(1)
}
