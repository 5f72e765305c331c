package aiinference

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestVerifiedGenerations(t *testing.T) {
	var v verifiedGenerations
	stable := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "chat", UID: "u1", Generation: 3}}
	canary := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "chat-canary", UID: "u2", Generation: 1}}
	if v.matches(stable) {
		t.Fatal("a Deployment never seen matches")
	}
	for _, d := range []*appsv1.Deployment{stable, canary} {
		v.record(types.NamespacedName{Namespace: d.Namespace, Name: d.Name}, d.UID, d.Generation)
	}
	if !v.matches(stable) || !v.matches(canary) {
		t.Fatal("recorded generations do not match")
	}
	edited := stable.DeepCopy()
	edited.Generation++
	recreated := stable.DeepCopy()
	recreated.UID = "u3"
	if v.matches(edited) || v.matches(recreated) {
		t.Error("a spec written since, or a Deployment made again under the name, matches")
	}
	v.forget(types.NamespacedName{Namespace: "ns", Name: "chat"})
	if v.matches(stable) || v.matches(canary) {
		t.Error("the Deployments of a deleted AIInference are remembered")
	}
}
