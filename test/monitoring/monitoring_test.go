// Package monitoring tests what config/prometheus ships for the Prometheus
// Operator (the ServiceMonitor, PodMonitor and PrometheusRule, read with the
// operator's own API types) and the Grafana dashboard, with promtool.
package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/testutil"
)

// readStrict reads a manifest of config/prometheus into its API type, refusing
// fields the type does not have.
func readStrict(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "prometheus", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// rulesFile writes the PrometheusRule's groups as a Prometheus rule file in dir.
func rulesFile(t *testing.T, dir string) string {
	t.Helper()
	var rule monitoringv1.PrometheusRule
	readStrict(t, "prometheusrule.yaml", &rule)
	if rule.Kind != monitoringv1.PrometheusRuleKind || len(rule.Spec.Groups) == 0 {
		t.Fatalf("prometheusrule.yaml holds no rule groups: %+v", rule.TypeMeta)
	}
	data, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin := testutil.NeedPromtool(t)
	out, err := exec.Command(bin, args...).CombinedOutput()
	t.Logf("promtool %v:\n%s", args, out)
	if err != nil {
		t.Fatalf("promtool %v: %v", args, err)
	}
}

// TestAlertRules checks the rules and runs their unit tests
// (testdata/rules_test.yaml: every alert fires when it should and not before).
func TestAlertRules(t *testing.T) {
	dir := t.TempDir()
	rules := rulesFile(t, dir)
	promtool(t, "check", "rules", rules)
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "test", "rules", filepath.Join(dir, "rules_test.yaml"))
}

// TestEveryAlertHasARunbookAndATest: each alert links its section of
// docs/runbooks.md, that section exists, and the unit tests exercise it.
func TestEveryAlertHasARunbookAndATest(t *testing.T) {
	var rule monitoringv1.PrometheusRule
	readStrict(t, "prometheusrule.yaml", &rule)
	runbooks, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !contains(runbooks, "## "+r.Alert+"\n") {
				t.Errorf("docs/runbooks.md has no section ## %s", r.Alert)
			}
			if want := "docs/runbooks.md#" + lower(r.Alert); r.Annotations["runbook_url"] == "" || !contains([]byte(r.Annotations["runbook_url"]), want) {
				t.Errorf("%s: runbook_url %q does not link %s", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !contains(tests, "alertname: "+r.Alert+"\n") {
				t.Errorf("testdata/rules_test.yaml does not test %s", r.Alert)
			}
		}
	}
}

// TestMonitors reads the ServiceMonitor and PodMonitor with the Prometheus
// Operator's types: a misspelt field would make it ignore them silently.
func TestMonitors(t *testing.T) {
	var sm monitoringv1.ServiceMonitor
	readStrict(t, "servicemonitor.yaml", &sm)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor endpoints: %+v", sm.Spec.Endpoints)
	}
	var pm monitoringv1.PodMonitor
	readStrict(t, "podmonitor.yaml", &pm)
	// The engines' HTTP port (vLLM, TGI), Triton's metrics port, the loader's progress.
	var ports []string
	for _, e := range pm.Spec.PodMetricsEndpoints {
		if e.Port == nil {
			t.Errorf("PodMonitor endpoint without a port name: %+v", e)
			continue
		}
		ports = append(ports, *e.Port)
	}
	if want := []string{"http", "metrics", loadspec.ProgressPortName}; !slices.Equal(ports, want) {
		t.Errorf("PodMonitor endpoints on ports %v, want %v", ports, want)
	}
	if !pm.Spec.NamespaceSelector.Any {
		t.Error("the PodMonitor must look in every namespace")
	}
	// The router's series name the model's namespace: honorLabels keeps it.
	var router monitoringv1.PodMonitor
	readStrict(t, "router_podmonitor.yaml", &router)
	if len(router.Spec.PodMetricsEndpoints) != 1 || ptrValue(router.Spec.PodMetricsEndpoints[0].Port) != "metrics" || !router.Spec.PodMetricsEndpoints[0].HonorLabels {
		t.Errorf("the router's PodMonitor endpoints: %+v, want one on port metrics with honorLabels", router.Spec.PodMetricsEndpoints)
	}
}

func ptrValue(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
