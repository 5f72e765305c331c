package testutil

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// TrafficCRDs are the manifests of the CRDs a canary's traffic children need:
// the Gateway API's HTTPRoute (standard channel) and the Inference Extension's
// InferencePool, read from the versions of their Go modules in go.mod.
func TrafficCRDs() ([]string, error) {
	gateway, err := moduleDir("sigs.k8s.io/gateway-api")
	if err != nil {
		return nil, err
	}
	inference, err := moduleDir("sigs.k8s.io/gateway-api-inference-extension")
	if err != nil {
		return nil, err
	}
	return []string{
		filepath.Join(gateway, "config", "crd", "standard", "gateway.networking.k8s.io_httproutes.yaml"),
		filepath.Join(inference, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
	}, nil
}

func moduleDir(module string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding module %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}
