package localcluster

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// ImageArchive is an image tarball in the format `docker save` writes, which
// `ctr images import` reads. hack/tools/build.sh images writes them without a
// Docker daemon or a registry.
type ImageArchive struct {
	// Name is the file's base name without .tar, e.g. llm-d-inference-sim.
	Name string `json:"name"`
	// Path is the tarball.
	Path string `json:"path"`
	// Ref is the image reference recorded in the tarball, which pods name in
	// their image field, e.g. localcluster.local/model-loader:0123456789abcdef.
	Ref string `json:"ref"`
}

// The image archives of hack/tools/build.sh images, by Name.
const (
	PauseImage       = "pause"
	ModelLoaderImage = "model-loader"
	EngineSimImage   = "llm-d-inference-sim"
	// EngineOllamaImage is Ollama behind cmd/ollama-start (engine.type Ollama).
	EngineOllamaImage = "ollama"
	RouterImage       = "router"
)

// LoadImageArchives returns the *.tar image archives in dir, sorted by name,
// with the reference each one carries.
func LoadImageArchives(dir string) ([]ImageArchive, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no image archives (*.tar) in %s", dir)
	}
	slices.Sort(paths)
	archives := make([]ImageArchive, 0, len(paths))
	for _, p := range paths {
		ref, err := archiveRef(p)
		if err != nil {
			return nil, fmt.Errorf("image archive %s: %w", p, err)
		}
		archives = append(archives, ImageArchive{Name: strings.TrimSuffix(filepath.Base(p), ".tar"), Path: p, Ref: ref})
	}
	return archives, nil
}

// FindImage returns the archive called name.
func FindImage(archives []ImageArchive, name string) (ImageArchive, error) {
	for _, a := range archives {
		if a.Name == name {
			return a, nil
		}
	}
	return ImageArchive{}, fmt.Errorf("no image archive %s.tar", name)
}

// archiveRef reads the one image reference from the archive's manifest.json.
func archiveRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// The tar reader seeks over the layers, so this reads little of a large archive.
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", errors.New("no manifest.json")
		}
		if err != nil {
			return "", err
		}
		if h.Name != "manifest.json" {
			continue
		}
		var manifest []struct {
			RepoTags []string `json:"RepoTags"`
		}
		if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
			return "", fmt.Errorf("manifest.json: %w", err)
		}
		if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 {
			return "", errors.New("manifest.json: want exactly one image with one tag")
		}
		return manifest[0].RepoTags[0], nil
	}
}

// BuildImages runs `hack/tools/build.sh images` in repoRoot, which writes the
// pause, model-loader, llm-d-inference-sim, router and ollama image archives
// (or finds them in its cache), and returns the folder holding them. A cold
// run builds llm-d-inference-sim and Ollama, which takes about 10 minutes.
func BuildImages(ctx context.Context, repoRoot string, progress io.Writer) (string, error) {
	return runBuildScript(ctx, repoRoot, "images", progress)
}

// importImage imports an image archive into the containerd at socket, in the
// namespace the CRI plugin (and so the kubelet) uses.
func importImage(ctx context.Context, ctr, socket string, archive ImageArchive) error {
	cmd := exec.CommandContext(ctx, ctr, "--address", socket, "--namespace", "k8s.io", "images", "import", "--local", archive.Path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("importing %s into %s: %w: %s", archive.Ref, socket, err, out)
	}
	return nil
}

// runBuildScript runs hack/tools/build.sh GROUP in repoRoot, with its progress
// going to progress (nil: discarded), and returns the folder it prints last.
func runBuildScript(ctx context.Context, repoRoot, group string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	var stdout strings.Builder
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "tools", "build.sh"), group)
	cmd.Dir = repoRoot
	cmd.Stdout = &stdout
	cmd.Stderr = progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/tools/build.sh %s: %w", group, err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}
