/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package flux holds an example Flux Kustomization whose healthCheckExprs
// tell Flux when an AIInference is ready (kustomization.yaml, also in
// docs/gitops.md). Its test evaluates the expressions with cel-go as Flux's
// kustomize-controller does (fluxcd/pkg runtime/cel: the same environment
// and order) against the objects captured from the operator for Argo CD
// (integrations/argocd's testdata).
package flux
