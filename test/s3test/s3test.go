// Package s3test runs a real S3-compatible server (versitygw, built from the Go
// module proxy by hack/tools/build.sh) on loopback for the loader's tests and
// benchmark, and fills it with model-shaped trees.
package s3test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/aiinference/operator/test/testutil/freeport"
)

// Root access keys of the test server.
const (
	AccessKey = "loadertestaccess"
	SecretKey = "loadertestsecret0123456789"
)

// RepoRoot finds the repository root: the folder of the go.mod above the working
// directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "build.sh")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no repository root (go.mod with hack/tools/build.sh) above the working directory")
		}
		dir = parent
	}
}

// Binary builds (or reuses from the cache) a tool group with hack/tools/build.sh
// and returns the path of the named binary in it.
func Binary(group, name string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, "hack", "tools", "build.sh"), group)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools/build.sh %s: %w", group, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], name), nil
}

// Server is a running versitygw serving the sub-folders of Root as buckets.
type Server struct {
	Endpoint string
	Root     string
	Client   *s3.Client
	cmd      *exec.Cmd
	exited   chan struct{}
}

// Start runs versitygw (at binary) on 127.0.0.1 over the folder root, and waits
// until it answers. logw receives its output (nil: discarded). A port taken
// before versitygw bound it costs a start on another port (see freeport).
func Start(binary, root string, logw io.Writer) (*Server, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	var s *Server
	_, err := freeport.Start(func(port int) (err error) {
		s, err = startOn(binary, root, port, logw)
		return err
	})
	return s, err
}

func startOn(binary, root string, port int, logw io.Writer) (*Server, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(binary, "--port", addr, "--access", AccessKey, "--secret", SecretKey,
		"--quiet", "--keep-alive", "posix", root)
	// The output is kept too (read once the process has exited), to tell a
	// taken port from another failure; it says little (--quiet).
	var early bytes.Buffer
	out := io.Writer(&early)
	if logw != nil {
		out = io.MultiWriter(logw, &early)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + addr, Root: root, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(s.exited) }()
	s.Client = NewClient(s.Endpoint, AccessKey, SecretKey)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := s.Client.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			msg := early.String()
			if freeport.Taken(nil, msg) {
				return nil, fmt.Errorf("versitygw on %s: %w: %s", addr, freeport.ErrTaken, msg)
			}
			return nil, fmt.Errorf("versitygw exited at start: %v: %s", cmd.ProcessState, msg)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw did not answer on %s: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NewClient is an S3 client for a loopback endpoint with path-style addressing.
func NewClient(endpoint, access, secret string) *s3.Client {
	cfg, err := awsconfig.LoadDefaultConfig(context.Background(),
		awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(awscreds.NewStaticCredentialsProvider(access, secret, "")),
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConnsPerHost = 16
		})),
		awsconfig.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		awsconfig.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	)
	if err != nil {
		panic(fmt.Sprintf("s3test: AWS configuration: %v", err))
	}
	return s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
}

// Stop ends the server.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// CPUTime is the processor time (user and system) the server has used so far,
// from /proc: the benchmark shows it, as on a small machine the server's share
// bounds what a client can reach.
func (s *Server) CPUTime() (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks of 1/100 s.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat %q", data)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// MakeBucket creates a bucket (an existing one is fine).
func (s *Server) MakeBucket(ctx context.Context, bucket string) error {
	_, err := s.Client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket})
	var owned *types.BucketAlreadyOwnedByYou
	if errors.As(err, &owned) {
		return nil
	}
	return err
}

// Layout is how an object is uploaded: in one request, or as a multipart upload of
// PartSize parts when PartSize > 0 and the object is larger; with a checksum the
// client computes (Checksum, of ChecksumType for multipart uploads), or with none,
// leaving the server to add its default.
type Layout struct {
	PartSize     int64
	Checksum     types.ChecksumAlgorithm
	ChecksumType types.ChecksumType
}

// Upload puts a local file as key.
func (s *Server) Upload(ctx context.Context, bucket, key, path string, layout Layout) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return s.put(ctx, bucket, key, fi.Size(), layout, func(off, n int64) io.ReadSeeker { return io.NewSectionReader(f, off, n) })
}

