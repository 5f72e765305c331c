// Package testutil holds helpers shared by the integration and end-to-end tests:
// finding the real binaries they run, and checking the kstatus invariants of an
// AIInference's conditions.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// RepoRoot is the folder holding the project's go.mod.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the project's module")
	}
	return filepath.Dir(gomod), nil
}

// BuildTools runs hack/tools/build.sh for a group of binaries (envtest, cluster, s3,
// rclone) and returns the folder holding them; it builds only what the cache lacks.
func BuildTools(group string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, "hack", "tools", "build.sh"), group)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools/build.sh %s: %w", group, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// EnvtestAssets is KUBEBUILDER_ASSETS if set, else the folder build.sh fills.
func EnvtestAssets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	return BuildTools("envtest")
}

// Promtool is the path of promtool (Debian's prometheus package), installed by
// hack/tools/build.sh when missing.
func Promtool() (string, error) {
	dir, err := BuildTools("promtool")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "promtool"), nil
}

// NeedPromtool is the path of promtool for a test. Installing it (apt-get)
// needs root: where promtool is missing and this runs as another user, the test
// is skipped, saying so (make test prints the same at its end); as root a failed
// install fails the test.
func NeedPromtool(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("promtool"); err != nil && os.Geteuid() != 0 {
		t.Skip("skipped: promtool (Debian's prometheus package) is not installed, and installing it needs root; " +
			"as root, make test installs it (hack/tools/build.sh promtool)")
	}
	bin, err := Promtool()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var pascalCase = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// KstatusViolations lists how an AIInference's status breaks the kstatus rules the
// operator promises: Ready always present; Reconciling and Stalled only while True
// and never both; every condition with a PascalCase reason, a message and the
// object's generation once the status is current.
func KstatusViolations(obj *servingv1.AIInference) []string {
	var problems []string
	conds := obj.Status.Conditions
	if len(conds) == 0 {
		return nil // not reconciled yet
	}
	if meta.FindStatusCondition(conds, servingv1.ConditionReady) == nil {
		problems = append(problems, "Ready condition missing")
	}
	for _, t := range []string{servingv1.ConditionReconciling, servingv1.ConditionStalled} {
		if c := meta.FindStatusCondition(conds, t); c != nil && c.Status != metav1.ConditionTrue {
			problems = append(problems, fmt.Sprintf("%s present with status %s; kstatus wants it only while True", t, c.Status))
		}
	}
	if meta.IsStatusConditionTrue(conds, servingv1.ConditionReconciling) && meta.IsStatusConditionTrue(conds, servingv1.ConditionStalled) {
		problems = append(problems, "Reconciling and Stalled both True")
	}
	if meta.IsStatusConditionTrue(conds, servingv1.ConditionReady) && meta.IsStatusConditionTrue(conds, servingv1.ConditionStalled) {
		problems = append(problems, "Ready and Stalled both True")
	}
	for _, c := range conds {
		if !pascalCase.MatchString(c.Reason) {
			problems = append(problems, fmt.Sprintf("%s reason %q is not PascalCase", c.Type, c.Reason))
		}
		if c.Message == "" {
			problems = append(problems, fmt.Sprintf("%s has no message", c.Type))
		}
		if obj.Status.ObservedGeneration == obj.Generation && c.ObservedGeneration != obj.Generation {
			problems = append(problems, fmt.Sprintf("%s observedGeneration %d, object generation %d", c.Type, c.ObservedGeneration, obj.Generation))
		}
	}
	phase := obj.Status.Phase
	ready := meta.IsStatusConditionTrue(conds, servingv1.ConditionReady)
	if (phase == servingv1.PhaseReady) != ready {
		problems = append(problems, fmt.Sprintf("phase %s disagrees with Ready=%v", phase, ready))
	}
	if phase == servingv1.PhaseFailed && !meta.IsStatusConditionTrue(conds, servingv1.ConditionStalled) {
		problems = append(problems, "phase Failed without Stalled=True")
	}
	return problems
}
