/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	networkingv1 "k8s.io/api/networking/v1"
)

// NetworkPolicySpec asks the operator to write NetworkPolicies for the model's
// pods: who may call the engine, and where the pods may connect.
type NetworkPolicySpec struct {
	// Enabled writes the NetworkPolicies; off by default, so that a cluster's
	// traffic does not change unless asked.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// From are the peers that may call the engine's port (namespaces, pod
	// labels, a gateway's pods). The operator's own pods (its autoscaler reads
	// /metrics, its activator passes held requests on) are always allowed.
	// Empty: only the operator.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	From []networkingv1.NetworkPolicyPeer `json:"from,omitempty"`
}
