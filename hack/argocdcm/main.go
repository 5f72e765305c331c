/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

// Command argocdcm writes the argocd-cm snippet (Argo CD's health check and
// actions for AIInference) from integrations/argocd's resource_customizations
// into integrations/argocd/argocd-cm.yaml and the chart's files/argocd-cm.yaml.
// Run from the repository root (make argocd-cm); a test fails when either is stale.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/aiinference/operator/integrations/argocd"
)

// Outputs are the files the snippet is written to, from the repository root.
var Outputs = []string{
	"integrations/argocd/argocd-cm.yaml",
	"charts/aiinference-operator/files/argocd-cm.yaml",
}

func main() {
	snippet, err := argocd.Snippet(filepath.Join("integrations", "argocd", argocd.CustomizationDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, out := range Outputs {
		if err := os.WriteFile(out, snippet, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("wrote", out)
	}
}
