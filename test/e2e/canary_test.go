package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
)

// A canary with maxSurge 0 on a GPU pool that has no free GPU: a stable replica
// makes room for the canary, the canary is promoted, and the stable set takes the
// new spec, with no pod stuck Pending and at least one replica ready throughout.
func TestCanaryWithoutSpareGPUs(t *testing.T) {
	shared.share(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns, nodes := newNamespaceWithNodes(t)
	// Two GPUs in all, both taken by the two stable replicas; no other test's
	// pods go to this product.
	const product = "NVIDIA-L40S"
	g.Expect(nodes.add(localcluster.NodePool{Name: "l40s", Count: 2, GPUProduct: product, GPUCount: 1,
		CPU: resource.MustParse("32"), Memory: resource.MustParse("256Gi")})).To(Succeed())
	obj := inference(ns, "canary", 1, product)
	obj.Spec.Replicas = ptr.To[int32](2)
	obj.Spec.Rollout = &servingv1.RolloutSpec{Strategy: servingv1.RolloutCanary, Canary: &servingv1.CanarySpec{
		Replicas: 1, MaxSurge: ptr.To[int32](0),
		Steps: []servingv1.CanaryStep{
			{Weight: 25, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: 2 * time.Second}}},
			{Weight: 50, Pause: &servingv1.PauseStep{Duration: &metav1.Duration{Duration: 2 * time.Second}}},
		},
	}}
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, readyTimeout, beReady(2))

	// Sample the ready replicas of both Deployments, and the status at each change,
	// from the spec change until the new spec is Ready.
	key := client.ObjectKeyFromObject(obj)
	begin := time.Now()
	update(g, obj, func(o *servingv1.AIInference) { o.Spec.Engine.Args = []string{"--max-model-len", "4096"} })
	minReady, lastLine := int32(2), ""
	assets, err := testutil.EnvtestAssets()
	g.Expect(err).NotTo(HaveOccurred())
	kubectl := filepath.Join(assets, "kubectl")
	var printed sync.WaitGroup
	defer printed.Wait()
	var rolledOut bool
	g.Eventually(func(g Gomega) {
		ready := int32(0)
		for _, name := range []string{obj.Name, obj.Name + "-canary"} {
			d := &appsv1.Deployment{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err == nil {
				ready += d.Status.ReadyReplicas
			}
		}
		minReady = min(minReady, ready)
		got := &servingv1.AIInference{}
		g.Expect(k8s.Get(ctx, key, got)).To(Succeed())
		if line := statusLine(got); line != lastLine {
			at := time.Since(begin).Round(100 * time.Millisecond)
			t.Logf("%6s  %s", at, line)
			lastLine = line
			// What a user sees meanwhile, without slowing the sampling.
			printed.Add(1)
			go func() {
				defer printed.Done()
				out, err := exec.Command(kubectl, "--kubeconfig", cluster.Kubeconfig(), "get", "aii", "-n", ns, "--no-headers").CombinedOutput()
				if err == nil {
					t.Logf("%6s  kubectl get aii: %s", at, strings.TrimSpace(string(out)))
				}
			}()
		}
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseReady))
		g.Expect(got.Status.Rollout).NotTo(BeNil())
		g.Expect(got.Status.Rollout.Phase).To(Equal(servingv1.RolloutPromoted))
		rolledOut = true
	}).WithTimeout(3 * readyTimeout).WithPolling(50 * time.Millisecond).Should(Succeed())
	g.Expect(rolledOut).To(BeTrue())
	g.Expect(minReady).To(BeNumerically(">=", 1), "no replica was ready at some moment of the canary rollout")
	t.Logf("surge-0 canary rollout: promoted and Ready %s after the spec change; fewest ready replicas seen: %d", time.Since(begin).Round(100*time.Millisecond), minReady)

	got := &servingv1.AIInference{}
	g.Expect(k8s.Get(ctx, key, got)).To(Succeed())
	var decisions []string
	for _, d := range got.Status.Rollout.History {
		decisions = append(decisions, d.Decision)
	}
	g.Expect(decisions).To(Equal([]string{"CanaryStarted", "StepStarted", "PauseEnded", "StepStarted", "PauseEnded", "Promoting", "Promoted"}))
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.Name + "-canary"}, &appsv1.Deployment{})).NotTo(Succeed(), "the canary's Deployment is gone")
}

// statusLine is what `kubectl get aii` and the rollout status say, on one line.
func statusLine(o *servingv1.AIInference) string {
	reason := ""
	if c := meta.FindStatusCondition(o.Status.Conditions, servingv1.ConditionReady); c != nil {
		reason = c.Reason
	}
	line := fmt.Sprintf("phase=%-7s ready=%-4s reason=%-18s", o.Status.Phase, o.Status.Ready, reason)
	if r := o.Status.Rollout; r != nil {
		line += fmt.Sprintf(" rollout=%s step=%d weight=%d%% split=%s", r.Phase, r.Step, r.Weight, r.TrafficSplit)
	}
	return line
}
