package loader

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/s3test"
)

// The tests below run against a real S3 server (versitygw) on loopback, built by
// hack/tools/build.sh (cached after the first build), and the real loader binary.
var (
	srv       *s3test.Server
	loaderBin string
	srcTree   string // the model-shaped tree uploaded under mp/llama and single/llama
	treeBytes int64
	treeFiles int
	setupErr  error
)

const bucket = "models"

func TestMain(m *testing.M) {
	flag.Parse()
	tmp, err := os.MkdirTemp("", "loader-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !testing.Short() {
		setupErr = setup(tmp)
	}
	code := m.Run()
	if srv != nil {
		srv.Stop()
	}
	os.RemoveAll(tmp)
	os.Exit(code)
}

func setup(tmp string) error {
	// Never ask a cloud metadata endpoint for credentials from a test.
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Setenv(loadspec.EnvAccessKeyID, s3test.AccessKey)
	os.Setenv(loadspec.EnvSecretAccessKey, s3test.SecretKey)
	bin, err := s3test.Binary("s3", "versitygw")
	if err != nil {
		return err
	}
	if srv, err = s3test.Start(bin, filepath.Join(tmp, "s3"), nil); err != nil {
		return err
	}
	loaderBin = filepath.Join(tmp, "model-loader")
	build := exec.Command("go", "build", "-o", loaderBin, "github.com/aiinference/operator/cmd/model-loader")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the loader: %w", err)
	}
	// A model-shaped tree: shards of tens of MB (the last one shorter), config and
	// tokenizer files, an empty file, and many small files in nested folders.
	files := s3test.ModelTree(3, 20<<20+12345, 9<<20+7, 40)
	srcTree = filepath.Join(tmp, "src")
	if err := s3test.WriteTree(srcTree, files, 42); err != nil {
		return err
	}
	for _, f := range files {
		treeBytes += f.Size
	}
	treeFiles = len(files)
	ctx := context.Background()
	if err := srv.MakeBucket(ctx, bucket); err != nil {
		return err
	}
	// The same tree in every shape a store may hold it: large files as multipart
	// uploads ("-N" ETags) or every file in one request (ETag = MD5), each with
	// the server's default checksum (CRC64NVME, as AWS S3 adds to every new
	// object), or with one the client computed: composite CRC32C, full-object
	// CRC32, SHA256 of single requests.
	for prefix, layout := range map[string]s3test.Layout{
		"mp/llama":     {PartSize: 5 << 20},
		"single/llama": {},
		"crc32c/llama": {PartSize: 5 << 20, Checksum: types.ChecksumAlgorithmCrc32c, ChecksumType: types.ChecksumTypeComposite},
		"crc32/llama":  {PartSize: 5 << 20, Checksum: types.ChecksumAlgorithmCrc32, ChecksumType: types.ChecksumTypeFullObject},
		"sha256/llama": {Checksum: types.ChecksumAlgorithmSha256},
	} {
		if err := srv.UploadTree(ctx, srcTree, bucket, prefix, layout); err != nil {
			return fmt.Errorf("uploading %s: %w", prefix, err)
		}
	}
	return nil
}

func needServer(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the S3 server; not in -short")
	}
	if setupErr != nil {
		t.Fatalf("test setup: %v", setupErr)
	}
}

// testOptions are options for an in-process run against the test server.
func testOptions(source, dest string) Options {
	return Options{
		Config: loadspec.Config{
			Source: source, Dest: dest,
			S3:            &loadspec.S3Options{Endpoint: srv.Endpoint, Region: "us-east-1", PathStyle: true},
			Concurrency:   8,
			PartSizeBytes: 4 << 20,
			Timeout:       loadspec.Duration{Duration: 2 * time.Minute},
			StallTimeout:  loadspec.Duration{Duration: 10 * time.Second},
		},
		ProgressInterval:   time.Second,
		CheckMultipartETag: true,
		StoreChecksums:     true,
	}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func runInProcess(t *testing.T, o Options) (loadspec.Summary, error) {
	t.Helper()
	return Run(context.Background(), o, slog.New(slog.NewTextHandler(testLogWriter{t}, nil)))
}

// runBinary runs the real loader binary and returns its exit code, the summary it
// wrote to its termination message file, and its log.
func runBinary(t *testing.T, env []string, args ...string) (int, loadspec.Summary, string) {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(loaderBin, append(args, "--termination-message-path", term)...)
	cmd.Env = append(os.Environ(), env...)
	var log bytes.Buffer
	cmd.Stderr = &log
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, readSummary(t, term), log.String()
}

func readSummary(t *testing.T, path string) loadspec.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no termination message: %v", err)
	}
	var s loadspec.Summary
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("termination message is not a valid summary: %v\n%s", err, data)
	}
	return s
}

