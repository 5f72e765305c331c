package kubectlaii

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	sigsyaml "sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// heldBinding is a ResourceBinding as Karmada v1.16.0 held it in
// test/multicluster's rollout test, trimmed: east serves generation 2, west
// has taken it but its new pod cannot be scheduled.
const heldBinding = `
apiVersion: work.karmada.io/v1alpha2
kind: ResourceBinding
metadata:
  name: revised-aiinference
  namespace: rollout
spec:
  clusters:
  - name: east
    replicas: 2
  - name: west
    replicas: 1
  - name: north
    replicas: 1
  resource:
    apiVersion: serving.aiinference.io/v1
    kind: AIInference
    name: revised
status:
  aggregatedStatus:
  - applied: true
    clusterName: east
    health: Healthy
    status:
      conditions:
      - {type: Ready, status: "True", reason: Ready, message: 2 of 2 replicas are ready to serve revised-model, observedGeneration: 2}
      generation: 2
      observedGeneration: 2
      phase: Ready
      readyReplicas: 2
      replicas: 2
      resourceTemplateGeneration: 2
      servingRevision: 2f675ad728058d37
      updatedReplicas: 2
  - applied: true
    clusterName: west
    health: Unhealthy
    status:
      conditions:
      - {type: Ready, status: "False", reason: Unschedulable, message: pod revised-64c45845bb-xdzwx cannot be scheduled, observedGeneration: 2}
      generation: 2
      observedGeneration: 2
      phase: Pending
      readyReplicas: 1
      replicas: 2
      resourceTemplateGeneration: 2
      servingRevision: 02eefafbabb70c4f
      updatedReplicas: 1
  - applied: true
    clusterName: north
    health: Healthy
    status:
      conditions:
      - {type: Ready, status: "True", reason: Ready, message: 1 of 1 replicas are ready, observedGeneration: 1}
      generation: 1
      observedGeneration: 1
      phase: Ready
      readyReplicas: 1
      replicas: 1
      resourceTemplateGeneration: 1
`

// On Karmada's API server status shows the members' parts from the
// ResourceBinding and names the members that block the template: west's
// unschedulable pod, and north, whose operator has not seen generation 2.
func TestStatusOfAKarmadaTemplateShowsTheMembersAndWhatBlocksIt(t *testing.T) {
	rb := &unstructured.Unstructured{}
	if err := sigsyaml.Unmarshal([]byte(heldBinding), &rb.Object); err != nil {
		t.Fatal(err)
	}
	at := metav1.NewTime(time.Date(2026, 12, 7, 0, 30, 0, 0, time.UTC))
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: "rollout", Name: "revised", Generation: 2}}
	obj.Spec.Replicas = ptr.To[int32](4)
	obj.Spec.Model.Name, obj.Spec.Engine.Type = "revised-model", servingv1.EngineVLLM
	obj.Status.Phase, obj.Status.ReadyReplicas = servingv1.PhasePending, 4
	obj.Status.Conditions = []metav1.Condition{{Type: servingv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Unschedulable",
		Message: "west: pod revised-64c45845bb-xdzwx cannot be scheduled", LastTransitionTime: at}}
	r := statusReport(&view{obj: obj}, at.Time)
	r.Karmada = karmadaReport(rb, obj.Generation)
	r.Ready = "4/4"
	var out strings.Builder
	writeStatus(&out, r)
	for _, want := range []string{
		"AIInference rollout/revised: Pending, 4/4 ready",
		"Ready      False   Unschedulable  0s     west: pod revised-64c45845bb-xdzwx cannot be scheduled",
		"A Karmada resource template: its pods run in the member clusters; its status is the members' aggregated (ResourceBinding revised-aiinference)",
		"east    2         true     Healthy    Ready    2/2    2        2f675ad728058d37  true      Ready",
		"west    1         true     Unhealthy  Pending  1/1    1        02eefafbabb70c4f  true      Unschedulable",
		"north   1         true     Healthy    Ready    1/1    0        -                 false     Ready",
		"Blocked by west: Unschedulable: pod revised-64c45845bb-xdzwx cannot be scheduled",
		"Blocked by north: NotObserved: its operator has not seen the template's current generation yet",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	for _, unwanted := range []string{"No pods.", "Blocked by east", "Last load"} {
		if strings.Contains(out.String(), unwanted) {
			t.Errorf("status has %q:\n%s", unwanted, out.String())
		}
	}
}
