package monitoring

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/activator"
	"github.com/aiinference/operator/internal/controller/aiinference"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/router"
)

// otherMetrics are the metrics the dashboard may name besides the operator's
// own: Prometheus's up, controller-runtime's (served beside the operator's on the
// same endpoint), and the engines' documented ones (vLLM's production metrics,
// TGI's router metrics, Triton's), which the PodMonitor scrapes.
var otherMetrics = []string{
	"up",
	"controller_runtime_reconcile_total", "controller_runtime_reconcile_errors_total", "controller_runtime_reconcile_time_seconds", "workqueue_depth",
	"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
	"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
	"tgi_request_generated_tokens", "tgi_request_duration",
	"nv_inference_first_response_histogram_ms",
}

// loaderMetrics are the names the model loader's progress endpoint serves.
func loaderMetrics(t *testing.T) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	(&loader.ProgressBoard{}).Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var names []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names = append(names, f[2])
		}
	}
	if len(names) == 0 {
		t.Fatal("the loader's progress endpoint serves no metric")
	}
	return names
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

var (
	// Grafana's variables, replaced by values Prometheus accepts.
	grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$namespace", "ns", "$name", "name", "${datasource}", "x")
	strs        = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers    = regexp.MustCompile(`\{[^}]*\}`)
	ranges      = regexp.MustCompile(`\[[^\]]*\]`)
	labelLists  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	ident       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	keywords    = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
	labelValues = regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)`)
)

// metricNames are the metrics an expression selects.
func metricNames(expr string) []string {
	e := strs.ReplaceAllString(expr, `""`)
	e = matchers.ReplaceAllString(e, "")
	e = ranges.ReplaceAllString(e, "")
	e = labelLists.ReplaceAllString(e, "")
	var names []string
	for _, m := range ident.FindAllStringSubmatch(e, -1) {
		if m[1] != "" || keywords[strings.ToLower(m[0])] {
			continue // a function or aggregation, or a keyword
		}
		names = append(names, m[0])
	}
	return names
}

// TestDashboard: every query of the Grafana dashboard parses (promtool checks it
// as a recording rule) and names only metrics that exist.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "grafana", "aiinference-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range slices.Concat(aiinference.MetricNames(), activator.MetricNames(), router.MetricNames(), otherMetrics, loaderMetrics(t)) {
		known[n] = true
	}
	if len(known) < 20 {
		t.Fatalf("only %d metrics known", len(known))
	}
	exists := func(name string) bool {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
				return true
			}
		}
		return false
	}

	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			expr := grafanaVars.Replace(target.Expr)
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query%d", len(rules)), Expr: expr})
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("panel %q: %s names no metric", p.Title, target.Expr)
			}
			for _, n := range names {
				if !exists(n) {
					t.Errorf("panel %q names %s, which neither the operator nor the engines serve", p.Title, n)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil || !exists(m[1]) {
			t.Errorf("variable %s: query %v names no known metric", v.Name, q["query"])
		}
	}
	if len(rules) < 20 {
		t.Errorf("only %d queries", len(rules))
	}

	// promtool parses each query as a recording rule.
	file := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	out, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", path)
}

func TestMetricNamesOfAnExpression(t *testing.T) {
	got := metricNames(`histogram_quantile(0.9, sum by (aiinference, le) (rate(vllm:time_to_first_token_seconds_bucket{namespace=~"a|b"}[5m]))) > on (namespace) group_left x_total and up == 1`)
	want := []string{"vllm:time_to_first_token_seconds_bucket", "x_total", "up"}
	if !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}

// TestMetricsDocumented: docs/metrics.md has a row for each operator metric.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range slices.Concat(aiinference.MetricNames(), activator.MetricNames()) {
		if !strings.Contains(string(doc), "| `"+n+"` |") {
			t.Errorf("docs/metrics.md has no row for %s", n)
		}
	}
}
