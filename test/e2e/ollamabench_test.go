package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/routingbench"
)

// The real-engine half of the routing bench: Ollama (llama.cpp, computing
// every token) on the generated model, its compute bounded per pod by a CPU
// limit, as each GPU bounds a replica's.
var (
	// ollamaBenchRates are the conversations started per second: the four
	// pods of half a CPU serve about one a second round robin in the
	// prompt-heavy shape, so the sweep goes from light load to past that.
	ollamaBenchRates = []float64{0.25, 0.5, 1, 2}
	// ollamaBenchWindow is how long each rate's conversations keep starting.
	ollamaBenchWindow = 16 * time.Second
	// ollamaShapes are the workload's two shapes. Prompt-heavy: system
	// prompts of 300 words (about 400 tokens) shared by a tenant's
	// conversations, 3 turns, 8-token answers; its cost is prefill, which a
	// replica that holds the prefix in a slot skips. Answer-heavy: short
	// prompts, 64-token answers; its cost is decode.
	ollamaShapes = []struct {
		name  string
		shape routingbench.WorkloadOptions
	}{
		{"prompt-heavy", routingbench.WorkloadOptions{Tenants: 4, SystemPromptWords: 300, Turns: 3, TurnWords: 30, MaxTokens: 8}},
		{"answer-heavy", routingbench.WorkloadOptions{Tenants: 4, SystemPromptWords: 30, Turns: 3, TurnWords: 20, MaxTokens: 64}},
	}
)

// Each replica of the bench: half a CPU (one llama.cpp thread) and 2 slots;
// the bound is one pod with all four's CPU and slots.
const (
	ollamaBenchReplicas = 4
	ollamaBenchCPU      = "500m"
	ollamaBenchSlots    = 2
)

