package ingresspolicy

import (
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	servingv1 "github.com/aiinference/operator/api/v1"
)

func TestAdmits(t *testing.T) {
	gatewayNamespace := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "gateway"}}
	frontend := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "frontend"}}
	pod := func(namespace string, podLabels map[string]string) Client {
		return Client{IP: net.ParseIP("10.244.1.7"), Pod: true, Namespace: namespace, PodLabels: podLabels,
			NamespaceLabels: labels.Set{corev1.LabelMetadataName: namespace}}
	}
	outside := Client{IP: net.ParseIP("192.0.2.10")}
	for _, tc := range []struct {
		name   string
		policy *servingv1.NetworkPolicySpec
		client Client
		want   bool
	}{
		{"no policy: all", nil, outside, true},
		{"policy off: all", &servingv1.NetworkPolicySpec{From: []networkingv1.NetworkPolicyPeer{{PodSelector: frontend}}}, outside, true},
		{"on, no peer: none", &servingv1.NetworkPolicySpec{Enabled: true}, pod("ml", nil), false},
		{"podSelector alone: a matching pod of the model's namespace",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{PodSelector: frontend}}},
			pod("ml", map[string]string{"app": "frontend"}), true},
		{"podSelector alone: not the same labels in another namespace",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{PodSelector: frontend}}},
			pod("other", map[string]string{"app": "frontend"}), false},
		{"podSelector alone: another pod of the namespace",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{PodSelector: frontend}}},
			pod("ml", map[string]string{"app": "batch"}), false},
		{"namespaceSelector alone: any pod there",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: gatewayNamespace}}},
			pod("gateway", nil), true},
		{"namespaceSelector alone: not another namespace",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: gatewayNamespace}}},
			pod("attacker", nil), false},
		{"both selectors: the pods in those namespaces",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: gatewayNamespace, PodSelector: frontend}}},
			pod("gateway", map[string]string{"app": "frontend"}), true},
		{"both selectors: other pods there",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: gatewayNamespace, PodSelector: frontend}}},
			pod("gateway", map[string]string{"app": "other"}), false},
		{"empty namespaceSelector: every namespace",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}},
			pod("anywhere", nil), true},
		{"a selector on pods never admits an address no pod holds",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}},
			outside, false},
		{"ipBlock: inside",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}}}},
			outside, true},
		{"ipBlock: in an except",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.8/29"}}}}},
			outside, false},
		{"ipBlock: a pod's address inside it",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16"}}}},
			pod("attacker", nil), true},
		{"ipBlock: outside",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}}}},
			outside, false},
		{"a selector that does not parse admits nobody",
			&servingv1.NetworkPolicySpec{Enabled: true, From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}}}},
			pod("ml", map[string]string{"app": "frontend"}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm"}}
			model.Spec.NetworkPolicy = tc.policy
			if got := Admits(model, tc.client); got != tc.want {
				t.Errorf("Admits = %v, want %v", got, tc.want)
			}
		})
	}
}
