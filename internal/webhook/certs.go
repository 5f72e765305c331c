package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update,namespace=system
// The rotator writes CA bundles into the operator's own CRD and webhook
// configurations only (resourceNames: the default names; flags that rename them
// need these rules renamed too). Its informers list and watch the kinds, which
// RBAC cannot narrow by name.
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;update,resourceNames=aiinferences.serving.aiinference.io
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;update,resourceNames=aiinference-mutating-webhook-configuration;aiinference-validating-webhook-configuration

// CertMode is who issues the webhook serving certificate.
type CertMode string

const (
	// CertSelfManaged: the operator keeps its own CA and serving certificate in a
	// Secret (open-policy-agent/cert-controller), injects the CA bundle into the CRD
	// and the webhook configurations, rotates both well before they expire, and
	// writes the certificate into CertDir, where the webhook server reloads it.
	CertSelfManaged CertMode = "self-managed"
	// CertManager: cert-manager issues the certificate into a Secret mounted at
	// CertDir and its CA injector fills the CA bundles (config/certmanager).
	CertManager CertMode = "cert-manager"
)

// Options configure the webhook server and its certificate.
type Options struct {
	// Port the webhook server listens on; Host empty listens on every address.
	Port int
	Host string
	// CertDir holds tls.crt and tls.key. The server reloads them when they change.
	CertDir  string
	CertMode CertMode

	// SecretName and SecretNamespace: the Secret holding the CA and the serving
	// certificate in self-managed mode.
	SecretName, SecretNamespace string
	// DNSName is the name the API server calls the webhook by: the webhook
	// Service's <name>.<namespace>.svc, or localhost when the operator runs outside.
	DNSName       string
	ExtraDNSNames []string
	// The objects whose CA bundle the operator fills in self-managed mode.
	CRDName, MutatingConfigName, ValidatingConfigName string

	// Rotation: the CA and serving certificate lifetimes, how long before expiry
	// they are replaced and how often that is checked. Zero takes the defaults
	// (10 years, 1 year, 90 days, 12 hours); tests shorten them.
	CAValidity, CertValidity, RotateBefore, CheckEvery time.Duration
}

// Defaults of Options, matching config/default.
const (
	DefaultPort                 = 9443
	DefaultCertDir              = "/tmp/k8s-webhook-server/serving-certs"
	DefaultSecretName           = "aiinference-webhook-server-cert"
	DefaultCRDName              = "aiinferences.serving.aiinference.io"
	DefaultMutatingConfigName   = "aiinference-mutating-webhook-configuration"
	DefaultValidatingConfigName = "aiinference-validating-webhook-configuration"
)

// Setup adds the webhook server to the manager, and in self-managed mode the
// certificate rotation. The server starts once its certificate is on disk; the
// returned checker, for the manager's readiness, fails until then and afterwards
// whenever the server does not accept a TLS connection.
func Setup(mgr manager.Manager, opts Options) (healthz.Checker, error) {
	if opts.Port == 0 {
		opts.Port = DefaultPort
	}
	if opts.CertDir == "" {
		opts.CertDir = DefaultCertDir
	}
	server := webhook.NewServer(webhook.Options{Host: opts.Host, Port: opts.Port, CertDir: opts.CertDir, TLSOpts: TLSOptions()})
	Register(server, mgr.GetScheme(), mgr.GetRESTMapper())

	certsReady := make(chan struct{})
	switch opts.CertMode {
	case CertSelfManaged, "":
		if err := addRotation(mgr, opts, certsReady); err != nil {
			return nil, err
		}
	case CertManager:
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return waitForFile(ctx, filepath.Join(opts.CertDir, "tls.crt"), certsReady)
		})); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown certificate mode %q: use %s or %s", opts.CertMode, CertSelfManaged, CertManager)
	}

	if err := mgr.Add(&deferredServer{Server: server, ready: certsReady}); err != nil {
		return nil, err
	}
	started := server.StartedChecker()
	return func(req *http.Request) error {
		select {
		case <-certsReady:
		default:
			return errors.New("the webhook serving certificate is not ready yet")
		}
		return started(req)
	}, nil
}

// deferredServer starts the webhook server once its certificate exists: the
// server's certificate watcher refuses to start without one. It runs on every
// replica, leader or not, since the API server may call any of them.
type deferredServer struct {
	webhook.Server
	ready <-chan struct{}
}

func (d *deferredServer) Start(ctx context.Context) error {
	select {
	case <-d.ready:
	case <-ctx.Done():
		return nil
	}
	return d.Server.Start(ctx)
}

func (*deferredServer) NeedLeaderElection() bool { return false }

