package kubectlaii

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/internal/loadspec"
)

// TestKrewManifest: the krew manifest names this plugin, its binary and a
// platform for each archive.
func TestKrewManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "plugins", "krew", "aii.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Version          string `json:"version"`
			ShortDescription string `json:"shortDescription"`
			Platforms        []struct {
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
				Bin    string `json:"bin"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "aii" || m.Spec.Version == "" || m.Spec.ShortDescription == "" {
		t.Errorf("manifest header: %+v", m)
	}
	if len(m.Spec.Platforms) == 0 {
		t.Fatal("no platforms")
	}
	for _, p := range m.Spec.Platforms {
		if p.Bin != "kubectl-aii" || p.URI == "" || len(p.SHA256) != 64 {
			t.Errorf("platform %+v", p)
		}
	}
}

func TestDescribeProgress(t *testing.T) {
	p := &loadspec.Progress{Stage: "downloading", Bytes: 3_200_000_000, Total: 16_000_000_000, RateBytesPerSecond: 410e6, ETASeconds: 31, Files: 12, FilesDone: 3}
	if got, want := describeProgress(p), "loading 3.2 GB of 16.0 GB (20%), 410.0 MB/s, ETA 31s, 3/12 files"; got != want {
		t.Errorf("describeProgress = %q, want %q", got, want)
	}
}