func s3args(source, dest string, extra ...string) []string {
	return append([]string{"--source", source, "--dest", dest, "--endpoint", srv.Endpoint, "--path-style", "--region", "us-east-1"}, extra...)
}

func assertSameTree(t *testing.T, dest string) {
	t.Helper()
	diff, err := s3test.SameTree(srcTree, dest, loadspec.CompleteMarker)
	if err != nil {
		t.Fatal(err)
	}
	if diff != "" {
		t.Fatalf("destination differs from the source: %s", diff)
	}
	if _, err := os.Stat(filepath.Join(dest, workDirName)); !os.IsNotExist(err) {
		t.Errorf("the work folder %s is still there", workDirName)
	}
}

func TestDownloadEqualsSource(t *testing.T) {
	needServer(t)
	// Every file but the empty one, which is checked by its ETag (the MD5 of
	// nothing) as the loader asks the store nothing about it.
	all := func(check string) map[string]int { return map[string]int{check: treeFiles - 1, checkMD5: 1} }
	for _, tc := range []struct {
		name           string
		source         string
		concurrency    int
		partSize       int64
		fsync          bool
		storeChecksums bool
		wantChecks     map[string]int
	}{
		{"server's CRC64NVME, multipart uploads, default part size", "s3://models/mp/llama", 16, DefaultPartSize, false, true,
			all("crc64nvme")},
		{"server's CRC64NVME, single requests, odd parts, fsync", "s3://models/single/llama", 8, 2<<20 + 1, true, true,
			all("crc64nvme")},
		{"composite CRC32C, part size not a multiple of the upload parts", "s3://models/crc32c/llama", 5, 3<<20 + 17, false, true,
			map[string]int{"crc32c-composite": 3, "crc32c": treeFiles - 4, checkMD5: 1}},
		{"full-object CRC32 of multipart uploads, odd parts", "s3://models/crc32/llama/", 4, 1<<20 + 1, false, true,
			all("crc32")},
		{"SHA256 of single requests, read back in order", "s3://models/sha256/llama", 8, 1<<20 + 333, false, true,
			all("sha256")},
		{"single-part ETags, one request at a time, parts not dividing the files", "s3://models/single/llama", 1, 1<<20 + 333, false, false,
			map[string]int{checkMD5: treeFiles}},
		{"multipart ETags, part size not a multiple of the upload parts", "s3://models/mp/llama/", 5, 3<<20 + 17, false, false,
			map[string]int{checkMultipart: 3, checkMD5: treeFiles - 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "model")
			o := testOptions(tc.source, dest)
			o.Concurrency, o.PartSizeBytes, o.Fsync, o.StoreChecksums = tc.concurrency, tc.partSize, tc.fsync, tc.storeChecksums
			s, err := runInProcess(t, o)
			if err != nil {
				t.Fatal(err)
			}
			assertSameTree(t, dest)
			if s.Files != treeFiles || s.Bytes != treeBytes || s.BytesFetched != treeBytes || !s.Verified || s.CacheHit {
				t.Errorf("summary %+v: want %d files, %d bytes all fetched, verified", s, treeFiles, treeBytes)
			}
			if fmt.Sprint(s.Checks) != fmt.Sprint(tc.wantChecks) {
				t.Errorf("checks %v, want %v", s.Checks, tc.wantChecks)
			}
			m, err := readMarker(dest)
			if err != nil || len(m.Files) != treeFiles || m.Bytes != treeBytes {
				t.Errorf("marker %+v, %v", m, err)
			}
		})
	}
}

