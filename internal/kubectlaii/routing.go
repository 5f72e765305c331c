package kubectlaii

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// RoutingReport is where the router sent the model's requests
// (spec.routing.enabled), summed over the router's pods since they started.
type RoutingReport struct {
	// Routed is true when the model's Service leads to the router: it has an
	// EndpointSlice of the router's pods. False while no router pod is
	// ready, when the Service goes round robin to the model's pods.
	Routed bool `json:"routed"`
	// RouterPods are the router's pods whose metrics were read.
	RouterPods []string `json:"routerPods,omitempty"`
	// Unreadable says why the router's metrics could not be read.
	Unreadable string `json:"unreadable,omitempty"`
	// Endpoints are the replicas the router sent requests to, and "" for
	// the requests it answered itself (no replica: 429, 503, 403).
	Endpoints []EndpointRoutingReport `json:"endpoints,omitempty"`
	// PrefixHitShare is the router's estimate of the prompt blocks that met
	// a replica holding them; -1 when it routed none.
	PrefixHitShare float64 `json:"prefixHitShare"`
	// Ejected are the replicas a router pod has taken out of the picking
	// for failing their answers, with the router pods that did.
	Ejected map[string][]string `json:"ejected,omitempty"`
	// Shed counts the requests answered 429 while every replica was
	// saturated, by priority and why (saturated, queue_full, for_room).
	Shed map[string]float64 `json:"shed,omitempty"`
	// Refused counts the requests answered 429 for the router's, the
	// namespace's or the model's share of requests or of request bodies.
	Refused map[string]float64 `json:"refused,omitempty"`
}

// EndpointRoutingReport is what one replica got from the router.
type EndpointRoutingReport struct {
	Endpoint string `json:"endpoint"`
	// Requests by HTTP status.
	Requests map[string]float64 `json:"requests"`
	// Picks by reason: prefix, adapter, hash, spill, session, load, retry.
	Picks map[string]float64 `json:"picks,omitempty"`
}

// readRouting reads the router's metrics through the API server's pod proxy,
// with the user's own permissions.
func (e *env) readRouting(obj *servingv1.AIInference) *RoutingReport {
	r := &RoutingReport{PrefixHitShare: -1}
	slice := &discoveryv1.EndpointSlice{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: obj.Namespace, Name: servingv1.RouterSliceName(obj.Name)}, slice); err == nil {
		r.Routed = len(slice.Endpoints) > 0
	}
	pods := &corev1.PodList{}
	if err := e.c.List(e.ctx, pods, client.MatchingLabels{servingv1.LabelName: servingv1.RouterPodName}); err != nil {
		r.Unreadable = fmt.Sprintf("cannot list the router's pods (%v); reading where requests went needs list on pods and get on pods/proxy in the router's namespace", err)
		return r
	}
	var texts [][]byte
	var failures []error
	for _, p := range pods.Items {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
		data, err := e.cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, "9090", "/metrics", nil).DoRaw(ctx)
		cancel()
		if err != nil {
			failures = append(failures, fmt.Errorf("%s: %w", p.Name, err))
			continue
		}
		r.RouterPods = append(r.RouterPods, p.Namespace+"/"+p.Name)
		texts = append(texts, data)
	}
	if len(failures) > 0 {
		r.Unreadable = unreadableRouters(failures)
	}
	if len(pods.Items) == 0 {
		r.Unreadable = "no router pod found (install config/router or the chart's router.enabled)"
	}
	if err := routingFromMetrics(r, obj.Namespace, obj.Name, texts, r.RouterPods); err != nil {
		r.Unreadable = err.Error()
	}
	return r
}

// unreadableRouters says which router pods' metrics the API server's pod
// proxy did not bring, and what to do: a refusal (401, 403) needs the user's
// permission; anything else is the API server not reaching the pod's port
// 9090, which the router's NetworkPolicy (config/router, the chart's
// router.networkPolicy) admits from the pod's own node and from the ipBlocks
// it lists only.
func unreadableRouters(failures []error) string {
	var names []string
	denied, unreached := false, false
	for _, err := range failures {
		names = append(names, err.Error())
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			denied = true
		} else {
			unreached = true
		}
	}
	var todo []string
	if denied {
		todo = append(todo, "needs get on pods/proxy in the router's namespace")
	}
	if unreached {
		todo = append(todo, "the API server did not reach the pod's port 9090; where the router's NetworkPolicy is enforced, it "+
			"admits the API server only from the router pod's own node and from router.networkPolicy.metrics.ipBlocks "+
			"(config/router: an ipBlock in networkpolicy.yaml): list the API server's addresses there, docs/routing.md#who-reaches-the-router")
	}
	return "could not read the metrics of router pod(s) " + strings.Join(names, "; ") + " (" + strings.Join(todo, "; ") + ")"
}

