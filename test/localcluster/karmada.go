package localcluster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aiinference/operator/test/testutil"
)

// Karmada's control plane (github.com/karmada-io/karmada, built from its
// module by hack/tools/build.sh karmada) on the host, as the LeaderWorkerSet
// controller runs: its API server is a plain kube-apiserver with an etcd of its
// own (a local cluster with no nodes: Start with empty NodePools), holding
// Karmada's CRDs from the module's charts/karmada/_crds/bases. Beside it run,
// as host processes against it:
//   - karmada-aggregated-apiserver, which serves cluster.karmada.io (the
//     Cluster objects are no CRD), behind an APIService whose Service is an
//     ExternalName (localhost), as Karmada's own deployment has it
//     (artifacts/deploy/karmada-aggregated-apiserver-apiservice.yaml); the
//     API server reaches it through its aggregation layer (certs.go's front
//     proxy client certificate);
//   - karmada-webhook, registered with the module's
//     artifacts/deploy/webhook-configuration.yaml at the host's loopback
//     address: it defaults PropagationPolicies (the cluster tolerations that
//     failover reads, the permanent IDs of policies and bindings) as a real
//     Karmada does;
//   - karmada-controller-manager and karmada-scheduler (the scheduler without
//     the accurate estimator: it divides replicas by each member's resource
//     summary, the free allocatable the controller manager collects).
//
// The host cluster's own kube-controller-manager runs too (Karmada runs one
// for namespaces and garbage collection); its kube-scheduler and kwok have no
// node to act on. Members join in push mode (Join): the controller manager
// reaches each member's API server with the credentials `karmadactl join`
// writes.

// The Karmada binaries, as hack/tools/build.sh karmada names them.
const (
	karmadaControllerManagerBinary = "karmada-controller-manager"
	karmadaSchedulerBinary         = "karmada-scheduler"
	karmadaWebhookBinary           = "karmada-webhook"
	karmadaAggregatedAPIBinary     = "karmada-aggregated-apiserver"
	karmadaModule                  = "github.com/karmada-io/karmada"
)

// KarmadaClusterNamespace is where Join keeps a member's credentials on
// Karmada and on the member, as karmadactl join does (its default).
const KarmadaClusterNamespace = "karmada-cluster"

// karmadaSystemLabel marks the namespaces and objects Karmada owns, as
// karmadactl join labels them.
var karmadaSystemLabel = map[string]string{"karmada.io/system": "true"}

// ClusterGVK is Karmada's Cluster, served by karmada-aggregated-apiserver.
var ClusterGVK = schema.GroupVersionKind{Group: "cluster.karmada.io", Version: "v1alpha1", Kind: "Cluster"}

// KarmadaOptions configure StartKarmada.
type KarmadaOptions struct {
	// Cluster configures the API server's own local cluster; its NodePools are
	// ignored (none: Karmada's API server runs no pods).
	Cluster Options
	// BinDir holds the Karmada binaries; empty: hack/tools/build.sh karmada
	// builds or finds them.
	BinDir string
	// ControllerManagerArgs are added to karmada-controller-manager's flags
	// (after the usual ones, so they win), e.g. its failover settings.
	ControllerManagerArgs []string
	// SchedulerArgs are added to karmada-scheduler's flags.
	SchedulerArgs []string
}

// Karmada is a running Karmada control plane. Its embedded Cluster is its API
// server's: Kubeconfig, RESTConfig and LogsDir are Karmada's, and Stop stops
// every component.
type Karmada struct {
	*Cluster
	k8s client.Client
}

