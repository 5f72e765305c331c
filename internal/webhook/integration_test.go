package webhook_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/webhook"
)

func key(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// update reads the object in the version of obj, changes it and writes the whole
// object back, again on a conflict with the controller's own writes.
func update[T client.Object](g Gomega, obj T, change func(T)) {
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return k8s.Update(context.Background(), obj)
	})).To(Succeed())
}

// Created as v1alpha1, read as v1 and back, through the API server calling the
// operator's conversion and admission webhooks over TLS.
func TestCreateAsV1Alpha1ReadAsV1AndBack(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)

	alpha := validV1Alpha1(func(o *servingv1alpha1.AIInference) {
		o.Namespace = ns
		o.Spec.S3Endpoint = "http://minio.storage:9000"
		o.Spec.CredentialsSecret = "s3"
		o.Spec.LoadTimeoutSeconds = ptr.To[int32](900)
	})
	g.Expect(k8s.Create(ctx, alpha)).To(Succeed())

	v1obj := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, key(ns, "llama"), v1obj)).To(Succeed())
	g.Expect(v1obj.Spec.Model.Source).To(Equal(servingv1.ModelSource{S3: &servingv1.S3Source{
		Bucket: "models", Prefix: "llama-3.1-8b/", Endpoint: "http://minio.storage:9000",
		CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: "s3", AccessKeyIDKey: "AWS_ACCESS_KEY_ID", SecretAccessKeyKey: "AWS_SECRET_ACCESS_KEY"},
	}}))
	g.Expect(v1obj.Spec.GPU).To(Equal(servingv1.GPUSpec{Count: 1, Products: []string{"NVIDIA-L4"}}))
	g.Expect(v1obj.Spec.Loading.Timeout.Duration).To(Equal(15 * time.Minute))
	g.Expect(v1obj.Spec.Loading.Backoff.Duration).To(Equal(30*time.Second), "the v1alpha1 schema default, 30 seconds")
	g.Expect(*v1obj.Spec.Replicas).To(BeEquivalentTo(1))
	g.Expect(v1obj.Spec.Engine.Port).To(BeEquivalentTo(8000), "the defaulting webhook sets vLLM's port on the v1 form of a v1alpha1 request")
	g.Expect(v1obj.Annotations).NotTo(HaveKey(servingv1alpha1.AnnotationV1Fields))

	// A v1 client uses what v1alpha1 cannot express.
	update(g, v1obj, func(o *servingv1.AIInference) {
		o.Spec.GPU.Products = []string{"NVIDIA-L4", "NVIDIA-A10G"}
		o.Spec.Model.Source.S3.Region = "eu-west-1"
		o.Spec.Engine.Env = []corev1.EnvVar{{Name: "HF_HOME", Value: "/tmp/hf"}}
		o.Spec.Loading.Timeout = &metav1.Duration{Duration: 15*time.Minute + 30*time.Second + 500*time.Millisecond}
	})

	// A v1alpha1 client sees its own shape, edits a field and writes the whole object back.
	alpha = &servingv1alpha1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"}}
	update(g, alpha, func(o *servingv1alpha1.AIInference) {
		g.Expect(o.Spec.GPUProduct).To(Equal("NVIDIA-L4"))
		g.Expect(*o.Spec.LoadTimeoutSeconds).To(BeEquivalentTo(930))
		g.Expect(o.Annotations).To(HaveKey(servingv1alpha1.AnnotationV1Fields))
		o.Spec.Replicas = ptr.To[int32](3)
	})

	v1obj = &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, key(ns, "llama"), v1obj)).To(Succeed())
	g.Expect(*v1obj.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(v1obj.Spec.GPU.Products).To(Equal([]string{"NVIDIA-L4", "NVIDIA-A10G"}), "the preference list survives a v1alpha1 update")
	g.Expect(v1obj.Spec.Model.Source.S3.Region).To(Equal("eu-west-1"))
	g.Expect(v1obj.Spec.Engine.Env).To(Equal([]corev1.EnvVar{{Name: "HF_HOME", Value: "/tmp/hf"}}))
	g.Expect(v1obj.Spec.Loading.Timeout.Duration).To(Equal(15*time.Minute + 30*time.Second + 500*time.Millisecond))
	g.Expect(v1obj.Annotations).NotTo(HaveKey(servingv1alpha1.AnnotationV1Fields), "the conversion cleans its annotation up")

	// A v1alpha1 edit that contradicts a saved field wins over it.
	update(g, alpha, func(o *servingv1alpha1.AIInference) { o.Spec.GPUProduct = "NVIDIA-A10G" })
	g.Expect(k8s.Get(ctx, key(ns, "llama"), v1obj)).To(Succeed())
	g.Expect(v1obj.Spec.GPU.Products).To(Equal([]string{"NVIDIA-A10G"}))
}