func TestCacheHitAndRepair(t *testing.T) {
	needServer(t)
	dest := filepath.Join(t.TempDir(), "model")
	o := testOptions("s3://models/mp/llama", dest)
	if _, err := runInProcess(t, o); err != nil {
		t.Fatal(err)
	}

	// A destination that holds the complete model: nothing fetched, in seconds.
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if !s.CacheHit || s.BytesFetched != 0 || s.Bytes != treeBytes || s.Seconds > 5 {
		t.Errorf("second run %+v: want a cache hit with nothing fetched", s)
	}

	// One file lost (a partly wiped volume): only that file is fetched again.
	lost := "model-00002-of-00003.safetensors"
	fi, err := os.Stat(filepath.Join(dest, lost))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dest, lost)); err != nil {
		t.Fatal(err)
	}
	s, err = runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if s.CacheHit || s.BytesFetched != fi.Size() {
		t.Errorf("repair run %+v: want only %s (%d bytes) fetched", s, lost, fi.Size())
	}
	assertSameTree(t, dest)

	// One file corrupted in place, its size kept (a shared cache written by
	// someone else, a bad disk): not vouched for any more, fetched again.
	f, err := os.OpenFile(filepath.Join(dest, lost), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt"), 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s, err = runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if s.CacheHit || s.BytesFetched != fi.Size() {
		t.Errorf("run after a corruption %+v: want only %s (%d bytes) fetched", s, lost, fi.Size())
	}
	assertSameTree(t, dest)
}

// journalledBytes is how many bytes the journal (and the files already in place)
// say a killed run left done.
func journalledBytes(t *testing.T, dest string) int64 {
	t.Helper()
	var done int64
	for _, st := range readJournal(filepath.Join(dest, workDirName, "journal")) {
		if st.Done {
			done += st.Size
			continue
		}
		for i := range st.Parts {
			parts := planParts(st.Size, st.PartSize)
			done += parts[i].Len
		}
	}
	return done
}

// A killed loader, started again, fetches only what its journal does not have,
// and still checks every file: with CRCs of the parts kept in the journal
// (the default) or MD5s of the upload parts (multipart ETags).
func TestResumeAfterKill(t *testing.T) {
	needServer(t)
	// All files but the empty one have the server's CRC64NVME; of the ETags, the
	// three shards' are multipart.
	testResumeAfterKill(t, "crc64nvme", treeFiles-1, nil)
	testResumeAfterKill(t, checkMultipart, 3, []string{"--store-checksums=false"})
	// Started again with another check, the parts' digests in the journal are for
	// the old one: the partial files are fetched again, and all still checked.
	testResumeAfterKill(t, "", 0, nil, "--store-checksums=false")
}

// killMidLoad runs the loader with args into dest and kills it (SIGKILL: no
// chance to clean up) once a quarter of the model is in its journal, or after
// 60 s; it returns the loader's log.
func killMidLoad(t *testing.T, dest string, args []string) *bytes.Buffer {
	t.Helper()
	cmd := exec.Command(loaderBin, args...)
	log := &bytes.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for journalledBytes(t, dest) < treeBytes/4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	return log
}

// testResumeAfterKill kills a loader run with extra flags, then runs it again with
// extra and then flags, and wants wantChecked files checked by wantCheck ("": all
// verified, by whichever checks).
func testResumeAfterKill(t *testing.T, wantCheck string, wantChecked int, extra []string, then ...string) {
	t.Run(cmp.Or(wantCheck, "check changed"), func(t *testing.T) {
		// A slow link (about 4 MB/s per request) so that the loader is surely
		// mid-download when it is killed.
		proxy := newFaultProxy(srv.Endpoint, nil)
		proxy.rate.Store(4 << 20)
		defer proxy.Close()
		dest := filepath.Join(t.TempDir(), "model")
		args := []string{"--source", "s3://models/mp/llama", "--dest", dest, "--path-style", "--region", "us-east-1",
			"--concurrency", "4", "--part-size", "1Mi", "--termination-message-path", filepath.Join(t.TempDir(), "t")}
		args = append(args, extra...)
		log := killMidLoad(t, dest, append(args, "--endpoint", proxy.URL()))
		if _, err := os.Stat(filepath.Join(dest, loadspec.CompleteMarker)); err == nil {
			t.Fatalf("the killed run wrote the complete marker; it was not killed mid-download:\n%s", log.String())
		}
		done := journalledBytes(t, dest)
		if done <= 0 || done >= treeBytes {
			t.Fatalf("killed run left %d of %d bytes; want a partial download", done, treeBytes)
		}

		args = append([]string{"--concurrency", "4", "--part-size", "1Mi"}, extra...)
		code, s, out := runBinary(t, nil, s3args("s3://models/mp/llama", dest, append(args, then...)...)...)
		if code != 0 {
			t.Fatalf("resumed run exit %d:\n%s", code, out)
		}
		switch {
		case then == nil && s.BytesFetched != treeBytes-done:
			t.Errorf("resumed run fetched %d bytes, want only the missing %d (of %d)", s.BytesFetched, treeBytes-done, treeBytes)
		case then != nil && s.BytesFetched <= treeBytes-done:
			t.Errorf("resumed run with another check fetched %d bytes; want the partial files again, more than the missing %d", s.BytesFetched, treeBytes-done)
		}
		if !s.Verified || s.Bytes != treeBytes || s.Files != treeFiles || (wantCheck != "" && s.Checks[wantCheck] != wantChecked) {
			t.Errorf("summary %+v: want every file verified, %d by %s", s, wantChecked, wantCheck)
		}
		assertSameTree(t, dest)
	})
}

