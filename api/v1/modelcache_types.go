/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

// MaxModelCacheNodes is how many nodes status.modelCache lists; the copies of
// further nodes are counted in NodesNotListed.
const MaxModelCacheNodes = 100

// ModelCacheStatus is where the node-local model cache (cache.type Node) holds
// copies of this model, as the nodes' cache plugins report them. It holds no
// last-use time: that changes on every pod mount, and `kubectl aii status`
// reads it from the nodes' reports instead.
type ModelCacheStatus struct {
	// Key identifies this model's copies on the nodes: a node that holds a
	// complete copy carries the label model-cache.aiinference.io/<key>.
	Key string `json:"key"`

	// Nodes are the nodes that hold a copy, complete or in progress, sorted by
	// name; when more nodes hold one than fit, complete copies are kept first.
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=100
	// +optional
	Nodes []NodeModelCopy `json:"nodes,omitempty"`

	// NodesNotListed counts the nodes holding a copy that Nodes has no room for.
	// +optional
	NodesNotListed int32 `json:"nodesNotListed,omitempty"`

	// CompleteNodes counts the nodes that hold a complete copy, listed or not.
	CompleteNodes int32 `json:"completeNodes"`
}

// NodeModelCopy is one node's copy of the model.
type NodeModelCopy struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Complete is true once a loader finished and verified the copy.
	Complete bool `json:"complete"`
	// Bytes is a complete copy's size on the node's disk; 0 while the copy is
	// in progress (it grows with every report, which would rewrite the status
	// each time; `kubectl aii status` shows it from the node's report).
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// Pods is how many pods have the copy mounted.
	Pods int32 `json:"pods"`
}
