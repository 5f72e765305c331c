package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// TestChartCertManagerModeNeedsNoCertificatePermissions renders the chart with
// webhook.certManager.enabled, which grants nothing for the self-managed
// certificate (no Secret in its namespace, no update of the CRD or the webhook
// configurations), creates its RBAC and ServiceAccount on the local cluster,
// and runs the operator binary with --webhooks --webhook-cert-mode=cert-manager
// as that ServiceAccount, with a token and nothing else. The certificate in its
// --webhook-cert-dir is one the test writes, standing in for the Secret
// cert-manager would fill (no cert-manager runs here; the Issuer, Certificate
// and webhook configurations are left out, as the API server could not reach
// this process's webhooks anyway). The operator serves its webhooks, a sample
// reaches Ready, and its log has no forbidden request. On the solo cluster: the
// chart's operator is cluster-wide, and the only one there.
func TestChartCertManagerModeNeedsNoCertificatePermissions(t *testing.T) {
	e := soloCluster.get(t)
	e.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	release, workloads := e.newNamespace(t), e.newNamespace(t)
	helmDir, err := testutil.BuildTools("helm")
	g.Expect(err).NotTo(HaveOccurred())
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	out, err := exec.Command(filepath.Join(helmDir, "helm"), "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"),
		"--namespace", release, "--set", "crds.install=false", "--set", "webhook.certManager.enabled=true", "--set", "replicas=0").Output()
	g.Expect(err).NotTo(HaveOccurred(), "helm template: %s", out)
	var created []*unstructured.Unstructured
	defer func() {
		for _, obj := range created {
			if obj.GetNamespace() == "" {
				_ = e.k8s.Delete(context.Background(), obj)
			}
		}
	}()
	var roles []string
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed())
		switch obj.GetKind() {
		case "", "Issuer", "Certificate", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			continue
		case "Role", "ClusterRole":
			roles = append(roles, obj.GetKind()+" "+obj.GetName())
		}
		err := e.k8s.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) && obj.GetNamespace() == "" {
			t.Fatalf("%s %s exists already: another install of the chart is in this cluster", obj.GetKind(), obj.GetName())
		}
		g.Expect(err).NotTo(HaveOccurred(), "%s %s", obj.GetKind(), obj.GetName())
		created = append(created, obj)
	}
	t.Logf("roles of the chart in cert-manager mode: %s", strings.Join(roles, ", "))
	g.Expect(roles).NotTo(ContainElement(ContainSubstring("webhook-cert")))

	certDir := t.TempDir()
	writeSelfSignedCert(t, g, certDir, "localhost")
	port, err := freePort()
	g.Expect(err).NotTo(HaveOccurred())

	charted := e.operator("chart-cert-manager", e.tokenKubeconfig(t, g, release, "aiinference-controller-manager"),
		"--leader-election-namespace="+release, "--webhooks", "--webhook-cert-mode=cert-manager",
		"--webhook-cert-dir="+certDir, "--webhook-port="+strconv.Itoa(port), "--webhook-namespace="+release)
	g.Expect(charted.start()).To(Succeed())
	defer charted.stop()
	obj := inference(workloads, "cert-manager-mode", 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(ctx, obj)).To(Succeed())
	start := time.Now()
	e.waitFor(t, g, obj, readyTimeout, beReady(1))
	t.Logf("Ready %.1f s after creation, reconciled with the chart's cert-manager-mode permissions only", time.Since(start).Seconds())
	g.Eventually(func() string { return charted.logTail(300) }).WithTimeout(10*time.Second).Should(ContainSubstring("Serving webhook server"),
		"the webhook server did not start on the mounted certificate")
	g.Expect(charted.logTail(300)).NotTo(ContainSubstring("forbidden"), "the operator hit a permission cert-manager mode lacks")
}

// writeSelfSignedCert writes tls.crt and tls.key for host into dir, as the
// kubelet mounts cert-manager's Secret.
func writeSelfSignedCert(t *testing.T, g *WithT, dir, host string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	g.Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	g.Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)).To(Succeed())
}