// etcdValue reads what the API server stored for an object, straight from etcd.
func etcdValue(ctx context.Context, ns, name string) (string, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{envtestEnv.ControlPlane.Etcd.URL.String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	resp, err := c.Get(ctx, fmt.Sprintf("/registry/serving.aiinference.io/aiinferences/%s/%s", ns, name))
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) != 1 {
		return "", fmt.Errorf("%s/%s not in etcd", ns, name)
	}
	return string(resp.Kvs[0].Value), nil
}

func storedAs(g Gomega, ns, name string) string {
	raw, err := etcdValue(context.Background(), ns, name)
	g.Expect(err).NotTo(HaveOccurred())
	var obj metav1.TypeMeta
	g.Expect(json.Unmarshal([]byte(raw), &obj)).To(Succeed())
	return strings.TrimPrefix(obj.APIVersion, "serving.aiinference.io/")
}

// setStorageVersion makes version the CRD's storage version, and waits until the
// API server stores new objects in it.
func setStorageVersion(t *testing.T, g *WithT, ns, version string) {
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, key("", webhook.DefaultCRDName), crd)).To(Succeed())
	for i := range crd.Spec.Versions {
		crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == version
	}
	g.Expect(k8s.Update(ctx, crd)).To(Succeed())
	// The API server swaps its storage shortly after the CRD changes; wait until
	// several objects in a row land in the new version.
	n, inRow := 0, 0
	g.Eventually(func(g Gomega) {
		n++
		probe := validV1(func(o *servingv1.AIInference) { o.Namespace, o.Name = ns, fmt.Sprintf("probe-%s-%d", version, n) })
		g.Expect(k8s.Create(ctx, probe)).To(Succeed())
		defer func() { _ = k8s.Delete(ctx, probe) }()
		if storedAs(g, ns, probe.Name) != version {
			inRow = 0
		} else {
			inRow++
		}
		g.Expect(inRow).To(BeNumerically(">=", 5))
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	t.Logf("objects are now stored as %s", version)
}

// An operator upgrade from a release that stored v1alpha1: objects stored under
// both versions list and read in both.
func TestListObjectsStoredUnderBothVersions(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	t.Cleanup(func() { setStorageVersion(t, NewWithT(t), ns, "v1") })

	create := func(prefix string, n int, version string) {
		for i := range n {
			var obj client.Object
			if i%2 == 0 {
				obj = validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Spec.ModelName = fmt.Sprintf("%s-%d", prefix, i) })
			} else {
				obj = validV1(func(o *servingv1.AIInference) { o.Spec.Model.Name = fmt.Sprintf("%s-%d", prefix, i) })
			}
			obj.SetNamespace(ns)
			obj.SetName(fmt.Sprintf("%s-%d", prefix, i))
			g.Expect(k8s.Create(ctx, obj)).To(Succeed())
			g.Expect(storedAs(g, ns, obj.GetName())).To(Equal(version), obj.GetName())
		}
	}
	setStorageVersion(t, g, ns, "v1alpha1")
	create("old", 4, "v1alpha1")
	// Let the controller finish its first writes while v1alpha1 is still stored.
	g.Eventually(func(g Gomega) {
		for i := range 4 {
			o := &servingv1.AIInference{}
			g.Expect(k8s.Get(ctx, key(ns, fmt.Sprintf("old-%d", i)), o)).To(Succeed())
			g.Expect(o.Status.ObservedGeneration).To(Equal(o.Generation))
		}
	}).WithTimeout(30 * time.Second).Should(Succeed())
	setStorageVersion(t, g, ns, "v1")
	create("new", 4, "v1")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, key("", webhook.DefaultCRDName), crd)).To(Succeed())
	g.Expect(crd.Status.StoredVersions).To(ConsistOf("v1alpha1", "v1"))

	v1list := &servingv1.AIInferenceList{}
	g.Expect(k8s.List(ctx, v1list, client.InNamespace(ns))).To(Succeed())
	g.Expect(v1list.Items).To(HaveLen(8))
	for _, o := range v1list.Items {
		g.Expect(o.Spec.Model.Name).To(Equal(o.Name))
		g.Expect(o.Spec.Model.Source.S3).NotTo(BeNil(), o.Name)
		g.Expect(o.Spec.Model.Source.S3.Bucket).To(Equal("models"), o.Name)
		g.Expect(o.Spec.GPU.Products).To(Equal([]string{"NVIDIA-L4"}), o.Name)
	}
	// What etcd holds while listing: objects of both versions.
	stored := map[string]int{}
	for _, o := range v1list.Items {
		stored[storedAs(g, ns, o.Name)]++
	}
	t.Logf("objects listed, by the version etcd holds them in: %v", stored)
	g.Expect(stored["v1alpha1"]).To(BeNumerically(">=", 1))
	g.Expect(stored["v1"]).To(BeNumerically(">=", 4))

	alphaList := &servingv1alpha1.AIInferenceList{}
	g.Expect(k8s.List(ctx, alphaList, client.InNamespace(ns))).To(Succeed())
	g.Expect(alphaList.Items).To(HaveLen(8))
	for _, o := range alphaList.Items {
		g.Expect(o.Spec.ModelName).To(Equal(o.Name))
		g.Expect(o.Spec.ModelURI).To(Equal("s3://models/llama-3.1-8b/"), o.Name)
		g.Expect(o.Spec.GPUProduct).To(Equal("NVIDIA-L4"), o.Name)
	}
}