// Through a store-shaped link, the files queued last are fetched in tail parts
// and verified; a loader killed with some of them part-way, started again with
// flags that plan other part sizes, keeps theirs and fetches only what is missing.
func TestTailPartsVerifyAndResume(t *testing.T) {
	needServer(t)
	link, err := s3test.NewLink(srv.Endpoint, s3test.LinkShape{Latency: 30 * time.Millisecond, PerConnection: 6 << 20, Aggregate: 10 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	dest := filepath.Join(t.TempDir(), "model")
	// Eight requests and 8 MiB parts: the last 8 x 2 MiB of the queue are parts of
	// the three shards (interleaved) and the tokenizer, queued last, so those are
	// fetched in 2 MiB parts, and the files queued before them (config.json) in
	// 8 MiB ones.
	first, second, third := "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"
	args := append(s3args("s3://models/mp/llama", dest, "--concurrency", "8", "--part-size", "8Mi",
		"--termination-message-path", filepath.Join(t.TempDir(), "t")), "--endpoint", link.URL())
	log := killMidLoad(t, dest, args)
	states := readJournal(filepath.Join(dest, workDirName, "journal"))
	for name, want := range map[string]int64{first: 2 << 20, second: 2 << 20, third: 2 << 20, "tokenizer.json": 2 << 20, "config.json": 8 << 20} {
		if st := states[name]; st == nil || st.PartSize != want {
			t.Errorf("journal of the killed run: %s %+v, want part size %d\n%s", name, st, want, log.String())
		}
	}
	if st := states[second]; st == nil || st.Done || len(st.Parts) == 0 {
		t.Fatalf("killed run left %s %+v; want some of its parts in, not all\n%s", second, st, log.String())
	}
	done := journalledBytes(t, dest)

	// 4 MiB parts now, and 1 MiB ones at the end: the shards started in 2 MiB parts
	// must keep them for their journalled parts to count.
	code, s, out := runBinary(t, nil, s3args("s3://models/mp/llama", dest, "--concurrency", "4", "--part-size", "4Mi")...)
	if code != 0 {
		t.Fatalf("resumed run exit %d:\n%s", code, out)
	}
	if s.BytesFetched != treeBytes-done {
		t.Errorf("resumed run fetched %d bytes, want only the missing %d (of %d)\n%s", s.BytesFetched, treeBytes-done, treeBytes, out)
	}
	if !s.Verified || s.Checks["crc64nvme"] != treeFiles-1 {
		t.Errorf("summary %+v: want every file verified, %d by crc64nvme", s, treeFiles-1)
	}
	assertSameTree(t, dest)
}

func TestTerminationMessageFigures(t *testing.T) {
	needServer(t)
	dest := filepath.Join(t.TempDir(), "model")
	start := time.Now()
	code, s, out := runBinary(t, nil, s3args("s3://models/single/llama", dest, "--progress-interval", "200ms")...)
	elapsed := time.Since(start).Seconds()
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if s.Files != treeFiles || s.Bytes != treeBytes || s.BytesFetched != treeBytes || !s.Verified || s.Failure != nil {
		t.Errorf("summary %+v", s)
	}
	if s.Seconds <= 0 || s.Seconds > elapsed {
		t.Errorf("seconds %v, want in (0, %v]", s.Seconds, elapsed)
	}
	want := float64(s.BytesFetched) / 1e6 / s.Seconds
	if d := s.ThroughputMBps - want; d > want*0.02+0.2 || d < -(want*0.02+0.2) {
		t.Errorf("throughput %v MB/s, want %v (bytesFetched/seconds)", s.ThroughputMBps, want)
	}
	if !strings.Contains(out, "msg=Progress") && s.Seconds > 0.5 {
		t.Errorf("no progress line in the log:\n%s", out)
	}
}

func TestPermanentFailures(t *testing.T) {
	needServer(t)
	for _, tc := range []struct {
		name       string
		source     string
		env        []string
		wantCode   int
		wantReason string
	}{
		{"missing bucket", "s3://no-such-bucket/llama", nil, loadspec.ExitNotFound, loadspec.ReasonNotFound},
		{"missing key", "s3://models/no/such/model", nil, loadspec.ExitNotFound, loadspec.ReasonNotFound},
		{"wrong secret", "s3://models/mp/llama", []string{loadspec.EnvSecretAccessKey + "=wrong-secret"},
			loadspec.ExitAccessDenied, loadspec.ReasonAccessDenied},
		{"unknown access key", "s3://models/mp/llama", []string{loadspec.EnvAccessKeyID + "=nobody"},
			loadspec.ExitAccessDenied, loadspec.ReasonAccessDenied},
		{"half the credentials", "s3://models/mp/llama", []string{loadspec.EnvSecretAccessKey + "="},
			loadspec.ExitInvalidConfig, loadspec.ReasonInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "model")
			start := time.Now()
			code, s, out := runBinary(t, tc.env, s3args(tc.source, dest, "--credentials-dir", "")...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.wantCode, out)
			}
			if s.Failure == nil || s.Failure.Reason != tc.wantReason || s.Failure.Retryable {
				t.Errorf("failure %+v, want permanent %s", s.Failure, tc.wantReason)
			}
			if time.Since(start) > 20*time.Second {
				t.Errorf("a permanent failure took %s; it must not be retried", time.Since(start))
			}
		})
	}
}

