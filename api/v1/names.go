/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	"fmt"
	"regexp"
)

// The names an AIInference's children take from its own: the Service <name>
// (a DNS-1035 label: no dots, at most 63 characters, starting with a letter),
// the label value <name> on every child and pod (at most 63 characters), and
// with a canary rollout's Gateway traffic the Services <name>-stable and
// <name>-canary. A name that one of them cannot take would be admitted and then
// fail for ever, and a name cannot be changed, so admission refuses it: the CRD's
// CEL rules on AIInference (in both versions) say the same as NameProblem, and a
// test keeps the two in step.
const (
	// MaxNameLength is the longest name: a Service name and a label value.
	MaxNameLength = 63
	// MaxGatewayCanaryNameLength is the longest name with canary Gateway traffic,
	// whose Services add "-stable" and "-canary".
	MaxGatewayCanaryNameLength = MaxNameLength - len("-canary")
	// MaxMultiNodeNameLength is the longest name of a model whose replicas
	// span nodes: its LeaderWorkerSet <name>-group makes a StatefulSet
	// <name>-group-<replica> per replica, and a StatefulSet's name must leave
	// room in its pods' controller-revision-hash label (63 characters) for a
	// hash of 10 and its dash, so at most 52, with up to 9999 replicas.
	MaxMultiNodeNameLength = 52 - len("-group") - len("-9999")
)

var dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

// NameProblem says why name cannot work for an AIInference, given whether it
// asks for canary Gateway traffic (spec.rollout.canary.traffic) and whether
// its replicas span nodes (spec.gpu.nodes above 1); "" when it can.
func NameProblem(name string, gatewayCanary, spansNodes bool) string {
	switch {
	case !dns1035Label.MatchString(name):
		return fmt.Sprintf("metadata.name %q cannot be used: the model's Service takes this name, and a Service name is lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (no dots: write qwen2-5-7b for qwen2.5-7b)", name)
	case len(name) > MaxNameLength:
		return fmt.Sprintf("metadata.name has %d characters: at most %d fit, since the model's Service and the label on every pod take this name", len(name), MaxNameLength)
	case gatewayCanary && len(name) > MaxGatewayCanaryNameLength:
		return fmt.Sprintf("metadata.name has %d characters: with rollout.canary.traffic at most %d fit, since the Services <name>-stable and <name>-canary take it", len(name), MaxGatewayCanaryNameLength)
	case spansNodes && len(name) > MaxMultiNodeNameLength:
		return fmt.Sprintf("metadata.name has %d characters: with gpu.nodes above 1 at most %d fit, since the LeaderWorkerSet <name>-group and its StatefulSets <name>-group-<replica> take it", len(name), MaxMultiNodeNameLength)
	}
	return ""
}

// NameProblem says why the object's name cannot work with its spec; "" when it can.
func (in *AIInference) NameProblem() string {
	gatewayCanary := in.Spec.Rollout != nil && in.Spec.Rollout.Canary != nil && in.Spec.Rollout.Canary.Traffic != nil
	return NameProblem(in.Name, gatewayCanary, in.SpansNodes())
}

// The children's names: deterministic, so that a restarted operator finds what
// it made and kubectl aii looks at the same objects.

// ServiceName names the model's Service, and the Deployment of its (stable) pods.
func (in *AIInference) ServiceName() string { return in.Name }

// GroupSetName names the LeaderWorkerSet of a model whose replicas span
// nodes: its groups' pods are <name>-group-<replica> (the leader) and
// <name>-group-<replica>-<worker>. (Not <name>: the LeaderWorkerSet
// controller would take the model's Service of that name for the headless
// one its pods' DNS names need.)
func (in *AIInference) GroupSetName() string { return in.Name + "-group" }

// GroupPodGroupName names the PodGroup of group index of the LeaderWorkerSet
// groupSet, which the scheduler places all or nothing (docs/multinode.md):
// the name of the group's leader pod.
func GroupPodGroupName(groupSet, index string) string { return groupSet + "-" + index }

// LoaderConfigMapName names the loader's configuration of the (stable) pods.
func (in *AIInference) LoaderConfigMapName() string { return in.Name + "-loader" }

// CanaryName names a canary rollout's Deployment.
func (in *AIInference) CanaryName() string { return in.Name + "-canary" }

// CanaryLoaderConfigMapName names the loader's configuration of the canary's pods.
func (in *AIInference) CanaryLoaderConfigMapName() string { return in.Name + "-canary-loader" }

// CachePVCName names the cache claim the operator makes (spec.cache.type PVC
// without a claimName).
func (in *AIInference) CachePVCName() string { return in.Name + "-model-cache" }

// StableBackendName and CanaryBackendName name the backends of canary Gateway
// traffic (Services or InferencePools); HTTPRouteName its route.
func (in *AIInference) StableBackendName() string { return in.Name + "-stable" }
func (in *AIInference) CanaryBackendName() string { return in.Name + "-canary" }
func (in *AIInference) HTTPRouteName() string     { return in.Name }

// IngressPolicyName and EgressPolicyName name the model pods' NetworkPolicies.
func (in *AIInference) IngressPolicyName() string { return in.Name + "-ingress" }
func (in *AIInference) EgressPolicyName() string  { return in.Name + "-egress" }

// ActivatorSliceName names the EndpointSlice that leads the model's Service to
// the activator while the model is at zero.
func (in *AIInference) ActivatorSliceName() string { return in.Name + "-activator" }
