// Package nodecachespec is the contract between the node-local model cache's
// CSI plugin (internal/nodecache) and the operator and kubectl-aii: the driver's
// name, the volume attributes the operator sets on a pod's cache volume, the
// node labels and the report each node writes of the copies it holds.
package nodecachespec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// DriverName is the CSI driver's name: the pods' volumes and the CSIDriver
// object name it.
const DriverName = "model-cache.aiinference.io"

// Volume attributes the operator sets on a pod's cache volume.
const (
	// AttrSource is the loader's source (s3://BUCKET/PREFIX or an http(s) URL).
	AttrSource = "source"
	// AttrEndpoint is the S3 endpoint ("" for AWS).
	AttrEndpoint = "endpoint"
	// AttrSizeBytes is the model's expected size, for the node's budget.
	AttrSizeBytes = "sizeBytes"
)

// MaxAttrLength bounds the source and the endpoint a volume may name: as long
// as an AIInference's own (an http URL or s3.endpoint, 2048 bytes). Every copy
// of the node goes into one report, a ConfigMap of at most 1 MiB; a pod that
// names its volume directly must not be able to fill it alone.
const MaxAttrLength = 2048

// NodeLabelPrefix starts the node labels that say a node holds a complete copy
// of a model (the label's name is the copy's key).
const NodeLabelPrefix = "model-cache.aiinference.io/"

// NodeLabel is the label a node carries while it holds a complete copy of key.
func NodeLabel(key string) string { return NodeLabelPrefix + key }

// StateLabel marks the ConfigMaps that report a node's copies (one per node,
// in the plugin's namespace); its value is the node's name.
const StateLabel = "model-cache.aiinference.io/node"

// StateKey is the key of the report in a node's ConfigMap.
const StateKey = "models.json"

// Key identifies a copy: the namespace whose pods use it and the source it is
// a copy of. The namespace is part of it so that a pod of one namespace can
// never write into the copy another namespace's pods load (the folder is
// writable by the loaders that share it). The content (ETags, checksums) is
// the loader's to check on every start, against the store.
func Key(namespace, source, endpoint string) string {
	h := sha256.Sum256([]byte(namespace + "\x00" + source + "\x00" + endpoint))
	return hex.EncodeToString(h[:16])
}

// Entry is one copy on a node, as the node reports it.
type Entry struct {
	Key       string `json:"key"`
	Namespace string `json:"namespace"`
	Source    string `json:"source"`
	Endpoint  string `json:"endpoint,omitempty"`
	// Bytes is the copy's size on the node's disk.
	Bytes int64 `json:"bytes"`
	// Complete is true once a loader finished and verified the copy.
	Complete bool `json:"complete"`
	// LastUsed is when a pod last mounted or unmounted it (RFC 3339).
	LastUsed string `json:"lastUsed"`
	// Pods is how many pods have it mounted now.
	Pods int `json:"pods"`
}

// Report is a node's ConfigMap content.
type Report struct {
	Node        string  `json:"node"`
	BudgetBytes int64   `json:"budgetBytes"`
	UsedBytes   int64   `json:"usedBytes"`
	Entries     []Entry `json:"entries"`
	// Omitted counts the copies left out to keep the report within its bound
	// (idle copies, least recently used first).
	Omitted int `json:"omitted,omitempty"`
}

// ParseBudget reads a node's cache budget, a quantity of bytes above zero
// (for example 500Gi). A budget of zero or less would hold no copy, and every
// pod on the node would wait for room that never comes.
func ParseBudget(s string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return q, fmt.Errorf("%q is not a quantity of bytes (for example 500Gi): %w", s, err)
	}
	if q.Sign() <= 0 {
		return q, fmt.Errorf("%q holds no model: give a size above zero (for example 500Gi)", s)
	}
	return q, nil
}
