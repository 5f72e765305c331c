package loader

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/s3test"
)

// smallTree writes a small model-shaped tree (with a sha256 manifest) for the
// sources that need no S3 server.
func smallTree(t *testing.T) (dir string, files []s3test.TreeFile) {
	t.Helper()
	dir = t.TempDir()
	files = s3test.ModelTree(2, 3<<20+101, 1<<20+3, 6)
	if err := s3test.WriteTree(dir, files, 7); err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, f := range files {
		b, _ := os.ReadFile(filepath.Join(dir, f.Path))
		s := sha256.Sum256(b)
		fmt.Fprintf(&sb, "%s  %s\n", hex.EncodeToString(s[:]), f.Path)
	}
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, files
}

func localOptions(source, dest string) Options {
	return Options{
		Config: loadspec.Config{
			Source: source, Dest: dest, S3: &loadspec.S3Options{},
			Concurrency: 4, PartSizeBytes: 1<<20 + 7,
			Timeout:      loadspec.Duration{Duration: time.Minute},
			StallTimeout: loadspec.Duration{Duration: 10 * time.Second},
		},
		ProgressInterval: time.Second,
	}
}

func sameAs(t *testing.T, src, dest string) {
	t.Helper()
	diff, err := s3test.SameTree(src, dest, loadspec.CompleteMarker)
	if err != nil || diff != "" {
		t.Fatalf("destination differs: %s %v", diff, err)
	}
}

func TestHTTPSourceFolderWithManifest(t *testing.T) {
	src, files := smallTree(t)
	var ranged, auth atomic.Int64
	fs := http.FileServer(http.Dir(src))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		}
		if r.Header.Get("Authorization") == "Bearer sesame" {
			auth.Add(1)
		}
		fs.ServeHTTP(w, r)
	}))
	defer ts.Close()
	t.Setenv(loadspec.EnvHTTPBearerToken, "sesame")

	dest := filepath.Join(t.TempDir(), "model")
	o := localOptions(ts.URL+"/", dest)
	o.SHA256Manifest = "SHA256SUMS"
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	sameAs(t, src, dest)
	if s.Files != len(files)+1 || s.Checks[checkSHA256] != len(files) || s.Checks[checkSize] != 1 {
		t.Errorf("summary %+v: want every file but the manifest checked by sha256", s)
	}
	if ranged.Load() < int64(len(files)) || auth.Load() == 0 {
		t.Errorf("%d ranged requests, %d with the bearer token", ranged.Load(), auth.Load())
	}
	// Again: a cache hit.
	if s, err = runInProcess(t, o); err != nil || !s.CacheHit || s.BytesFetched != 0 {
		t.Errorf("second run: %+v %v", s, err)
	}
}

func TestHTTPSourceSingleFile(t *testing.T) {
	src, _ := smallTree(t)
	ts := httptest.NewServer(http.FileServer(http.Dir(src)))
	defer ts.Close()
	dest := filepath.Join(t.TempDir(), "model")
	name := "model-00001-of-00002.safetensors"
	s, err := runInProcess(t, localOptions(ts.URL+"/"+name, dest))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(src, name))
	got, _ := os.ReadFile(filepath.Join(dest, name))
	if string(want) != string(got) || s.Files != 1 || s.BytesFetched != int64(len(want)) {
		t.Errorf("summary %+v; content equal: %v", s, string(want) == string(got))
	}
	// A missing file is a permanent NotFound.
	_, err = runInProcess(t, localOptions(ts.URL+"/missing.bin", filepath.Join(t.TempDir(), "m")))
	if ExitCode(err) != loadspec.ExitNotFound {
		t.Errorf("missing file: %v", err)
	}
}

func TestHTTPSourceWithoutRanges(t *testing.T) {
	src, _ := smallTree(t)
	name := "tokenizer.json"
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(filepath.Join(src, name))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer f.Close()
		fi, _ := f.Stat()
		w.Header().Set("Content-Length", fmt.Sprint(fi.Size()))
		io.Copy(w, f) // ignores Range
	}))
	defer ts.Close()
	dest := filepath.Join(t.TempDir(), "model")
	if _, err := runInProcess(t, localOptions(ts.URL+"/"+name, dest)); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(src, name))
	got, _ := os.ReadFile(filepath.Join(dest, name))
	if string(want) != string(got) {
		t.Error("content differs")
	}
}

