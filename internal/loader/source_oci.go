package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	orascreds "oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/aiinference/operator/internal/loadspec"
)

// Annotations that name the file a layer holds: ModelPack's, and the one
// `oras push` writes.
const (
	annotationModelFilepath = "org.cncf.model.filepath"
	annotationTitle         = ocispec.AnnotationTitle
	// mediaTypeModelPackConfig is ModelPack's config; its layers are the model's files.
	mediaTypeModelPackConfig = "application/vnd.cncf.model.config.v1+json"
)

// ociSource reads a model stored in an OCI registry as an artifact whose
// layers are the model's files, one file a layer (ModelPack's raw layers, or
// what `oras push` and `kubectl aii push` write), each named by an annotation.
// Each file is checked against its layer's digest and read in ranged requests.
// A layer that is a tar archive (a container image's) is refused: an image is
// mounted as an image volume instead (oci.mode ImageVolume), which the node's
// runtime unpacks.
type ociSource struct {
	ref    registry.Reference
	repo   *remote.Repository
	client remote.Client
	// digest is the manifest's digest (set by List).
	digest string
}

// parseOCIReference reads REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@DIGEST.
func parseOCIReference(ref string) (registry.Reference, error) {
	r, err := registry.ParseReference(ref)
	if err != nil {
		return r, err
	}
	if r.Reference == "" {
		return r, errors.New("no tag or digest: want REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST")
	}
	return r, nil
}

func newOCISource(su sourceURL, o Options) (*ociSource, error) {
	ref, err := parseOCIReference(su.Prefix)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "oci reference %q: %v", su.Prefix, err)
	}
	if p := o.Resolved; p != nil && p.Source == o.Source && strings.HasPrefix(p.Revision, "sha256:") {
		// An earlier load resolved the tag: load the same manifest.
		ref.Reference = p.Revision
	}
	store, err := pullSecretStore(o.PullSecretsDir)
	if err != nil {
		return nil, err
	}
	client := &auth.Client{
		Client:     &http.Client{Transport: newHTTPTransport(o.Concurrency, o.StallTimeout.Duration)},
		Cache:      auth.NewCache(),
		Credential: orascreds.Credential(store),
	}
	client.SetUserAgent("aiinference-model-loader")
	repo := &remote.Repository{Reference: ref, Client: client}
	if o.OCI != nil {
		repo.PlainHTTP = o.OCI.PlainHTTP
	}
	return &ociSource{ref: ref, repo: repo, client: client}, nil
}

// pullSecretStore reads the image pull Secrets mounted under dir (each a
// folder holding .dockerconfigjson or .dockercfg's successor), the first that
// knows a registry winning.
func pullSecretStore(dir string) (orascreds.Store, error) {
	paths, _ := filepath.Glob(filepath.Join(dir, "*", ".dockerconfigjson"))
	var stores []orascreds.Store
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "image pull Secret %s: %v", p, err)
		}
		s, err := orascreds.NewMemoryStoreFromDockerConfig(data)
		if err != nil {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "image pull Secret %s is not a docker config: %v", filepath.Base(filepath.Dir(p)), err)
		}
		stores = append(stores, s)
	}
	if len(stores) == 0 {
		return orascreds.NewMemoryStore(), nil
	}
	return orascreds.NewStoreWithFallbacks(stores[0], stores[1:]...), nil
}

// Resolved is the manifest's digest.
func (s *ociSource) Resolved() string { return s.digest }

