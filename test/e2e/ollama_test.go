package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/localcluster"
)

// chatCompletion is what a test reads of a chat completion.
type chatCompletion struct {
	Choices []struct {
		Message      struct{ Content string } `json:"message"`
		FinishReason string                   `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// TestRealNodeOllamaAnswersThroughTheRouter: engine.type Ollama on a real
// node. The generated GGUF the store is seeded with (hack/tinymodel: random
// weights, Llama 3.2's tokenizer) goes from the store through the loader to Ollama
// (registered by ollama-start, not copied), which computes a chat completion
// with llama.cpp, token by token, at the pod and through the model's Service,
// which leads to the router.
func TestRealNodeOllamaAnswersThroughTheRouter(t *testing.T) {
	g, store, obj := startRealNodeTest(t, 3, "ollama")
	ctx := context.Background()
	image, err := localcluster.FindImage(cluster.Images(), localcluster.EngineOllamaImage)
	g.Expect(err).NotTo(HaveOccurred())
	installRouter(t, g)

	obj.Spec.Model.Source.S3.Prefix = store.GGUFPrefix
	obj.Spec.Model.Size = ptr.To(*resource.NewQuantity(store.GGUFBytes, resource.BinarySI))
	obj.Spec.Engine = servingv1.EngineSpec{Type: servingv1.EngineOllama, Image: image.Ref,
		Ollama: &servingv1.OllamaSpec{Parallel: 2, ContextLength: 2048}}
	obj.Spec.GPU = servingv1.GPUSpec{}
	// The real nodes, on CPU: their GPU taint is tolerated by hand, as the
	// operator tolerates it only for pods that ask for GPUs.
	obj.Spec.NodeSelector = map[string]string{localcluster.GPUProductLabel: realGPUProduct}
	obj.Spec.Tolerations = []corev1.Toleration{{Key: localcluster.GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	obj.Spec.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}
	obj.Spec.Routing = &servingv1.RoutingSpec{Enabled: true}
	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, beReady(1))
	t.Logf("apply to Ready on the real node, Ollama on %d bytes of GGUF: %s", store.GGUFBytes, time.Since(begin).Round(100*time.Millisecond))

	pod := oneServingPod(g, obj)[0]
	engine := pod.Spec.Containers[0]
	for _, c := range pod.Spec.Containers {
		if c.Name == servingv1.EngineContainerName {
			engine = c
		}
	}
	g.Expect(engine.Command).To(Equal([]string{"/ollama-start"}))
	g.Expect(engine.Args).To(ContainElements("--threads", "1", "--parallel", "2"), "threads from the CPU limit, slots from engine.ollama")

	// At the pod: a chat completion of 8 tokens, computed.
	httpClient := &http.Client{Timeout: 30 * time.Second}
	g.Expect(engine.Ports).NotTo(BeEmpty())
	at := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(engine.Ports[0].ContainerPort)))
	var chat chatCompletion
	_, data, err := postJSON(httpClient, at+"/v1/chat/completions", "", map[string]any{"model": obj.Spec.Model.Name, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": "Tell me about the war and the peace."}}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(json.Unmarshal(data, &chat)).To(Succeed(), "%s", data)
	g.Expect(chat.Choices).To(HaveLen(1), "%s", data)
	g.Expect(chat.Choices[0].Message.Content).NotTo(BeEmpty(), "%s", data)
	g.Expect(chat.Choices[0].FinishReason).To(Equal("length"), "%s", data)
	g.Expect(chat.Usage.CompletionTokens).To(Equal(8), "%s", data)
	g.Expect(chat.Usage.PromptTokens).To(BeNumerically(">", 8), "%s", data)
	t.Logf("Ollama at the pod: %q (%d prompt tokens, %d completion tokens)", chat.Choices[0].Message.Content, chat.Usage.PromptTokens, chat.Usage.CompletionTokens)

	// Through the Service: the router sends it to the one replica.
	url := serviceURL(g, obj)
	for _, stream := range []bool{false, true} {
		header, data, err := postJSON(&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
			url+"/v1/chat/completions", "", map[string]any{"model": obj.Spec.Model.Name, "max_tokens": 8, "stream": stream,
				"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("Once more, streamed %v.", stream)}}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(header.Get(router.EndpointHeader)).To(Equal(pod.Name), "the router names the replica it sent the request to")
		if stream {
			g.Expect(string(data)).To(ContainSubstring("data: [DONE]"))
		} else {
			g.Expect(string(data)).To(ContainSubstring(`"finish_reason":"length"`))
		}
	}
}
