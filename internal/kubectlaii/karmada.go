package kubectlaii

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// On Karmada's API server an AIInference is a resource template: its pods,
// Deployment and nodes are in the member clusters, and the server holds the
// template (its status aggregated from the members' by the project's resource
// interpreter, integrations/karmada) and a ResourceBinding with the members'
// shares (spec.clusters) and the status each member reported
// (status.aggregatedStatus, as the interpreter's ReflectStatus reads it).

// karmadaBindingList is the list kind of Karmada's ResourceBindings.
var karmadaBindingList = schema.GroupVersionKind{Group: "work.karmada.io", Version: "v1alpha2", Kind: "ResourceBindingList"}

// karmadaPolicyLabels mark a template Karmada propagates (a PropagationPolicy
// or ClusterPropagationPolicy selected it).
var karmadaPolicyLabels = []string{"propagationpolicy.karmada.io/permanent-id", "clusterpropagationpolicy.karmada.io/permanent-id"}

// KarmadaReport is what Karmada's API server holds of an AIInference it
// propagates to member clusters.
type KarmadaReport struct {
	// Binding is the ResourceBinding's name; empty when it could not be read.
	Binding string `json:"binding,omitempty"`
	// Note says why the members' status is not shown, if it is not.
	Note    string         `json:"note,omitempty"`
	Members []MemberReport `json:"members,omitempty"`
	// Blocking are the members that keep the template from Ready, and why.
	Blocking []BlockingMember `json:"blocking,omitempty"`
}

// MemberReport is one member cluster's part, as its binding says.
type MemberReport struct {
	Cluster string `json:"cluster"`
	// Replicas is the member's share of spec.replicas.
	Replicas int32 `json:"replicas"`
	// Applied is whether Karmada applied the member's object.
	Applied bool   `json:"applied"`
	Health  string `json:"health,omitempty"`
	Phase   string `json:"phase,omitempty"`
	// Ready is ready/replicas of the member's pods.
	Ready string `json:"ready"`
	// Updated is how many of its pods run the member's current spec.
	Updated         int32  `json:"updated"`
	ServingRevision string `json:"servingRevision,omitempty"`
	// Observed is true once the member's operator has seen the template's
	// current generation.
	Observed bool   `json:"observed"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
}

// BlockingMember is a member that keeps the template from Ready.
type BlockingMember struct {
	Cluster string `json:"cluster"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// reflectedStatus is what the interpreter's ReflectStatus copies of a
// member's object.
type reflectedStatus struct {
	ObservedGeneration         *int64           `json:"observedGeneration"`
	Generation                 *int64           `json:"generation"`
	ResourceTemplateGeneration *int64           `json:"resourceTemplateGeneration"`
	Replicas                   int32            `json:"replicas"`
	ReadyReplicas              int32            `json:"readyReplicas"`
	UpdatedReplicas            int32            `json:"updatedReplicas"`
	Phase                      string           `json:"phase"`
	Reason                     string           `json:"reason"`
	ServingRevision            string           `json:"servingRevision"`
	Conditions                 []reflectedReady `json:"conditions"`
}

type reflectedReady struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason"`
	Message            string `json:"message"`
	ObservedGeneration int64  `json:"observedGeneration"`
}

