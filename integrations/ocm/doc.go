/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package ocm holds an Open Cluster Management ManifestWork that runs an
// AIInference on a managed cluster and reports its status to the hub
// (manifestwork.yaml: JSONPaths feedback rules for the status's flat
// scalars, a CEL condition rule for Ready). Its tests read it into OCM's own
// types (open-cluster-management.io/api work/v1), evaluate each path with
// client-go's jsonpath as OCM's work agent does and the condition rule with
// cel-go as the agent does, against the objects captured from the operator
// for Argo CD (integrations/argocd's testdata). docs/multicluster.md tells
// how to use it.
package ocm
