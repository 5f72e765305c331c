package router

import (
	"testing"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// The router applies a canary's weight where no Gateway carries it, keeps a
// Gateway's track where one does, and sends to all serving replicas otherwise.
func TestCanarySplit(t *testing.T) {
	eps := []Endpoint{{Name: "s1", Track: servingv1.TrackStable}, {Name: "s2", Track: servingv1.TrackStable}, {Name: "c1", Track: servingv1.TrackCanary}}
	obj := &servingv1.AIInference{}
	if got := candidatesFor(obj, "", eps, 7); len(got) != 3 {
		t.Errorf("no rollout: %d candidates, want all 3", len(got))
	}
	obj.Status.Rollout = &servingv1.RolloutStatus{Weight: 30}
	canary := 0
	const n = 2000
	for i := range n {
		key := blockHashes([]byte{byte(i), byte(i >> 8), 1, 2}, 4)[0]
		got := candidatesFor(obj, "", eps, key)
		if len(got) == 1 && got[0].Name == "c1" {
			canary++
		} else if len(got) != 2 {
			t.Fatalf("key %d: %v, want the stable replicas or the canary", key, got)
		}
		if again := candidatesFor(obj, "", eps, key); len(again) != len(got) {
			t.Fatal("the same key fell on both sides")
		}
	}
	if share := float64(canary) / n; share < 0.25 || share > 0.35 {
		t.Errorf("canary share %.3f, want about 0.30", share)
	}
	if got := candidatesFor(obj, servingv1.TrackStable, eps, 1); len(got) != 2 {
		t.Errorf("the -stable Service: %v, want the two stable replicas", got)
	}
	obj.Status.Rollout.Weight = 0
	for i := range 100 {
		if got := candidatesFor(obj, "", eps, uint64(i)); len(got) != 2 {
			t.Fatalf("weight 0: %v, want the stable replicas only", got)
		}
	}
}
