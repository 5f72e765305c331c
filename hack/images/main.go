// Command images writes an image made of static binaries (one, the entrypoint,
// and any -add beside it, and -link symbolic links to them) as a tarball that
// `ctr -n k8s.io images import --local` accepts, with no Docker daemon and no
// registry. hack/tools/build.sh (group images) runs it for the real nodes of the
// local cluster. `images release` (release.go, run by `make images`) builds the
// operator's and the model loader's published multi-platform images.
//
// The layer is built with fixed timestamps and owners, so the same binary and
// flags always give the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "release" {
		if err := releaseMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "images release:", err)
			os.Exit(1)
		}
		return
	}
	binary := flag.String("binary", "", "static binary to put in the image (required)")
	var added []string
	flag.Func("add", "another static binary to put in the image, at /<base name> (repeatable); -binary stays the entrypoint", func(p string) error {
		added = append(added, p)
		return nil
	})
	var links []link
	flag.Func("link", "a symbolic link in the image, NAME=TARGET, e.g. /bin/bash=/fake-vllm (repeatable)", func(s string) error {
		name, target, ok := strings.Cut(s, "=")
		if !ok || !path.IsAbs(name) || target == "" {
			return fmt.Errorf("-link %q: want /NAME=TARGET", s)
		}
		links = append(links, link{name: name, target: target})
		return nil
	})
	entrypoint := flag.String("entrypoint", "", "path of the binary in the image (default: /<base name of -binary>)")
	tag := flag.String("tag", "", "image reference written into the tarball, e.g. localcluster.local/pause:3.10 (required)")
	user := flag.String("user", "65532:65532", "user:group the image runs as")
	out := flag.String("out", "", "tarball to write (required)")
	flag.Parse()
	if *binary == "" || *tag == "" || *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *entrypoint == "" {
		*entrypoint = "/" + path.Base(*binary)
	}
	if err := writeImage(*binary, *entrypoint, added, links, *tag, *user, *out); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// link is a symbolic link at name (absolute) to target.
type link struct{ name, target string }

func writeImage(binary, entrypoint string, added []string, links []link, tag, user, out string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	files := []file{{path: strings.TrimPrefix(entrypoint, "/")}}
	for _, a := range added {
		files = append(files, file{path: path.Base(a)})
	}
	for i, p := range append([]string{binary}, added...) {
		if files[i].data, err = os.ReadFile(p); err != nil {
			return err
		}
	}
	layerTar, err := rootFS(files, links)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	configFile, err := img.ConfigFile()
	if err != nil {
		return err
	}
	configFile = configFile.DeepCopy()
	configFile.OS = "linux"
	configFile.Architecture = "amd64"
	configFile.Config = v1.Config{
		Entrypoint: []string{entrypoint},
		User:       user,
		WorkingDir: "/",
		// HOME points at a writable folder, for programs that keep a cache there.
		Env: []string{"PATH=/", "HOME=/tmp"},
	}
	if img, err = mutate.ConfigFile(img, configFile); err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// rootFS is the image's only layer: the programs (path relative to /, data), in
// the order given, then the links (with the folders they are in), and a
// world-writable /tmp, with fixed times and root ownership.
func rootFS(programs []file, links []link) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	for _, p := range programs {
		if err := tw.WriteHeader(&tar.Header{Name: p.path, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(p.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(p.data); err != nil {
			return nil, err
		}
	}
	dirs := map[string]bool{"tmp/": true}
	for _, l := range links {
		name := strings.TrimPrefix(path.Clean(l.name), "/")
		var parents []string
		for dir := path.Dir(name); dir != "." && !dirs[dir+"/"]; dir = path.Dir(dir) {
			parents = append([]string{dir + "/"}, parents...)
			dirs[dir+"/"] = true
		}
		for _, dir := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: l.target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
