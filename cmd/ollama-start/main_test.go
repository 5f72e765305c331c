package main

import (
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	t.Setenv("HOME", "/home/x")
	o, err := parseArgs([]string{"--model-dir", "/models/m", "--name", "m"})
	want := options{modelDir: "/models/m", name: "m", store: "/home/x/ollama", ollama: "/ollama", port: 11434, parallel: 4, contextLength: 4096}
	if err != nil || o != want {
		t.Errorf("parseArgs = %+v, %v, want %+v", o, err, want)
	}
	for args, wantErr := range map[string]string{
		"--name m":                                   "--model-dir and --name are required",
		"--model-dir /m --name m --port 0":           "--port 0",
		"--model-dir /m --name m --threads -1":       "--threads 0 or more",
		"--model-dir /m --name m serve":              "unexpected arguments",
		"--model-dir /m --name m --parallel 0":       "must be positive",
		"--model-dir /m --name m --context-length x": "invalid value",
	} {
		if _, err := parseArgs(strings.Fields(args)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("parseArgs(%s) = %v, want an error with %q", args, err, wantErr)
		}
	}
	t.Setenv("HOME", "")
	if _, err := parseArgs([]string{"--model-dir", "/m", "--name", "m"}); err == nil || !strings.Contains(err.Error(), "--store is required") {
		t.Errorf("without HOME: %v, want --store is required", err)
	}
}
