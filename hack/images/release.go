package main

// `images release` builds the operator's and the model loader's published
// images: one multi-platform OCI image per binary, on a base built here (static
// binaries need no libc: CA certificates from Debian's ca-certificates package,
// /etc/passwd and /etc/group with the non-root user 65532, a writable /tmp),
// written as an OCI layout, as a tar of that layout (`ctr images import`,
// `docker load`, `crane push` accept it) and as one single-platform docker
// tarball per platform, with an SPDX SBOM per image and platform.
//
// Everything is fixed that could vary between builds: file times and owners in
// the layers, the config's creation time (SOURCE_DATE_EPOCH, default 0), the order
// of entries, gzip settings. The same binaries give the same digests.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonRootUID is the user the images run as (the same UID as the engine's pods).
const nonRootUID = 65532

// releaseSpec is what one `images release` run builds.
type releaseSpec struct {
	Name       string            // image name in file names, e.g. operator
	Repository string            // repository without a host, e.g. aiinference/operator
	Version    string            // tag, the version the binary's --version prints
	Entrypoint string            // path of the binary in the image, e.g. /manager
	Binaries   map[string]string // platform (linux/amd64) -> static binary
	CADir      string            // Debian ca-certificates package extracted (dpkg-deb -x)
	CAVersion  string            // that package's version, for the SBOM
	Epoch      int64             // SOURCE_DATE_EPOCH
	Out        string            // output folder
}

// releaseResult names what was written.
type releaseResult struct {
	IndexDigest v1.Hash
	Platforms   map[string]v1.Hash
}

func releaseMain(args []string) error {
	fl := flag.NewFlagSet("release", flag.ExitOnError)
	var s releaseSpec
	var binaries stringList
	fl.StringVar(&s.Name, "name", "", "image name used in file names (required)")
	fl.StringVar(&s.Repository, "repository", "", "repository the image is tagged in, without a host (required)")
	fl.StringVar(&s.Version, "version", "", "tag: the version the binary's --version prints (required)")
	fl.StringVar(&s.Entrypoint, "entrypoint", "", "path of the binary in the image (default /<name>)")
	fl.Var(&binaries, "binary", "PLATFORM=PATH of a static binary, e.g. linux/arm64=bin/linux-arm64/manager (repeat)")
	fl.StringVar(&s.CADir, "ca-dir", "", "Debian's ca-certificates package extracted with dpkg-deb -x (required)")
	fl.StringVar(&s.CAVersion, "ca-version", "", "that package's version (required)")
	fl.StringVar(&s.Out, "out", "", "output folder (required)")
	_ = fl.Parse(args)
	if s.Name == "" || s.Repository == "" || s.Version == "" || s.CADir == "" || s.CAVersion == "" || s.Out == "" || len(binaries) == 0 {
		fl.Usage()
		os.Exit(2)
	}
	if s.Entrypoint == "" {
		s.Entrypoint = "/" + s.Name
	}
	s.Binaries = map[string]string{}
	for _, b := range binaries {
		platform, file, ok := strings.Cut(b, "=")
		if !ok {
			return fmt.Errorf("--binary %q: want PLATFORM=PATH", b)
		}
		s.Binaries[platform] = file
	}
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		s.Epoch = n
	}
	res, err := release(s)
	if err != nil {
		return err
	}
	fmt.Printf("%s:%s %s\n", s.Repository, s.Version, res.IndexDigest)
	for _, p := range sortedKeys(res.Platforms) {
		fmt.Printf("  %s %s\n", p, res.Platforms[p])
	}
	return nil
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func release(s releaseSpec) (releaseResult, error) {
	res := releaseResult{Platforms: map[string]v1.Hash{}}
	ref, err := name.NewTag(s.Repository+":"+s.Version, name.WeakValidation)
	if err != nil {
		return res, err
	}
	bundle, err := caBundle(s.CADir)
	if err != nil {
		return res, err
	}
	base, err := layerFrom(baseFiles(bundle, s.CADir))
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(s.Out, 0o755); err != nil {
		return res, err
	}
	created := v1.Time{Time: time.Unix(s.Epoch, 0).UTC()}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, platform := range sortedKeys(s.Binaries) {
		osName, arch, ok := strings.Cut(platform, "/")
		if !ok {
			return res, fmt.Errorf("platform %q: want OS/ARCH", platform)
		}
		program, err := os.ReadFile(s.Binaries[platform])
		if err != nil {
			return res, err
		}
		sbom, err := spdx(s, platform, s.Binaries[platform], program)
		if err != nil {
			return res, err
		}
		sbomPath := "usr/share/sbom/" + s.Name + ".spdx.json"
		app, err := layerFrom([]file{
			{path: "usr/share/sbom/", dir: true, mode: 0o755},
			{path: sbomPath, data: sbom, mode: 0o644},
			{path: strings.TrimPrefix(s.Entrypoint, "/"), data: program, mode: 0o755},
		})
		if err != nil {
			return res, err
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		if img, err = mutate.AppendLayers(img, base, app); err != nil {
			return res, err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return res, err
		}
		cfg = cfg.DeepCopy()
		cfg.OS, cfg.Architecture = osName, arch
		cfg.Config = v1.Config{
			Entrypoint: []string{s.Entrypoint},
			User:       fmt.Sprintf("%d:%d", nonRootUID, nonRootUID),
			WorkingDir: "/",
			Env:        []string{"PATH=/", "HOME=/home/nonroot", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			Labels: map[string]string{
				"org.opencontainers.image.version": s.Version,
				"org.opencontainers.image.title":   s.Name,
			},
		}
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			return res, err
		}
		if img, err = mutate.CreatedAt(img, created); err != nil {
			return res, err
		}
		img = mutate.Annotations(img, map[string]string{
			"org.opencontainers.image.version": s.Version,
			"org.opencontainers.image.created": created.Format(time.RFC3339),
		}).(v1.Image)
		digest, err := img.Digest()
		if err != nil {
			return res, err
		}
		res.Platforms[platform] = digest
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: osName, Architecture: arch}},
		})
		archName := s.Name + "-" + osName + "-" + arch
		if err := os.WriteFile(filepath.Join(s.Out, archName+".spdx.json"), sbom, 0o644); err != nil {
			return res, err
		}
		// One platform per docker tarball: `docker load` and `ctr images import` of
		// older versions take no index.
		if err := tarball.WriteToFile(filepath.Join(s.Out, archName+".docker.tar"), ref, img); err != nil {
			return res, err
		}
	}
	if res.IndexDigest, err = idx.Digest(); err != nil {
		return res, err
	}
	dir := filepath.Join(s.Out, s.Name+".oci")
	if err := os.RemoveAll(dir); err != nil {
		return res, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return res, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": s.Version,
		"io.containerd.image.name":          ref.String(),
	})); err != nil {
		return res, err
	}
	return res, tarDir(dir, filepath.Join(s.Out, s.Name+".oci.tar"))
}