// At least 30 invalid objects of both versions are refused at admission, each with
// a message naming the field, what is wrong and how to fix it; the controller
// never hears of any of them.
func TestInvalidObjectsAreRefusedAtAdmission(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	cases := invalidCases()
	g.Expect(len(cases)).To(BeNumerically(">=", 30))

	// The controller learns of objects only through watches: watch the namespace
	// from before the first attempt.
	wc, err := client.NewWithWatch(restConfig, client.Options{Scheme: testScheme()})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := wc.Watch(ctx, &servingv1.AIInferenceList{}, client.InNamespace(ns))
	g.Expect(err).NotTo(HaveOccurred())
	defer w.Stop()

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.obj.DeepCopyObject().(client.Object)
			obj.SetNamespace(ns)
			obj.SetName(fmt.Sprintf("invalid-%02d", i))
			err := k8s.Create(ctx, obj)
			if err == nil {
				t.Fatalf("%s was admitted", tc.name)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("want a 422 Invalid API error, got %T %v", err, err)
			}
			if !tc.schema && !strings.Contains(err.Error(), "admission webhook") {
				t.Errorf("not refused by the admission webhook: %v", err)
			}
			t.Logf("%v", err)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message lacks %q:\n%s", want, err)
				}
			}
		})
	}
	select {
	case ev := <-w.ResultChan():
		t.Fatalf("an invalid object reached the watch the controller uses: %s %v", ev.Type, ev.Object)
	case <-time.After(2 * time.Second):
	}
	list := &servingv1.AIInferenceList{}
	g.Expect(k8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(BeEmpty())
}

type warnings struct {
	mu  sync.Mutex
	all []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all = append(w.all, text)
}

func TestUnknownGPUProductIsAdmittedWithAWarning(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	seen := &warnings{}
	cfg := rest.CopyConfig(restConfig)
	cfg.WarningHandler = seen
	c, err := client.New(cfg, client.Options{Scheme: testScheme()})
	g.Expect(err).NotTo(HaveOccurred())
	obj := validV1(func(o *servingv1.AIInference) {
		o.Namespace = ns
		o.Spec.GPU.Products = []string{"NVIDIA-H100-80GB-HMB3"}
	})
	g.Expect(c.Create(context.Background(), obj)).To(Succeed())
	g.Expect(seen.all).To(ContainElement(ContainSubstring(`"NVIDIA-H100-80GB-HMB3" is not a GPU product the operator knows`)))

	// The deprecated version says so on every request.
	seen.all = nil
	g.Expect(c.Get(context.Background(), key(ns, obj.Name), &servingv1alpha1.AIInference{})).To(Succeed())
	g.Expect(seen.all).To(ContainElement(ContainSubstring("v1alpha1 AIInference is deprecated; use serving.aiinference.io/v1")))
}