// put uploads size bytes as key; body gives the bytes of [off, off+n), asked for
// front to back.
func (s *Server) put(ctx context.Context, bucket, key string, size int64, layout Layout, body func(off, n int64) io.ReadSeeker) error {
	if layout.PartSize <= 0 || size <= layout.PartSize {
		_, err := s.Client.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key,
			Body: body(0, size), ContentLength: aws.Int64(size), ChecksumAlgorithm: layout.Checksum})
		return err
	}
	up, err := s.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key,
		ChecksumAlgorithm: layout.Checksum, ChecksumType: layout.ChecksumType})
	if err != nil {
		return err
	}
	var parts []types.CompletedPart
	for n, off := int32(1), int64(0); off < size; n, off = n+1, off+layout.PartSize {
		length := min(layout.PartSize, size-off)
		out, err := s.Client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: &bucket, Key: &key, UploadId: up.UploadId, PartNumber: aws.Int32(n),
			Body: body(off, length), ContentLength: aws.Int64(length), ChecksumAlgorithm: layout.Checksum,
		})
		if err != nil {
			return err
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n),
			ChecksumCRC32: out.ChecksumCRC32, ChecksumCRC32C: out.ChecksumCRC32C, ChecksumCRC64NVME: out.ChecksumCRC64NVME,
			ChecksumSHA1: out.ChecksumSHA1, ChecksumSHA256: out.ChecksumSHA256})
	}
	_, err = s.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &bucket, Key: &key, UploadId: up.UploadId, ChecksumType: layout.ChecksumType,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	return err
}

// UploadTree uploads every file under dir to bucket/prefix/..., each with layout.
func (s *Server) UploadTree(ctx context.Context, dir, bucket, prefix string, layout Layout) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		return s.Upload(ctx, bucket, strings.TrimPrefix(prefix+"/"+filepath.ToSlash(rel), "/"), p, layout)
	})
}

// TreeFile is one file of a model-shaped tree.
type TreeFile struct {
	Path string
	Size int64
}

// ModelTree describes a model-shaped tree: shards of shardSize (the last one
// shorter when lastShard is given), config and tokenizer files, and many small
// files in nested folders.
func ModelTree(shards int, shardSize, lastShard int64, small int) []TreeFile {
	var files []TreeFile
	for i := 1; i <= shards; i++ {
		size := shardSize
		if i == shards && lastShard > 0 {
			size = lastShard
		}
		files = append(files, TreeFile{fmt.Sprintf("model-%05d-of-%05d.safetensors", i, shards), size})
	}
	files = append(files,
		TreeFile{"config.json", 1234},
		TreeFile{"generation_config.json", 0},
		TreeFile{"tokenizer.json", 2_100_003},
		TreeFile{"model.safetensors.index.json", 23_456},
	)
	for i := range small {
		files = append(files, TreeFile{fmt.Sprintf("extra/layer-%02d/part-%03d.bin", i%7, i), int64(100 + 977*i)})
	}
	return files
}

// WriteTree writes the files with pseudo-random content (seeded, so a tree can be
// made again identically) under dir.
func WriteTree(dir string, files []TreeFile, seed uint64) error {
	buf := make([]byte, 1<<20)
	for i, tf := range files {
		p := filepath.Join(dir, filepath.FromSlash(tf.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(i), byte(i >> 8)})
		for left := tf.Size; left > 0; {
			n := min(int64(len(buf)), left)
			rng.Read(buf[:n])
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return err
			}
			left -= n
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// SameTree compares two folders file by file, byte for byte, ignoring the names
// in skip (relative paths). It returns a description of the first difference.
func SameTree(want, got string, skip ...string) (string, error) {
	seen := map[string]bool{}
	for _, s := range skip {
		seen[s] = true
	}
	var diff string
	err := filepath.WalkDir(want, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || diff != "" {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		seen[rel] = true
		a, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(got, rel))
		if err != nil {
			diff = fmt.Sprintf("%s: %v", rel, err)
			return nil
		}
		if !bytes.Equal(a, b) {
			diff = fmt.Sprintf("%s differs (%d vs %d bytes)", rel, len(a), len(b))
		}
		return nil
	})
	if err != nil || diff != "" {
		return diff, err
	}
	err = filepath.WalkDir(got, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || diff != "" {
			return err
		}
		rel, _ := filepath.Rel(got, p)
		if !seen[rel] {
			diff = "unexpected file " + rel
		}
		return nil
	})
	return diff, err
}

// UploadGenerated uploads size bytes of seeded pseudo-random content as key, made
// on the fly (nothing on disk but one part).
func (s *Server) UploadGenerated(ctx context.Context, bucket, key string, size int64, layout Layout, seed uint64) error {
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24), 'g'})
	buf := make([]byte, min(max(layout.PartSize, 1), max(size, 1)))
	if layout.PartSize <= 0 || size <= layout.PartSize {
		buf = make([]byte, size)
	}
	return s.put(ctx, bucket, key, size, layout, func(_, n int64) io.ReadSeeker {
		rng.Read(buf[:n])
		return bytes.NewReader(buf[:n])
	})
}