// TestRealNodeOllamaRoutingBench: four Ollama replicas of the generated
// model on the real nodes (an AIInference each time, so every kind of
// routing starts on fresh slots), sent each shape's sweep through their
// Service (kube-proxy), through the Gateway (Traefik, an HTTPRoute to the
// Service) and through the router (its code on the host, over the pods'
// addresses, told the engine's slots); and the bound, one pod with the CPU
// and slots of all four. Ollama counts no prefix hits, so the hit share is
// not read.
func TestRealNodeOllamaRoutingBench(t *testing.T) {
	if os.Getenv(routingBenchEnv) != "1" {
		t.Skipf("set %s=1 (make bench-routing) to run the routing bench on the real nodes", routingBenchEnv)
	}
	shared.share(t)
	store := needRealNode(t)
	reserveRealPods(t, int64(realNodes*runtime.NumCPU()))
	gw := sharedGateway(t)
	g := NewWithT(t)
	ctx := context.Background()
	out := os.Stdout
	ns := newNamespace(t)
	g.Expect(k8s.Create(ctx, store.CredentialsSecret(ns))).To(Succeed())
	image, err := localcluster.FindImage(cluster.Images(), localcluster.EngineOllamaImage)
	g.Expect(err).NotTo(HaveOccurred())
	ollama, err := engine.For(servingv1.EngineOllama)
	g.Expect(err).NotTo(HaveOccurred())
	generation := 0

	// start serves the model with replicas pods of cpu and slots each, and
	// returns it and its pods, once Ready. A pod asks for 10% less CPU than
	// its limit: the warm-up gate's and the node's own requests would leave
	// no node room for a pod that asks for all of the host's.
	start := func(replicas int32, cpu string, slots int32) (*servingv1.AIInference, []*routingbench.Sim) {
		limit := resource.MustParse(cpu)
		request := resource.NewMilliQuantity(limit.MilliValue()*9/10, resource.DecimalSI)
		generation++
		obj := &servingv1.AIInference{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("ollama-%d", generation)},
			Spec: servingv1.AIInferenceSpec{
				Model: servingv1.ModelSpec{
					Name: routingbench.Model,
					Size: ptr.To(*resource.NewQuantity(store.GGUFBytes, resource.BinarySI)),
					Source: servingv1.ModelSource{S3: &servingv1.S3Source{
						Bucket: store.Bucket, Prefix: store.GGUFPrefix, Endpoint: store.Endpoint, PathStyle: true,
						CredentialsSecretRef: &servingv1.S3CredentialsSecretRef{Name: store.CredentialsSecret(ns).Name},
					}},
				},
				Engine: servingv1.EngineSpec{Type: servingv1.EngineOllama, Image: image.Ref,
					Ollama: &servingv1.OllamaSpec{Parallel: slots, ContextLength: 4096}},
				Replicas:     ptr.To(replicas),
				NodeSelector: map[string]string{localcluster.GPUProductLabel: realGPUProduct},
				Tolerations:  []corev1.Toleration{{Key: localcluster.GPUTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: *request},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: limit, corev1.ResourceMemory: resource.MustParse("2Gi")}},
			},
		}
		g.Expect(k8s.Create(ctx, obj)).To(Succeed())
		waitFor(t, g, obj, 3*time.Minute, beReady(replicas))
		var sims []*routingbench.Sim
		for _, p := range servingPods(g, obj) {
			sims = append(sims, &routingbench.Sim{Name: p.Name, Addr: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(ollama.DefaultPort())))})
		}
		g.Expect(sims).To(HaveLen(int(replicas)))
		return obj, sims
	}
	stop := func(obj *servingv1.AIInference) {
		g.Expect(k8s.Delete(ctx, obj)).To(Succeed())
		g.Eventually(func(g Gomega) {
			pods := &corev1.PodList{}
			g.Expect(k8s.List(ctx, pods, client.InNamespace(ns))).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty())
		}).WithTimeout(2 * time.Minute).Should(Succeed())
	}
	sweep := func(name string, points []routingbench.SweepPoint, o routingbench.RunOptions) []routingbench.Summary {
		var summaries []routingbench.Summary
		for _, p := range points {
			s, err := routingbench.Measure(ctx, out, fmt.Sprintf("%s %.2f/s", name, p.Rate), nil, o, p)
			g.Expect(err).NotTo(HaveOccurred())
			fmt.Fprintf(out, "routing bench: %s at %.2f/s: TTFT p50 %s p90 %s p99 %s, %.1f output tokens/s, %d requests, %d failed\n",
				name, p.Rate, s.P50.Round(time.Millisecond), s.P90.Round(time.Millisecond), s.P99.Round(time.Millisecond), s.TokensPerSecond, s.Requests, s.Failed)
			summaries = append(summaries, s)
		}
		return summaries
	}

	fmt.Fprintf(out, "routing bench (real nodes, Ollama): %d replicas of %s CPU (one llama.cpp thread) and %d slots each, the generated model (hack/tinymodel); the bound: one of %d CPUs and %d slots\n",
		ollamaBenchReplicas, ollamaBenchCPU, ollamaBenchSlots, ollamaBenchReplicas/2, ollamaBenchReplicas*ollamaBenchSlots)
	for i, shape := range ollamaShapes {
		points := routingbench.ShapePoints(shape.shape, ollamaBenchRates, ollamaBenchWindow, uint64(500+100*i))
		fmt.Fprintf(out, "routing bench: shape %s: at each rate, for %s, conversations start over %d tenants (system prompts of %d words), %d turns of %d words resending the history, %d output tokens, %s between turns (open loop)\n",
			shape.name, ollamaBenchWindow, shape.shape.Tenants, shape.shape.SystemPromptWords, shape.shape.Turns, shape.shape.TurnWords, shape.shape.MaxTokens, routingbench.ThinkTime)

		obj, _ := start(ollamaBenchReplicas, ollamaBenchCPU, ollamaBenchSlots)
		service := sweep("service", points, routingbench.RunOptions{Targets: []string{serviceURL(g, obj)}})
		stop(obj)

		obj, _ = start(ollamaBenchReplicas, ollamaBenchCPU, ollamaBenchSlots)
		host := obj.Name + "." + ns + ".routing.test"
		svc := &corev1.Service{}
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), svc)).To(Succeed())
		route := routeTo(gw, ns, obj.Name, host, obj.Name, svc.Spec.Ports[0].Port)
		g.Expect(k8s.Create(ctx, route)).To(Succeed())
		viaGateway := routingbench.RunOptions{Targets: []string{gw.URL}, Host: host}
		g.Eventually(func() error {
			_, err := postCompletion(newConnectionClient, gw.URL, host, routingbench.Model, "Hello")
			return err
		}).WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(Succeed(), "a completion through the Gateway")
		gateway := sweep("gateway", points, viaGateway)
		stop(obj)

		obj, sims := start(ollamaBenchReplicas, ollamaBenchCPU, ollamaBenchSlots)
		dir := routingbench.NewFixedDirectory("bench", "chat", sims)
		dir.Update(func(m *servingv1.AIInference) { m.Spec.Engine = obj.Spec.Engine })
		rt := router.New(router.Options{}, dir, router.NetworkPolicyCheck{}, nil, logr.Discard())
		routed := sweep("router", points, routingbench.RunOptions{Targets: []string{routingbench.ServeRouter(t, rt)}})
		stop(obj)

		obj, one := start(1, strconv.Itoa(ollamaBenchReplicas/2), ollamaBenchReplicas*ollamaBenchSlots)
		bound := sweep("bound", points, routingbench.RunOptions{Targets: []string{"http://" + one[0].Addr}})
		stop(obj)

		for j, p := range points {
			routingbench.PrintTable(out, fmt.Sprintf("\nrouting figure (real nodes, Ollama, %s): %.2f conversations/s (%d requests)", shape.name, p.Rate, service[j].Requests),
				service[j], gateway[j], routed[j], bound[j])
		}
		routingbench.AtSaturation(out, "the Service (kube-proxy), "+shape.name, points, service, routed, bound)
		routingbench.AtSaturation(out, "the Gateway (Traefik), "+shape.name, points, gateway, routed, bound)
	}
}
