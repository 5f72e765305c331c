/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

// RoutingSpec says whether the model's requests go through the operator's
// router, which sends each one to the replica that serves it fastest.
type RoutingSpec struct {
	// Enabled sends the requests for the model's Service (and the namespace's
	// OpenAI address, Service aiinference-openai) through the router: a
	// request goes to the ready replica that holds the longest prefix of its
	// prompt in its KV cache, unless that replica is past its load bound, and
	// otherwise to the least loaded one. Clients keep calling the same
	// address. Off by default: turning it on moves the model's data path to
	// the router's pods, which are installed apart (config/router, the chart's
	// router.enabled), and an upgrade of the operator must not move a model's
	// traffic by itself. docs/routing.md gives the figures against round robin.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
}

// RoutingEnabled is true when the model's requests go through the router.
func (in *AIInference) RoutingEnabled() bool {
	return in.Spec.Routing != nil && in.Spec.Routing.Enabled
}

// RouterPodName is the app.kubernetes.io/name label of the router's pods
// (config/router, the chart's router.enabled): the routed models'
// NetworkPolicies let them in, and `kubectl aii status` reads their metrics.
const RouterPodName = "aiinference-router"

// RouterSliceName is the EndpointSlice of a routed model's Service, which
// lists the router's ready pods.
func RouterSliceName(model string) string { return model + "-router" }