// corruptStored flips one byte of an object as the server stores it, leaving its
// ETag as it was: what bit rot or a broken upload looks like.
func corruptStored(t *testing.T, key string, at int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(srv.Root, bucket, filepath.FromSlash(key)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && at >= fi.Size() {
		at = fi.Size() / 2
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

func TestChecksumMismatch(t *testing.T) {
	needServer(t)
	ctx := context.Background()
	shard := "model-00001-of-00003.safetensors"
	small := "extra/layer-03/part-010.bin"
	for _, tc := range []struct {
		name     string
		prefix   string
		layout   s3test.Layout
		args     []string
		corrupt  string // object to corrupt on the server's disk
		manifest string // a wrong sha256 for this file in SHA256SUMS
		wantFile string
	}{
		{"server's CRC64NVME", "corrupt/crc64nvme", s3test.Layout{PartSize: 5 << 20}, nil, shard, "", shard},
		{"composite CRC32C", "corrupt/crc32c", s3test.Layout{PartSize: 5 << 20, Checksum: types.ChecksumAlgorithmCrc32c, ChecksumType: types.ChecksumTypeComposite}, nil, shard, "", shard},
		{"single-part ETag", "corrupt/single", s3test.Layout{}, []string{"--store-checksums=false"}, shard, "", shard},
		{"multipart ETag", "corrupt/multipart", s3test.Layout{PartSize: 5 << 20}, []string{"--store-checksums=false"}, shard, "", shard},
		{"small file", "corrupt/small", s3test.Layout{}, nil, small, "", small},
		{"sha256 manifest", "corrupt/manifest", s3test.Layout{PartSize: 5 << 20}, nil, "", small, small},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := srv.UploadTree(ctx, srcTree, bucket, tc.prefix, tc.layout); err != nil {
				t.Fatal(err)
			}
			args := tc.args
			if tc.manifest != "" {
				sums := manifestFor(t, srcTree)
				sums = strings.Replace(sums, sha256Of(t, filepath.Join(srcTree, tc.manifest)), strings.Repeat("0", 64), 1)
				writeAndUpload(t, tc.prefix+"/SHA256SUMS", sums)
				args = append(args, "--sha256-manifest", "SHA256SUMS")
			}
			if tc.corrupt != "" {
				corruptStored(t, tc.prefix+"/"+tc.corrupt, 12345)
			}
			dest := filepath.Join(t.TempDir(), "model")
			code, s, out := runBinary(t, nil, s3args("s3://models/"+tc.prefix, dest, args...)...)
			if code != loadspec.ExitChecksum {
				t.Fatalf("exit %d, want %d:\n%s", code, loadspec.ExitChecksum, out)
			}
			if s.Failure == nil || s.Failure.Reason != loadspec.ReasonChecksumMismatch || s.Failure.Retryable ||
				!strings.Contains(s.Failure.Message, tc.wantFile) {
				t.Errorf("failure %+v: want a permanent checksum mismatch naming %s", s.Failure, tc.wantFile)
			}
			// The other workers stop on this failure; they must not claim it as theirs.
			if n := strings.Count(s.Failure.Message, "part "); n > 1 {
				t.Errorf("failure message names %d parts: %s", n, s.Failure.Message)
			}
			if _, err := os.Stat(filepath.Join(dest, tc.wantFile)); err == nil {
				t.Errorf("the corrupt file %s was moved into place", tc.wantFile)
			}
			if _, err := os.Stat(filepath.Join(dest, loadspec.CompleteMarker)); err == nil {
				t.Error("complete marker written over a corrupt model")
			}
		})
	}
}

func sha256Of(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// manifestFor is a sha256sum-format manifest of every file under dir.
func manifestFor(t *testing.T, dir string) string {
	t.Helper()
	var sb strings.Builder
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			fmt.Fprintf(&sb, "%s  %s\n", sha256Of(t, p), filepath.ToSlash(rel))
		}
		return err
	})
	return sb.String()
}

