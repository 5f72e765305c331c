package aiinference

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

// OperatorPodLabel is the label of the operator's own pods (config/manager and
// the chart), which the models' NetworkPolicies let in: the autoscaler reads
// the engines' /metrics and the activator passes held requests on.
const OperatorPodLabel = "app.kubernetes.io/name"

// OperatorPodName is the value of OperatorPodLabel on the operator's pods.
const OperatorPodName = "aiinference-operator"

// desiredNetworkPolicies are the model's NetworkPolicies with
// spec.networkPolicy enabled: one that lets in only the listed peers and the
// operator, on the engine's ports, and one that lets the pods out only to DNS
// and the model's store. operatorNamespace is where the operator's pods run
// ("" when it runs outside the cluster: no peer names it).
func desiredNetworkPolicies(obj *servingv1.AIInference, eng engine.Engine, operatorNamespace string) (ingress, egress *networkingv1.NetworkPolicy) {
	pods := metav1.LabelSelector{MatchLabels: selectorLabels(obj)}
	from := append([]networkingv1.NetworkPolicyPeer(nil), obj.Spec.NetworkPolicy.From...)
	if operatorNamespace != "" {
		from = append(from, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: operatorNamespace}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{OperatorPodLabel: OperatorPodName}},
		})
		if obj.RoutingEnabled() {
			// The router passes on the requests of the peers above, after
			// checking them against the same list (docs/routing.md).
			from = append(from, networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: operatorNamespace}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{OperatorPodLabel: RouterPodName}},
			})
		}
	}
	ports := []networkingv1.NetworkPolicyPort{tcpPort(enginePort(obj, eng))}
	if p := eng.MetricsPort(); p != 0 {
		ports = append(ports, tcpPort(p))
	}
	// A rule whose from is empty lets every client in: with no peer listed
	// and no operator to name, the policy has no rule, and lets nobody in.
	var ingressRules []networkingv1.NetworkPolicyIngressRule
	if len(from) > 0 {
		ingressRules = append(ingressRules, networkingv1.NetworkPolicyIngressRule{From: from, Ports: ports})
	}
	if operatorNamespace != "" && runtimeAdapters(obj) {
		// Only the operator talks to the adapter agent.
		ingressRules = append(ingressRules, networkingv1.NetworkPolicyIngressRule{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: operatorNamespace}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{OperatorPodLabel: OperatorPodName}},
			}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(loadspec.AdapterAgentPort)},
		})
	}
	// The members of a group talk among themselves on ports the engine
	// chooses (Ray's, NCCL's): the model's pods let each other in and out.
	group := []networkingv1.NetworkPolicyPeer{{PodSelector: &pods}}
	if obj.SpansNodes() {
		ingressRules = append(ingressRules, networkingv1.NetworkPolicyIngressRule{From: group})
	}
	ingress = &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: childMeta(obj, obj.IngressPolicyName()),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: pods,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     ingressRules,
		},
	}
	dns := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{
		{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))}, tcpPort(53)}}
	rules := []networkingv1.NetworkPolicyEgressRule{dns}
	if obj.SpansNodes() {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: group})
	}
	sources := []servingv1.ModelSource{obj.Spec.Model.Source}
	for _, a := range obj.Spec.Adapters {
		sources = append(sources, a.Source)
	}
	for _, src := range sources {
		if store, ok := storeEgress(src); ok && !slices.ContainsFunc(rules, func(r networkingv1.NetworkPolicyEgressRule) bool {
			return equality.Semantic.DeepEqual(r, store)
		}) {
			rules = append(rules, store)
		}
	}
	egress = &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: childMeta(obj, obj.EgressPolicyName()),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: pods,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      rules,
		},
	}
	return ingress, egress
}

func tcpPort(p int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(p))}
}

// storeEgress lets the loader reach its store: the store's port, to its
// address when the source names an IP, to any address otherwise (a
// NetworkPolicy cannot name a host; the Hub's and registries' redirects to
// their storage stay on the same port). A PVC source needs none.
func storeEgress(src servingv1.ModelSource) (networkingv1.NetworkPolicyEgressRule, bool) {
	var raw string
	switch {
	case src.S3 != nil && src.S3.Endpoint != "":
		raw = src.S3.Endpoint
	case src.S3 != nil:
		raw = "https://s3.amazonaws.com"
	case src.HTTP != nil:
		raw = src.HTTP.URL
	case src.HuggingFace != nil && src.HuggingFace.Endpoint != "":
		raw = src.HuggingFace.Endpoint
	case src.HuggingFace != nil:
		raw = servingv1.DefaultHuggingFaceEndpoint
	case src.OCI != nil:
		scheme := "https://"
		if src.OCI.PlainHTTP {
			scheme = "http://"
		}
		raw = scheme + strings.SplitN(src.OCI.Reference, "/", 2)[0]
	default:
		return networkingv1.NetworkPolicyEgressRule{}, false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return networkingv1.NetworkPolicyEgressRule{}, false
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p, err := strconv.Atoi(u.Port()); err == nil {
		port = p
	}
	rule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{tcpPort(int32(port))}}
	if ip := net.ParseIP(u.Hostname()); ip != nil {
		bits := 32
		if ip.To4() == nil {
			bits = 128
		}
		rule.To = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: ip.String() + "/" + strconv.Itoa(bits)}}}
	}
	return rule, true
}

// reconcileNetworkPolicies writes the model's NetworkPolicies while
// spec.networkPolicy is enabled, and removes them when it is not.
func (r *Reconciler) reconcileNetworkPolicies(ctx context.Context, s *scope) error {
	np := s.obj.Spec.NetworkPolicy
	if np == nil {
		np = &servingv1.NetworkPolicySpec{}
	}
	obj := s.obj.DeepCopy()
	obj.Spec.NetworkPolicy = np
	ingress, egress := desiredNetworkPolicies(obj, s.engine, r.Options.OperatorNamespace)
	for _, policy := range []*networkingv1.NetworkPolicy{ingress, egress} {
		var err error
		if np.Enabled {
			_, err = r.apply(ctx, s, policy, &networkingv1.NetworkPolicy{})
		} else {
			err = r.deleteOwned(ctx, s, policy, &networkingv1.NetworkPolicy{})
		}
		if err != nil {
			return err
		}
	}
	return nil
}
