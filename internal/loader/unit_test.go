package loader

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/smithy-go"

	"github.com/aiinference/operator/internal/loadspec"
)

func TestPlanParts(t *testing.T) {
	for _, tc := range []struct {
		size, partSize int64
		want           []part
	}{
		{0, 10, nil},
		{5, 10, []part{{0, 0, 5}}},
		{10, 10, []part{{0, 0, 10}}},
		{25, 10, []part{{0, 0, 10}, {1, 10, 10}, {2, 20, 5}}},
		{21, 7, []part{{0, 0, 7}, {1, 7, 7}, {2, 14, 7}}},
		{3, 0, []part{{0, 0, 3}}},
	} {
		got := planParts(tc.size, tc.partSize)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("planParts(%d, %d) = %v, want %v", tc.size, tc.partSize, got, tc.want)
		}
		var sum int64
		for _, p := range got {
			sum += p.Len
		}
		if sum != tc.size {
			t.Errorf("planParts(%d, %d) covers %d bytes", tc.size, tc.partSize, sum)
		}
	}
}

func TestAlignedPartSize(t *testing.T) {
	mib := int64(1 << 20)
	for _, tc := range []struct{ want, upload, got int64 }{
		{16 * mib, 5 * mib, 15 * mib},
		{16 * mib, 8 * mib, 16 * mib},
		{3 * mib, 5 * mib, 5 * mib},
		{16 * mib, 0, 16 * mib},
		{16 * mib, 64 * mib, 64 * mib},
	} {
		if got := alignedPartSize(tc.want, tc.upload); got != tc.got {
			t.Errorf("alignedPartSize(%d, %d) = %d, want %d", tc.want, tc.upload, got, tc.got)
		}
	}
}

type apiErr struct{ code string }

func (e apiErr) Error() string                 { return e.code }
func (e apiErr) ErrorCode() string             { return e.code }
func (e apiErr) ErrorMessage() string          { return e.code }
func (e apiErr) ErrorFault() smithy.ErrorFault { return smithy.FaultServer }

