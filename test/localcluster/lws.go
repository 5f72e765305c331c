package localcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/aiinference/operator/test/testutil"
)

// The LeaderWorkerSet controller (sigs.k8s.io/lws, built from its module by
// hack/tools/build.sh lws) runs on the host as the cluster's own controllers
// do, with its webhooks, which the API server calls at the host's loopback
// address: its pod webhook gives a group's pods their group labels and the
// leader's address (LWS_LEADER_ADDRESS), which its controller and the pods
// rely on, so a cluster without it would be kinder than a real one. Its CRD
// is the one of the sigs.k8s.io/lws version the repository's go.mod requires,
// which is the version hack/tools/lws builds (a test keeps them equal).

const lwsBinary = "lws-manager"

// LeaderWorkerSetOptions configure StartLeaderWorkerSet.
type LeaderWorkerSetOptions struct {
	// RepoRoot is the repository; empty: found from the working directory.
	RepoRoot string
	// BinDir holds lws-manager; empty: hack/tools/build.sh lws builds or finds it.
	BinDir string
}

// StartLeaderWorkerSet installs the LeaderWorkerSet CRD and runs its
// controller until the cluster stops, returning once its webhooks answer. A
// second call does nothing. Start it before an operator that should watch
// LeaderWorkerSets (it looks at the kinds the cluster serves when it starts).
func (c *Cluster) StartLeaderWorkerSet(ctx context.Context, opts LeaderWorkerSetOptions) error {
	c.mu.Lock()
	started := c.lwsStarted
	c.lwsStarted = true
	c.mu.Unlock()
	if started {
		return nil
	}
	if opts.RepoRoot == "" {
		var err error
		if opts.RepoRoot, err = FindRepoRoot("."); err != nil {
			return err
		}
	}
	if opts.BinDir == "" {
		fmt.Fprintln(c.progress, "Finding or building the LeaderWorkerSet controller (hack/tools/build.sh lws)")
		var err error
		if opts.BinDir, err = runBuildScript(ctx, opts.RepoRoot, "lws", c.progress); err != nil {
			return err
		}
	}
	binary := filepath.Join(opts.BinDir, lwsBinary)
	if _, err := os.Stat(binary); err != nil {
		return fmt.Errorf("the LeaderWorkerSet controller's binary: %w", err)
	}
	k8s, err := c.lwsClient()
	if err != nil {
		return err
	}
	module, err := moduleDir(ctx, opts.RepoRoot, "sigs.k8s.io/lws")
	if err != nil {
		return err
	}
	fmt.Fprintln(c.progress, "Installing the LeaderWorkerSet CRD")
	if err := testutil.InstallCRDs(ctx, k8s, filepath.Join(module, "config", "crd", "bases", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")); err != nil {
		return err
	}

	dir := filepath.Join(c.dir, "lws")
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	caBundle, err := writeLoopbackServingCert(certDir)
	if err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	webhookPort, healthPort := ports[0], ports[1]
	config := filepath.Join(dir, "config.yaml")
	// No leader election (one replica), no certificate rotation (the
	// certificate above), no metrics server.
	if err := os.WriteFile(config, fmt.Appendf(nil, `apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:%d
`, webhookPort, certDir, healthPort), 0o600); err != nil {
		return err
	}
	if err := applyLWSWebhooks(ctx, k8s, webhookPort, caBundle); err != nil {
		return err
	}
	if err := c.startEnv("lws-controller", binary, []string{"KUBECONFIG=" + c.kubeconfig}, "--config="+config); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "the LeaderWorkerSet controller", "http://127.0.0.1:"+strconv.Itoa(healthPort)+"/readyz", nil); err != nil {
		return err
	}
	// Its webhook server starts with the manager; its controllers once the
	// certificates are in (at once: no rotation). A dry-run create goes
	// through both of its LeaderWorkerSet webhooks.
	return c.poll(ctx, "the LeaderWorkerSet webhooks", func(ctx context.Context) (bool, error) {
		probe := &lwsv1.LeaderWorkerSet{
			ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Namespace: metav1.NamespaceDefault},
			Spec: lwsv1.LeaderWorkerSetSpec{
				LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{WorkerTemplate: lwsPodTemplate()},
				RolloutStrategy:      lwsv1.RolloutStrategy{Type: lwsv1.RollingUpdateStrategyType},
				StartupPolicy:        lwsv1.LeaderCreatedStartupPolicy,
			},
		}
		err := k8s.Create(ctx, probe, client.DryRunAll)
		if apierrors.IsInvalid(err) {
			return false, fmt.Errorf("the LeaderWorkerSet probe: %w", err) // no wait mends it
		}
		return err == nil, nil
	})
}