// StartKarmada starts a Karmada control plane and returns once its Cluster
// API answers and its controller manager and scheduler are healthy.
func StartKarmada(ctx context.Context, opts KarmadaOptions) (_ *Karmada, err error) {
	root := opts.Cluster.RepoRoot
	if root == "" {
		if root, err = FindRepoRoot("."); err != nil {
			return nil, err
		}
		opts.Cluster.RepoRoot = root
	}
	progress := opts.Cluster.Progress
	if opts.BinDir == "" {
		if progress != nil {
			fmt.Fprintln(progress, "Finding or building Karmada (hack/tools/build.sh karmada)")
		}
		if opts.BinDir, err = runBuildScript(ctx, root, "karmada", progress); err != nil {
			return nil, err
		}
	}
	for _, bin := range []string{karmadaControllerManagerBinary, karmadaSchedulerBinary, karmadaWebhookBinary, karmadaAggregatedAPIBinary} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("karmada's binary %s: %w", bin, err)
		}
	}
	module, err := KarmadaModuleDir(ctx, root)
	if err != nil {
		return nil, err
	}

	hostOpts := opts.Cluster
	hostOpts.NodePools = []NodePool{}
	host, err := Start(ctx, hostOpts)
	if err != nil {
		return nil, fmt.Errorf("starting Karmada's API server: %w", err)
	}
	k := &Karmada{Cluster: host}
	defer func() {
		if err != nil {
			err = fmt.Errorf("starting Karmada in %s: %w%s", host.dir, err, host.logTails(15))
			if stopErr := host.Stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()
	timeout := opts.Cluster.StartTimeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	if k.k8s, err = client.New(host.RESTConfig(), client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}

	fmt.Fprintln(host.progress, "Installing Karmada's CRDs")
	crds, err := yamlFilesUnder(filepath.Join(module, "charts", "karmada", "_crds", "bases"))
	if err != nil {
		return nil, err
	}
	if err := testutil.InstallCRDs(ctx, k.k8s, crds...); err != nil {
		return nil, fmt.Errorf("installing Karmada's CRDs: %w", err)
	}
	for _, ns := range []string{"karmada-system", KarmadaClusterNamespace} {
		if err := ensureNamespace(ctx, k.k8s, ns); err != nil {
			return nil, err
		}
	}

	dir := filepath.Join(host.dir, "karmada")
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	// The API server checks the aggregated API server's certificate against
	// the name of its Service (NAME.NAMESPACE.svc), whatever address the
	// Service leads to.
	caBundle, err := writeLoopbackServingCert(certDir, "karmada-aggregated-apiserver.karmada-system.svc")
	if err != nil {
		return nil, err
	}
	p, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	aggregatedPort, webhookPort, cmHealth, cmMetrics, schedHealth, schedMetrics := p[0], p[1], p[2], p[3], p[4], p[5]
	kubeconfig := "--kubeconfig=" + host.kubeconfig

	// The aggregated API server: the Cluster objects, in the same etcd.
	if err := host.start(karmadaAggregatedAPIBinary, filepath.Join(opts.BinDir, karmadaAggregatedAPIBinary),
		kubeconfig,
		"--authentication-kubeconfig="+host.kubeconfig,
		"--authorization-kubeconfig="+host.kubeconfig,
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(host.ports.etcdClient),
		"--tls-cert-file="+filepath.Join(certDir, "tls.crt"),
		"--tls-private-key-file="+filepath.Join(certDir, "tls.key"),
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(aggregatedPort),
		"--audit-log-path=-", "--audit-log-maxage=0", "--audit-log-maxbackup=0",
	); err != nil {
		return nil, err
	}
	if err := k.applyAggregatedAPIService(ctx, module, aggregatedPort, caBundle); err != nil {
		return nil, err
	}
	if err := host.poll(ctx, "Karmada's Cluster API", func(ctx context.Context) (bool, error) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(ClusterGVK.GroupVersion().WithKind("ClusterList"))
		err := k.k8s.List(ctx, list)
		return err == nil, err
	}); err != nil {
		return nil, err
	}

	// The webhook, at the host's loopback address.
	if err := host.start(karmadaWebhookBinary, filepath.Join(opts.BinDir, karmadaWebhookBinary),
		kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(webhookPort),
		"--cert-dir="+certDir,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--allow-no-execute-taint-policy=true",
	); err != nil {
		return nil, err
	}
	if err := k.applyWebhookConfiguration(ctx, module, webhookPort, caBundle); err != nil {
		return nil, err
	}
	// Its probe endpoint has no check to answer; a dry-run PropagationPolicy
	// goes through its mutating and validating webhooks.
	if err := host.poll(ctx, "Karmada's webhooks", func(ctx context.Context) (bool, error) {
		probe := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "policy.karmada.io/v1alpha1", "kind": "PropagationPolicy",
			"metadata": map[string]any{"namespace": "karmada-system", "name": "webhook-probe"},
			"spec":     map[string]any{"resourceSelectors": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}},
		}}
		err := k.k8s.Create(ctx, probe, client.DryRunAll)
		if apierrors.IsInvalid(err) {
			return false, fmt.Errorf("the PropagationPolicy probe: %w", err) // no wait mends it
		}
		return err == nil, err
	}); err != nil {
		return nil, err
	}

	// The controller manager and the scheduler.
	if err := host.start(karmadaControllerManagerBinary, filepath.Join(opts.BinDir, karmadaControllerManagerBinary), append([]string{
		kubeconfig,
		"--leader-elect=false",
		"--cluster-status-update-frequency=5s",
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(cmMetrics),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(cmHealth),
		"--enable-no-execute-taint-eviction=true",
	}, opts.ControllerManagerArgs...)...); err != nil {
		return nil, err
	}
	if err := host.start(karmadaSchedulerBinary, filepath.Join(opts.BinDir, karmadaSchedulerBinary), append([]string{
		kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(schedMetrics),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(schedHealth),
	}, opts.SchedulerArgs...)...); err != nil {
		return nil, err
	}
	if err := host.waitHTTP(ctx, karmadaControllerManagerBinary, "http://127.0.0.1:"+strconv.Itoa(cmHealth)+"/healthz", nil); err != nil {
		return nil, err
	}
	if err := host.waitHTTP(ctx, karmadaSchedulerBinary, "http://127.0.0.1:"+strconv.Itoa(schedHealth)+"/healthz", nil); err != nil {
		return nil, err
	}
	fmt.Fprintf(host.progress, "Karmada ready: export KUBECONFIG=%s\n", host.kubeconfig)
	return k, nil
}