var _ smithy.APIError = apiErr{}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		wantRetry  bool
		wantReason string
	}{
		{"no such bucket", apiErr{"NoSuchBucket"}, false, loadspec.ReasonNotFound},
		{"no such key", apiErr{"NoSuchKey"}, false, loadspec.ReasonNotFound},
		{"access denied", apiErr{"AccessDenied"}, false, loadspec.ReasonAccessDenied},
		{"bad signature", apiErr{"SignatureDoesNotMatch"}, false, loadspec.ReasonAccessDenied},
		{"unknown key id", apiErr{"InvalidAccessKeyId"}, false, loadspec.ReasonAccessDenied},
		{"slow down", apiErr{"SlowDown"}, true, ""},
		{"internal error", apiErr{"InternalError"}, true, ""},
		{"changed object", apiErr{"PreconditionFailed"}, false, loadspec.ReasonTransient},
		{"http 503", &httpStatusError{Status: 503}, true, ""},
		{"http 429", &httpStatusError{Status: 429}, true, ""},
		{"http 404", &httpStatusError{Status: 404}, false, loadspec.ReasonNotFound},
		{"http 403", &httpStatusError{Status: 403}, false, loadspec.ReasonAccessDenied},
		{"http 400", &httpStatusError{Status: 400}, false, loadspec.ReasonInvalidConfig},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true, ""},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true, ""},
		{"cut body", io.ErrUnexpectedEOF, true, ""},
		{"stall", fmt.Errorf("%w: x", errStalled), true, ""},
		{"local disk", fileErr("a", syscall.ENOSPC), false, loadspec.ReasonTransient},
		{"checksum", failf(loadspec.ReasonChecksumMismatch, "a", "x"), false, loadspec.ReasonChecksumMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			retry, perm := classify(tc.err)
			if retry != tc.wantRetry {
				t.Fatalf("retry = %v, want %v", retry, tc.wantRetry)
			}
			if !retry && (perm == nil || perm.Reason != tc.wantReason) {
				t.Errorf("permanent = %v, want reason %s", perm, tc.wantReason)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{failf(loadspec.ReasonNotFound, "", "x"), loadspec.ExitNotFound},
		{fmt.Errorf("wrapped: %w", failf(loadspec.ReasonAccessDenied, "", "x")), loadspec.ExitAccessDenied},
		{failf(loadspec.ReasonChecksumMismatch, "f", "x"), loadspec.ExitChecksum},
		{failf(loadspec.ReasonInvalidConfig, "", "x"), loadspec.ExitInvalidConfig},
		{failf(loadspec.ReasonHalted, "", "x"), loadspec.ExitHalted},
		{failf(loadspec.ReasonTimeout, "", "x"), loadspec.ExitRetryable},
		{errors.New("anything else"), loadspec.ExitRetryable},
	} {
		if got := ExitCode(tc.err); got != tc.code {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
		if f := FailureOf(tc.err); tc.err != nil && f.Retryable != loadspec.IsRetryableExit(int32(tc.code)) {
			t.Errorf("FailureOf(%v).Retryable = %v, disagrees with the exit code", tc.err, f.Retryable)
		}
		if f := FailureOf(tc.err); f != nil && strings.HasPrefix(f.Message, f.Reason) {
			t.Errorf("FailureOf(%v).Message = %q repeats the reason, which readers print before it", tc.err, f.Message)
		}
	}
}

func TestBackoff(t *testing.T) {
	p := retryPolicy{Attempts: 5, Base: 100 * time.Millisecond, Max: time.Second}
	for _, tc := range []struct {
		attempt  int
		rnd      float64
		min, max time.Duration
	}{
		{0, 0, 50 * time.Millisecond, 50 * time.Millisecond},
		{0, 0.999, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 0, 200 * time.Millisecond, 200 * time.Millisecond},
		{10, 0.999, 500 * time.Millisecond, time.Second},
	} {
		got := p.backoff(tc.attempt, func() float64 { return tc.rnd })
		if got < tc.min || got > tc.max {
			t.Errorf("backoff(%d, %v) = %s, want in [%s, %s]", tc.attempt, tc.rnd, got, tc.min, tc.max)
		}
	}
}

func TestRetryPolicyDo(t *testing.T) {
	p := retryPolicy{Attempts: 3, Base: time.Millisecond, Max: time.Millisecond}
	calls := 0
	err := p.do(context.Background(), func(context.Context) error { calls++; return io.ErrUnexpectedEOF }, nil)
	if calls != 3 || ExitCode(err) != loadspec.ExitRetryable {
		t.Errorf("transient: %d calls, %v", calls, err)
	}
	calls = 0
	err = p.do(context.Background(), func(context.Context) error { calls++; return apiErr{"NoSuchKey"} }, nil)
	if calls != 1 || ExitCode(err) != loadspec.ExitNotFound {
		t.Errorf("permanent: %d calls, %v", calls, err)
	}
	calls = 0
	err = p.do(context.Background(), func(context.Context) error {
		calls++
		if calls < 2 {
			return apiErr{"SlowDown"}
		}
		return nil
	}, nil)
	if calls != 2 || err != nil {
		t.Errorf("recovering: %d calls, %v", calls, err)
	}
}

func TestMergeOptions(t *testing.T) {
	file := loadspec.Config{
		Source: "s3://file-bucket/model", Dest: "/models",
		S3:          &loadspec.S3Options{Endpoint: "http://store:9000", Region: "eu-west-1", PathStyle: true},
		Concurrency: 32, PartSizeBytes: 8 << 20,
		Timeout: loadspec.Duration{Duration: time.Hour},
	}
	for _, tc := range []struct {
		name  string
		file  loadspec.Config
		fv    flagValues
		set   []string
		check func(Options) string
		err   bool
	}{
		{name: "file only", file: file, check: func(o Options) string {
			if o.Source != file.Source || o.Concurrency != 32 || o.PartSizeBytes != 8<<20 || o.S3.Endpoint != "http://store:9000" ||
				o.Timeout.Duration != time.Hour || o.StallTimeout.Duration != DefaultStallTimeout {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{name: "flags win", file: file,
			fv:  flagValues{source: "s3://flag/model", concurrency: 4, partSize: "5Mi", endpoint: "http://other:1", pathStyle: false, stallTimeout: time.Second},
			set: []string{"source", "concurrency", "part-size", "endpoint", "path-style", "stall-timeout"},
			check: func(o Options) string {
				if o.Source != "s3://flag/model" || o.Concurrency != 4 || o.PartSizeBytes != 5<<20 || o.S3.Endpoint != "http://other:1" ||
					o.S3.PathStyle || o.S3.Region != "eu-west-1" || o.StallTimeout.Duration != time.Second || o.Dest != "/models" {
					return fmt.Sprintf("%+v %+v", o, o.S3)
				}
				return ""
			}},
		{name: "file turns the multipart check off, a flag back on", file: loadspec.Config{Source: "s3://b/m", Dest: "/d", SkipMultipartETagCheck: true, Fsync: true},
			fv: flagValues{checkMultipart: true}, set: []string{"check-multipart-etag"},
			check: func(o Options) string {
				if !o.CheckMultipartETag || !o.Fsync {
					return fmt.Sprintf("%+v", o)
				}
				return ""
			}},
		{name: "file turns the multipart check off", file: loadspec.Config{Source: "s3://b/m", Dest: "/d", SkipMultipartETagCheck: true},
			check: func(o Options) string {
				if o.CheckMultipartETag {
					return fmt.Sprintf("%+v", o)
				}
				return ""
			}},
		{name: "defaults", fv: flagValues{source: "file:///m", dest: "/d"}, set: []string{"source", "dest"},
			check: func(o Options) string {
				if o.Concurrency != DefaultConcurrency || o.PartSizeBytes != DefaultPartSize || o.Timeout.Duration != DefaultTimeout ||
					!o.CheckMultipartETag || o.Fsync {
					return fmt.Sprintf("%+v", o)
				}
				return ""
			}},
		{name: "no source", fv: flagValues{dest: "/d"}, set: []string{"dest"}, err: true},
		{name: "no dest", fv: flagValues{source: "s3://b/p"}, set: []string{"source"}, err: true},
		{name: "bad scheme", fv: flagValues{source: "ftp://x/y", dest: "/d"}, set: []string{"source", "dest"}, err: true},
		{name: "bad part size", fv: flagValues{source: "s3://b/p", dest: "/d", partSize: "lots"}, set: []string{"source", "dest", "part-size"}, err: true},
		{name: "tiny part size", fv: flagValues{source: "s3://b/p", dest: "/d", partSize: "1K"}, set: []string{"source", "dest", "part-size"}, err: true},
		{name: "relative file source", fv: flagValues{source: "file://rel/path", dest: "/d"}, set: []string{"source", "dest"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]bool{}
			for _, s := range tc.set {
				set[s] = true
			}
			o, err := mergeOptions(tc.file, tc.fv, set)
			if tc.err {
				if ExitCode(err) != loadspec.ExitInvalidConfig {
					t.Fatalf("err = %v, want InvalidConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(o); msg != "" {
				t.Error(msg)
			}
		})
	}
	if file.S3.Endpoint != "http://store:9000" {
		t.Error("mergeOptions changed the file's configuration")
	}
}

func TestParseArgsConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	os.WriteFile(cfg, []byte(`{"source":"s3://b/m","dest":"/x","timeout":"90s","s3":{"pathStyle":true}}`), 0o644)
	o, err := ParseArgs([]string{"--config", cfg, "--dest", "/y"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Source != "s3://b/m" || o.Dest != "/y" || o.Timeout.Duration != 90*time.Second || !o.S3.PathStyle {
		t.Errorf("%+v", o)
	}
	if _, err := ParseArgs([]string{"--config", filepath.Join(dir, "missing.json")}, io.Discard); ExitCode(err) != loadspec.ExitInvalidConfig {
		t.Errorf("an explicit missing config file: %v", err)
	}
	os.WriteFile(cfg, []byte(`{"timeout": 5}`), 0o644)
	if _, err := ParseArgs([]string{"--config", cfg}, io.Discard); ExitCode(err) != loadspec.ExitInvalidConfig {
		t.Errorf("a malformed config file: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "16Mi": 16 << 20, "8MB": 8e6, "2Gi": 2 << 30, "64KiB": 64 << 10, "5M": 5e6} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-5", "5Q"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

func TestParseManifest(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	got, err := parseManifest("SUMS", []byte(sum+"  a/b.bin\n"+strings.ToUpper(sum)+" *c.json\r\n# comment\n\n"+sum+"  ./d\n"))
	if err != nil || len(got) != 3 || got["a/b.bin"] != sum || got["c.json"] != sum || got["d"] != sum {
		t.Errorf("%v %v", got, err)
	}
	for _, bad := range []string{"nothex  a\n", sum + "  ../escape\n", sum[:10] + "  a\n", ""} {
		if _, err := parseManifest("SUMS", []byte(bad)); ExitCode(err) != loadspec.ExitInvalidConfig {
			t.Errorf("parseManifest(%q) = %v, want InvalidConfig", bad, err)
		}
	}
}

func TestCheckRelPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"a": true, "a/b/c.bin": true, "": false, "/abs": false, "../up": false, "a/../../b": false,
		"a//b": false, "./a": false, loadspec.CompleteMarker: false, workDirName + "/journal": false,
	} {
		if err := checkRelPath(p); (err == nil) != ok {
			t.Errorf("checkRelPath(%q) = %v", p, err)
		}
	}
}

func TestMultipartETag(t *testing.T) {
	for etag, want := range map[string]int{"abc-3": 3, "d41d8cd98f00b204e9800998ecf8427e": 0, "x-": 0, "x-1a": 0, "-5": 5} {
		n, ok := multipartETag(etag)
		if n != want || ok != (want > 0) {
			t.Errorf("multipartETag(%q) = %d, %v", etag, n, ok)
		}
	}
}

func TestUploadHasher(t *testing.T) {
	data := make([]byte, 23)
	for i := range data {
		data[i] = byte(i * 7)
	}
	// Upload parts of 5 bytes; a download part of 10 bytes at offset 10 covers
	// upload parts 3 and 4, fed in uneven pieces.
	u := newUploadHasher(md5.New(), 5, int64(len(data)), 10)
	u.write(data[10:13])
	u.write(data[13:19])
	u.write(data[19:20])
	want := []string{md5hex(data[10:15]), md5hex(data[15:20])}
	if got := hexAll(u.sums); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sums %v, want %v", got, want)
	}
	// The last, shorter upload part.
	u = newUploadHasher(md5.New(), 5, int64(len(data)), 20)
	u.write(data[20:])
	if got := hexAll(u.sums); len(got) != 1 || got[0] != md5hex(data[20:]) {
		t.Errorf("last part %v", got)
	}
}

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

// The CRC of a file made of parts, combined from the parts' CRCs, equals the CRC
// of the whole, for every CRC a store may keep and for parts of any length
// (empty, one byte, not multiples of anything).
func TestCRCCombine(t *testing.T) {
	data := make([]byte, 3<<20+17)
	rand.NewChaCha8([32]byte{1}).Read(data)
	for _, alg := range []string{"CRC64NVME", "CRC32C", "CRC32"} {
		a := storeAlgorithms[alg]
		sum := func(b []byte) []byte { h := a.newHash(); h.Write(b); return h.Sum(nil) }
		want := sum(data)
		for _, cuts := range [][]int{{0}, {1}, {1 << 20}, {0, 0, 5}, {7, 1 << 20, 1<<20 + 1, 3 << 20}} {
			var crc uint64
			prev := 0
			for _, c := range append(cuts, len(data)) {
				crc = a.crc.combine(crc, a.crc.crcValue(sum(data[prev:c])), int64(c-prev))
				prev = c
			}
			if got := a.crc.digest(crc); !bytes.Equal(got, want) {
				t.Errorf("%s cut at %v: combined %x, whole %x", alg, cuts, got, want)
			}
		}
	}
}

func TestParseStoreChecksum(t *testing.T) {
	for _, tc := range []struct {
		alg, value string
		ok         bool
		parts      int
	}{
		{"CRC64NVME", "CQ+RajXxJZ8=", true, 0},
		{"CRC32C", "yZRlqg==-12", true, 12},
		{"CRC32", "yZRlqg==-x", false, 0},
		{"CRC32", "yZRlqg==-0", false, 0},
		{"CRC32", "CQ+RajXxJZ8=", false, 0}, // 8 bytes for a 4-byte CRC
		{"MD5", "1B2M2Y8AsgTpgAmY7PhCfg==", false, 0},
		{"SHA256", "", false, 0},
	} {
		sc, ok := parseStoreChecksum(tc.alg, tc.value)
		if ok != tc.ok || ok && sc.Parts != tc.parts {
			t.Errorf("parseStoreChecksum(%s, %q) = %+v, %v", tc.alg, tc.value, sc, ok)
		}
	}
}

// checkFor prefers the manifest, then a full-object store checksum, then the
// single-part MD5, then per-upload-part checks, then the size.
func TestCheckFor(t *testing.T) {
	crc, _ := parseStoreChecksum("CRC64NVME", "CQ+RajXxJZ8=")
	composite, _ := parseStoreChecksum("CRC32C", "yZRlqg==-3")
	md5sum := md5hex(nil)
	for _, tc := range []struct {
		obj  Object
		want string
	}{
		{Object{SHA256: strings.Repeat("ab", 32), Checksum: crc, MD5: md5sum}, checkSHA256},
		{Object{Checksum: crc, MD5: md5sum}, "crc64nvme"},
		{Object{Checksum: composite, MD5: md5sum}, checkMD5},
		{Object{ETag: md5sum + "-3", Checksum: composite, UploadPartSize: 5, UploadParts: 3}, "crc32c-composite"},
		{Object{ETag: md5sum + "-3", UploadPartSize: 5, UploadParts: 3}, checkMultipart},
		{Object{ETag: md5sum + "-3"}, checkSize},
		{Object{ETag: md5sum + "-3", Checksum: composite}, checkSize},
	} {
		if got := checkFor(&tc.obj); got.name != tc.want {
			t.Errorf("checkFor(%+v) = %s, want %s", tc.obj, got.name, tc.want)
		}
	}
}

func TestLoadCredentials(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, loadspec.EnvAccessKeyID), []byte("file-key\n"), 0o600)
	os.WriteFile(filepath.Join(dir, loadspec.EnvSecretAccessKey), []byte("file-secret"), 0o600)
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	c, err := loadCredentials(dir, getenv)
	if err != nil || c.AccessKeyID != "file-key" || c.SecretAccessKey != "file-secret" {
		t.Errorf("from files: %+v %v", c, err)
	}
	env[loadspec.EnvAccessKeyID], env[loadspec.EnvSecretAccessKey] = "env-key", "env-secret"
	if c, err = loadCredentials(dir, getenv); err != nil || c.AccessKeyID != "env-key" || c.SecretAccessKey != "env-secret" {
		t.Errorf("env wins: %+v %v", c, err)
	}
	if _, err := loadCredentials("", func(k string) string {
		if k == loadspec.EnvAccessKeyID {
			return "only-key"
		}
		return ""
	}); ExitCode(err) != loadspec.ExitInvalidConfig {
		t.Errorf("half credentials: %v", err)
	}
}

func TestHelpIsNoFailure(t *testing.T) {
	var out strings.Builder
	if code := Main([]string{"-help"}, &out); code != 0 || !strings.Contains(out.String(), "-store-checksums") {
		t.Errorf("exit %d, output:\n%s", code, out.String())
	}
}

func TestInterleave(t *testing.T) {
	var files [][]job
	name := map[*fileTask]string{}
	for i, parts := range []int{3, 1, 2, 2} {
		ft := &fileTask{}
		name[ft] = string(rune('a' + i))
		var js []job
		for p := range parts {
			js = append(js, job{t: ft, p: part{Index: p}})
		}
		files = append(files, js)
	}
	var got []string
	for _, j := range interleave(files, 2) {
		got = append(got, fmt.Sprintf("%s%d", name[j.t], j.p.Index))
	}
	// Two files at a time; b runs out first and c takes its place, then d a's.
	if want := "a0 b0 a1 c0 a2 c1 d0 d1"; strings.Join(got, " ") != want {
		t.Errorf("order %v, want %s", got, want)
	}
}

func TestTailPartSize(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ partSize, want int64 }{
		{64 * mib, 16 * mib},
		{16 * mib, 4 * mib},
		{4 * mib, mib},
		{2 * mib, mib},
		{512 << 10, 512 << 10},
	} {
		if got := tailPartSize(tc.partSize); got != tc.want {
			t.Errorf("tailPartSize(%d) = %d, want %d", tc.partSize, got, tc.want)
		}
	}
}

// shrinkTail gives tail parts to the files with a part among the last
// concurrency x part size bytes of the queue (four files interleaved), whatever
// their names' order, and only when their part size is free.
func TestShrinkTail(t *testing.T) {
	const mib = 1 << 20
	type file struct {
		name    string
		size    int64
		kind    checkKind
		resumed bool // its first part kept from an earlier run
		// uploadPart is the upload part size of a file checked by upload parts.
		uploadPart int64
		noRanges   bool
	}
	for _, tc := range []struct {
		name        string
		files       []file
		concurrency int
		partSize    int64
		want        string // the files given tail parts
	}{
		{"the parts queued last, not the file named last", []file{
			{name: "a", size: 128 * mib, kind: kindCRC},
			{name: "b", size: 1 << 10, kind: kindWhole},
			{name: "c", size: 32 * mib, kind: kindCRC},
			{name: "d", size: 2 * mib, kind: kindSize},
		}, 2, 16 * mib, "a"},
		{"a window across files: CRCs, read-back hashes and sizes alike", []file{
			{name: "a", size: 16 * mib, kind: kindCRC},
			{name: "b", size: 64 * mib, kind: kindCRC},
			{name: "c", size: 64 * mib, kind: kindWhole},
			{name: "d", size: 64 * mib, kind: kindSize},
		}, 16, 16 * mib, "b c d"},
		{"upload-part checks, unranged and resumed files keep their parts", []file{
			{name: "a", size: 64 * mib, kind: kindUploadParts, uploadPart: 5 * mib},
			{name: "b", size: 64 * mib, kind: kindCRC, resumed: true},
			{name: "c", size: 20 * mib, kind: kindCRC, noRanges: true},
			{name: "d", size: 64 * mib, kind: kindCRC},
		}, 64, 16 * mib, "d"},
		{"a part size at the floor already", []file{
			{name: "a", size: 64 * mib, kind: kindCRC},
		}, 64, mib, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tasks []*fileTask
			before := map[*fileTask]int64{}
			for _, f := range tc.files {
				ft := &fileTask{obj: &Object{Path: f.name, Size: f.size, UploadPartSize: f.uploadPart, NoRanges: f.noRanges},
					check: check{kind: f.kind}}
				switch {
				case f.uploadPart > 0:
					ft.setParts(alignedPartSize(tc.partSize, f.uploadPart))
				case f.noRanges:
					ft.setParts(f.size)
				default:
					ft.setParts(tc.partSize)
				}
				if f.resumed {
					ft.done[0], ft.resumed = true, true
					ft.remaining--
				}
				tasks = append(tasks, ft)
				before[ft] = ft.partSize
			}
			shrunk := shrinkTail(tasks, tc.concurrency, tc.partSize)
			small := tailPartSize(tc.partSize)
			var got []string
			for _, ft := range tasks {
				if ft.partSize != before[ft] {
					got = append(got, ft.obj.Path)
					if ft.partSize != small || fmt.Sprint(ft.parts) != fmt.Sprint(planParts(ft.obj.Size, small)) {
						t.Errorf("%s: part size %d, parts %v; want parts of %d", ft.obj.Path, ft.partSize, ft.parts, small)
					}
				}
				if len(ft.done) != len(ft.parts) || len(ft.partCRCs) != len(ft.parts) && ft.check.kind == kindCRC {
					t.Errorf("%s: %d parts, %d done flags, %d CRCs", ft.obj.Path, len(ft.parts), len(ft.done), len(ft.partCRCs))
				}
			}
			if strings.Join(got, " ") != tc.want || shrunk != len(got) {
				t.Errorf("tail parts for %v (%d counted), want %q", got, shrunk, tc.want)
			}
		})
	}
}
