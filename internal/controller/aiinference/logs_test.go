package aiinference

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// TestPodLogsLastLine reads the previous run's log as the API server relays
// the kubelet's answer: the last line the engine wrote, or an error when the
// kubelet answered, in a successful response, that it has no such log.
func TestPodLogsLastLine(t *testing.T) {
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/ml/pods/llm-0/log" || r.URL.Query().Get("previous") != "true" || r.URL.Query().Get("container") != servingv1.EngineContainerName {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	logs := PodLogs{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})}
	for _, c := range []struct{ body, want, wantErr string }{
		{"starting\nError: unknown flag: --no-such-flag\n\n", "Error: unknown flag: --no-such-flag", ""},
		{"unable to retrieve container logs for containerd://8e1182c58c87", "", "could not serve the previous run's log yet"},
		{"", "", ""},
	} {
		body = c.body
		got, err := logs.LastLine(context.Background(), "ml", "llm-0", servingv1.EngineContainerName)
		if got != c.want || (c.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("body %q: got %q, %v; want %q, error %q", c.body, got, err, c.want, c.wantErr)
		}
	}
}
