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

	// Priority of the model's requests when its replicas are saturated (each
	// has a queue in its engine or a nearly full KV cache): Critical requests
	// are released first from the router's queues, Standard next, and
	// Sheddable ones are not queued but answered 429 with Retry-After at
	// once. A request may ask for another priority only through one of the
	// Objectives below. Default Standard.
	// +optional
	Priority RequestPriority `json:"priority,omitempty"`

	// Objectives a client may name in the request header
	// x-gateway-inference-objective (the Gateway API Inference Extension's),
	// each with its priority: for example "batch" as Sheddable and
	// "interactive" as Critical. A request that names no objective has
	// Priority; one that names an objective not listed here is refused (400).
	// No header can give a priority the spec does not list.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Objectives []RoutingObjective `json:"objectives,omitempty"`

	// TenantHeader names the request header whose value is the client's
	// tenant: while the replicas are saturated, each tenant's requests wait
	// in a queue of their own and the queues are served in turn, so a tenant
	// that floods the model delays its own requests, not the others'.
	// Default: none, and a client's tenant is its pod's namespace (every
	// client outside the cluster, behind one gateway, is then one tenant).
	// Set it only where the clients cannot set it falsely (a gateway that
	// writes it), since a client that varies it takes several shares.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9]*$`
	TenantHeader string `json:"tenantHeader,omitempty"`
}

// RequestPriority orders a model's requests under overload.
// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
type RequestPriority string

// Request priorities, highest first.
const (
	PriorityCritical  RequestPriority = "Critical"
	PriorityStandard  RequestPriority = "Standard"
	PrioritySheddable RequestPriority = "Sheddable"
)

// RoutingObjective is a priority a client may ask for by name.
type RoutingObjective struct {
	// Name is the value of the header x-gateway-inference-objective that
	// selects this objective.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Priority of the requests that name it.
	Priority RequestPriority `json:"priority"`
}

// ObjectiveHeader is the request header that names a RoutingObjective, as
// the Gateway API Inference Extension names an InferenceObjective.
const ObjectiveHeader = "X-Gateway-Inference-Objective"

// RequestPriority is the priority of a request that names objective (""
// for none); ok is false when the spec lists no such objective.
func (in *AIInference) RequestPriority(objective string) (p RequestPriority, ok bool) {
	r := in.Spec.Routing
	if objective == "" {
		if r == nil || r.Priority == "" {
			return PriorityStandard, true
		}
		return r.Priority, true
	}
	if r != nil {
		for _, o := range r.Objectives {
			if o.Name == objective {
				return o.Priority, true
			}
		}
	}
	return "", false
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
