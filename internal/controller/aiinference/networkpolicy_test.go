package aiinference

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

func policiesOf(t *testing.T, obj *servingv1.AIInference, operatorNamespace string) (ingress, egress *networkingv1.NetworkPolicy) {
	t.Helper()
	obj.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{}
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		t.Fatal(err)
	}
	return desiredNetworkPolicies(obj, eng, operatorNamespace)
}

// An ingress rule with no peer lets every client in (the NetworkPolicy API's
// meaning of an empty from): no peer listed and no operator to name must be
// no rule at all.
func TestNoPeerLetsNobodyIn(t *testing.T) {
	ingress, _ := policiesOf(t, sampleInference(), "")
	if len(ingress.Spec.Ingress) != 0 {
		t.Fatalf("ingress rules %+v: a rule without peers lets everyone in", ingress.Spec.Ingress)
	}
}

// The agent's port is the operator's alone, and only when an agent runs.
func TestOnlyTheOperatorReachesTheAdapterAgent(t *testing.T) {
	obj := sampleInference()
	ingress, _ := policiesOf(t, obj, "ops")
	if n := len(ingress.Spec.Ingress); n != 1 {
		t.Fatalf("%d ingress rules without adapters, want 1", n)
	}
	obj.Spec.Adapters = []servingv1.AdapterSpec{{Name: "sql", Source: obj.Spec.Model.Source}}
	ingress, _ = policiesOf(t, obj, "ops")
	if n := len(ingress.Spec.Ingress); n != 2 {
		t.Fatalf("%d ingress rules with adapters, want 2", n)
	}
	agent := ingress.Spec.Ingress[1]
	if len(agent.Ports) != 1 || agent.Ports[0].Port.IntVal != loadspec.AdapterAgentPort {
		t.Errorf("agent rule ports %+v", agent.Ports)
	}
	if len(agent.From) != 1 || agent.From[0].PodSelector.MatchLabels[OperatorPodLabel] != OperatorPodName {
		t.Errorf("agent rule lets in %+v, want the operator only", agent.From)
	}
	for _, p := range ingress.Spec.Ingress[0].Ports {
		if p.Port.IntVal == loadspec.AdapterAgentPort {
			t.Errorf("the peers' rule opens the agent's port")
		}
	}
}

// Every source the loader and the agent fetch from gets its egress: the
// Hub's port, the registry's address and port, an adapter's own store.
func TestEgressReachesEverySource(t *testing.T) {
	for _, tc := range []struct {
		name     string
		source   servingv1.ModelSource
		adapters []servingv1.AdapterSpec
		want     []networkingv1.NetworkPolicyEgressRule
	}{
		{"the Hub", servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "Qwen/Qwen2.5-0.5B"}}, nil,
			[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcpPort(443)}}}},
		{"a mirror of the Hub", servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "q/q", Endpoint: "http://10.1.2.3:8080"}}, nil,
			[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcpPort(8080)},
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.2.3/32"}}}}}},
		{"a plain-HTTP registry", servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: "10.0.0.5:5000/models/qwen:v1", PlainHTTP: true}}, nil,
			[]networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcpPort(5000)},
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.5/32"}}}}}},
		{"an adapter's store beside the model's", servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "m", Endpoint: "http://10.0.0.7:9000"}},
			[]servingv1.AdapterSpec{
				{Name: "a", Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "m", Endpoint: "http://10.0.0.7:9000"}}},
				{Name: "b", Source: servingv1.ModelSource{HTTP: &servingv1.HTTPSource{URL: "https://adapters.example/b/"}}},
			},
			[]networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{tcpPort(9000)}, To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.7/32"}}}},
				{Ports: []networkingv1.NetworkPolicyPort{tcpPort(443)}},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := sampleInference()
			obj.Spec.Model.Source, obj.Spec.Adapters = tc.source, tc.adapters
			_, egress := policiesOf(t, obj, "ops")
			got := egress.Spec.Egress[1:] // after DNS
			if len(got) != len(tc.want) {
				t.Fatalf("egress after DNS %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i].Ports[0].Port.IntVal != tc.want[i].Ports[0].Port.IntVal || len(got[i].To) != len(tc.want[i].To) ||
					(len(got[i].To) == 1 && got[i].To[0].IPBlock.CIDR != tc.want[i].To[0].IPBlock.CIDR) {
					t.Errorf("egress rule %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
