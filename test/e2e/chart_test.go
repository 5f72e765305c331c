package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
)

// TestChartInstallsAndItsPermissionsServe renders the Helm chart (helm v4 from
// the tool cache), creates every object it renders on the local cluster (the API
// server accepts them all, RBAC escalation checks included), then runs the
// operator binary as the chart's ServiceAccount, with a token and nothing else:
// with exactly the chart's permissions, a sample reaches Ready. On the solo
// cluster: the chart's operator is cluster-wide, and the only one there.
func TestChartInstallsAndItsPermissionsServe(t *testing.T) {
	e := soloCluster.own(t)
	g := NewWithT(t)
	release, workloads := e.newNamespace(t), e.newNamespace(t)
	// The suite installed the CRD; webhooks would need the operator's pod to
	// serve, which a simulated node does not run.
	created := e.createChart(t, g, release, nil, "crds.install=false", "webhook.enabled=false", "replicas=0")
	t.Logf("the API server accepted the chart's %d objects", len(created))

	charted, took := e.serveAsChart(t, g, "chart", release, workloads, "charted")
	t.Logf("Ready %.1f s after creation, reconciled with the chart's permissions only", took.Seconds())
	g.Expect(strings.Contains(charted.LogTail(300), "forbidden")).To(BeFalse(), "the operator hit a permission the chart lacks:\n%s", charted.LogTail(30))
}

// createChart renders the Helm chart (helm v4 from the tool cache) as release
// aiinference in the namespace release with the values set, and creates on the
// cluster every object it renders but those skip (when not nil) leaves out; the
// objects are returned in the order created. Its cluster-wide objects are
// deleted when the test ends; the namespaced ones go with their namespace.
func (e *env) createChart(t *testing.T, g *WithT, release string, skip func(*unstructured.Unstructured) bool, set ...string) []*unstructured.Unstructured {
	t.Helper()
	helmDir, err := testutil.BuildTools("helm")
	g.Expect(err).NotTo(HaveOccurred())
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	args := []string{"template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"), "--namespace", release}
	for _, value := range set {
		args = append(args, "--set", value)
	}
	out, err := exec.Command(filepath.Join(helmDir, "helm"), args...).Output()
	g.Expect(err).NotTo(HaveOccurred(), "helm template: %s", out)
	var created []*unstructured.Unstructured
	t.Cleanup(func() {
		for _, obj := range created {
			if obj.GetNamespace() == "" {
				_ = e.k8s.Delete(context.Background(), obj)
			}
		}
	})
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		if len(obj.Object) == 0 || (skip != nil && skip(obj)) {
			continue
		}
		err := e.k8s.Create(context.Background(), obj)
		if apierrors.IsAlreadyExists(err) && obj.GetNamespace() == "" {
			t.Fatalf("%s %s exists already: another install of the chart is in this cluster", obj.GetKind(), obj.GetName())
		}
		g.Expect(err).NotTo(HaveOccurred(), "%s %s", obj.GetKind(), obj.GetName())
		created = append(created, obj)
	}
	return created
}

// serveAsChart runs the operator binary (named name) as the ServiceAccount of
// the chart's release, with a token and nothing else and the extra args, until
// the test ends; it creates a sample called sample in workloads and waits until
// it is Ready. It returns the operator and how long the sample took to be Ready.
func (e *env) serveAsChart(t *testing.T, g *WithT, name, release, workloads, sample string, args ...string) (*operatorProcess, time.Duration) {
	t.Helper()
	charted := e.operator(name, e.tokenKubeconfig(t, g, release, "aiinference-controller-manager"),
		append([]string{"--leader-election-namespace=" + release}, args...)...)
	g.Expect(charted.Start()).To(Succeed())
	t.Cleanup(charted.Stop)
	obj := inference(workloads, sample, 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(context.Background(), obj)).To(Succeed())
	start := time.Now()
	e.waitFor(t, g, obj, readyTimeout, beReady(1))
	return charted, time.Since(start)
}
