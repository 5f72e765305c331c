package main

import (
	"errors"
	"slices"
	"testing"
)

// The operator's command lines for a multi-node replica, as
// internal/engine/vllm.go writes them (LeaderCommand, WorkerCommand): this
// module cannot import the operator's, so they are copied here, and the
// real-node test (test/e2e, TestRealNodeMultiNode...) runs the operator's own.
const (
	leaderScript = `bash /vllm-workspace/examples/online_serving/multi-node-serving.sh leader --ray_cluster_size="$LWS_GROUP_SIZE" && exec python3 -m vllm.entrypoints.openai.api_server "$@"`
	workerScript = `exec bash /vllm-workspace/examples/online_serving/multi-node-serving.sh worker --ray_address="$LWS_LEADER_ADDRESS"`
)

func TestParseScriptRunsTheOperatorsCommandLines(t *testing.T) {
	env := map[string]string{"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "big-group-0.big-group.ns"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		name, script string
		params       []string
		want         [][]string
	}{
		{"leader", leaderScript, []string{"--model", "/models/m", "--served-model-name", "two words"}, [][]string{
			{"bash", "/vllm-workspace/examples/online_serving/multi-node-serving.sh", "leader", "--ray_cluster_size=2"},
			{"exec", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m", "--served-model-name", "two words"},
		}},
		{"leader without arguments: \"$@\" is no word", leaderScript, nil, [][]string{
			{"bash", "/vllm-workspace/examples/online_serving/multi-node-serving.sh", "leader", "--ray_cluster_size=2"},
			{"exec", "python3", "-m", "vllm.entrypoints.openai.api_server"},
		}},
		{"worker", workerScript, nil, [][]string{
			{"exec", "bash", "/vllm-workspace/examples/online_serving/multi-node-serving.sh", "worker", "--ray_address=big-group-0.big-group.ns"},
		}},
		{"quotes, escapes, an unset variable and $0", `echo 'a b' "c\"d" e\ f "$UNSET" $UNSET ${LWS_GROUP_SIZE}x $0`, nil, [][]string{
			{"echo", "a b", `c"d`, "e f", "", "2x", "vllm-leader"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseScript(tc.script, "vllm-leader", tc.params, getenv)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("parseScript(%q) =\n%q, want\n%q", tc.script, got, tc.want)
			}
		})
	}
}

func TestParseScriptRefusesWhatBashWouldRunOtherwise(t *testing.T) {
	for _, script := range []string{
		"a; b", "a | b", "a || b", "a > f", "echo $(id)", "echo `id`", "a &", "echo *", "X=1 a",
		`echo a"$@"`, "echo $@", "# comment", "(a)",
	} {
		if _, err := parseScript(script, "bash", nil, func(string) string { return "" }); !errors.Is(err, errUnsupported) {
			t.Errorf("parseScript(%q) = %v, want the stand-in's refusal", script, err)
		}
	}
	for _, script := range []string{`echo "open`, "echo 'open", "&& a"} {
		if _, err := parseScript(script, "bash", nil, func(string) string { return "" }); err == nil {
			t.Errorf("parseScript(%q) took a script bash refuses", script)
		}
	}
}
