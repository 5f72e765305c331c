package aiinference

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/analysis"
)

// An analysis shows Prometheus's own error message only when it queried the
// operator's --prometheus-url: an object's rollout.canary.prometheusURL is set by
// anyone who may edit the object and may name a service only the operator can
// reach, so what it answers shows as a status code and fixed reasons only, even
// when it names the same URL as the operator.
func TestAnalysisShowsAnswersOnlyOfTheOperatorsURL(t *testing.T) {
	const secret = "s3cr3t-from-an-internal-service"
	var authorization []string
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Authorization"); a != "" {
			authorization = append(authorization, a)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"status":"error","errorType":"bad_data","error":%q}`, secret)
	}))
	defer endpoint.Close()

	for _, tc := range []struct {
		name                 string
		operatorURL, objects string
		wantSource           analysis.URLSource
	}{
		{"the operator's URL", endpoint.URL, "", analysis.OperatorURL},
		{"an object's URL", "", endpoint.URL, analysis.ObjectURL},
		{"an object's URL that is also the operator's", endpoint.URL, endpoint.URL, analysis.ObjectURL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := canaryObject(analysisStepOf(1, 0, 1))
			obj.Spec.Rollout.Canary.PrometheusURL = tc.objects
			var got AnalysisInput
			r := &Reconciler{Options: Options{PrometheusURL: tc.operatorURL},
				Analyzer: func(ctx context.Context, in AnalysisInput) servingv1.AnalysisRun {
					got = in
					return PrometheusAnalyzer(ctx, in)
				}}
			run := r.runAnalysis(context.Background(), obj, 0, obj.Spec.Rollout.Canary.Steps[0].Analysis)
			if got.PrometheusURL != endpoint.URL || got.URLSource != tc.wantSource {
				t.Errorf("queried %s as %v, want %s as %v", got.PrometheusURL, got.URLSource, endpoint.URL, tc.wantSource)
			}
			message := run.Checks[0].Message
			t.Logf("%s: %s", run.Verdict, message)
			if shown := strings.Contains(fmt.Sprintf("%+v", run), secret); shown != (tc.wantSource == analysis.OperatorURL) {
				t.Errorf("the endpoint's own message shown: %v, want %v: %q", shown, tc.wantSource == analysis.OperatorURL, message)
			}
			if !strings.Contains(message, "Prometheus refused the query (bad_data") {
				t.Errorf("message %q does not say Prometheus refused the query", message)
			}
		})
	}
	if len(authorization) > 0 {
		t.Errorf("requests carried Authorization headers: %q", authorization)
	}
}