func (s *ociSource) List(ctx context.Context) ([]Object, error) {
	var desc ocispec.Descriptor
	err := defaultRetry.do(ctx, func(ctx context.Context) error {
		var err error
		desc, err = s.repo.Resolve(ctx, s.ref.Reference)
		return s.registryError(err)
	}, nil)
	if err != nil {
		return nil, err
	}
	manifest, err := s.fetchManifest(ctx, desc)
	if err != nil {
		return nil, err
	}
	if desc.MediaType == ocispec.MediaTypeImageIndex || desc.MediaType == "application/vnd.docker.distribution.manifest.list.v2+json" {
		var index ocispec.Index
		if err := json.Unmarshal(manifest, &index); err != nil {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: unreadable index: %v", s.ref, err)
		}
		if desc, err = pickManifest(index); err != nil {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: %v", s.ref, err)
		}
		if manifest, err = s.fetchManifest(ctx, desc); err != nil {
			return nil, err
		}
	}
	s.digest = desc.Digest.String()
	var m ocispec.Manifest
	if err := json.Unmarshal(manifest, &m); err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: unreadable manifest: %v", s.ref, err)
	}
	var objs []Object
	for _, l := range m.Layers {
		name := l.Annotations[annotationModelFilepath]
		if name == "" {
			name = l.Annotations[annotationTitle]
		}
		// oras push gives a plain file the image layer media type and a title; a
		// folder it archives carries its unpack annotation. ModelPack says tar in
		// the media type.
		archive := name == "" && isTarLayer(l.MediaType) || l.Annotations["io.deis.oras.content.unpack"] == "true" ||
			strings.HasPrefix(l.MediaType, "application/vnd.cncf.model.") && strings.Contains(l.MediaType, ".tar")
		if archive {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: layer %s is a tar archive (%s), as a container image's layers are: "+
				"mount an image with model.source.oci.mode ImageVolume, or push the model's files one a layer (kubectl aii push, or oras push)", s.ref, l.Digest, l.MediaType)
		}
		if name == "" {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: layer %s names no file (annotation %s or %s)", s.ref, l.Digest, annotationModelFilepath, annotationTitle)
		}
		if l.Digest.Algorithm() != digest.SHA256 || l.Digest.Validate() != nil {
			return nil, failf(loadspec.ReasonInvalidConfig, name, "layer digest %q is not a sha256 digest", l.Digest)
		}
		objs = append(objs, Object{Key: l.Digest.String(), Path: name, Size: l.Size, ETag: l.Digest.String(), SHA256: l.Digest.Encoded()})
	}
	if len(objs) == 0 {
		return nil, failf(loadspec.ReasonNotFound, "", "%s (%s) has no layers: push the model's files into it", s.ref, s.digest)
	}
	return objs, nil
}

func isTarLayer(mediaType string) bool {
	return strings.HasPrefix(mediaType, "application/vnd.oci.image.layer.") || strings.HasPrefix(mediaType, "application/vnd.docker.image.rootfs.")
}

// pickManifest takes the index's manifest for this platform, or its only one.
func pickManifest(index ocispec.Index) (ocispec.Descriptor, error) {
	if len(index.Manifests) == 1 {
		return index.Manifests[0], nil
	}
	for _, d := range index.Manifests {
		if d.Platform != nil && d.Platform.OS == runtime.GOOS && d.Platform.Architecture == runtime.GOARCH {
			return d, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("the index has %d manifests and none for %s/%s", len(index.Manifests), runtime.GOOS, runtime.GOARCH)
}

// fetchManifest reads a manifest, checked against its digest.
func (s *ociSource) fetchManifest(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size > 4<<20 {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "%s: a manifest of %d bytes is more than the 4 MiB the loader reads", s.ref, desc.Size)
	}
	var data []byte
	err := defaultRetry.do(ctx, func(ctx context.Context) error {
		var err error
		data, err = content.FetchAll(ctx, s.repo.Manifests(), desc)
		if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
			return failf(loadspec.ReasonChecksumMismatch, "", "%s: the manifest does not match its digest %s", s.ref, desc.Digest)
		}
		return s.registryError(err)
	}, nil)
	return data, err
}

// registryError gives a registry's answer the reason the loader reports.
func (s *ociSource) registryError(err error) error {
	var re *errcode.ErrorResponse
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdef.ErrNotFound):
		return failf(loadspec.ReasonNotFound, "", "%s is not in the registry: check model.source.oci.reference (registry, repository and tag or digest)", s.ref)
	case errors.Is(err, auth.ErrBasicCredentialNotFound) || errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return failf(loadspec.ReasonAccessDenied, "", "the registry refused to serve %s (%v): put a pull Secret for %s in spec.imagePullSecrets", s.ref, err, s.ref.Registry)
	case errors.As(err, &re) && re.StatusCode == http.StatusNotFound:
		return failf(loadspec.ReasonNotFound, "", "%s is not in the registry (%v): check model.source.oci.reference", s.ref, err)
	case errors.As(err, &re):
		return &httpStatusError{Status: re.StatusCode, URL: re.URL.Redacted()}
	}
	return err
}

// Fetch reads a range of a layer with one request (oras-go's blob reader
// fetches the whole blob before it can seek).
func (s *ociSource) Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error) {
	scheme := "https"
	if s.repo.PlainHTTP {
		scheme = "http"
	}
	u := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", scheme, s.ref.Host(), s.ref.Repository, obj.Key)
	req, err := http.NewRequestWithContext(auth.AppendRepositoryScope(ctx, s.ref, auth.ActionPull), http.MethodGet, u, nil)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "%v", err)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		return resp.Body, nil
	case resp.StatusCode == http.StatusOK && off == 0 && n == obj.Size:
		return resp.Body, nil
	case resp.StatusCode == http.StatusOK:
		resp.Body.Close()
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "the registry ignored a range request")
	}
	resp.Body.Close()
	return nil, &httpStatusError{Status: resp.StatusCode, URL: u, RetryAfterHeader: resp.Header.Get("Retry-After")}
}
