package main

import (
	"slices"
	"testing"
)

func TestSimArgsDropOnlyTheListedFlags(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args, want []string
	}{
		{"the operator's arguments with adapters",
			[]string{"--model", "/models", "--served-model-name", "m", "--port", "8000", "--enable-lora", "--force-dummy-tokenizer"},
			[]string{"--model", "/models", "--served-model-name", "m", "--port", "8000", "--force-dummy-tokenizer"}},
		{"a flag with its value, as two arguments or one",
			[]string{"--max-lora-rank", "64", "--max-loras", "4", "--max-lora-rank=32"},
			[]string{"--max-loras", "4"}},
		{"an unknown flag goes on to the simulator, which refuses it as vLLM would",
			[]string{"--enable-lora", "--no-such-flag", "--max-model-len", "2"},
			[]string{"--no-such-flag", "--max-model-len", "2"}},
		{"a multi-node leader's arguments: the parallel layout goes",
			[]string{"--model", "/models", "--served-model-name", "m", "--port", "8000", "--tensor-parallel-size", "8",
				"--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray", "--force-dummy-tokenizer"},
			[]string{"--model", "/models", "--served-model-name", "m", "--port", "8000", "--force-dummy-tokenizer"}},
		{"a name that only starts like a listed flag stays",
			[]string{"--enable-lora-bias", "--max-lora-ranks", "1"},
			[]string{"--enable-lora-bias", "--max-lora-ranks", "1"}},
		{"nothing", nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := simArgs(tc.args); !slices.Equal(got, tc.want) {
				t.Errorf("simArgs(%q) = %q, want %q", tc.args, got, tc.want)
			}
		})
	}
}
