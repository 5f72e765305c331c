/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package argocd holds Argo CD's health check and resource actions for
// AIInference, in the layout of Argo CD's resource_customizations
// (resource_customizations/serving.aiinference.io/AIInference), and builds
// from them the argocd-cm snippet that installs them into a running Argo CD
// (Snippet; `make argocd-cm` writes it). Its tests run every case of
// health_test.yaml and action_test.yaml in gopher-lua with Argo CD's sandbox,
// against objects captured from the operator (capture_test.go, CAPTURE=1).
// docs/gitops.md tells how to use them.
package argocd
