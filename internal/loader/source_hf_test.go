package loader

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/hubfake"
)

// hubModel is a repository shaped like the Hub's models: LFS weights, git
// config and tokenizer files, duplicate .bin weights and an original/ folder
// the default patterns leave out.
func hubModel(name string, seed uint64) []hubfake.File {
	rnd := rand.New(rand.NewPCG(seed, 1))
	blob := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.UintN(256))
		}
		return b
	}
	return []hubfake.File{
		{Path: "model-00001-of-00002.safetensors", Data: blob(3<<20 + 11), LFS: true},
		{Path: "model-00002-of-00002.safetensors", Data: blob(1<<20 + 5), LFS: true},
		{Path: "model.safetensors.index.json", Data: []byte(`{"weight_map":{}}`)},
		{Path: "config.json", Data: []byte(`{"model_type":"` + name + `"}`)},
		{Path: "tokenizer.json", Data: blob(200_000), LFS: true},
		{Path: "tokenizer_config.json", Data: []byte(`{}`)},
		{Path: "README.md", Data: []byte("# " + name)},
		{Path: "pytorch_model.bin", Data: blob(1 << 20), LFS: true},
		{Path: "original/consolidated.00.pth", Data: blob(1 << 20), LFS: true},
		{Path: "original/params.json", Data: []byte(`{}`)},
	}
}

// wantedByDefault are the files the default patterns take from hubModel.
var wantedByDefault = []string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
	"model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"}

func newHub(t *testing.T) *hubfake.Server {
	t.Helper()
	hub := hubfake.New("hf_granted", "hf_other")
	t.Cleanup(hub.Close)
	hub.PageSize = 3 // every listing spans several pages
	v1, v2 := hubfake.Commit("v1"), hubfake.Commit("v2")
	hub.Add(&hubfake.Repo{Name: "acme/tiny", Refs: map[string]string{"main": v1, "v1.0": v1},
		Commits: map[string][]hubfake.File{v1: hubModel("tiny", 1), v2: hubModel("tiny2", 2)}})
	hub.Add(&hubfake.Repo{Name: "acme/gated", Gated: true, Granted: []string{"hf_granted"}, Refs: map[string]string{"main": v1},
		Commits: map[string][]hubfake.File{v1: hubModel("gated", 3)}})
	hub.Add(&hubfake.Repo{Name: "acme/private", Private: true, Granted: []string{"hf_granted"}, Refs: map[string]string{"main": v1},
		Commits: map[string][]hubfake.File{v1: hubModel("private", 4)}})
	return hub
}

func hubOptions(hub *hubfake.Server, source, dest string) Options {
	o := localOptions(source, dest)
	o.HuggingFace = &loadspec.HuggingFaceOptions{Endpoint: hub.API.URL}
	return o
}

// sameAsCommit checks that dest holds exactly the files of a commit that the
// patterns select.
func sameAsCommit(t *testing.T, dest string, files []hubfake.File, want []string) {
	t.Helper()
	var got []string
	_ = filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dest, p)
			if rel != loadspec.CompleteMarker && !strings.HasPrefix(rel, workDirName) {
				got = append(got, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("destination holds %q, want %q", got, want)
	}
	for _, f := range files {
		if slices.Contains(want, f.Path) {
			b, _ := os.ReadFile(filepath.Join(dest, f.Path))
			if !bytes.Equal(b, f.Data) {
				t.Fatalf("%s differs from the commit's", f.Path)
			}
		}
	}
}

