package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The binaries of a cluster, as hack/tools/build.sh cluster puts them in one folder.
const (
	etcdBinary                  = "etcd"
	kubeAPIServerBinary         = "kube-apiserver"
	kubeControllerManagerBinary = "kube-controller-manager"
	kubeSchedulerBinary         = "kube-scheduler"
	kwokBinary                  = "kwok"
)

// FindRepoRoot walks up from dir to the repository checkout: the first folder
// that holds hack/tools/build.sh.
func FindRepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "hack", "tools", "build.sh")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no hack/tools/build.sh in %s or any folder above it: run from the repository", dir)
		}
	}
}

// BuildBinaries runs `hack/tools/build.sh cluster` in repoRoot, which builds the
// control plane binaries and kwok from their pinned module versions (or reuses
// them from the cache outside the repository), and returns the folder holding
// them all. A cold build takes about 20 minutes on 2 cores; its progress goes to
// progress (nil: discarded).
func BuildBinaries(ctx context.Context, repoRoot string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "tools", "build.sh"), "cluster")
	cmd.Dir = repoRoot
	cmd.Stdout = &stdout
	cmd.Stderr = progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/tools/build.sh cluster: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if err := checkBinaries(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// checkBinaries reports a missing binary in dir.
func checkBinaries(dir string) error {
	var errs []error
	for _, b := range []string{etcdBinary, kubeAPIServerBinary, kubeControllerManagerBinary, kubeSchedulerBinary, kwokBinary} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			errs = append(errs, fmt.Errorf("binary %s: %w", b, err))
		}
	}
	return errors.Join(errs...)
}

// KwokStageDir returns the kustomize/stage folder of the kwok module whose version
// hack/tools/kwok pins (downloading the module if needed), where kwok ships its
// Stage configurations.
func KwokStageDir(ctx context.Context, repoRoot string) (string, error) {
	toolsDir := filepath.Join(repoRoot, "hack", "tools", "kwok")
	download := exec.CommandContext(ctx, "go", "mod", "download", "sigs.k8s.io/kwok")
	download.Dir = toolsDir
	if out, err := download.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go mod download sigs.k8s.io/kwok in %s: %w: %s", toolsDir, err, out)
	}
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok")
	list.Dir = toolsDir
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m sigs.k8s.io/kwok in %s: %w: %s", toolsDir, err, stderr.String())
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "kustomize", "stage")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("kwok stage folder: %w", err)
	}
	return dir, nil
}
