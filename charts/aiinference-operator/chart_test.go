// Package chart tests the Helm chart with helm v4 built from its Go module
// (hack/tools/build.sh helm): lint, rendering with every option, the values
// schema, and that its default rendering is config/default's objects.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/nodecachespec"
	"github.com/aiinference/operator/internal/version"
	"github.com/aiinference/operator/test/testutil"
)

func tools(t *testing.T) (helm, kubectl, root string) {
	t.Helper()
	dir, err := testutil.BuildTools("helm")
	if err != nil {
		t.Fatal(err)
	}
	assets, err := testutil.EnvtestAssets()
	if err != nil {
		t.Fatal(err)
	}
	root, err = testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "helm"), filepath.Join(assets, "kubectl"), root
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// objects parses a multi-document YAML stream into kind/namespace/name -> object.
func objects(t *testing.T, stream string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range strings.Split(stream, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if obj == nil {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		key := fmt.Sprintf("%s %v/%v", obj["kind"], meta["namespace"], meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = obj
	}
	return out
}

// rulesAsPermissions compares RBAC rules by what they grant (each group,
// resource and verb), not by how they are grouped: controller-gen joins
// resources that share verbs into one rule, the chart keeps a namespaced
// workload's rules apart from the cluster-wide ones.
var rulesAsPermissions = cmp.FilterPath(func(p cmp.Path) bool {
	mi, ok := p.Last().(cmp.MapIndex)
	return ok && mi.Key().String() == "rules"
}, cmp.Transformer("permissions", func(rules any) []string {
	var out []string
	list, _ := rules.([]any)
	for _, r := range list {
		rule, _ := r.(map[string]any)
		groups := strs(rule["apiGroups"])
		if len(groups) == 0 {
			groups = []string{"-"} // a nonResourceURLs rule
		}
		for _, group := range groups {
			for _, resource := range append(strs(rule["resources"]), strs(rule["nonResourceURLs"])...) {
				for _, verb := range strs(rule["verbs"]) {
					out = append(out, fmt.Sprintf("%s %s %s %v", group, resource, verb, strs(rule["resourceNames"])))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}))

func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func TestHelmLint(t *testing.T) {
	helm, _, root := tools(t)
	chart := filepath.Join(root, "charts", "aiinference-operator")
	for _, set := range [][]string{
		nil,
		{"--set", "watchNamespaces={team-a,team-b}", "--set", "webhook.enabled=false"},
		{"--set", "webhook.certManager.enabled=true", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
			"--set", "metrics.prometheusRule.enabled=true", "--set", "podDisruptionBudget.enabled=true",
			"--set", "priorityClassName=system-cluster-critical", "--set", "nodeSelector.pool=system", "--set", "leaderElection.leaseDuration=30s"},
	} {
		out, err := run(t, helm, append([]string{"lint", "--strict", chart}, set...)...)
		t.Logf("helm lint %v:\n%s", set, out)
		if err != nil {
			t.Error(err)
		}
	}
	// The schema refuses what the operator could not run with.
	for _, bad := range []string{"replicas=-1", "image.pullPolicy=Sometimes", "leaderElection.leaseDuration=soon", "unknownValue=1", "metrics.podMonitor.interval=often"} {
		if out, err := run(t, helm, "template", "x", chart, "--set", bad); err == nil {
			t.Errorf("--set %s rendered:\n%.300s", bad, out)
		}
	}
}

// TestChartMatchesKustomize: `helm template` with the default values, in the
// namespace config/default uses, gives config/default's objects, but for the
// Namespace (helm install --create-namespace makes it) and the CRD's keep policy.
func TestChartMatchesKustomize(t *testing.T) {
	helm, kubectl, root := tools(t)
	rendered, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"), "--namespace", "aiinference-system")
	if err != nil {
		t.Fatal(err)
	}
	built, err := run(t, kubectl, "kustomize", filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	chart, kustomize := objects(t, rendered), objects(t, built)
	delete(kustomize, "Namespace <nil>/aiinference-system")
	crd := chart["CustomResourceDefinition <nil>/aiinferences.serving.aiinference.io"]
	if crd == nil {
		t.Fatal("the chart renders no CRD")
	}
	annotations := crd["metadata"].(map[string]any)["annotations"].(map[string]any)
	if annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD without the keep policy: %v", annotations)
	}
	delete(annotations, "helm.sh/resource-policy")
	if diff := cmp.Diff(kustomize, chart, rulesAsPermissions); diff != "" {
		t.Errorf("config/default (-) and the chart's default rendering (+) differ:\n%s", diff)
	}
	dep := chart["Deployment aiinference-system/aiinference-controller-manager"]
	image := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["image"]
	if image != version.OperatorImage() {
		t.Errorf("the chart's image is %v, want %s", image, version.OperatorImage())
	}
	t.Logf("%d objects, the same in both", len(chart))
}

// TestChartNamespaceMode: with watchNamespaces, a Role and RoleBinding per
// namespace and no ClusterRole that reaches AIInference objects or Secrets.
func TestChartNamespaceMode(t *testing.T) {
	helm, _, root := tools(t)
	rendered, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"), "--namespace", "ops",
		"--set", "watchNamespaces={team-a,team-b}", "--set", "webhook.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, rendered)
	for _, ns := range []string{"team-a", "team-b"} {
		for _, kind := range []string{"Role", "RoleBinding"} {
			if objs[kind+" "+ns+"/aiinference-manager"] == nil {
				t.Errorf("no %s in %s", kind, ns)
			}
		}
	}
	for key := range objs {
		if strings.HasPrefix(key, "ClusterRole <nil>/aiinference-manager-role") {
			t.Errorf("namespace mode renders %s", key)
		}
	}
	if !strings.Contains(rendered, "--watch-namespaces=team-a,team-b") {
		t.Error("the operator is not told which namespaces to watch")
	}
}

// TestChartMetricsSecurity: the operator serves its metrics over HTTPS with
// authentication unless metrics.secure is false, which the chart must say in so
// many words (plain HTTP is no longer the operator's default), and the
// ServiceMonitor scrapes as the operator serves.
func TestChartMetricsSecurity(t *testing.T) {
	helm, _, root := tools(t)
	chart := filepath.Join(root, "charts", "aiinference-operator")
	for _, tc := range []struct {
		secure     string
		wantArg    string
		wantScheme any
	}{
		{"true", "--metrics-secure", "https"},
		{"false", "--metrics-secure=false", nil},
	} {
		rendered, err := run(t, helm, "template", "aiinference", chart, "--namespace", "aiinference-system",
			"--set", "metrics.secure="+tc.secure, "--set", "metrics.serviceMonitor.enabled=true")
		if err != nil {
			t.Fatal(err)
		}
		objs := objects(t, rendered)
		dep := objs["Deployment aiinference-system/aiinference-controller-manager"]
		container := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		var metricsArgs []string
		found := false
		for _, a := range container["args"].([]any) {
			if s := a.(string); strings.HasPrefix(s, "--metrics-") {
				metricsArgs = append(metricsArgs, s)
				found = found || s == tc.wantArg
			}
		}
		if !found {
			t.Errorf("metrics.secure=%s: the operator's metrics flags are %v, want %s among them", tc.secure, metricsArgs, tc.wantArg)
		}
		monitor := objs["ServiceMonitor aiinference-system/aiinference-controller-manager"]
		endpoint := monitor["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
		if endpoint["scheme"] != tc.wantScheme {
			t.Errorf("metrics.secure=%s: the ServiceMonitor scrapes with scheme %v, want %v", tc.secure, endpoint["scheme"], tc.wantScheme)
		}
	}
}

// kustomizeDefaultWith builds config/default with more of config/'s components
// after its own, as its kustomization.yaml says to add them.
func kustomizeDefaultWith(t *testing.T, kubectl, root string, components ...string) string {
	t.Helper()
	dir := t.TempDir()
	config, err := filepath.Rel(dir, filepath.Join(root, "config"))
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := os.ReadFile(filepath.Join(root, "config", "default", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(defaults)), "- ../webhook") {
		t.Fatalf("config/default/kustomization.yaml no longer ends with its components list; adapt this test:\n%s", defaults)
	}
	kustomization := strings.ReplaceAll(string(defaults), "../", config+"/")
	for _, c := range components {
		kustomization += "  - " + config + "/" + c + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	built, err := run(t, kubectl, "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	return built
}

// TestChartMatchesKustomizeWithRouter: with router.enabled, the chart gives
// config/default's objects with config/router added, and its router runs the
// image of this version; off by default.
func TestChartMatchesKustomizeWithRouter(t *testing.T) {
	helm, kubectl, root := tools(t)
	chartDir := filepath.Join(root, "charts", "aiinference-operator")
	rendered, err := run(t, helm, "template", "aiinference", chartDir, "--namespace", "aiinference-system", "--set", "router.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	chart, kustomize := objects(t, rendered), objects(t, kustomizeDefaultWith(t, kubectl, root, "router"))
	delete(kustomize, "Namespace <nil>/aiinference-system")
	delete(chart["CustomResourceDefinition <nil>/aiinferences.serving.aiinference.io"]["metadata"].(map[string]any)["annotations"].(map[string]any), "helm.sh/resource-policy")
	router := chart["Deployment aiinference-system/aiinference-router"]
	if router == nil {
		t.Fatal("the chart renders no Deployment aiinference-system/aiinference-router")
	}
	container := router["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if container["image"] != version.RouterImage() {
		t.Errorf("the router's image is %v, want %s", container["image"], version.RouterImage())
	}
	if diff := cmp.Diff(kustomize, chart, rulesAsPermissions); diff != "" {
		t.Errorf("config/default with config/router (-) and the chart with router.enabled (+) differ:\n%s", diff)
	}
	defaults, err := run(t, helm, "template", "aiinference", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(defaults, "aiinference-router") {
		t.Error("the chart renders the router by default")
	}
}

// TestChartMatchesKustomizeWithPrometheus: with the metrics Service,
// ServiceMonitor, PodMonitor and PrometheusRule on, the chart gives
// config/default's objects with config/prometheus added: the same scrapes and the
// same alerts (the chart reads them from its copies in files/, which `make
// manifests` refreshes).
func TestChartMatchesKustomizeWithPrometheus(t *testing.T) {
	helm, kubectl, root := tools(t)
	rendered, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"), "--namespace", "aiinference-system",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	chart, kustomize := objects(t, rendered), objects(t, kustomizeDefaultWith(t, kubectl, root, "prometheus"))
	delete(kustomize, "Namespace <nil>/aiinference-system")
	delete(chart["CustomResourceDefinition <nil>/aiinferences.serving.aiinference.io"]["metadata"].(map[string]any)["annotations"].(map[string]any), "helm.sh/resource-policy")
	for _, key := range []string{"Service aiinference-system/aiinference-controller-manager-metrics", "ServiceMonitor aiinference-system/aiinference-controller-manager",
		"PodMonitor aiinference-system/aiinference-engines", "PrometheusRule aiinference-system/aiinference-alerts"} {
		if chart[key] == nil {
			t.Errorf("the chart renders no %s", key)
		}
	}
	if diff := cmp.Diff(kustomize, chart, rulesAsPermissions); diff != "" {
		t.Errorf("config/default with config/prometheus (-) and the chart with its monitoring on (+) differ (after editing config/prometheus, run make manifests):\n%s", diff)
	}
	// Off by default, and the alerts refuse to come without the operator's scrapes.
	defaults, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		if strings.Contains(defaults, "kind: "+kind+"\n") {
			t.Errorf("the default rendering has a %s", kind)
		}
	}
	if out, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"), "--set", "metrics.prometheusRule.enabled=true"); err == nil ||
		!strings.Contains(out, "needs metrics.serviceMonitor.enabled") {
		t.Errorf("prometheusRule without serviceMonitor: %v\n%.300s", err, out)
	}
	t.Logf("%d objects, the same in both", len(chart))
}

// TestChartMatchesKustomizeInCertManagerMode: with webhook.certManager.enabled,
// the chart gives config/default's objects with the ../certmanager component
// added (as config/default says to), and neither grants what only the
// self-managed certificate needs: no Secret in the operator's namespace, no
// update of any CRD or webhook configuration.
func TestChartMatchesKustomizeInCertManagerMode(t *testing.T) {
	helm, kubectl, root := tools(t)
	rendered, err := run(t, helm, "template", "aiinference", filepath.Join(root, "charts", "aiinference-operator"),
		"--namespace", "aiinference-system", "--set", "webhook.certManager.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	chart, kustomize := objects(t, rendered), objects(t, kustomizeDefaultWith(t, kubectl, root, "certmanager"))
	delete(kustomize, "Namespace <nil>/aiinference-system")
	delete(chart["CustomResourceDefinition <nil>/aiinferences.serving.aiinference.io"]["metadata"].(map[string]any)["annotations"].(map[string]any), "helm.sh/resource-policy")
	if diff := cmp.Diff(kustomize, chart, rulesAsPermissions); diff != "" {
		t.Errorf("config/default with config/certmanager (-) and the chart in cert-manager mode (+) differ:\n%s", diff)
	}
	for key, obj := range chart {
		rules, _ := obj["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			text := fmt.Sprint(rule)
			if strings.Contains(text, "secrets") && strings.Contains(key, "Role aiinference-system/") && !strings.Contains(key, "ClusterRole") {
				t.Errorf("%s grants %v in the operator's namespace; cert-manager keeps the certificate", key, rule)
			}
			if (strings.Contains(text, "customresourcedefinitions") || strings.Contains(text, "webhookconfigurations")) && strings.Contains(text, "update") {
				t.Errorf("%s grants %v; cert-manager's CA injector fills the CA bundles", key, rule)
			}
		}
	}
	t.Logf("%d objects, the same in both", len(chart))
}

// TestNoRoleReadsUsersSecrets: the operator may not read users' Secrets, in any
// install mode (the kubelet reads the credentials Secret an AIInference names,
// and the pod's status says when it is missing). The one rule on Secrets is the
// self-managed webhook certificate's, in a Role of the operator's own namespace.
func TestNoRoleReadsUsersSecrets(t *testing.T) {
	helm, kubectl, root := tools(t)
	chart := filepath.Join(root, "charts", "aiinference-operator")
	render := func(args ...string) string {
		t.Helper()
		out, err := run(t, helm, append([]string{"template", "aiinference", chart}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	kustomize, err := run(t, kubectl, "kustomize", filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	namespaced, err := os.ReadFile(filepath.Join(root, "config", "namespaced", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		stream string
		want   []string // the roles with a rule on Secrets
	}{
		{"config/default", kustomize, []string{"Role aiinference-system/aiinference-webhook-cert-role"}},
		{"config/namespaced", string(namespaced), nil},
		{"the chart", render("--namespace", "aiinference-system"), []string{"Role aiinference-system/aiinference-webhook-cert-role"}},
		{"the chart, cert-manager", render("--namespace", "aiinference-system", "--set", "webhook.certManager.enabled=true"), nil},
		{"the chart, namespace mode", render("--namespace", "ops", "--set", "watchNamespaces={team-a,team-b}"), []string{"Role ops/aiinference-webhook-cert-role"}},
		{"the chart, model cache", render("--namespace", "aiinference-system", "--set", "modelCache.enabled=true"), []string{"Role aiinference-system/aiinference-webhook-cert-role"}},
		{"the chart, namespace mode without webhooks", render("--namespace", "ops", "--set", "watchNamespaces={team-a,team-b}", "--set", "webhook.enabled=false"), nil},
	} {
		var got []string
		roles := 0
		for key, obj := range objects(t, tt.stream) {
			if obj["kind"] != "Role" && obj["kind"] != "ClusterRole" {
				continue
			}
			roles++
			rules, _ := obj["rules"].([]any)
			for _, r := range rules {
				rule, _ := r.(map[string]any)
				groups, _ := rule["apiGroups"].([]any)
				resources, _ := rule["resources"].([]any)
				core := false
				for _, g := range groups {
					core = core || g == "" || g == "*"
				}
				for _, res := range resources {
					if core && (res == "secrets" || res == "*") {
						got = append(got, key)
					}
				}
			}
		}
		slices.Sort(got)
		got = slices.Compact(got)
		if roles == 0 {
			t.Errorf("%s: no Role or ClusterRole rendered; the test would prove nothing", tt.name)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: the roles with a rule on Secrets are %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestChartModelCache: modelCache.enabled renders the node cache's CSIDriver
// (the driver name the operator writes into the pods' volumes) and a DaemonSet
// whose one path setting is the same on the host and in the container (the
// lesson of KServe's LocalModelCache, where two settings drifted apart and
// downloads repeated forever); it is off by default, and the schema refuses a
// relative path or a budget that is no quantity.
func TestChartModelCache(t *testing.T) {
	helm, _, root := tools(t)
	chart := filepath.Join(root, "charts", "aiinference-operator")
	off, err := run(t, helm, "template", "aiinference", chart, "--namespace", "ops")
	if err != nil {
		t.Fatal(err)
	}
	for key := range objects(t, off) {
		if strings.HasPrefix(key, "CSIDriver ") || strings.HasPrefix(key, "DaemonSet ") {
			t.Errorf("rendered by default: %s", key)
		}
	}
	on, err := run(t, helm, "template", "aiinference", chart, "--namespace", "ops",
		"--set", "modelCache.enabled=true", "--set", "modelCache.path=/mnt/nvme/models", "--set", "modelCache.budget=2Ti",
		"--set", "metrics.podMonitor.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, on)
	if objs["CSIDriver <nil>/"+nodecachespec.DriverName] == nil {
		t.Errorf("no CSIDriver %s", nodecachespec.DriverName)
	}
	if objs["PodMonitor ops/aiinference-model-cache"] == nil {
		t.Error("no PodMonitor for the cache's metrics")
	}
	ds := objs["DaemonSet ops/aiinference-model-cache"]
	if ds == nil {
		t.Fatal("no DaemonSet ops/aiinference-model-cache")
	}
	var parsed struct {
		Spec struct {
			Template struct {
				Spec corev1.PodSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	data, err := yaml.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &parsed); err != nil {
		t.Fatal(err)
	}
	pod := parsed.Spec.Template.Spec
	c := pod.Containers[0]
	for _, arg := range []string{"node-cache", "--cache-dir=/mnt/nvme/models", "--budget=2Ti"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %v lack %s", c.Args, arg)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, m := range c.VolumeMounts {
		if hostPaths[m.Name] != m.MountPath {
			t.Errorf("volume %s: host path %q mounted at %q: the paths must be the same", m.Name, hostPaths[m.Name], m.MountPath)
		}
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v: the plugin must run on the GPU nodes, whatever their taints", pod.Tolerations)
	}
	if hostPaths["cache"] != "/mnt/nvme/models" {
		t.Errorf("the cache's host path is %q", hostPaths["cache"])
	}
	for _, bad := range []string{"modelCache.path=models", "modelCache.budget=lots", "modelCache.size=1Gi"} {
		if out, err := run(t, helm, "template", "x", chart, "--set", "modelCache.enabled=true", "--set", bad); err == nil {
			t.Errorf("--set %s rendered:\n%.300s", bad, out)
		}
	}
}

// TestChartRouterNetworkPolicy: with the router, a NetworkPolicy on its pods
// by default that opens the requests port to every client and the metrics
// port only to the operator's pods, the namespaces of
// router.networkPolicy.metrics.namespaceSelector and its ipBlocks; an empty
// selector admits no namespace (a namespaceSelector of {} would admit every
// one); router.networkPolicy.enabled=false renders none, and the schema
// refuses an ipBlock that is no CIDR.
func TestChartRouterNetworkPolicy(t *testing.T) {
	helm, _, root := tools(t)
	chart := filepath.Join(root, "charts", "aiinference-operator")
	const key = "NetworkPolicy ops/aiinference-router"
	render := func(set ...string) map[string]map[string]any {
		t.Helper()
		args := []string{"template", "aiinference", chart, "--namespace", "ops", "--set", "router.enabled=true"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := run(t, helm, args...)
		if err != nil {
			t.Fatal(err)
		}
		return objects(t, out)
	}
	// policy parses the rendered policy's spec.
	policy := func(objs map[string]map[string]any) *networkingv1.NetworkPolicySpec {
		t.Helper()
		obj := objs[key]
		if obj == nil {
			t.Fatalf("no %s", key)
		}
		data, err := yaml.Marshal(obj["spec"])
		if err != nil {
			t.Fatal(err)
		}
		spec := &networkingv1.NetworkPolicySpec{}
		if err := yaml.UnmarshalStrict(data, spec); err != nil {
			t.Fatal(err)
		}
		return spec
	}
	// portRule is the ingress rule of one port.
	portRule := func(spec *networkingv1.NetworkPolicySpec, port int) networkingv1.NetworkPolicyIngressRule {
		t.Helper()
		var found []networkingv1.NetworkPolicyIngressRule
		for _, r := range spec.Ingress {
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.IntValue() == port {
					found = append(found, r)
				}
			}
		}
		if len(found) != 1 {
			t.Fatalf("port %d is in %d ingress rules, want 1: %+v", port, len(found), spec.Ingress)
		}
		return found[0]
	}
	operator := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "aiinference-operator"}}}

	spec := policy(render())
	if diff := cmp.Diff(metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "aiinference-router"}}, spec.PodSelector); diff != "" {
		t.Errorf("the policy's pods (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, spec.PolicyTypes); diff != "" {
		t.Errorf("policyTypes (-want +got):\n%s", diff)
	}
	if requests := portRule(spec, 8080); len(requests.From) != 0 {
		t.Errorf("the requests port admits only %+v, want every client", requests.From)
	}
	monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	if diff := cmp.Diff([]networkingv1.NetworkPolicyPeer{operator, monitoring}, portRule(spec, 9090).From); diff != "" {
		t.Errorf("the metrics port's peers by default (-want +got):\n%s", diff)
	}

	spec = policy(render("router.networkPolicy.metrics.namespaceSelector.matchLabels.team=observability",
		"router.networkPolicy.metrics.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=null",
		"router.networkPolicy.metrics.ipBlocks[0].cidr=10.0.0.10/32"))
	want := []networkingv1.NetworkPolicyPeer{operator,
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "observability"}}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.10/32"}}}
	if diff := cmp.Diff(want, portRule(spec, 9090).From); diff != "" {
		t.Errorf("the metrics port's peers, set (-want +got):\n%s", diff)
	}

	for _, empty := range []string{"router.networkPolicy.metrics.namespaceSelector=null", "router.networkPolicy.metrics.namespaceSelector.matchLabels=null",
		"router.networkPolicy.metrics.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=null"} {
		if diff := cmp.Diff([]networkingv1.NetworkPolicyPeer{operator}, portRule(policy(render(empty)), 9090).From); diff != "" {
			t.Errorf("--set %s: the metrics port's peers (-want +got):\n%s", empty, diff)
		}
	}
	if objs := render("router.networkPolicy.enabled=false"); objs[key] != nil {
		t.Errorf("router.networkPolicy.enabled=false renders %s", key)
	}
	for _, bad := range []string{"router.networkPolicy.metrics.ipBlocks[0].cidr=10.0.0.10", "router.networkPolicy.metrics.ports={9091}"} {
		if out, err := run(t, helm, "template", "x", chart, "--set", "router.enabled=true", "--set", bad); err == nil {
			t.Errorf("--set %s rendered:\n%.300s", bad, out)
		}
	}
}
