package analysis

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// docs/canary.md ("Analysis checks") shows every built-in query and sample count
// as the code sends it.
func TestDocsShowEveryBuiltinQuery(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "canary.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for _, engine := range []servingv1.EngineType{servingv1.EngineVLLM, servingv1.EngineTGI, servingv1.EngineTriton} {
		for _, m := range []servingv1.AnalysisMetric{"", servingv1.MetricErrorRatio, servingv1.MetricTimeToFirstToken,
			servingv1.MetricInterTokenLatency, servingv1.MetricEndToEndLatency, servingv1.MetricQueueLength} {
			for _, q := range []string{BuiltinQuery(engine, m), SamplesQuery(engine, m)} {
				if q != "" && !strings.Contains(text, q) {
					t.Errorf("docs/canary.md lacks the %s %s query %s", engine, m, q)
				}
			}
		}
	}
}
