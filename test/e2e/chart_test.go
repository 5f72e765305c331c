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

	"github.com/aiinference/operator/internal/localcluster"
	"github.com/aiinference/operator/internal/testutil"
)

// TestChartInstallsAndItsPermissionsServe renders the Helm chart (helm v4 from
// the tool cache), creates every object it renders on the local cluster (the API
// server accepts them all, RBAC escalation checks included), then runs the
// operator binary as the chart's ServiceAccount, with a token and nothing else:
// with exactly the chart's permissions, a sample reaches Ready. On the solo
// cluster: the chart's operator is cluster-wide, and the only one there.
func TestChartInstallsAndItsPermissionsServe(t *testing.T) {
	e := soloCluster.get(t)
	e.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	release, workloads := e.newNamespace(t), e.newNamespace(t)
	helmDir, err := testutil.BuildTools("helm")
	g.Expect(err).NotTo(HaveOccurred())
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	// The suite installed the CRD; webhooks would need the operator's pod to
	// serve, which a simulated node does not run.
	out, err := exec.Command(filepath.Join(helmDir, "helm"), "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"),
		"--namespace", release, "--set", "crds.install=false", "--set", "webhook.enabled=false", "--set", "replicas=0").Output()
	g.Expect(err).NotTo(HaveOccurred(), "helm template: %s", out)
	var created []*unstructured.Unstructured
	defer func() {
		for _, obj := range created {
			if obj.GetNamespace() == "" {
				_ = e.k8s.Delete(context.Background(), obj)
			}
		}
	}()
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		if len(obj.Object) == 0 {
			continue
		}
		err := e.k8s.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) && obj.GetNamespace() == "" {
			t.Fatalf("%s %s exists already: another install of the chart is in this cluster", obj.GetKind(), obj.GetName())
		}
		g.Expect(err).NotTo(HaveOccurred(), "%s %s", obj.GetKind(), obj.GetName())
		created = append(created, obj)
	}
	t.Logf("the API server accepted the chart's %d objects", len(created))

	charted := e.operator("chart", e.tokenKubeconfig(t, g, release, "aiinference-controller-manager"), "--leader-election-namespace="+release)
	g.Expect(charted.start()).To(Succeed())
	defer charted.stop()
	obj := inference(workloads, "charted", 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(ctx, obj)).To(Succeed())
	start := time.Now()
	e.waitFor(t, g, obj, readyTimeout, beReady(1))
	t.Logf("Ready %.1f s after creation, reconciled with the chart's permissions only", time.Since(start).Seconds())
	g.Expect(strings.Contains(charted.logTail(300), "forbidden")).To(BeFalse(), "the operator hit a permission the chart lacks:\n%s", charted.logTail(30))
}