func TestHuggingFaceSourceLoadsTheResolvedCommit(t *testing.T) {
	hub := newHub(t)
	dest := filepath.Join(t.TempDir(), "model")
	o := hubOptions(hub, "hf://acme/tiny@main", dest)
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	sameAsCommit(t, dest, hubModel("tiny", 1), wantedByDefault)
	if s.Resolved != hubfake.Commit("v1") {
		t.Errorf("resolved %q, want the commit of main %s", s.Resolved, hubfake.Commit("v1"))
	}
	// LFS files by their sha256, git files by their blob id; nothing by size.
	if !s.Verified || s.Checks[checkSHA256] != 3 || s.Checks[checkGitBlob] != 3 {
		t.Errorf("checks %v, verified %v: want 3 sha256 (LFS) and 3 gitBlobSHA1", s.Checks, s.Verified)
	}
	if hub.CDNBytes.Load() < 4<<20 {
		t.Errorf("the CDN served %d bytes: LFS files must come from the CDN host", hub.CDNBytes.Load())
	}
	// Again: a cache hit, nothing fetched.
	if s, err = runInProcess(t, o); err != nil || !s.CacheHit || s.BytesFetched != 0 {
		t.Errorf("second run: %+v %v", s, err)
	}

	// main moves to another commit: a loader given the earlier resolution
	// (resolved.json) keeps loading that commit, a fresh one loads the new.
	hub.Move("acme/tiny", "main", hubfake.Commit("v2"))
	pinned := hubOptions(hub, "hf://acme/tiny@main", filepath.Join(t.TempDir(), "pinned"))
	pinned.Resolved = &loadspec.Resolved{Source: "hf://acme/tiny@main", Revision: hubfake.Commit("v1")}
	if s, err := runInProcess(t, pinned); err != nil || s.Resolved != hubfake.Commit("v1") {
		t.Fatalf("pinned run: resolved %q, %v", s.Resolved, err)
	}
	sameAsCommit(t, pinned.Dest, hubModel("tiny", 1), wantedByDefault)
	fresh := hubOptions(hub, "hf://acme/tiny@main", filepath.Join(t.TempDir(), "fresh"))
	if s, err := runInProcess(t, fresh); err != nil || s.Resolved != hubfake.Commit("v2") {
		t.Fatalf("fresh run: resolved %q, %v", s.Resolved, err)
	}
	sameAsCommit(t, fresh.Dest, hubModel("tiny2", 2), wantedByDefault)
}

func TestHuggingFaceSourcePatterns(t *testing.T) {
	hub := newHub(t)
	dest := filepath.Join(t.TempDir(), "model")
	o := hubOptions(hub, "hf://acme/tiny@v1.0", dest)
	o.HuggingFace.Include = []string{"*.bin", "original/*", "config.json"}
	o.HuggingFace.Exclude = []string{}
	if _, err := runInProcess(t, o); err != nil {
		t.Fatal(err)
	}
	sameAsCommit(t, dest, hubModel("tiny", 1), []string{"config.json", "original/consolidated.00.pth", "original/params.json", "pytorch_model.bin"})

	o = hubOptions(hub, "hf://acme/tiny", filepath.Join(t.TempDir(), "none"))
	o.HuggingFace.Include = []string{"*.gguf"}
	_, err := runInProcess(t, o)
	if reasonOf(err) != loadspec.ReasonNotFound || !strings.Contains(err.Error(), "include") {
		t.Errorf("no file selected: %v", err)
	}
}