// applyAggregatedAPIService registers the Cluster API as Karmada's deployment
// does, its Service an ExternalName pointing at localhost on the aggregated
// API server's port.
func (k *Karmada) applyAggregatedAPIService(ctx context.Context, module string, port int, caBundle []byte) error {
	objs, err := readKarmadaArtifact(module, "karmada-aggregated-apiserver-apiservice.yaml", caBundle, "")
	if err != nil {
		return err
	}
	for _, obj := range objs {
		switch obj.GetKind() {
		case "Service":
			if err := unstructured.SetNestedField(obj.Object, "localhost", "spec", "externalName"); err != nil {
				return err
			}
		case "APIService":
			if err := unstructured.SetNestedField(obj.Object, int64(port), "spec", "service", "port"); err != nil {
				return err
			}
		}
		if err := k.apply(ctx, obj); err != nil {
			return fmt.Errorf("registering Karmada's Cluster API: %w", err)
		}
	}
	return nil
}

// applyWebhookConfiguration registers Karmada's webhooks from its deployment's
// configuration, at the host's loopback address.
func (k *Karmada) applyWebhookConfiguration(ctx context.Context, module string, port int, caBundle []byte) error {
	objs, err := readKarmadaArtifact(module, "webhook-configuration.yaml", caBundle, "https://127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := k.apply(ctx, obj); err != nil {
			return fmt.Errorf("registering Karmada's webhooks: %w", err)
		}
	}
	return nil
}

// readKarmadaArtifact reads one of the module's artifacts/deploy manifests
// with its {{caBundle}} filled in and, when webhookURL is set, the webhook
// Service's address replaced by it.
func readKarmadaArtifact(module, name string, caBundle []byte, webhookURL string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(filepath.Join(module, "artifacts", "deploy", name))
	if err != nil {
		return nil, err
	}
	text := strings.ReplaceAll(string(data), "{{caBundle}}", base64.StdEncoding.EncodeToString(caBundle))
	if webhookURL != "" {
		text = strings.ReplaceAll(text, "https://karmada-webhook.karmada-system.svc:443", webhookURL)
	}
	if strings.Contains(text, "{{") {
		return nil, fmt.Errorf("%s: a placeholder is left: %s", name, text[strings.Index(text, "{{"):][:40])
	}
	var objs []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(text), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := decoder.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// apply creates obj or replaces what its fields say (server-side apply).
func (k *Karmada) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	obj.SetManagedFields(nil)
	return k.k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("localcluster"), client.ForceOwnership)
}

// Client is a controller-runtime client of Karmada's API server (unstructured
// for Karmada's own kinds).
func (k *Karmada) Client() client.Client { return k.k8s }

