/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AdapterSpec is one LoRA adapter served on top of the base model: clients ask
// for it by Name, as they ask for the base model by model.name.
type AdapterSpec struct {
	// Name is the adapter's served name, which requests name as their model.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$')",message="adapters[].name must be letters, digits, '.', '_' and '-', starting with a letter or digit, e.g. sql-lora"
	Name string `json:"name"`

	// Source is where the adapter's files are: any source the model takes
	// (s3, pvc or http), fetched verified and resumable like the model.
	Source ModelSource `json:"source"`

	// Revision is an optional version label: a new one fetches the adapter
	// again into a folder of its own and loads it in place of the old.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Revision string `json:"revision,omitempty"`

	// SHA256Manifest optionally names a file in the source, in `sha256sum`
	// format, that every downloaded file is checked against.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	SHA256Manifest string `json:"sha256Manifest,omitempty"`
}

// AdapterState is where one adapter stands on one replica.
// +kubebuilder:validation:Enum=Fetching;Loading;Loaded;Failed
type AdapterState string

// Adapter states.
const (
	// AdapterFetching: the adapter's files are being downloaded and verified.
	AdapterFetching AdapterState = "Fetching"
	// AdapterLoading: the files are verified and the engine is asked to load them.
	AdapterLoading AdapterState = "Loading"
	// AdapterLoaded: the engine serves the adapter.
	AdapterLoaded AdapterState = "Loaded"
	// AdapterFailed: the last attempt failed; see the failure for whether and
	// when it is tried again.
	AdapterFailed AdapterState = "Failed"
)

// AdapterStatus is what the operator observed of one adapter of spec.adapters.
type AdapterStatus struct {
	// Name is the adapter's served name.
	Name string `json:"name"`
	// ServingReplicas counts the ready replicas whose engine serves the adapter.
	ServingReplicas int32 `json:"servingReplicas"`
	// Pods are the ready pods whose engine serves the adapter (at most 32 listed).
	// +listType=atomic
	// +optional
	Pods []string `json:"pods,omitempty"`
	// LastFailure is the last failure to fetch or load the adapter on a
	// replica; it stays after a later success, as a record.
	// +optional
	LastFailure *AdapterFailure `json:"lastFailure,omitempty"`
}

// AdapterFailure is one replica's failure to fetch or load an adapter.
type AdapterFailure struct {
	// Reason is a stable PascalCase word: the loader's (SourceNotFound,
	// AccessDenied, ChecksumMismatch, ...) or EngineRefused.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Pod where it failed.
	Pod string `json:"pod,omitempty"`
	// Attempts made on that pod.
	Attempts int32 `json:"attempts,omitempty"`
	// Retrying is true while another attempt will follow (with the model's
	// back-off, up to loading.maxRetries).
	Retrying bool `json:"retrying"`
	// Time the failure was observed.
	Time metav1.Time `json:"time"`
}

// NamesCredentials is true when the source names a credentials Secret (S3
// keys, an HTTP bearer token).
func (s ModelSource) NamesCredentials() bool {
	return (s.S3 != nil && s.S3.CredentialsSecretRef != nil) || (s.HTTP != nil && s.HTTP.BearerTokenSecretRef != nil)
}

// SameCredentials is true when other names the same credentials as s: the
// same Secret and keys for a source of the same kind, or the same claim. The
// pods hold the model's credentials only, so an adapter's source is fetched
// with them only when it names them.
func (s ModelSource) SameCredentials(other ModelSource) bool {
	switch {
	case s.S3 != nil && other.S3 != nil:
		m, a := s.S3.CredentialsSecretRef, other.S3.CredentialsSecretRef
		return m != nil && a != nil && m.Name == a.Name && m.AccessKeyID() == a.AccessKeyID() && m.SecretAccessKey() == a.SecretAccessKey()
	case s.HTTP != nil && other.HTTP != nil:
		m, a := s.HTTP.BearerTokenSecretRef, other.HTTP.BearerTokenSecretRef
		return m != nil && a != nil && m.Name == a.Name && m.Key == a.Key
	case s.PVC != nil && other.PVC != nil:
		return s.PVC.ClaimName == other.PVC.ClaimName
	}
	return false
}

// AccessKeyID is the Secret key holding the access key ID, with its default.
func (r *S3CredentialsSecretRef) AccessKeyID() string {
	if r.AccessKeyIDKey != "" {
		return r.AccessKeyIDKey
	}
	return "AWS_ACCESS_KEY_ID"
}

// SecretAccessKey is the Secret key holding the secret access key, with its default.
func (r *S3CredentialsSecretRef) SecretAccessKey() string {
	if r.SecretAccessKeyKey != "" {
		return r.SecretAccessKeyKey
	}
	return "AWS_SECRET_ACCESS_KEY"
}