// caBundle concatenates the package's certificates in name order, as
// update-ca-certificates does with Debian's default configuration.
func caBundle(caDir string) ([]byte, error) {
	certs, err := filepath.Glob(filepath.Join(caDir, "usr/share/ca-certificates/mozilla/*.crt"))
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("no certificates under %s/usr/share/ca-certificates/mozilla", caDir)
	}
	sort.Strings(certs)
	var buf bytes.Buffer
	for _, c := range certs {
		b, err := os.ReadFile(c)
		if err != nil {
			return nil, err
		}
		buf.Write(bytes.TrimRight(b, "\n"))
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// file is one entry of a layer.
type file struct {
	path     string
	data     []byte
	mode     int64
	dir      bool
	uid, gid int
}

// baseFiles is the base layer: what a static Go binary needs from a root file system.
func baseFiles(bundle []byte, caDir string) []file {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonRootUID, nonRootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonRootUID)
	files := []file{
		{path: "etc/", dir: true, mode: 0o755},
		{path: "etc/group", data: []byte(group), mode: 0o644},
		{path: "etc/passwd", data: []byte(passwd), mode: 0o644},
		{path: "etc/ssl/", dir: true, mode: 0o755},
		{path: "etc/ssl/certs/", dir: true, mode: 0o755},
		{path: "etc/ssl/certs/ca-certificates.crt", data: bundle, mode: 0o644},
		{path: "home/", dir: true, mode: 0o755},
		{path: "home/nonroot/", dir: true, mode: 0o700, uid: nonRootUID, gid: nonRootUID},
		{path: "tmp/", dir: true, mode: 0o1777},
	}
	if copyright, err := os.ReadFile(filepath.Join(caDir, "usr/share/doc/ca-certificates/copyright")); err == nil {
		files = append(files,
			file{path: "usr/", dir: true, mode: 0o755},
			file{path: "usr/share/", dir: true, mode: 0o755},
			file{path: "usr/share/doc/", dir: true, mode: 0o755},
			file{path: "usr/share/doc/ca-certificates/", dir: true, mode: 0o755},
			file{path: "usr/share/doc/ca-certificates/copyright", data: copyright, mode: 0o644})
	}
	return files
}