// routingFromMetrics sums the router pods' metrics of one model into r;
// pods name the router pod each text was read from.
func routingFromMetrics(r *RoutingReport, namespace, name string, texts [][]byte, pods []string) error {
	byEndpoint := map[string]*EndpointRoutingReport{}
	endpoint := func(ep string) *EndpointRoutingReport {
		if byEndpoint[ep] == nil {
			byEndpoint[ep] = &EndpointRoutingReport{Endpoint: ep, Requests: map[string]float64{}}
		}
		return byEndpoint[ep]
	}
	var blocks, hits float64
	add := func(m *map[string]float64, key string, v float64) {
		if v == 0 {
			return
		}
		if *m == nil {
			*m = map[string]float64{}
		}
		(*m)[key] += v
	}
	for i, text := range texts {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
		if err != nil {
			return fmt.Errorf("the router's metrics do not parse: %w", err)
		}
		for _, m := range families["aiinference_router_requests_total"].GetMetric() {
			if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name {
				endpoint(l["endpoint"]).Requests[l["code"]] += m.GetCounter().GetValue()
			}
		}
		for _, m := range families["aiinference_router_picks_total"].GetMetric() {
			if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name {
				ep := endpoint(l["endpoint"])
				if ep.Picks == nil {
					ep.Picks = map[string]float64{}
				}
				ep.Picks[l["reason"]] += m.GetCounter().GetValue()
			}
		}
		for _, m := range families["aiinference_router_ejected_endpoints"].GetMetric() {
			if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name && m.GetGauge().GetValue() > 0 {
				if r.Ejected == nil {
					r.Ejected = map[string][]string{}
				}
				pod := ""
				if i < len(pods) {
					pod = pods[i]
				}
				r.Ejected[l["endpoint"]] = append(r.Ejected[l["endpoint"]], pod)
			}
		}
		for _, m := range families["aiinference_router_shed_requests_total"].GetMetric() {
			if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name {
				add(&r.Shed, l["priority"]+" "+l["reason"], m.GetCounter().GetValue())
			}
		}
		for _, m := range families["aiinference_router_refused_requests_total"].GetMetric() {
			if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name {
				add(&r.Refused, l["reason"], m.GetCounter().GetValue())
			}
		}
		for family, sum := range map[string]*float64{"aiinference_router_prefix_blocks_total": &blocks, "aiinference_router_prefix_hit_blocks_total": &hits} {
			for _, m := range families[family].GetMetric() {
				if l := labels(m.GetLabel()); l["namespace"] == namespace && l["name"] == name {
					*sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, ep := range byEndpoint {
		r.Endpoints = append(r.Endpoints, *ep)
	}
	slices.SortFunc(r.Endpoints, func(a, b EndpointRoutingReport) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	if blocks > 0 {
		r.PrefixHitShare = hits / blocks
	}
	return nil
}

func labels[L interface {
	GetName() string
	GetValue() string
}](pairs []L) map[string]string {
	m := map[string]string{}
	for _, p := range pairs {
		m[p.GetName()] = p.GetValue()
	}
	return m
}

func writeRouting(out io.Writer, r *RoutingReport) {
	switch {
	case r.Routed:
		fmt.Fprintf(out, "\nRouting: on; the Service leads to the router (%d pod(s) read)\n", len(r.RouterPods))
	default:
		fmt.Fprintln(out, "\nRouting: on, but no router pod is ready: the Service goes round robin to the pods")
	}
	if r.Unreadable != "" {
		fmt.Fprintf(out, "  %s\n", r.Unreadable)
	}
	if len(r.Endpoints) == 0 {
		fmt.Fprintln(out, "  No request routed yet.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  REPLICA\tREQUESTS\tBY STATUS\tPICKED BY")
	for _, ep := range r.Endpoints {
		total := 0.0
		for _, n := range ep.Requests {
			total += n
		}
		name := ep.Endpoint
		if name == "" {
			name = "(none: answered by the router)"
		}
		fmt.Fprintf(tw, "  %s\t%.0f\t%s\t%s\n", name, total, countsLine(ep.Requests), dash(countsLine(ep.Picks)))
	}
	_ = tw.Flush()
	if r.PrefixHitShare >= 0 {
		fmt.Fprintf(out, "  Estimated prefix hit share: %.1f%% of prompt blocks went to a replica that had them\n", 100*r.PrefixHitShare)
	}
	names := make([]string, 0, len(r.Ejected))
	for ep := range r.Ejected {
		names = append(names, ep)
	}
	slices.Sort(names)
	for _, ep := range names {
		fmt.Fprintf(out, "  Out of the picking for failing its answers: %s (by %s; events ReplicaEjected)\n", ep, strings.Join(r.Ejected[ep], ", "))
	}
	if len(r.Shed) > 0 {
		fmt.Fprintf(out, "  Shed while every replica was saturated (429): %s\n", countsLine(r.Shed))
	}
	if len(r.Refused) > 0 {
		fmt.Fprintf(out, "  Refused for a share of the router's bounds (429): %s\n", countsLine(r.Refused))
	}
}

// countsLine is "k1 n1, k2 n2" in key order.
func countsLine(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
