/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import corev1 "k8s.io/api/core/v1"

// DefaultHuggingFaceEndpoint is the Hub's address.
const DefaultHuggingFaceEndpoint = "https://huggingface.co"

// HuggingFaceSource is a model repository on the Hugging Face Hub (or a mirror of
// its API).
type HuggingFaceSource struct {
	// Repository is the model's repository, "organisation/name" (e.g.
	// "Qwen/Qwen2.5-0.5B-Instruct").
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$') && !self.contains('..')",message="huggingface.repository must be organisation/name as on the Hub, e.g. Qwen/Qwen2.5-0.5B-Instruct: letters, digits, '.', '_' and '-', one '/', no '..'"
	Repository string `json:"repository"`

	// Revision is a branch, tag or commit; "main" when unset. The commit it
	// resolves to is recorded in status.source.revision, and every replica
	// loads that commit.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="!self.contains('..') && !self.startsWith('/') && !self.contains(' ')",message="huggingface.revision must be a branch, tag or commit name without spaces or '..', e.g. main or v1.0"
	// +optional
	Revision string `json:"revision,omitempty"`

	// Include are glob patterns of the files to fetch (path.Match, against the
	// path in the repository; a pattern without '/' also matches the base name).
	// Unset: *.safetensors, *.json, *.model, *.txt, *.tiktoken and *.jinja (the
	// weights, the tokenizer and the configuration; not duplicate .bin weights).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	// +optional
	Include []string `json:"include,omitempty"`

	// Exclude are glob patterns of files to leave out, applied after include.
	// Unset: original/* and consolidated* (a repository's original checkpoint
	// and consolidated copies of the weights).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	// +optional
	Exclude []string `json:"exclude,omitempty"`

	// TokenSecretRef names a Secret key holding a Hub access token, needed for
	// gated and private repositories.
	// +optional
	TokenSecretRef *corev1.SecretKeySelector `json:"tokenSecretRef,omitempty"`

	// Endpoint overrides the Hub's address, for a mirror that serves the Hub's
	// API (as HF_ENDPOINT does for huggingface_hub).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="huggingface.endpoint must be an http:// or https:// URL, e.g. https://hf-mirror.example.com"
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
}

// OCIMode is how a model in an OCI registry reaches the pods.
// +kubebuilder:validation:Enum=Auto;Loader;ImageVolume
type OCIMode string

const (
	// OCIModeAuto picks ImageVolume where the cluster serves image volumes
	// (Kubernetes v1.35 and later, where the feature is on by default), and
	// Loader elsewhere.
	OCIModeAuto OCIMode = "Auto"
	// OCIModeLoader: the model loader pulls the layers into the cache volume,
	// digest-verified, in parallel ranges and resumable; any node, any cache type.
	OCIModeLoader OCIMode = "Loader"
	// OCIModeImageVolume: the engine mounts the artifact as an image volume; the
	// node's container runtime pulls and keeps it, and no loader runs.
	OCIModeImageVolume OCIMode = "ImageVolume"
)

// OCISource is a model stored as an OCI artifact or image in a registry.
type OCISource struct {
	// Reference is the artifact, by tag or digest: registry/repository:tag or
	// registry/repository@sha256:... The digest it resolves to is recorded in
	// status.source.digest.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?/[a-z0-9]+([._/-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|@sha256:[a-f0-9]{64})$')",message="oci.reference must be registry/repository with a :tag or @sha256:digest, e.g. registry.example.com/models/qwen:v1 (lower-case repository, the registry host first)"
	Reference string `json:"reference"`

	// Mode is Loader (the model loader pulls the layers), ImageVolume (the node's
	// runtime pulls and mounts it) or Auto (ImageVolume where the cluster serves
	// it). Auto when unset; status.source.mode says which was chosen.
	// +kubebuilder:default=Auto
	// +optional
	Mode OCIMode `json:"mode,omitempty"`

	// PlainHTTP talks to the registry over plain HTTP, for a registry inside the
	// cluster without TLS (loader mode; for image volumes, the node's runtime
	// must be told of such a registry in its own configuration).
	// +optional
	PlainHTTP bool `json:"plainHTTP,omitempty"`
}

// SourceStatus is what the model's source resolved to.
type SourceStatus struct {
	// Revision is the Hugging Face commit the revision resolved to.
	// +optional
	Revision string `json:"revision,omitempty"`
	// Digest is the OCI manifest digest the reference resolved to.
	// +optional
	Digest string `json:"digest,omitempty"`
	// Mode is how an OCI model reaches the pods: Loader or ImageVolume.
	// +optional
	Mode OCIMode `json:"mode,omitempty"`
	// For identifies the source spec this was resolved for; a changed source is
	// resolved again.
	// +optional
	For string `json:"for,omitempty"`
}
