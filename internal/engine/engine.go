// Package engine holds what the operator knows about each model server: its
// default image and port, how it is told where the model is, and its health
// endpoints. One file per engine; the controller only sees the Engine interface.
package engine

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/warmup"
)

// Params are the facts an engine needs to build its command line.
type Params struct {
	// ModelPath is the folder holding the complete model inside the pod.
	ModelPath string
	// ServedName is the name clients ask for (the AIInference's model name).
	ServedName string
	// Port is the HTTP port to listen on.
	Port int32
	// TensorParallel is the number of GPUs to shard the model over on each
	// node (at least 1).
	TensorParallel int32
	// Nodes is the number of nodes one replica spans (at least 1); above 1
	// only for an engine that is a MultiNode.
	Nodes int32
	// Ollama is spec.engine.ollama with its defaults.
	Ollama servingv1.OllamaSpec
	// CPUs is the engine container's CPU limit in whole CPUs (at least 1),
	// 0 when it has none.
	CPUs int32
	// Adapters are the LoRA adapters of the spec; the engine is started able
	// to serve them (and, for an engine that takes them only at start, with
	// them).
	Adapters []Adapter
}

// Adapter is a LoRA adapter's served name and its folder in the pod.
type Adapter struct {
	Name, Path string
}

// AdapterLoading is how an engine takes LoRA adapters.
type AdapterLoading int

const (
	// AdaptersUnsupported: the engine cannot serve adapters (admission refuses them).
	AdaptersUnsupported AdapterLoading = iota
	// AdaptersAtStart: the adapters are part of the engine's start (its
	// environment), so a change of adapters is a rolling update.
	AdaptersAtStart
	// AdaptersAtRunTime: the adapter agent loads and unloads them in the
	// running engine.
	AdaptersAtRunTime
)

// Engine is one model server's knowledge.
type Engine interface {
	// DefaultImage is used unless the spec overrides it.
	DefaultImage() string
	// DefaultPort is used unless the spec overrides it.
	DefaultPort() int32
	// Command replaces the image's entrypoint; nil keeps it.
	Command() []string
	// Args are the arguments that point the engine at the model; user args follow.
	Args(p Params) []string
	// ReadinessPath answers 200 only when the engine can serve requests.
	ReadinessPath() string
	// LivenessPath answers 200 while the process is healthy, even if not ready.
	LivenessPath() string
	// ReservedPorts are the ports the engine opens besides its HTTP port, which
	// the HTTP port must not take.
	ReservedPorts() []int32
	// MetricsPort is the port of the engine's Prometheus /metrics when it is not
	// the HTTP port; 0 when /metrics is on the HTTP port.
	MetricsPort() int32
	// WarmupAPI is how the warm-up gate asks the engine for a completion; empty
	// when the engine has no completions API to ask.
	WarmupAPI() warmup.API
	// AdapterLoading is how the engine takes LoRA adapters.
	AdapterLoading() AdapterLoading
	// Env is the environment the engine needs beside the user's (which wins).
	Env(p Params) []corev1.EnvVar
	// SignalMetrics are the /metrics gauges that carry an autoscaling signal,
	// the first one exported wins; none when the engine exports no such gauge.
	SignalMetrics(s servingv1.AutoscalingSignal) []string
	// Concurrency is how many requests the engine runs at once as the
	// engine spec sets it; 0 when it does not say (the router then learns
	// it from the engine's readings).
	Concurrency(spec servingv1.EngineSpec) int
}

// flagInt is the value of a --name N or --name=N argument, the last one
// given winning as in the engines' own parsers; 0 when absent or not a
// positive number.
func flagInt(args []string, name string) int {
	n := 0
	for i, a := range args {
		v, ok := strings.CutPrefix(a, name+"=")
		if !ok && a == name && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if !ok {
			continue
		}
		if parsed, err := strconv.Atoi(v); err == nil && parsed > 0 {
			n = parsed
		} else {
			n = 0
		}
	}
	return n
}

var engines = map[servingv1.EngineType]Engine{
	servingv1.EngineVLLM:   vllm{},
	servingv1.EngineTGI:    tgi{},
	servingv1.EngineTriton: triton{},
	servingv1.EngineOllama: ollama{},
}

// For returns the engine of a type. Admission only lets known types through, so an
// unknown one is a programming error reported as such.
func For(t servingv1.EngineType) (Engine, error) {
	e, ok := engines[t]
	if !ok {
		return nil, fmt.Errorf("unknown engine type %q", t)
	}
	return e, nil
}

// MultiNode is an engine that can spread one replica over several nodes: a
// group's leader serves, its workers lend it their GPUs. Every member gets
// the LeaderWorkerSet controller's LWS_LEADER_ADDRESS and LWS_GROUP_SIZE.
type MultiNode interface {
	// LeaderCommand replaces the image's entrypoint on the leader; Args (for
	// Params.Nodes) and the user's arguments follow it.
	LeaderCommand() []string
	// WorkerCommand is a worker's whole command line: it joins the leader and
	// serves nothing itself, so it has no HTTP port and no probes.
	WorkerCommand() []string
}

// SpansNodes tells whether an engine type can spread one replica over nodes.
func SpansNodes(t servingv1.EngineType) bool {
	eng, err := For(t)
	if err != nil {
		return false
	}
	_, ok := eng.(MultiNode)
	return ok
}
