// Package ingresspolicy tells whether a model's spec.networkPolicy lets a
// client, known by the address its connection comes from, reach the model's
// pods directly. A component that passes requests on to the pods from the
// operator's address (the activator, a router) asks it first, so that it is no
// way around the policy: the operator's address is let in by every model's
// NAME-ingress policy, its clients are not.
//
// The answer is the one the NetworkPolicy the operator renders would give, for
// the peers the user listed (the operator's own peer aside):
//   - no policy (spec.networkPolicy absent or not enabled): every client;
//   - enabled with no peer: none;
//   - a peer with ipBlock: an address inside its CIDR and outside its excepts,
//     whether a pod holds it or not;
//   - a peer with podSelector and/or namespaceSelector: a pod (not one on the
//     host's network: policies do not select those) whose labels match the
//     podSelector (absent: every pod) in a namespace whose labels match the
//     namespaceSelector (absent: the model's namespace only).
//
// An address that is no running pod's (a node, a client outside the cluster)
// is let in by ipBlock peers only.
package ingresspolicy

import (
	"context"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Client is what a policy looks at of a caller.
type Client struct {
	// IP is the address the caller's connection comes from.
	IP net.IP
	// Pod is true when a running pod (not on the host's network) holds IP; the
	// fields below are then that pod's.
	Pod bool
	// Namespace is the pod's namespace.
	Namespace string
	// PodLabels and NamespaceLabels are the pod's labels and its namespace's.
	PodLabels, NamespaceLabels labels.Set
}

// Admits tells whether the model's policy lets c reach its pods.
func Admits(model *servingv1.AIInference, c Client) bool {
	np := model.Spec.NetworkPolicy
	if np == nil || !np.Enabled {
		return true
	}
	for _, peer := range np.From {
		if peerAdmits(peer, model.Namespace, c) {
			return true
		}
	}
	return false
}

// peerAdmits applies one NetworkPolicyPeer of a policy in namespace to c. A
// selector that does not parse admits nobody.
func peerAdmits(peer networkingv1.NetworkPolicyPeer, namespace string, c Client) bool {
	if peer.IPBlock != nil {
		return inBlock(*peer.IPBlock, c.IP)
	}
	if !c.Pod {
		return false
	}
	if peer.NamespaceSelector == nil {
		if c.Namespace != namespace {
			return false
		}
	} else if !matches(peer.NamespaceSelector, c.NamespaceLabels) {
		return false
	}
	return peer.PodSelector == nil || matches(peer.PodSelector, c.PodLabels)
}

func matches(selector *metav1.LabelSelector, set labels.Set) bool {
	s, err := metav1.LabelSelectorAsSelector(selector)
	return err == nil && s.Matches(set)
}

func inBlock(block networkingv1.IPBlock, ip net.IP) bool {
	if _, cidr, err := net.ParseCIDR(block.CIDR); err != nil || !cidr.Contains(ip) {
		return false
	}
	for _, except := range block.Except {
		if _, cidr, err := net.ParseCIDR(except); err != nil || cidr.Contains(ip) {
			return false // an except that does not parse excludes all: fail closed
		}
	}
	return true
}

// Lookup finds who holds an address. Reader must see every namespace's pods,
// since any pod may call: the API server itself (a manager's APIReader, which
// takes the field selector status.podIP), or a cache of all pods with an index
// of that name (the router's). It needs list on pods and get on namespaces in
// every namespace.
type Lookup struct {
	Reader client.Reader
}

// Client finds the running pod that holds ip, and its namespace's labels; a
// Client with Pod false when none does.
func (l Lookup) Client(ctx context.Context, ip net.IP) (Client, error) {
	c := Client{IP: ip}
	pods := &corev1.PodList{}
	if err := l.Reader.List(ctx, pods, client.MatchingFields{"status.podIP": ip.String()}); err != nil {
		return c, fmt.Errorf("finding the pod at %s: %w", ip, err)
	}
	var holder *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if holder != nil {
			return c, fmt.Errorf("pods %s/%s and %s/%s both hold %s", holder.Namespace, holder.Name, p.Namespace, p.Name, ip)
		}
		holder = p
	}
	if holder == nil {
		return c, nil
	}
	ns := &corev1.Namespace{}
	if err := l.Reader.Get(ctx, client.ObjectKey{Name: holder.Namespace}, ns); err != nil {
		return c, fmt.Errorf("reading the namespace of pod %s/%s: %w", holder.Namespace, holder.Name, err)
	}
	c.Pod, c.Namespace, c.PodLabels, c.NamespaceLabels = true, holder.Namespace, holder.Labels, ns.Labels
	return c, nil
}