// readKarmada finds the ResourceBinding of obj on Karmada's API server: nil
// when the server serves no ResourceBindings (not Karmada) and the template
// carries no Karmada policy label.
func (e *env) readKarmada(obj *servingv1.AIInference) *KarmadaReport {
	labelled := false
	for _, l := range karmadaPolicyLabels {
		labelled = labelled || obj.Labels[l] != ""
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(karmadaBindingList)
	if err := e.c.List(e.ctx, list, client.InNamespace(obj.Namespace)); err != nil {
		if meta.IsNoMatchError(err) && !labelled {
			return nil
		}
		return &KarmadaReport{Note: "its ResourceBinding could not be read: " + err.Error()}
	}
	for i := range list.Items {
		rb := &list.Items[i]
		res, _, _ := unstructured.NestedStringMap(rb.Object, "spec", "resource")
		if res["apiVersion"] == servingv1.GroupVersion.String() && res["kind"] == "AIInference" && res["name"] == obj.Name {
			return karmadaReport(rb, obj.Generation)
		}
	}
	if !labelled {
		return nil
	}
	return &KarmadaReport{Note: "a Karmada policy selects it, but no ResourceBinding is there yet: Karmada has not placed it on any member"}
}

// karmadaReport reads a ResourceBinding: each member's share and the status it
// reported, and which members keep the template (of generation generation)
// from Ready.
func karmadaReport(rb *unstructured.Unstructured, generation int64) *KarmadaReport {
	r := &KarmadaReport{Binding: rb.GetName()}
	var binding struct {
		Spec struct {
			Clusters []struct {
				Name     string `json:"name"`
				Replicas int32  `json:"replicas"`
			} `json:"clusters"`
		} `json:"spec"`
		Status struct {
			AggregatedStatus []struct {
				ClusterName    string          `json:"clusterName"`
				Status         json.RawMessage `json:"status"`
				Applied        bool            `json:"applied"`
				AppliedMessage string          `json:"appliedMessage"`
				Health         string          `json:"health"`
			} `json:"aggregatedStatus"`
		} `json:"status"`
	}
	data, err := json.Marshal(rb.Object)
	if err == nil {
		err = json.Unmarshal(data, &binding)
	}
	if err != nil {
		r.Note = "its ResourceBinding could not be read: " + err.Error()
		return r
	}
	reported := map[string]int{}
	for i, item := range binding.Status.AggregatedStatus {
		reported[item.ClusterName] = i
	}
	for _, c := range binding.Spec.Clusters {
		m := MemberReport{Cluster: c.Name, Replicas: c.Replicas, Ready: "-"}
		i, ok := reported[c.Name]
		if !ok {
			r.Members = append(r.Members, m)
			r.Blocking = append(r.Blocking, BlockingMember{Cluster: c.Name, Reason: "NotReported", Message: "no status reported yet"})
			continue
		}
		item := binding.Status.AggregatedStatus[i]
		m.Applied, m.Health = item.Applied, item.Health
		var s reflectedStatus
		if len(item.Status) > 0 {
			_ = json.Unmarshal(item.Status, &s)
		}
		m.Phase, m.Updated, m.ServingRevision = s.Phase, s.UpdatedReplicas, s.ServingRevision
		m.Ready = fmt.Sprintf("%d/%d", s.ReadyReplicas, c.Replicas)
		m.Observed = s.ObservedGeneration != nil && s.Generation != nil && *s.ObservedGeneration == *s.Generation &&
			s.ResourceTemplateGeneration != nil && *s.ResourceTemplateGeneration == generation
		var ready *reflectedReady
		for j := range s.Conditions {
			if s.Conditions[j].Type == servingv1.ConditionReady {
				ready = &s.Conditions[j]
			}
		}
		if ready != nil {
			m.Reason, m.Message = ready.Reason, ready.Message
		}
		r.Members = append(r.Members, m)
		switch {
		case !item.Applied:
			r.Blocking = append(r.Blocking, BlockingMember{Cluster: c.Name, Reason: "NotApplied", Message: "Karmada could not apply it: " + item.AppliedMessage})
		case !m.Observed:
			r.Blocking = append(r.Blocking, BlockingMember{Cluster: c.Name, Reason: "NotObserved", Message: "its operator has not seen the template's current generation yet"})
		case ready == nil || ready.Status != "True" || s.Generation == nil || ready.ObservedGeneration != *s.Generation:
			b := BlockingMember{Cluster: c.Name, Reason: m.Reason, Message: m.Message}
			if ready == nil {
				b.Reason, b.Message = "NoReadyCondition", "its status has no Ready condition yet"
			}
			r.Blocking = append(r.Blocking, b)
		}
	}
	return r
}

// writeKarmada shows the members' parts and what blocks the template.
func writeKarmada(out io.Writer, k *KarmadaReport) {
	fmt.Fprint(out, "A Karmada resource template: its pods run in the member clusters; its status is the members' aggregated")
	if k.Binding != "" {
		fmt.Fprintf(out, " (ResourceBinding %s)", k.Binding)
	}
	fmt.Fprintln(out)
	if k.Note != "" {
		fmt.Fprintf(out, "  %s\n", k.Note)
	}
	if len(k.Members) > 0 {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tREPLICAS\tAPPLIED\tHEALTH\tPHASE\tREADY\tUPDATED\tREVISION\tOBSERVED\tREASON")
		for _, m := range k.Members {
			fmt.Fprintf(tw, "%s\t%d\t%t\t%s\t%s\t%s\t%d\t%s\t%t\t%s\n", m.Cluster, m.Replicas, m.Applied, dash(m.Health), dash(m.Phase), m.Ready,
				m.Updated, dash(m.ServingRevision), m.Observed, dash(m.Reason))
		}
		_ = tw.Flush()
	}
	for _, b := range k.Blocking {
		fmt.Fprintf(out, "Blocked by %s: %s: %s\n", b.Cluster, b.Reason, b.Message)
	}
	fmt.Fprintln(out, "Run kubectl aii status against a member cluster for its pods, loads and failures.")
}
