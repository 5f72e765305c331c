package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aiinference/operator/test/testutil"
)

// A Gateway API data plane for the cluster: Traefik (built by
// hack/tools/build.sh traefik) on the host, its kubernetesGateway provider
// watching the cluster with a ServiceAccount's token, a GatewayClass and one
// Gateway whose HTTP listener is a loopback port of the host. Traefik sends a
// route's requests to the ready endpoints of its backend Services (the pod IPs
// of their EndpointSlices, which the host routes to real nodes' pods), by the
// weights of the route's backendRefs.

// TraefikControllerName is the controllerName of Traefik's GatewayClasses.
const TraefikControllerName = "traefik.io/gateway-controller"

// GatewayOptions configure StartGateway. The zero value is the default gateway.
type GatewayOptions struct {
	// BinDir holds traefik. Empty: hack/tools/build.sh traefik builds it or finds
	// it in its cache (a cold build takes about 10 minutes on 2 cores).
	BinDir string
	// RepoRoot is the repository checkout, for the build and for the Gateway
	// API CRDs (those of the sigs.k8s.io/gateway-api version in its go.mod).
	// Empty: FindRepoRoot from the working directory.
	RepoRoot string
	// Namespace holds the Gateway and Traefik's ServiceAccount. Empty:
	// DefaultGatewayNamespace.
	Namespace string
	// Name is the Gateway's and the GatewayClass's name. Empty: DefaultGatewayName.
	Name string
}

// Defaults of GatewayOptions.
const (
	DefaultGatewayNamespace = "localcluster-gateway"
	DefaultGatewayName      = "traefik"
	// GatewayListenerName is the Gateway's one listener (HTTP), the sectionName
	// a route may name.
	GatewayListenerName = "http"
)

// Gateway is the cluster's running gateway.
type Gateway struct {
	// Namespace and Name are the Gateway's, which a route's parentRef names;
	// ClassName is its GatewayClass.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	ClassName string `json:"className"`
	// URL is the Gateway's HTTP listener on the host (loopback): requests there
	// go to the routes attached to the Gateway. Its port is the listener's.
	URL  string `json:"url"`
	Port int    `json:"port"`
	// APIURL is Traefik's API (read-only, on loopback): /api/http/services
	// shows the weights it applies, /ping its health.
	APIURL string `json:"apiURL"`
	// Kubeconfig is the ServiceAccount kubeconfig Traefik watches the cluster with.
	Kubeconfig string `json:"kubeconfig"`
	// Log and AccessLog are Traefik's logs (one access log line per request).
	Log       string `json:"log"`
	AccessLog string `json:"accessLog"`
}

// Gateway is the cluster's gateway, nil until StartGateway has started it.
func (c *Cluster) Gateway() *Gateway {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gateway
}

// gatewayCRDs are the Gateway API CRDs (standard channel) Traefik's provider
// watches: it fails to start without any of them.
var gatewayCRDs = []string{"gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies", "tlsroutes"}