func addRotation(mgr manager.Manager, opts Options, certsReady chan struct{}) error {
	if opts.SecretName == "" || opts.SecretNamespace == "" || opts.DNSName == "" {
		return errors.New("self-managed webhook certificates need a Secret name, its namespace and the webhook's DNS name")
	}
	if err := ensureSecret(mgr, opts); err != nil {
		return err
	}
	rotatorReady := make(chan struct{})
	cr := &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: opts.SecretNamespace, Name: opts.SecretName},
		CertDir:        opts.CertDir,
		CAName:         "aiinference-operator-ca",
		CAOrganization: "aiinference-operator",
		DNSName:        opts.DNSName,
		ExtraDNSNames:  opts.ExtraDNSNames,
		IsReady:        rotatorReady,
		// Named after its Secret: controller names are unique within a process.
		ControllerName: "webhook-cert-rotator-" + opts.SecretName,
		FieldOwner:     "aiinference-operator",
		Webhooks: []rotator.WebhookInfo{
			{Name: opts.CRDName, Type: rotator.CRDConversion},
			{Name: opts.MutatingConfigName, Type: rotator.Mutating},
			{Name: opts.ValidatingConfigName, Type: rotator.Validating},
		},
		// Every replica keeps the files current and serves; writes to the Secret
		// are optimistic updates, so concurrent replicas cannot both win.
		RequireLeaderElection:  false,
		CaCertDuration:         opts.CAValidity,
		ServerCertDuration:     opts.CertValidity,
		LookaheadInterval:      opts.RotateBefore,
		RotationCheckFrequency: opts.CheckEvery,
	}
	if err := rotator.AddRotator(mgr, cr); err != nil {
		return fmt.Errorf("adding the certificate rotator: %w", err)
	}
	if err := mgr.Add(&secretToDir{cfg: mgr, opts: opts}); err != nil {
		return err
	}
	// Serve once the certificate is on disk; the rotator's own readiness also
	// waits for the CA bundles, which the conversion needs too.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-rotatorReady:
			close(certsReady)
		case <-ctx.Done():
		}
		return nil
	}))
}

// ensureSecret creates the empty certificate Secret when it is missing: the
// rotator fills it but does not create it.
func ensureSecret(mgr manager.Manager, opts Options) error {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: opts.SecretName, Namespace: opts.SecretNamespace}}
	err = c.Get(ctx, client.ObjectKeyFromObject(secret), secret)
	if apierrors.IsNotFound(err) {
		ctrl.Log.WithName("webhook").Info("Creating the webhook certificate Secret", "secret", klog.KObj(secret))
		if err = c.Create(ctx, secret); apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("ensuring the webhook certificate Secret %s/%s: %w", opts.SecretNamespace, opts.SecretName, err)
	}
	return nil
}

// secretToDir writes the serving certificate from the Secret into CertDir
// whenever the Secret changes, as the kubelet does for a mounted Secret; the
// webhook server's certificate watcher then reloads it without a restart. Writing
// it here means the operator needs no Secret volume and works the same outside a
// pod (the local cluster, the tests), and a rotation is served within a second.
type secretToDir struct {
	cfg  manager.Manager
	opts Options
}

func (*secretToDir) NeedLeaderElection() bool { return false }

func (s *secretToDir) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("webhook-certs")
	c, err := cache.New(s.cfg.GetConfig(), cache.Options{
		Scheme:            s.cfg.GetScheme(),
		DefaultNamespaces: map[string]cache.Config{s.opts.SecretNamespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Field: fields.OneTermEqualSelector("metadata.name", s.opts.SecretName)},
		},
	})
	if err != nil {
		return err
	}
	informer, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return err
	}
	write := func(obj any) {
		secret, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		if err := writeCert(s.opts.CertDir, secret.Data); err != nil {
			log.Error(err, "Writing the webhook certificate", "dir", s.opts.CertDir)
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    write,
		UpdateFunc: func(_, obj any) { write(obj) },
	}); err != nil {
		return err
	}
	return c.Start(ctx)
}

// writeCert replaces tls.key and tls.crt, each by an atomic rename, key first:
// the watcher reloads on the certificate's change and then finds a matching key.
func writeCert(dir string, data map[string][]byte) error {
	crt, key := data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return nil // not issued yet
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return fmt.Errorf("the Secret holds a certificate and key that do not match: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{corev1.TLSPrivateKeyKey, key}, {corev1.TLSCertKey, crt}} {
		path := filepath.Join(dir, f.name)
		if old, err := os.ReadFile(path); err == nil && string(old) == string(f.data) {
			continue
		}
		tmp, err := os.CreateTemp(dir, "."+f.name+"-*")
		if err != nil {
			return err
		}
		if _, err := tmp.Write(f.data); err != nil {
			_ = tmp.Close()
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			return err
		}
	}
	return nil
}

// waitForFile closes ready once path exists.
func waitForFile(ctx context.Context, path string, ready chan struct{}) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			close(ready)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
