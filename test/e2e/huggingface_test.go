package e2e

import (
	"bytes"
	"context"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/hubfake"
)

// The loader on the real node against the FAKE Hugging Face Hub (test/hubfake:
// the Hub cannot be reached from here), which listens on the host's address
// with its API and its LFS CDN on two ports, as the Hub's resolve redirects
// to another host: a public repository is loaded at the commit its branch
// names, with the default patterns, verified and served; a gated one without
// a token fails for good with its own reason.
func TestRealNodeLoadsFromTheHub(t *testing.T) {
	g, _, obj := startRealNodeTest(t, 2, "hub")
	ctx := context.Background()
	addr, err := hostAddr()
	g.Expect(err).NotTo(HaveOccurred())
	host, _, _ := net.SplitHostPort(addr)
	hub, err := hubfake.NewAt(host, "hf_granted")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(hub.Close)

	rnd := rand.New(rand.NewPCG(7, 1))
	blob := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.UintN(256))
		}
		return b
	}
	files := []hubfake.File{
		{Path: "model-00001-of-00002.safetensors", Data: blob(6<<20 + 13), LFS: true},
		{Path: "model-00002-of-00002.safetensors", Data: blob(2<<20 + 7), LFS: true},
		{Path: "model.safetensors.index.json", Data: []byte(`{"weight_map":{}}`)},
		{Path: "config.json", Data: []byte(`{"model_type":"llama"}`)},
		{Path: "tokenizer.json", Data: blob(300_000), LFS: true},
		{Path: "tokenizer_config.json", Data: []byte(`{}`)},
		{Path: "pytorch_model.bin", Data: blob(1 << 20), LFS: true},
		{Path: "original/consolidated.00.pth", Data: blob(1 << 20), LFS: true},
	}
	wanted := []string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
		"model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"}
	commit, old := hubfake.Commit("hub-v2"), hubfake.Commit("hub-v1")
	hub.Add(&hubfake.Repo{Name: "acme/tiny", Refs: map[string]string{"main": commit},
		Commits: map[string][]hubfake.File{commit: files, old: files[:4]}})
	hub.Add(&hubfake.Repo{Name: "acme/gated", Gated: true, Granted: []string{"hf_granted"},
		Refs: map[string]string{"main": commit}, Commits: map[string][]hubfake.File{commit: files}})

	obj.Spec.Model.Source = servingv1.ModelSource{HuggingFace: &servingv1.HuggingFaceSource{Repository: "acme/tiny", Revision: "main", Endpoint: hub.API.URL}}
	obj.Spec.Model.Size = ptr.To(resource.MustParse("16Mi"))
	gated := obj.DeepCopy()
	gated.Name = "hub-gated"
	gated.Spec.Model.Source.HuggingFace.Repository = "acme/gated"

	begin := time.Now()
	g.Expect(k8s.Create(ctx, obj)).To(Succeed())
	g.Expect(k8s.Create(ctx, gated)).To(Succeed())
	waitFor(t, g, obj, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		beReady(1)(g, got)
		g.Expect(got.Status.Source).NotTo(BeNil())
		g.Expect(got.Status.Source.Revision).To(Equal(commit), "status records the commit main resolved to")
	})
	t.Logf("hub figure: a model from the fake Hub on the real node Ready in %.1f s (%d requests to the Hub, %d bytes from its CDN)",
		time.Since(begin).Seconds(), hub.Requests.Load(), hub.CDNBytes.Load())
	pod := oneServingPod(g, obj)[0]
	expectHubFilesOnHost(g, pod, files, wanted)
	model, err := complete(&http.Client{Timeout: 5 * time.Second}, engineURL(pod), obj.Spec.Model.Name)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(model).To(Equal(obj.Spec.Model.Name))

	waitFor(t, g, gated, realReadyTimeout, func(g Gomega, got *servingv1.AIInference) {
		g.Expect(got.Status.Phase).To(Equal(servingv1.PhaseFailed))
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Reason).To(Equal(loadspec.ReasonGatedModel), got.Status.LastFailure.Message)
		t.Logf("a gated repository without a token: %s: %s", got.Status.LastFailure.Reason, got.Status.LastFailure.Message)
	})
}

// expectHubFilesOnHost checks the pod's cache volume on its real node: the
// files the default patterns select, each byte for byte the commit's, and
// nothing else but the loader's complete marker.
func expectHubFilesOnHost(g Gomega, pod corev1.Pod, files []hubfake.File, wanted []string) {
	var nodeDir string
	for _, n := range cluster.RealNodes() {
		if n.Name == pod.Spec.NodeName {
			nodeDir = n.Dir
		}
	}
	g.Expect(nodeDir).NotTo(BeEmpty(), "pod %s is on no real node", pod.Name)
	volume := filepath.Join(nodeDir, "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~empty-dir", "model-cache")
	var got []string
	g.Expect(filepath.WalkDir(volume, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(volume, p)
		_, inModel, _ := strings.Cut(filepath.ToSlash(rel), "/") // under the model's own folder
		if inModel == loadspec.CompleteMarker {
			return nil
		}
		got = append(got, inModel)
		for _, f := range files {
			if f.Path == inModel {
				data, err := os.ReadFile(p)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(bytes.Equal(data, f.Data)).To(BeTrue(), "%s differs from the commit's", inModel)
			}
		}
		return nil
	})).To(Succeed())
	slices.Sort(got)
	g.Expect(got).To(Equal(wanted))
}