func TestFileSource(t *testing.T) {
	src, files := smallTree(t)
	dest := filepath.Join(t.TempDir(), "model")
	o := localOptions("file://"+src, dest)
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	sameAs(t, src, dest)
	if s.Files != len(files)+1 || s.Verified || s.Checks[checkSize] != len(files)+1 {
		t.Errorf("summary %+v: a local copy without a manifest is checked by size only", s)
	}
	// With the manifest every file is checked.
	dest2 := filepath.Join(t.TempDir(), "model")
	o = localOptions("file://"+src, dest2)
	o.SHA256Manifest = "SHA256SUMS"
	if s, err = runInProcess(t, o); err != nil || s.Checks[checkSHA256] != len(files) {
		t.Errorf("with manifest: %+v %v", s, err)
	}
	// A source file changed after the copy: no cache hit, only that file again.
	p := filepath.Join(src, "config.json")
	os.WriteFile(p, []byte(`{"changed": true}`), 0o644)
	os.Chtimes(p, time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	o = localOptions("file://"+src, dest)
	if s, err = runInProcess(t, o); err != nil || s.CacheHit || s.BytesFetched != int64(len(`{"changed": true}`)) {
		t.Errorf("after a change: %+v %v", s, err)
	}
	sameAs(t, src, dest)
	if _, err := runInProcess(t, localOptions("file:///does/not/exist", t.TempDir())); ExitCode(err) != loadspec.ExitNotFound {
		t.Errorf("missing path: %v", err)
	}
}

func TestSecondLoaderWaitsForTheFirst(t *testing.T) {
	src, _ := smallTree(t)
	dest := filepath.Join(t.TempDir(), "model")
	os.MkdirAll(dest, 0o755)
	unlock, err := lockDir(context.Background(), dest, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(700 * time.Millisecond); unlock() }()
	start := time.Now()
	if _, err := runInProcess(t, localOptions("file://"+src, dest)); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 600*time.Millisecond {
		t.Error("the loader did not wait for the lock holder")
	}
}

// An HTTP server that sends the file's digests (GCS's x-goog-hash, RFC 9530's
// Repr-Digest) has each file checked against them, with parts fetched in parallel;
// a digest that does not match the bytes fails the load naming the file.
func TestHTTPSourceDigestHeaders(t *testing.T) {
	src, _ := smallTree(t)
	name := "model-00001-of-00002.safetensors" // 3 MiB: several parts
	content, err := os.ReadFile(filepath.Join(src, name))
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(alg string, b []byte) string {
		h := storeAlgorithms[alg].newHash()
		h.Write(b)
		return base64.StdEncoding.EncodeToString(h.Sum(nil))
	}
	md5sum := md5.Sum(content)
	other := append([]byte("not the file"), content...)
	for _, tc := range []struct {
		name      string
		headers   map[string]string
		wantCheck string
		wantExit  int
	}{
		{"x-goog-hash", map[string]string{"X-Goog-Hash": "crc32c=" + b64("CRC32C", content) + ",md5=" + base64.StdEncoding.EncodeToString(md5sum[:])}, "crc32c", 0},
		{"x-goog-hash md5 only", map[string]string{"X-Goog-Hash": "md5=" + base64.StdEncoding.EncodeToString(md5sum[:])}, checkMD5, 0},
		{"Repr-Digest", map[string]string{"Repr-Digest": "sha-512=:AAAA:, sha-256=:" + b64("SHA256", content) + ":"}, "sha256", 0},
		{"wrong x-goog-hash", map[string]string{"X-Goog-Hash": "crc32c=" + b64("CRC32C", other)}, "", loadspec.ExitChecksum},
		{"wrong Repr-Digest", map[string]string{"Repr-Digest": "sha-256=:" + b64("SHA256", other) + ":"}, "", loadspec.ExitChecksum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := http.FileServer(http.Dir(src))
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.headers {
					w.Header().Set(k, v)
				}
				fs.ServeHTTP(w, r)
			}))
			defer ts.Close()
			dest := filepath.Join(t.TempDir(), "model")
			s, err := runInProcess(t, localOptions(ts.URL+"/"+name, dest))
			if code := ExitCode(err); code != tc.wantExit {
				t.Fatalf("exit %d (%v), want %d", code, err, tc.wantExit)
			}
			if tc.wantExit != 0 {
				if s.Failure == nil || !strings.Contains(s.Failure.Message, name) {
					t.Errorf("failure %+v: want it to name %s", s.Failure, name)
				}
				return
			}
			if s.Checks[tc.wantCheck] != 1 || !s.Verified {
				t.Errorf("summary %+v: want the file checked by %s", s, tc.wantCheck)
			}
			if got, _ := os.ReadFile(filepath.Join(dest, name)); string(got) != string(content) {
				t.Error("content differs")
			}
		})
	}
}