func secretData(g Gomega) map[string][]byte {
	s := &corev1.Secret{}
	g.Expect(k8s.Get(context.Background(), key(certNamespace, webhook.DefaultSecretName), s)).To(Succeed())
	return s.Data
}

// caBundles are the CA bundles of the CRD's conversion webhook and every
// admission webhook.
func caBundles(g Gomega) [][]byte {
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(k8s.Get(ctx, key("", webhook.DefaultCRDName), crd)).To(Succeed())
	bundles := [][]byte{crd.Spec.Conversion.Webhook.ClientConfig.CABundle}
	m := manifests.Mutating.DeepCopy()
	g.Expect(k8s.Get(ctx, key("", m.Name), m)).To(Succeed())
	for _, wh := range m.Webhooks {
		bundles = append(bundles, wh.ClientConfig.CABundle)
	}
	v := manifests.Validating.DeepCopy()
	g.Expect(k8s.Get(ctx, key("", v.Name), v)).To(Succeed())
	for _, wh := range v.Webhooks {
		bundles = append(bundles, wh.ClientConfig.CABundle)
	}
	return bundles
}

// convertOnce creates an object as v1alpha1 and reads it as v1 and as v1alpha1.
func convertOnce(ctx context.Context, ns string, i int) error {
	name := fmt.Sprintf("rot-%03d", i)
	obj := validV1Alpha1(func(o *servingv1alpha1.AIInference) { o.Namespace, o.Name = ns, name })
	if err := k8s.Create(ctx, obj); err != nil {
		return fmt.Errorf("create as v1alpha1: %w", err)
	}
	if err := k8s.Get(ctx, key(ns, name), &servingv1.AIInference{}); err != nil {
		return fmt.Errorf("get as v1: %w", err)
	}
	if err := k8s.List(ctx, &servingv1alpha1.AIInferenceList{}, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list as v1alpha1: %w", err)
	}
	return nil
}

// The serving certificate rotates (about every 15 s in this suite) while objects
// are converted without pause: no request fails. Then the CA itself is replaced
// and conversion works again as soon as the new bundle is injected.
func TestCertificateRotationDoesNotBreakConversion(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)

	ca := secretData(g)["ca.crt"]
	g.Expect(ca).NotTo(BeEmpty())
	for _, b := range caBundles(g) {
		g.Expect(b).To(Equal(ca), "every webhook trusts the operator's CA")
	}
	first, err := servedCert()
	g.Expect(err).NotTo(HaveOccurred())
	served := map[string]bool{first: true}
	i := 0
	deadline := time.Now().Add(90 * time.Second)
	for len(served) < 3 && time.Now().Before(deadline) {
		if err := convertOnce(ctx, ns, i); err != nil {
			t.Fatalf("conversion %d failed after %d certificate rotations: %v", i, len(served)-1, err)
		}
		i++
		cert, err := servedCert()
		g.Expect(err).NotTo(HaveOccurred())
		served[cert] = true
		time.Sleep(100 * time.Millisecond)
	}
	g.Expect(len(served)).To(BeNumerically(">=", 3), "the serving certificate rotated fewer than twice in 90 s")
	t.Logf("%d conversions across %d serving certificate rotations, none failed", i, len(served)-1)
	g.Expect(secretData(g)["ca.crt"]).To(Equal(ca), "rotating the serving certificate keeps the CA")

	// Replace the CA: empty the Secret, as if it had been lost.
	s := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, key(certNamespace, webhook.DefaultSecretName), s)).To(Succeed())
	s.Data = nil
	g.Expect(k8s.Update(ctx, s)).To(Succeed())
	start := time.Now()
	var newCA []byte
	g.Eventually(func(g Gomega) {
		newCA = secretData(g)["ca.crt"]
		g.Expect(newCA).NotTo(BeEmpty())
		g.Expect(newCA).NotTo(Equal(ca))
		for _, b := range caBundles(g) {
			g.Expect(bytes.Equal(b, newCA)).To(BeTrue(), "CA bundle not yet replaced")
		}
	}).WithTimeout(60 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Eventually(func() error { i++; return convertOnce(ctx, ns, i) }).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	t.Logf("new CA issued, injected and converting again after %s", time.Since(start).Round(time.Millisecond))
	for range 5 {
		i++
		g.Expect(convertOnce(ctx, ns, i)).To(Succeed())
	}
}

