package router_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routingbench"
)

// At a namespace's OpenAI address the body's model picks the AIInference by
// its spec.model.name or by its own name (docs/routing.md, the README). The
// engine knows only the served name (--served-model-name is spec.model.name),
// so a request that names the AIInference reaches it under the served name,
// and the answer names the served model.
func TestTheNamespaceAddressTakesTheAIInferencesName(t *testing.T) {
	sims := routingbench.StartSims(t, 1, fast)
	url, dir, _ := routerFor(t, router.Options{}, sims...)
	dir.NamespaceAddress()
	for _, model := range []string{routingbench.Model, dir.Key().Name} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			body := `{"model":"` + model + `","max_tokens":2,"prompt":"Hello","messages":[{"role":"user","content":"Hello"}],"stream":false}`
			resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s naming %q at the namespace's address: %s: %s", path, model, resp.Status, data)
				continue
			}
			var answer struct{ Model string }
			if err := json.Unmarshal(data, &answer); err != nil || answer.Model != routingbench.Model {
				t.Errorf("%s naming %q: the answer names model %q (%v), want the served name %q", path, model, answer.Model, err, routingbench.Model)
			}
		}
	}
}