// layerFrom writes files, in the order given, with fixed times into a gzip layer.
func layerFrom(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: epoch, Uid: f.uid, Gid: f.gid, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// tarDir writes the folder as a tar with sorted entries, fixed times and owners.
func tarDir(dir, out string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Mode: 0o644, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err = errors.Join(err, tw.Close(), f.Close()); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

// spdx is an SPDX 2.3 document for one platform's image: the binary's Go modules
// (read from its build information), the Go standard library and Debian's
// ca-certificates.
func spdx(s releaseSpec, platform, binaryPath string, program []byte) ([]byte, error) {
	info, err := buildinfo.ReadFile(binaryPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", binaryPath, err)
	}
	sum := sha256.Sum256(program)
	type ref struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	type checksum struct {
		Algorithm string `json:"algorithm"`
		Value     string `json:"checksumValue"`
	}
	type pkg struct {
		ID               string     `json:"SPDXID"`
		Name             string     `json:"name"`
		Version          string     `json:"versionInfo"`
		Download         string     `json:"downloadLocation"`
		FilesAnalyzed    bool       `json:"filesAnalyzed"`
		Checksums        []checksum `json:"checksums,omitempty"`
		Supplier         string     `json:"supplier,omitempty"`
		ExternalRefs     []ref      `json:"externalRefs,omitempty"`
		PrimaryPurpose   string     `json:"primaryPackagePurpose,omitempty"`
		LicenseConcluded string     `json:"licenseConcluded"`
	}
	type rel struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
	id := func(prefix, n string) string {
		h := sha256.Sum256([]byte(n))
		return "SPDXRef-" + prefix + "-" + hex.EncodeToString(h[:6])
	}
	imageID := "SPDXRef-Image"
	pkgs := []pkg{{
		ID: imageID, Name: s.Repository, Version: s.Version, Download: "NOASSERTION",
		PrimaryPurpose: "CONTAINER", LicenseConcluded: "NOASSERTION",
		ExternalRefs: []ref{{"PACKAGE-MANAGER", "purl", "pkg:oci/" + path.Base(s.Repository) + "?tag=" + s.Version + "&arch=" + strings.TrimPrefix(platform, "linux/")}},
	}}
	rels := []rel{{"SPDXRef-DOCUMENT", "DESCRIBES", imageID}}
	add := func(p pkg) {
		pkgs = append(pkgs, p)
		rels = append(rels, rel{imageID, "CONTAINS", p.ID})
	}
	mainVersion := info.Main.Version
	if mainVersion == "" || mainVersion == "(devel)" {
		mainVersion = s.Version
	}
	add(pkg{ID: id("Go", info.Path), Name: info.Main.Path, Version: mainVersion, Download: "NOASSERTION",
		PrimaryPurpose: "APPLICATION", LicenseConcluded: "NOASSERTION",
		Checksums:    []checksum{{"SHA256", hex.EncodeToString(sum[:])}},
		ExternalRefs: []ref{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + info.Main.Path + "@" + mainVersion}}})
	add(pkg{ID: "SPDXRef-Go-stdlib", Name: "stdlib", Version: info.GoVersion, Download: "NOASSERTION",
		LicenseConcluded: "BSD-3-Clause",
		ExternalRefs:     []ref{{"PACKAGE-MANAGER", "purl", "pkg:golang/stdlib@" + strings.TrimPrefix(info.GoVersion, "go")}}})
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := pkg{ID: id("Go", m.Path+"@"+m.Version), Name: m.Path, Version: m.Version, Download: "NOASSERTION",
			LicenseConcluded: "NOASSERTION",
			ExternalRefs:     []ref{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + m.Version}}}
		add(p)
	}
	add(pkg{ID: "SPDXRef-Deb-ca-certificates", Name: "ca-certificates", Version: s.CAVersion, Download: "NOASSERTION",
		Supplier: "Organization: Debian", LicenseConcluded: "GPL-2.0-or-later AND MPL-2.0",
		ExternalRefs: []ref{{"PACKAGE-MANAGER", "purl", "pkg:deb/debian/ca-certificates@" + s.CAVersion + "?arch=all"}}})
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              s.Repository + ":" + s.Version + " " + platform,
		"documentNamespace": "https://spdx.org/spdxdocs/" + path.Base(s.Repository) + "-" + s.Version + "-" + strings.ReplaceAll(platform, "/", "-") + "-" + hex.EncodeToString(sum[:8]),
		"creationInfo": map[string]any{
			"created":  time.Unix(s.Epoch, 0).UTC().Format(time.RFC3339),
			"creators": []string{"Tool: aiinference-operator hack/images"},
		},
		"packages":      pkgs,
		"relationships": rels,
	}
	return json.MarshalIndent(doc, "", "  ")
}