// Readiness fails, and the operator logs why, until the webhook serving
// certificate is there; then the webhook server starts with that certificate
// and readiness passes. The operator here is a second one, with the webhook
// server and readiness check as manager.New wires them but no controllers, in
// cert-manager mode: the test decides when the certificate appears. (Self-managed
// mode would issue one at once, and inject its CA into the suite's webhook
// configurations.)
func TestReadinessWaitsForTheCertificate(t *testing.T) {
	g := NewWithT(t)
	port, err := freePort()
	g.Expect(err).NotTo(HaveOccurred())
	probePort, err := freePort()
	g.Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 testScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: fmt.Sprintf("127.0.0.1:%d", probePort),
	})
	g.Expect(err).NotTo(HaveOccurred())
	certDir := t.TempDir()
	check, err := webhook.Setup(mgr, webhook.Options{Port: port, Host: "127.0.0.1", CertDir: certDir, CertMode: webhook.CertManager})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mgr.AddReadyzCheck("webhook", check)).To(Succeed())

	_, logOffset := operatorLog.Since(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the second operator stopped with: %v", err)
		}
	})

	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)
	notReady := func(g Gomega) {
		status, body := httpGet(g, readyz+"/webhook")
		g.Expect(status).To(Equal(http.StatusInternalServerError))
		g.Expect(body).To(ContainSubstring("the webhook serving certificate is not ready yet"))
	}
	g.Eventually(notReady).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	// Longer than the operator's once-a-second look for the certificate file.
	g.Consistently(notReady).WithTimeout(2500 * time.Millisecond).WithPolling(100 * time.Millisecond).Should(Succeed())
	status, body := httpGet(g, readyz)
	g.Expect(status).To(Equal(http.StatusInternalServerError), body)
	g.Eventually(func() string { log, _ := operatorLog.Since(logOffset); return log }).Should(
		MatchRegexp(`healthz check failed\t\{"checker": "webhook", "error": "the webhook serving certificate is not ready yet"\}`))
	_, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	g.Expect(err).To(HaveOccurred(), "the webhook server listens without a certificate")

	// The key first: the operator starts the server once tls.crt exists.
	certDER, keyPEM := selfSignedCert(g)
	g.Expect(os.WriteFile(filepath.Join(certDir, corev1.TLSPrivateKeyKey), keyPEM, 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(certDir, corev1.TLSCertKey), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), 0o600)).To(Succeed())
	g.Eventually(func(g Gomega) {
		status, body := httpGet(g, readyz)
		g.Expect(status).To(Equal(http.StatusOK), body)
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate only
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	g.Expect(conn.ConnectionState().PeerCertificates[0].Raw).To(Equal(certDER), "the webhook server serves the certificate written")
}

// httpGet returns the status code and body of a GET of url.
func httpGet(g Gomega, url string) (int, string) {
	resp, err := http.Get(url) //nolint:gosec,noctx // a loopback test endpoint
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}

// selfSignedCert returns a certificate for 127.0.0.1 and localhost (DER) and
// its key (PEM).
func selfSignedCert(g Gomega) ([]byte, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	g.Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	g.Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	g.Expect(err).NotTo(HaveOccurred())
	return der, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// A new object, before any operator has seen it, reads observedGeneration -1
// (the CRD's default), so kstatus, Flux and Argo CD take it as in progress
// rather than as current; v1alpha1 reads the same.
func TestANewObjectIsNotYetObserved(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	obj := validV1(func(o *servingv1.AIInference) { o.Namespace = ns })
	g.Expect(k8s.Create(context.Background(), obj)).To(Succeed())
	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(context.Background(), key(ns, obj.Name), got)).To(Succeed())
	g.Expect(got.Status.ObservedGeneration).To(Equal(int64(-1)))
	old := &servingv1alpha1.AIInference{}
	g.Expect(k8s.Get(context.Background(), key(ns, obj.Name), old)).To(Succeed())
	g.Expect(old.Status.ObservedGeneration).To(Equal(int64(-1)))
}