func TestHuggingFaceSourceFailures(t *testing.T) {
	hub := newHub(t)
	for _, tc := range []struct {
		name, source, token string
		reason, message     string
	}{
		{"gated without a token", "hf://acme/gated", "", loadspec.ReasonGatedModel, "tokenSecretRef"},
		{"gated, token not granted", "hf://acme/gated", "hf_other", loadspec.ReasonGatedModel, "not been granted access"},
		{"unknown repository", "hf://acme/nope", "", loadspec.ReasonRepositoryNotFound, "huggingface.repository"},
		{"unknown repository with a token", "hf://acme/nope", "hf_other", loadspec.ReasonRepositoryNotFound, "huggingface.repository"},
		{"private repository without access", "hf://acme/private", "hf_other", loadspec.ReasonRepositoryNotFound, "private repository needs a token"},
		{"unknown revision", "hf://acme/tiny@v9", "", loadspec.ReasonRevisionNotFound, `no revision "v9"`},
		{"invalid token", "hf://acme/tiny", "hf_wrong", loadspec.ReasonAccessDenied, "refused the token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(loadspec.EnvHFToken, tc.token)
			before := hub.Requests.Load()
			_, err := runInProcess(t, hubOptions(hub, tc.source, filepath.Join(t.TempDir(), "m")))
			if reasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("got %v, want reason %s saying %q", err, tc.reason, tc.message)
			}
			if loadspec.IsRetryableExit(int32(ExitCode(err))) {
				t.Errorf("exit %d is retryable; a %s is permanent", ExitCode(err), tc.reason)
			}
			// At most the metadata, the tree's four pages and one resolve per
			// part in flight; retried, it would be ten times that.
			if n := hub.Requests.Load() - before; n > 1+4+4 {
				t.Errorf("%d requests for a permanent failure: it must not be retried", n)
			}
		})
	}
	// The granted token reads the gated and the private repository.
	t.Setenv(loadspec.EnvHFToken, "hf_granted")
	for _, repo := range []string{"gated", "private"} {
		dest := filepath.Join(t.TempDir(), repo)
		if _, err := runInProcess(t, hubOptions(hub, "hf://acme/"+repo, dest)); err != nil {
			t.Fatalf("%s with a granted token: %v", repo, err)
		}
		sameAsCommit(t, dest, hubModel(repo, map[string]uint64{"gated": 3, "private": 4}[repo]), wantedByDefault)
	}
}

func TestHuggingFaceSourceHonoursRetryAfter(t *testing.T) {
	hub := newHub(t)
	hub.Throttle(2, 2*time.Second)
	start := time.Now()
	dest := filepath.Join(t.TempDir(), "model")
	s, err := runInProcess(t, hubOptions(hub, "hf://acme/tiny", dest))
	if err != nil {
		t.Fatal(err)
	}
	sameAsCommit(t, dest, hubModel("tiny", 1), wantedByDefault)
	// Two 429s asking for 2 s each, on the metadata request: at least 4 s,
	// where the back-off alone would have waited well under a second.
	if took := time.Since(start); took < 4*time.Second || hub.Throttled.Load() != 2 {
		t.Errorf("took %s after %d 429s: Retry-After was not honoured", took, hub.Throttled.Load())
	}
	if s.Resolved == "" {
		t.Errorf("summary %+v", s)
	}

	// A server asking for longer than the loader waits is a transient failure
	// at once, not a wait of an hour.
	hub.Throttle(1, time.Hour)
	start = time.Now()
	_, err = runInProcess(t, hubOptions(hub, "hf://acme/tiny", filepath.Join(t.TempDir(), "m2")))
	if reasonOf(err) != loadspec.ReasonTransient || !strings.Contains(err.Error(), "asked to wait 1h0m0s") || time.Since(start) > 30*time.Second {
		t.Errorf("Retry-After of an hour: %v after %s", err, time.Since(start))
	}
}

func TestHuggingFaceSourceDetectsCorruption(t *testing.T) {
	for _, path := range []string{"model-00001-of-00002.safetensors", "config.json"} {
		t.Run(path, func(t *testing.T) {
			hub := newHub(t)
			for _, f := range hubModel("tiny", 1) {
				if f.Path == path {
					hub.Corrupt(f.Data)
				}
			}
			_, err := runInProcess(t, hubOptions(hub, "hf://acme/tiny", filepath.Join(t.TempDir(), "m")))
			if reasonOf(err) != loadspec.ReasonChecksumMismatch || !strings.Contains(err.Error(), path) {
				t.Fatalf("a corrupt %s: %v, want %s", path, err, loadspec.ReasonChecksumMismatch)
			}
		})
	}
}