// lwsClient is a client for the objects the LeaderWorkerSet controller needs.
func (c *Cluster) lwsClient() (client.Client, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{apiextensionsv1.AddToScheme, admissionregistrationv1.AddToScheme, lwsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return client.New(c.RESTConfig(), client.Options{Scheme: scheme})
}

// applyLWSWebhooks registers the controller's webhooks as its release does
// (config/webhook), at the host's loopback address: its pod webhooks only for
// pods of a LeaderWorkerSet, so that no other pod waits on it.
func applyLWSWebhooks(ctx context.Context, k8s client.Client, port int, caBundle []byte) error {
	at := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", port, path)), CABundle: caBundle}
	}
	lwsRules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{lwsv1.GroupVersion.Group}, APIVersions: []string{"v1"}, Resources: []string{"leaderworkersets"}},
	}}
	podRules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}}
	groupPods := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: lwsv1.SetNameLabelKey, Operator: metav1.LabelSelectorOpExists}}}
	fail, none := ptr.To(admissionregistrationv1.Fail), ptr.To(admissionregistrationv1.SideEffectClassNone)
	versions := []string{"v1"}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "lws-mutating-webhook-configuration"}}
	if _, err := controllerutil.CreateOrUpdate(ctx, k8s, mutating, func() error {
		mutating.Webhooks = []admissionregistrationv1.MutatingWebhook{
			{Name: "mleaderworkerset.kb.io", ClientConfig: at("/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset"), Rules: lwsRules,
				FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: versions},
			{Name: "mpod.kb.io", ClientConfig: at("/mutate--v1-pod"), Rules: podRules, ObjectSelector: groupPods,
				FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: versions},
		}
		return nil
	}); err != nil {
		return fmt.Errorf("registering the LeaderWorkerSet mutating webhooks: %w", err)
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "lws-validating-webhook-configuration"}}
	if _, err := controllerutil.CreateOrUpdate(ctx, k8s, validating, func() error {
		validating.Webhooks = []admissionregistrationv1.ValidatingWebhook{
			{Name: "vleaderworkerset.kb.io", ClientConfig: at("/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset"), Rules: lwsRules,
				FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: versions},
			{Name: "vpod.kb.io", ClientConfig: at("/validate--v1-pod"), Rules: podRules, ObjectSelector: groupPods,
				FailurePolicy: fail, SideEffects: none, AdmissionReviewVersions: versions},
		}
		return nil
	}); err != nil {
		return fmt.Errorf("registering the LeaderWorkerSet validating webhooks: %w", err)
	}
	return nil
}

// lwsPodTemplate is the smallest pod template a LeaderWorkerSet takes.
func lwsPodTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "probe"}}}}
}

// writeLoopbackServingCert writes a self-signed serving certificate for
// 127.0.0.1, localhost and dnsNames (tls.crt, tls.key) into dir and returns it
// as the CA bundle.
func writeLoopbackServingCert(dir string, dnsNames ...string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "lws-webhook"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    append([]string{"localhost"}, dnsNames...),
		NotBefore:   time.Now().Add(-time.Minute), NotAfter: time.Now().AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return certPEM, nil
}
