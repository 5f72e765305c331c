package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestReleaseIsReproducible builds the same multi-platform image twice, from real
// static Go binaries (the pause program, built for amd64 and arm64), into two
// folders and checks that every digest and every written file is the same, and
// that the image is what the operator's pods need: non-root, CA certificates,
// /tmp, the SBOM.
func TestReleaseIsReproducible(t *testing.T) {
	work := t.TempDir()
	binaries := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		bin := filepath.Join(work, arch, "pause")
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./pause")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		binaries["linux/"+arch] = bin
	}
	// Two certificates in the layout of Debian's package (test data, not real CAs).
	caDir := filepath.Join(work, "ca")
	mozilla := filepath.Join(caDir, "usr/share/ca-certificates/mozilla")
	if err := os.MkdirAll(mozilla, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"B_Root.crt": "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n", "A_Root.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"} {
		if err := os.WriteFile(filepath.Join(mozilla, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := func(out string) releaseResult {
		t.Helper()
		res, err := release(releaseSpec{Name: "pause", Repository: "aiinference/pause", Version: "v9.9.9", Entrypoint: "/pause",
			Binaries: binaries, CADir: caDir, CAVersion: "20250419~deb12u2", Out: out})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first, second := filepath.Join(work, "first"), filepath.Join(work, "second")
	a, b := build(first), build(second)
	if a.IndexDigest != b.IndexDigest {
		t.Fatalf("index digests differ: %s and %s", a.IndexDigest, b.IndexDigest)
	}
	if len(a.Platforms) != 2 {
		t.Fatalf("platforms: %v", a.Platforms)
	}
	for _, f := range []string{"pause.oci.tar", "pause-linux-amd64.docker.tar", "pause-linux-arm64.docker.tar", "pause-linux-arm64.spdx.json"} {
		x, err := os.ReadFile(filepath.Join(first, f))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(second, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two builds", f)
		}
	}
	t.Logf("two builds: index %s, %v", a.IndexDigest, a.Platforms)

	// The layout holds the index under the version, and each image is what a
	// restricted pod runs.
	lp, err := layout.FromPath(filepath.Join(first, "pause.oci"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	topManifest, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(topManifest.Manifests) != 1 || topManifest.Manifests[0].Digest != a.IndexDigest || topManifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v9.9.9" {
		t.Fatalf("layout index: %+v", topManifest.Manifests)
	}
	idx, err := top.ImageIndex(a.IndexDigest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(a.Platforms["linux/arm64"])
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != "arm64" || cfg.OS != "linux" || cfg.Config.User != "65532:65532" || cfg.Config.Entrypoint[0] != "/pause" {
		t.Errorf("config: %s/%s user %q entrypoint %v", cfg.OS, cfg.Architecture, cfg.Config.User, cfg.Config.Entrypoint)
	}
	files := imageFiles(t, img)
	if got := string(files["etc/ssl/certs/ca-certificates.crt"]); !strings.HasPrefix(got, "-----BEGIN CERTIFICATE-----\nAAAA") || !strings.Contains(got, "BBBB") {
		t.Errorf("CA bundle not the package's certificates in name order: %q", got)
	}
	if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("etc/passwd: %q", files["etc/passwd"])
	}
	for _, want := range []string{"tmp/", "home/nonroot/", "pause", "usr/share/sbom/pause.spdx.json"} {
		if _, ok := files[want]; !ok {
			t.Errorf("image has no %s", want)
		}
	}
	sbom := string(files["usr/share/sbom/pause.spdx.json"])
	for _, want := range []string{`"spdxVersion": "SPDX-2.3"`, "pkg:deb/debian/ca-certificates@20250419~deb12u2", "pkg:golang/stdlib@", "github.com/aiinference/operator/hack/images"} {
		if !strings.Contains(sbom, want) {
			t.Errorf("SBOM has no %s", want)
		}
	}
}

// imageFiles reads every layer of img into a map of path to content.
func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			files[h.Name] = b
		}
		rc.Close()
	}
	return files
}
