/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package karmada holds Karmada's resource interpreter for AIInference
// (resourceinterpretercustomization.yaml: replicas and what each needs, a
// member's share, the status reflected from each member and aggregated on
// the control plane, health). Its tests run each Lua script in gopher-lua
// with a stand-in for Karmada's Lua VM (luavm_test.go) against the objects
// captured from the operator for Argo CD (integrations/argocd's testdata).
// docs/multicluster.md tells how to use it.
package karmada