func writeAndUpload(t *testing.T, key, content string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "upload")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Upload(context.Background(), bucket, key, p, s3test.Layout{}); err != nil {
		t.Fatal(err)
	}
}

func TestSHA256Manifest(t *testing.T) {
	needServer(t)
	prefix := "manifest-ok/llama"
	if err := srv.UploadTree(context.Background(), srcTree, bucket, prefix, s3test.Layout{PartSize: 5 << 20}); err != nil {
		t.Fatal(err)
	}
	writeAndUpload(t, prefix+"/SHA256SUMS", manifestFor(t, srcTree))
	dest := filepath.Join(t.TempDir(), "model")
	o := testOptions("s3://models/"+prefix, dest)
	o.SHA256Manifest = "SHA256SUMS"
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if s.Checks[checkSHA256] != treeFiles || !s.Verified {
		t.Errorf("summary %+v: want every file checked by sha256", s)
	}
	if err := os.Remove(filepath.Join(dest, "SHA256SUMS")); err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, dest)
}

func TestMultipartETagUncheckedSaysSo(t *testing.T) {
	needServer(t)
	dest := filepath.Join(t.TempDir(), "model")
	o := testOptions("s3://models/mp/llama", dest)
	o.CheckMultipartETag, o.StoreChecksums = false, false
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, dest)
	// The three shards were multipart uploads: checked by size only, and the
	// summary says so.
	if s.Verified || s.Checks[checkSize] != 3 || s.Checks[checkMD5] != treeFiles-3 {
		t.Errorf("summary %+v: want 3 files checked by size only and verified false", s)
	}
}

func TestSingleObjectSource(t *testing.T) {
	needServer(t)
	dest := filepath.Join(t.TempDir(), "model")
	name := "model-00003-of-00003.safetensors"
	s, err := runInProcess(t, testOptions("s3://models/mp/llama/"+name, dest))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(srcTree, name))
	got, err := os.ReadFile(filepath.Join(dest, name))
	if err != nil || !bytes.Equal(want, got) {
		t.Fatalf("content differs (%v)", err)
	}
	if s.Files != 1 || s.BytesFetched != int64(len(want)) || s.Checks["crc64nvme"] != 1 {
		t.Errorf("summary %+v", s)
	}
}
