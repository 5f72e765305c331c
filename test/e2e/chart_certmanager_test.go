package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/aiinference/operator/test/testutil/freeport"
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
	e := soloCluster.own(t)
	g := NewWithT(t)
	release, workloads := e.newNamespace(t), e.newNamespace(t)
	skip := func(obj *unstructured.Unstructured) bool {
		return slices.Contains([]string{"", "Issuer", "Certificate", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}, obj.GetKind())
	}
	var roles []string
	for _, obj := range e.createChart(t, g, release, skip, "crds.install=false", "webhook.certManager.enabled=true", "replicas=0") {
		if kind := obj.GetKind(); kind == "Role" || kind == "ClusterRole" {
			roles = append(roles, kind+" "+obj.GetName())
		}
	}
	t.Logf("roles of the chart in cert-manager mode: %s", strings.Join(roles, ", "))
	g.Expect(roles).NotTo(ContainElement(ContainSubstring("webhook-cert")))

	certDir := t.TempDir()
	writeSelfSignedCert(t, g, certDir, "localhost")
	port, err := freeport.Pick()
	g.Expect(err).NotTo(HaveOccurred())

	charted, took := e.serveAsChart(t, g, "chart-cert-manager", release, workloads, "cert-manager-mode",
		"--webhooks", "--webhook-cert-mode=cert-manager",
		"--webhook-cert-dir="+certDir, "--webhook-port="+strconv.Itoa(port), "--webhook-namespace="+release)
	t.Logf("Ready %.1f s after creation, reconciled with the chart's cert-manager-mode permissions only", took.Seconds())
	g.Eventually(func() string { return charted.LogTail(300) }).WithTimeout(10*time.Second).Should(ContainSubstring("Serving webhook server"),
		"the webhook server did not start on the mounted certificate")
	g.Expect(charted.LogTail(300)).NotTo(ContainSubstring("forbidden"), "the operator hit a permission cert-manager mode lacks")
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