// StartGateway installs the Gateway API CRDs (if missing), a GatewayClass and a
// Gateway for Traefik, and runs Traefik on the host until the cluster stops. It
// returns once Traefik has accepted the GatewayClass and programmed the Gateway.
// A second call returns the running gateway.
func (c *Cluster) StartGateway(ctx context.Context, opts GatewayOptions) (*Gateway, error) {
	if gw := c.Gateway(); gw != nil {
		return gw, nil
	}
	if opts.RepoRoot == "" {
		opts.RepoRoot = c.real.repoRoot
	}
	if opts.RepoRoot == "" {
		var err error
		if opts.RepoRoot, err = FindRepoRoot("."); err != nil {
			return nil, err
		}
	}
	opts.Namespace = cmpOr(opts.Namespace, DefaultGatewayNamespace)
	opts.Name = cmpOr(opts.Name, DefaultGatewayName)
	if opts.BinDir == "" {
		var err error
		fmt.Fprintln(c.progress, "Finding or building traefik (hack/tools/build.sh traefik)")
		if opts.BinDir, err = runBuildScript(ctx, opts.RepoRoot, "traefik", c.progress); err != nil {
			return nil, err
		}
	}
	traefik := filepath.Join(opts.BinDir, "traefik")
	if _, err := os.Stat(traefik); err != nil {
		return nil, fmt.Errorf("the gateway's binary: %w", err)
	}

	k8s, err := c.gatewayClient()
	if err != nil {
		return nil, err
	}
	if err := c.InstallGatewayAPI(ctx, opts.RepoRoot); err != nil {
		return nil, err
	}
	kubeconfig, err := c.gatewayKubeconfig(ctx, k8s, opts)
	if err != nil {
		return nil, err
	}

	p, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	gw := &Gateway{Namespace: opts.Namespace, Name: opts.Name, ClassName: opts.Name,
		URL: "http://127.0.0.1:" + strconv.Itoa(p[0]), Port: p[0], APIURL: "http://127.0.0.1:" + strconv.Itoa(p[1]),
		Kubeconfig: kubeconfig, Log: filepath.Join(c.logsDir, "traefik.log"), AccessLog: filepath.Join(c.logsDir, "traefik-access.log")}

	class := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: gw.ClassName},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: TraefikControllerName}}
	gateway := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: gw.Namespace, Name: gw.Name},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: gatewayv1.ObjectName(gw.ClassName), Listeners: []gatewayv1.Listener{{
			Name: GatewayListenerName, Protocol: gatewayv1.HTTPProtocolType, Port: gatewayv1.PortNumber(gw.Port),
			// Routes of every namespace attach: a model's route lives beside it.
			AllowedRoutes: &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromAll)}},
		}}}}
	for _, obj := range []client.Object{class, gateway} {
		if err := k8s.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	// A Gateway left from an earlier gateway of this cluster has another port.
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(gateway), gateway); err != nil {
		return nil, err
	}
	if gateway.Spec.Listeners[0].Port != gatewayv1.PortNumber(gw.Port) {
		gateway.Spec.Listeners[0].Port = gatewayv1.PortNumber(gw.Port)
		if err := k8s.Update(ctx, gateway); err != nil {
			return nil, err
		}
	}

	// Traefik reads KUBECONFIG; an in-cluster environment would win over it.
	env := []string{"KUBECONFIG=" + kubeconfig, "KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT="}
	if err := c.startEnv("traefik", traefik, env,
		// Nothing leaves the host: no update check, no usage report.
		"--global.checkNewVersion=false",
		"--global.sendAnonymousUsage=false",
		// The Gateway's listener port is the entry point's: Traefik matches them by port.
		"--entryPoints.web.address=127.0.0.1:"+strconv.Itoa(gw.Port),
		"--entryPoints.traefik.address=127.0.0.1:"+strconv.Itoa(p[1]),
		"--api.insecure=true",
		"--ping=true",
		"--providers.kubernetesGateway=true",
		"--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
		"--log.level=INFO",
		"--accessLog.filePath="+gw.AccessLog,
	); err != nil {
		return nil, err
	}
	if err := c.waitHTTP(ctx, "traefik", gw.APIURL+"/ping", nil); err != nil {
		return nil, err
	}
	if err := c.poll(ctx, "Traefik to accept GatewayClass "+class.Name+" and program Gateway "+gw.Namespace+"/"+gw.Name, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(class), class); err != nil {
			return false, err
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(gateway), gateway); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(class.Status.Conditions, string(gatewayv1.GatewayClassConditionStatusAccepted)) &&
			meta.IsStatusConditionTrue(gateway.Status.Conditions, string(gatewayv1.GatewayConditionProgrammed)), nil
	}); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gateway = gw
	fmt.Fprintf(c.progress, "Gateway %s/%s (Traefik) listening at %s\n", gw.Namespace, gw.Name, gw.URL)
	return gw, nil
}

// gatewayClient is a client for the objects a gateway needs.
func (c *Cluster) gatewayClient() (client.Client, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, rbacv1.AddToScheme, apiextensionsv1.AddToScheme, gatewayv1.Install} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return client.New(c.RESTConfig(), client.Options{Scheme: scheme})
}

