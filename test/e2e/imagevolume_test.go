package e2e

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/ocipush"
	"github.com/aiinference/operator/test/ociregistry"
)

// A model in a real OCI registry (distribution, on the host) mounted as an
// image volume: the real node's containerd pulls the image the operator's
// push made (kubectl aii push --format image) and the kubelet mounts it, with
// no loader; status records the digest. The figures (make bench-imagevolume,
// 256 MiB): a replica's start cold (containerd pulls) and warm (the node holds
// the image).
func TestRealNodeModelFromAnImageVolume(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 1, "imagevol")
	ctx := context.Background()
	binary, err := ociregistry.Binary()
	g.Expect(err).NotTo(HaveOccurred())
	// On the host's loopback, which the node's containerd (on the host)
	// reaches and, being loopback, talks to in plain HTTP.
	reg, err := ociregistry.Start(binary, t.TempDir(), ociregistry.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(reg.Stop)

	dir := t.TempDir()
	rnd := rand.New(rand.NewPCG(11, 1))
	size := 24 << 20
	if os.Getenv("IMAGEVOLUME_BENCH") != "" {
		size = 256 << 20 // the node cache's smaller figure's model (make bench-cache)
	}
	weights := make([]byte, size)
	for i := range weights {
		weights[i] = byte(rnd.UintN(256))
	}
	g.Expect(os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"llama"}`), 0o644)).To(Succeed())
	digest, err := ocipush.Push(ctx, dir, reg.Host+"/models/imagevol:v1", ocipush.Options{Format: ocipush.Image, PlainHTTP: true})
	g.Expect(err).NotTo(HaveOccurred())
	// By digest, as docs/model-loader.md asks for replicas that must never
	// mix versions: the kubelet reports no digest for a tag (its
	// ImageVolumeWithDigest gate is alpha and off in v1.37), so a tag leaves
	// status.source.digest unknown.
	ref := reg.Host + "/models/imagevol@" + digest

	obj.Spec.Model.Source = servingv1.ModelSource{OCI: &servingv1.OCISource{Reference: ref, Mode: servingv1.OCIModeImageVolume, PlainHTTP: true}}
	obj.Spec.Model.Size = resource.NewQuantity(int64(size+1<<20), resource.BinarySI)
	// One node, so that the second pod finds the image there.
	node := cluster.RealNodes()[0].Name
	obj.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		beReady(1)(g, got)
		g.Expect(got.Status.Source).NotTo(BeNil())
		g.Expect(got.Status.Source.Mode).To(Equal(servingv1.OCIModeImageVolume))
		g.Expect(got.Status.Source.Digest).To(Equal(digest))
	})
	cold := time.Since(begin)
	pod := oneServingPod(g, obj)[0]
	for _, c := range pod.Spec.InitContainers {
		g.Expect(c.Name).NotTo(Equal(servingv1.LoaderContainerName), "an image volume needs no loader")
	}
	g.Expect(pod.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Image.Reference", ref)))

	// Warm: a new pod on the same node, whose containerd holds the image.
	g.Expect(pod.Spec.NodeName).To(Equal(node))
	begin = time.Now()
	g.Expect(k8s.Delete(ctx, &pod)).To(Succeed())
	next := successorPod(g, obj, pod)
	warm := time.Since(begin)
	g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&next), &next)).To(Succeed())
	g.Expect(next.Spec.NodeName).To(Equal(node))
	t.Logf("imagevolume figure: a replica from a %d MiB image volume Ready cold (containerd pulls it) in %.1f s; after its pod is deleted, a new pod on the node holding the image serving in %.1f s",
		len(weights)>>20, cold.Seconds(), warm.Seconds())
}
