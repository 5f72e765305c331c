// Command fake-vllm is a stand-in, not vLLM: the entrypoint of the local
// cluster's engine image, where llm-d-inference-sim plays vLLM on CPU. The
// operator passes an engine the arguments real vLLM needs; a few of them the
// simulator (v0.10.2) does not know and exits on ("unknown flag"), though it
// serves what they turn on. fake-vllm drops exactly those (simOmits) and
// replaces itself with the simulator (exec, same process), which gets every
// other argument: an unknown flag still fails there, as vLLM would refuse it,
// and the simulator's own failures and exit codes are the pod's.
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
var simOmits = map[string]bool{
	"--enable-lora":   false,
	"--max-lora-rank": true,
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

func main() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-vllm:", err)
		os.Exit(1)
	}
	path := filepath.Join(filepath.Dir(self), simulator)
	argv := append([]string{path}, simArgs(os.Args[1:])...)
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "fake-vllm: running %s: %v\n", path, err)
	os.Exit(1)
}
