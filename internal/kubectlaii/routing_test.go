package kubectlaii

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Two router pods' metrics sum per replica; another model's series and
// another namespace's model of the same name are left out.
func TestRoutingFromTheRoutersMetrics(t *testing.T) {
	g := NewWithT(t)
	podA := `# TYPE aiinference_router_requests_total counter
aiinference_router_requests_total{namespace="ml",name="chat",endpoint="chat-1",code="200"} 30
aiinference_router_requests_total{namespace="ml",name="chat",endpoint="",code="429"} 2
aiinference_router_requests_total{namespace="other",name="chat",endpoint="chat-9",code="200"} 99
aiinference_router_requests_total{namespace="ml",name="embed",endpoint="embed-1",code="200"} 7
# TYPE aiinference_router_picks_total counter
aiinference_router_picks_total{namespace="ml",name="chat",endpoint="chat-1",reason="prefix"} 25
aiinference_router_picks_total{namespace="ml",name="chat",endpoint="chat-1",reason="hash"} 5
# TYPE aiinference_router_prefix_blocks_total counter
aiinference_router_prefix_blocks_total{namespace="ml",name="chat"} 100
# TYPE aiinference_router_prefix_hit_blocks_total counter
aiinference_router_prefix_hit_blocks_total{namespace="ml",name="chat"} 60
`
	podB := `# TYPE aiinference_router_requests_total counter
aiinference_router_requests_total{namespace="ml",name="chat",endpoint="chat-1",code="200"} 10
aiinference_router_requests_total{namespace="ml",name="chat",endpoint="chat-2",code="200"} 20
# TYPE aiinference_router_picks_total counter
aiinference_router_picks_total{namespace="ml",name="chat",endpoint="chat-2",reason="spill"} 20
# TYPE aiinference_router_prefix_blocks_total counter
aiinference_router_prefix_blocks_total{namespace="ml",name="chat"} 100
# TYPE aiinference_router_prefix_hit_blocks_total counter
aiinference_router_prefix_hit_blocks_total{namespace="ml",name="chat"} 90
# TYPE aiinference_router_ejected_endpoints gauge
aiinference_router_ejected_endpoints{namespace="ml",name="chat",endpoint="chat-3"} 1
aiinference_router_ejected_endpoints{namespace="ml",name="chat",endpoint="chat-2"} 0
# TYPE aiinference_router_shed_requests_total counter
aiinference_router_shed_requests_total{namespace="ml",name="chat",priority="Sheddable",reason="saturated"} 4
# TYPE aiinference_router_refused_requests_total counter
aiinference_router_refused_requests_total{namespace="ml",name="chat",reason="bodies"} 3
`
	r := &RoutingReport{Routed: true, RouterPods: []string{"aiinference-system/router-a", "aiinference-system/router-b"}, PrefixHitShare: -1}
	g.Expect(routingFromMetrics(r, "ml", "chat", [][]byte{[]byte(podA), []byte(podB)}, r.RouterPods)).To(Succeed())
	g.Expect(r.Ejected).To(Equal(map[string][]string{"chat-3": {"aiinference-system/router-b"}}))
	g.Expect(r.Endpoints).To(Equal([]EndpointRoutingReport{
		{Endpoint: "", Requests: map[string]float64{"429": 2}},
		{Endpoint: "chat-1", Requests: map[string]float64{"200": 40}, Picks: map[string]float64{"prefix": 25, "hash": 5}},
		{Endpoint: "chat-2", Requests: map[string]float64{"200": 20}, Picks: map[string]float64{"spill": 20}},
	}))
	g.Expect(r.PrefixHitShare).To(BeNumerically("~", 0.75, 1e-9))

	var out bytes.Buffer
	writeRouting(&out, r)
	text := out.String()
	for _, want := range []string{"Routing: on; the Service leads to the router (2 pod(s) read)", "(none: answered by the router)  2", "chat-1", "200 40", "hash 5, prefix 25", "Estimated prefix hit share: 75.0%",
		"Out of the picking for failing its answers: chat-3 (by aiinference-system/router-b", "Sheddable saturated 4", "Refused for a share of the router's bounds (429): bodies 3"} {
		g.Expect(text).To(ContainSubstring(want))
	}
	g.Expect(strings.Count(text, "\n")).To(BeNumerically(">=", 6))

	g.Expect(routingFromMetrics(&RoutingReport{}, "ml", "chat", [][]byte{[]byte("not { metrics")}, nil)).To(MatchError(ContainSubstring("do not parse")))
}

// A router pod whose metrics the pod proxy did not bring: a refusal asks for
// the permission; an API server that did not reach the pod (refused by the
// router's NetworkPolicy, or timed out where the policy drops) names the
// policy's ipBlocks.
func TestUnreadableRoutersSayWhatToDo(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/proxy"}, "router-a", errors.New("no RBAC policy matched"))
	refused := apierrors.NewServiceUnavailable("error trying to reach service: dial tcp 10.245.1.5:9090: connect: connection refused")
	timedOut := fmt.Errorf("router-b: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name     string
		failures []error
		want     []string
		not      []string
	}{
		{"forbidden", []error{fmt.Errorf("router-a: %w", forbidden)}, []string{"router-a: ", "needs get on pods/proxy"}, []string{"NetworkPolicy"}},
		{"refused", []error{fmt.Errorf("router-a: %w", refused)}, []string{"connection refused", "router.networkPolicy.metrics.ipBlocks", "docs/routing.md#who-reaches-the-router"}, []string{"pods/proxy"}},
		{"timed out", []error{timedOut}, []string{"router-b: context deadline exceeded", "NetworkPolicy"}, nil},
		{"both", []error{fmt.Errorf("router-a: %w", forbidden), timedOut}, []string{"router-a: ", "; router-b: ", "needs get on pods/proxy", "ipBlocks"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			msg := unreadableRouters(tc.failures)
			g.Expect(msg).To(HavePrefix("could not read the metrics of router pod(s) "))
			for _, w := range tc.want {
				g.Expect(msg).To(ContainSubstring(w))
			}
			for _, n := range tc.not {
				g.Expect(msg).NotTo(ContainSubstring(n))
			}
		})
	}
}
