// Package ocipush puts a model's folder into an OCI registry, in one of the two
// forms an oci model source reads: an artifact whose layers are the files, one
// file a layer, with ModelPack's media types (the model loader pulls it), or an
// image whose layers are tar archives of the files, one file a layer (the
// node's container runtime mounts it as an image volume).
package ocipush

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// Format is the form the model takes in the registry.
type Format string

const (
	// Artifact: ModelPack's manifest, config and raw weight layers.
	Artifact Format = "artifact"
	// Image: an OCI image of uncompressed tar layers, for image volumes.
	Image Format = "image"
)

// ModelPack's media types (CNCF model-spec v1).
const (
	MediaTypeModelManifest   = "application/vnd.cncf.model.manifest.v1+json"
	MediaTypeModelConfig     = "application/vnd.cncf.model.config.v1+json"
	MediaTypeModelWeight     = "application/vnd.cncf.model.weight.v1.raw"
	MediaTypeModelConfigFile = "application/vnd.cncf.model.weight.config.v1.raw"
	MediaTypeModelDoc        = "application/vnd.cncf.model.doc.v1.raw"
	AnnotationFilepath       = "org.cncf.model.filepath"
)

// Options say where and how to push.
type Options struct {
	Format Format
	// PlainHTTP talks to the registry without TLS.
	PlainHTTP bool
	// Username and Password authenticate, when set.
	Username, Password string
}

// Push uploads the regular files under dir to ref (REGISTRY/REPOSITORY:TAG)
// and returns the manifest's digest.
func Push(ctx context.Context, dir, ref string, o Options) (string, error) {
	r, err := registry.ParseReference(ref)
	if err != nil {
		return "", err
	}
	if r.Reference == "" {
		return "", fmt.Errorf("%s names no tag: want REGISTRY/REPOSITORY:TAG", ref)
	}
	repo := &remote.Repository{Reference: r, PlainHTTP: o.PlainHTTP}
	client := &auth.Client{Cache: auth.NewCache()}
	if o.Username != "" {
		client.Credential = auth.StaticCredential(r.Registry, auth.Credential{Username: o.Username, Password: o.Password})
	}
	repo.Client = client
	files, err := listFiles(dir)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("%s holds no file", dir)
	}
	var layers []ocispec.Descriptor
	for _, f := range files {
		var desc ocispec.Descriptor
		if o.Format == Image {
			desc, err = pushTarLayer(ctx, repo, dir, f)
		} else {
			desc, err = pushFile(ctx, repo, dir, f)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", f, err)
		}
		layers = append(layers, desc)
	}
	var config []byte
	configType, artifactType := MediaTypeModelConfig, MediaTypeModelManifest
	if o.Format == Image {
		configType, artifactType = ocispec.MediaTypeImageConfig, ""
		var diffIDs []digest.Digest
		for _, l := range layers {
			diffIDs = append(diffIDs, l.Digest) // uncompressed: the layer is its own diff
		}
		config, err = json.Marshal(ocispec.Image{
			Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
			RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
		})
	} else {
		config, err = json.Marshal(map[string]any{
			"descriptor": map[string]any{"createdAt": time.Now().UTC().Format(time.RFC3339)},
			"config":     map[string]any{},
			"modelfs":    map[string]any{"type": "layers", "diffIds": layerDigests(layers)},
		})
	}
	if err != nil {
		return "", err
	}
	configDesc := ocispec.Descriptor{MediaType: configType, Digest: digest.FromBytes(config), Size: int64(len(config))}
	if err := pushBytes(ctx, repo, configDesc, config); err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: artifactType, Config: configDesc, Layers: layers,
	})
	if err != nil {
		return "", err
	}
	mdesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifest), Size: int64(len(manifest))}
	if err := repo.PushReference(ctx, mdesc, strings.NewReader(string(manifest)), r.Reference); err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	return mdesc.Digest.String(), nil
}

func layerDigests(layers []ocispec.Descriptor) []string {
	var out []string
	for _, l := range layers {
		out = append(out, l.Digest.String())
	}
	return out
}

func listFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

func mediaTypeOf(name string) string {
	switch {
	case strings.HasSuffix(name, ".safetensors"), strings.HasSuffix(name, ".bin"), strings.HasSuffix(name, ".gguf"), strings.HasSuffix(name, ".pt"), strings.HasSuffix(name, ".pth"):
		return MediaTypeModelWeight
	case strings.HasSuffix(name, ".md"), strings.HasPrefix(filepath.Base(name), "LICENSE"):
		return MediaTypeModelDoc
	}
	return MediaTypeModelConfigFile
}

// pushFile pushes one file as a raw layer named by its path.
func pushFile(ctx context.Context, repo *remote.Repository, dir, rel string) (ocispec.Descriptor, error) {
	path := filepath.Join(dir, filepath.FromSlash(rel))
	d, size, err := fileDigest(path)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaTypeOf(rel), Digest: d, Size: size,
		Annotations: map[string]string{AnnotationFilepath: rel, ocispec.AnnotationTitle: rel}}
	f, err := os.Open(path)
	if err != nil {
		return desc, err
	}
	defer f.Close()
	return desc, pushIfMissing(ctx, repo, desc, f)
}

// pushTarLayer pushes one file as an uncompressed tar layer holding it at its
// path, written to a temporary file first (its digest is needed before the upload).
func pushTarLayer(ctx context.Context, repo *remote.Repository, dir, rel string) (ocispec.Descriptor, error) {
	tmp, err := os.CreateTemp("", "ocipush-*.tar")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	src, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(tmp, h))
	// Folders first, so the runtime makes them with modes a non-root engine can read.
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i], "/") + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Size: fi.Size(), Mode: 0o644, ModTime: time.Unix(0, 0)}); err != nil {
		return ocispec.Descriptor{}, err
	}
	if _, err := io.Copy(tw, src); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil))), Size: size}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return desc, err
	}
	return desc, pushIfMissing(ctx, repo, desc, tmp)
}

func fileDigest(path string) (digest.Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil))), n, nil
}

func pushBytes(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, b []byte) error {
	return pushIfMissing(ctx, repo, desc, strings.NewReader(string(b)))
}

// pushIfMissing uploads a blob the registry does not hold yet.
func pushIfMissing(ctx context.Context, repo *remote.Repository, desc ocispec.Descriptor, r io.Reader) error {
	if ok, err := repo.Blobs().Exists(ctx, desc); err == nil && ok {
		return nil
	}
	return repo.Blobs().Push(ctx, desc, r)
}