// Join joins member to Karmada as name in push mode, writing what `karmadactl
// join` writes (pkg/karmadactl/join and pkg/util/credential.go of the module):
// on the member, the namespace karmada-cluster, a ServiceAccount karmada-NAME
// bound to a ClusterRole of every permission, and one karmada-impersonator,
// each with a token Secret; on Karmada, the Secret NAME (the member's CA and
// the token) and NAME-impersonator, and the Cluster NAME (sync mode Push, the
// member's API endpoint, its kube-system namespace's UID as its ID), which
// owns both Secrets. It returns once the Cluster is Ready.
func (k *Karmada) Join(ctx context.Context, name string, member *Cluster) error {
	memberClient, err := client.New(member.RESTConfig(), client.Options{Scheme: k.k8s.Scheme()})
	if err != nil {
		return err
	}
	kubeSystem := &corev1.Namespace{}
	if err := memberClient.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, kubeSystem); err != nil {
		return fmt.Errorf("reading the member's cluster ID: %w", err)
	}
	if err := ensureNamespace(ctx, memberClient, KarmadaClusterNamespace); err != nil {
		return err
	}
	impersonator, err := serviceAccountToken(ctx, member, memberClient, "karmada-impersonator")
	if err != nil {
		return err
	}
	saName := "karmada-" + name
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "karmada-controller-manager:" + saName, Labels: karmadaSystemLabel},
		Rules: []rbacv1.PolicyRule{
			{Verbs: []string{rbacv1.VerbAll}, APIGroups: []string{rbacv1.APIGroupAll}, Resources: []string{rbacv1.ResourceAll}},
			{NonResourceURLs: []string{rbacv1.NonResourceAll}, Verbs: []string{"get"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Labels: karmadaSystemLabel},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: saName, Namespace: KarmadaClusterNamespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := memberClient.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("joining %s: %w", name, err)
		}
	}
	credentials, err := serviceAccountToken(ctx, member, memberClient, saName)
	if err != nil {
		return err
	}

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: name, Labels: karmadaSystemLabel},
		Data:       map[string][]byte{"caBundle": credentials.Data["ca.crt"], "token": credentials.Data["token"]},
	}
	impersonatorSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: name + "-impersonator", Labels: karmadaSystemLabel},
		Data:       map[string][]byte{"token": impersonator.Data["token"]},
	}
	for _, s := range []*corev1.Secret{secret, impersonatorSecret} {
		if err := k.k8s.Create(ctx, s); err != nil {
			return fmt.Errorf("joining %s: %w", name, err)
		}
	}
	cluster := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"syncMode":              "Push",
			"apiEndpoint":           member.APIServerURL(),
			"id":                    string(kubeSystem.UID),
			"secretRef":             map[string]any{"namespace": KarmadaClusterNamespace, "name": secret.Name},
			"impersonatorSecretRef": map[string]any{"namespace": KarmadaClusterNamespace, "name": impersonatorSecret.Name},
		},
	}}
	cluster.SetGroupVersionKind(ClusterGVK)
	if err := k.k8s.Create(ctx, cluster); err != nil {
		return fmt.Errorf("joining %s: creating its Cluster: %w", name, err)
	}
	owner := metav1.NewControllerRef(cluster, ClusterGVK)
	for _, s := range []*corev1.Secret{secret, impersonatorSecret} {
		patch := client.MergeFrom(s.DeepCopy())
		s.OwnerReferences = []metav1.OwnerReference{*owner}
		if err := k.k8s.Patch(ctx, s, patch); err != nil {
			return fmt.Errorf("joining %s: %w", name, err)
		}
	}
	fmt.Fprintf(k.progress, "Joined %s (%s); waiting for it to be Ready\n", name, member.APIServerURL())
	return k.poll(ctx, "the Cluster "+name+" to be Ready", func(ctx context.Context) (bool, error) {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(ClusterGVK)
		if err := k.k8s.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
			return false, err
		}
		conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conditions {
			c, _ := c.(map[string]any)
			if c["type"] == "Ready" {
				if c["status"] == "True" {
					return true, nil
				}
				return false, fmt.Errorf("Ready %v: %v: %v", c["status"], c["reason"], c["message"])
			}
		}
		return false, nil
	})
}

// serviceAccountToken makes the ServiceAccount name in karmada-cluster and
// its token Secret, as karmadactl join does, and returns the Secret once the
// token controller has filled it.
func serviceAccountToken(ctx context.Context, member *Cluster, k8s client.Client, name string) (*corev1.Secret, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: name, Labels: karmadaSystemLabel}}
	if err := k8s.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: KarmadaClusterNamespace, Name: name,
			Annotations: map[string]string{corev1.ServiceAccountNameKey: name}},
		Type: corev1.SecretTypeServiceAccountToken,
	}
	if err := k8s.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	err := member.poll(ctx, "the token of "+name, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(secret), secret); err != nil {
			return false, err
		}
		return len(secret.Data["token"]) > 0 && len(secret.Data["ca.crt"]) > 0, nil
	})
	return secret, err
}

func ensureNamespace(ctx context.Context, k8s client.Client, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: karmadaSystemLabel}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the namespace %s: %w", name, err)
	}
	return nil
}

// KarmadaModuleDir is the folder of the Karmada module that hack/tools/karmada
// requires (its CRDs and deployment manifests).
func KarmadaModuleDir(ctx context.Context, repoRoot string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", karmadaModule)
	cmd.Dir = filepath.Join(repoRoot, "hack", "tools", "karmada")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding Karmada's module (go mod download in %s): %w", cmd.Dir, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("finding Karmada's module: %v: %s", err, out)
	}
	return mod.Dir, nil
}

// yamlFilesUnder lists the YAML files under dir, in lexical order.
func yamlFilesUnder(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") {
			files = append(files, path)
		}
		return err
	})
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no CRDs under %s", dir)
	}
	return files, err
}
