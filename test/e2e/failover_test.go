package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil/freeport"
)

// TestFailoverToTheStandbyReplica runs two operator replicas with leader election
// and the default lease settings, kills the leader with SIGKILL (no hand-over of
// the lease), changes an object while no replica leads, and checks that the
// standby takes the lease within 20 s, finishes the change, and writes each child
// no more than the change needs. On the solo cluster: they are its only
// operators.
func TestFailoverToTheStandbyReplica(t *testing.T) {
	loadGate.own(t) // timed: not beside the chaos test
	e := soloCluster.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	ns := e.newNamespace(t)

	// Two replicas whose metrics say which one leads.
	replica := func(name string) (*operatorProcess, string) {
		port, err := freeport.Pick()
		g.Expect(err).NotTo(HaveOccurred())
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		return e.operator("failover-"+name, e.cluster.Kubeconfig(), "--metrics-secure=false", "--metrics-bind-address="+addr), addr
	}
	leader, leaderMetrics := replica("a")
	standby, standbyMetrics := replica("b")
	g.Expect(leader.Start()).To(Succeed())
	defer leader.Stop()
	g.Eventually(func() (bool, error) { return leads(leaderMetrics) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(BeTrue())
	g.Expect(standby.Start()).To(Succeed())
	defer standby.Stop()
	g.Eventually(func() error { _, err := leads(standbyMetrics); return err }).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(leads(standbyMetrics)).To(BeFalse(), "two leaders")

	obj := inference(ns, "failover", 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(ctx, obj)).To(Succeed())
	e.waitFor(t, g, obj, readyTimeout, beReady(1))

	// The children before the change.
	key := client.ObjectKeyFromObject(obj)
	dep, svc, cm := &appsv1.Deployment{}, &corev1.Service{}, &corev1.ConfigMap{}
	g.Expect(e.k8s.Get(ctx, key, dep)).To(Succeed())
	g.Expect(e.k8s.Get(ctx, key, svc)).To(Succeed())
	g.Expect(e.k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.Name + "-loader"}, cm)).To(Succeed())

	killed := time.Now()
	leader.Kill()
	e.update(g, obj, func(o *servingv1.AIInference) { o.Spec.Replicas = ptr.To[int32](2) })
	g.Eventually(func() (bool, error) { return leads(standbyMetrics) }).WithTimeout(60 * time.Second).WithPolling(100 * time.Millisecond).Should(BeTrue())
	takeover := time.Since(killed)
	e.waitFor(t, g, obj, 2*readyTimeout, beReady(2))
	done := time.Since(killed)
	t.Logf("Failover: the standby took the lease %.1f s after the leader's SIGKILL (the defaults: lease 12 s, renew deadline 10 s, retry 1.5 s; at most 18.6 s by design); the pending change (replicas 1 -> 2) was served %.1f s after it", takeover.Seconds(), done.Seconds())
	g.Expect(takeover).To(BeNumerically("<=", 20*time.Second), "takeover slower than the target")

	// Nothing written twice: the Deployment changed once (one new generation), the
	// Service and the loader's ConfigMap, which the change does not touch, not at all.
	depAfter, svcAfter, cmAfter := &appsv1.Deployment{}, &corev1.Service{}, &corev1.ConfigMap{}
	g.Expect(e.k8s.Get(ctx, key, depAfter)).To(Succeed())
	g.Expect(e.k8s.Get(ctx, key, svcAfter)).To(Succeed())
	g.Expect(e.k8s.Get(ctx, client.ObjectKeyFromObject(cm), cmAfter)).To(Succeed())
	g.Expect(depAfter.Generation).To(Equal(dep.Generation+1), "Deployment spec written more than once")
	g.Expect(svcAfter.ResourceVersion).To(Equal(svc.ResourceVersion), "Service rewritten")
	g.Expect(cmAfter.ResourceVersion).To(Equal(cm.ResourceVersion), "loader ConfigMap rewritten")
}

// leads reads controller-runtime's leader_election_master_status gauge from a
// replica's metrics endpoint.
func leads(addr string) (bool, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "leader_election_master_status{") {
			return strings.HasSuffix(line, " 1"), nil
		}
	}
	return false, sc.Err()
}