// InstallGatewayAPI installs the Gateway API CRDs (standard channel, of the
// sigs.k8s.io/gateway-api version in repoRoot's go.mod) that the cluster lacks,
// and returns once the API server serves them. StartGateway does it too; a
// controller that caches which kinds the cluster serves (the operator keeps
// its answer for a minute) sees them at once when they come before it starts.
func (c *Cluster) InstallGatewayAPI(ctx context.Context, repoRoot string) error {
	k8s, err := c.gatewayClient()
	if err != nil {
		return err
	}
	fmt.Fprintln(c.progress, "Installing the Gateway API CRDs")
	if err := installGatewayCRDs(ctx, k8s, repoRoot); err != nil {
		return err
	}
	// Established comes before discovery lists the kinds.
	return c.poll(ctx, "the API server to serve the Gateway API", func(context.Context) (bool, error) {
		resources, err := c.client.Discovery().ServerResourcesForGroupVersion(gatewayv1.GroupVersion.String())
		if err != nil {
			return false, nil
		}
		served := 0
		for _, r := range resources.APIResources {
			if r.Name == "httproutes" || r.Name == "gateways" || r.Name == "gatewayclasses" {
				served++
			}
		}
		return served == 3, nil
	})
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// installGatewayCRDs creates the Gateway API CRDs the cluster lacks and waits
// until they are established.
func installGatewayCRDs(ctx context.Context, k8s client.Client, repoRoot string) error {
	dir, err := moduleDir(ctx, repoRoot, "sigs.k8s.io/gateway-api")
	if err != nil {
		return err
	}
	var files []string
	for _, plural := range gatewayCRDs {
		files = append(files, filepath.Join(dir, "config", "crd", "standard", "gateway.networking.k8s.io_"+plural+".yaml"))
	}
	return testutil.InstallCRDs(ctx, k8s, files...)
}

// moduleDir is where the Go module that repoRoot's go.mod requires is.
func moduleDir(ctx context.Context, repoRoot, module string) (string, error) {
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", module)
	list.Dir = repoRoot
	out, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("finding the %s module: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// gatewayClusterRole is what Traefik's kubernetesGateway provider reads and
// writes: it watches these kinds in every namespace (Secrets and ConfigMaps
// for a listener's certificates and a BackendTLSPolicy's CA) and writes the
// status of the Gateway API objects it serves. Nothing else.
var gatewayClusterRole = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"namespaces", "services", "secrets", "configmaps"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{gatewayv1.GroupName}, Resources: []string{"gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies", "tlsroutes", "tcproutes"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{gatewayv1.GroupName}, Resources: []string{"gatewayclasses/status", "gateways/status", "httproutes/status", "grpcroutes/status", "backendtlspolicies/status", "tlsroutes/status", "tcproutes/status"}, Verbs: []string{"update"}},
}

// gatewayTokenLifetime is how long Traefik's token lasts: longer than a
// cluster left running for a demo is expected to.
const gatewayTokenLifetime = 7 * 24 * time.Hour

// gatewayKubeconfig makes Traefik's ServiceAccount, its ClusterRole and
// binding, and a kubeconfig with a token of the ServiceAccount.
func (c *Cluster) gatewayKubeconfig(ctx context.Context, k8s client.Client, opts GatewayOptions) (string, error) {
	name := opts.Name + "-gateway"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.Namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "localcluster:" + name}, Rules: gatewayClusterRole},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "localcluster:" + name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "localcluster:" + name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: opts.Namespace, Name: name}}},
	}
	for _, obj := range objs {
		if err := k8s.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
	}
	token, err := c.client.CoreV1().ServiceAccounts(opts.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(gatewayTokenLifetime.Seconds()))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for %s/%s: %w", opts.Namespace, name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[contextName] = &clientcmdapi.Cluster{Server: c.restConfig.Host, CertificateAuthorityData: c.restConfig.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token.Status.Token}
	cfg.Contexts[contextName] = &clientcmdapi.Context{Cluster: contextName, AuthInfo: name}
	cfg.CurrentContext = contextName
	path := filepath.Join(c.dir, "traefik-kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// WeightedBackends are the backends of the weighted service Traefik built for
// a route rule whose backendRefs include the Service namespace/service, with
// the weights it applies now, by Service name (Traefik's
// /api/http/services). Empty when Traefik has no such service (yet).
func (g *Gateway) WeightedBackends(ctx context.Context, namespace, service string) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.APIURL+"/api/http/services?per_page=1000", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	var services []struct {
		Weighted *struct {
			Services []struct {
				Name   string `json:"name"`
				Weight *int   `json:"weight"`
			} `json:"services"`
		} `json:"weighted"`
	}
	if err := json.Unmarshal(body, &services); err != nil {
		return nil, fmt.Errorf("reading Traefik's services: %w", err)
	}
	// A backend service of a rule is named ROUTER-svc-NAMESPACE-NAME-INDEX.
	backend := func(name string) (string, bool) {
		i := strings.LastIndex(name, "-svc-"+namespace+"-")
		if i < 0 {
			return "", false
		}
		rest := strings.TrimSuffix(name[i+len("-svc-"+namespace+"-"):], "@kubernetesgateway")
		j := strings.LastIndex(rest, "-")
		if j < 0 {
			return "", false
		}
		return rest[:j], true
	}
	for _, s := range services {
		if s.Weighted == nil {
			continue
		}
		weights := map[string]int{}
		for _, child := range s.Weighted.Services {
			if name, ok := backend(child.Name); ok {
				weights[name] = ptr.Deref(child.Weight, 1)
			}
		}
		if _, ok := weights[service]; ok {
			return weights, nil
		}
	}
	return map[string]int{}, nil
}
