package aiinference

import (
	"testing"

	. "github.com/onsi/gomega"
)

// A PodGroup for every desired group, and for every group that still has
// pods: a rollout's surge group one past the desired count, and groups being
// removed, whose pods would otherwise wait for a PodGroup that is gone.
func TestEveryGroupWithPodsHasAPodGroup(t *testing.T) {
	g := NewWithT(t)
	g.Expect(podGroupIndices(2, nil)).To(Equal([]int{0, 1}))
	g.Expect(podGroupIndices(2, []podView{{Group: "0"}, {Group: "2"}, {Group: "2"}})).To(Equal([]int{0, 1, 2}), "a surge group")
	g.Expect(podGroupIndices(0, []podView{{Group: "3"}, {Group: "1"}})).To(Equal([]int{1, 3}), "groups going away")
	g.Expect(podGroupIndices(1, []podView{{Group: ""}})).To(Equal([]int{0}), "a single-node pod")

	obj := multiNodeInference()
	pg := desiredPodGroup(obj, 3)
	g.Expect(pg.Name).To(Equal(obj.GroupSetName()+"-3"), "the group's leader pod's name")
	g.Expect(pg.Spec.SchedulingPolicy.Gang).NotTo(BeNil())
	g.Expect(pg.Spec.SchedulingPolicy.Gang.MinCount).To(Equal(int32(2)), "all of a group's pods or none")
}
