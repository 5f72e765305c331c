package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/s3test"
)

// ObjectStoreOptions ask for an S3-compatible store (versitygw, built from its Go
// module) beside the cluster, on the host's address so that real nodes' pods
// reach it, seeded with a small model uploaded through the S3 API, so that the
// store keeps its own checksums as a real one does.
type ObjectStoreOptions struct {
	// ModelBytes is the size of the seeded model's weights, in safetensors-shaped
	// shards of at most 64 MiB. Zero: 256 MiB.
	ModelBytes int64
	// BinDir holds versitygw. Empty: hack/tools/build.sh s3 builds it or finds it
	// in its cache.
	BinDir string
	// GGUFDir holds model.gguf, the model engine.type Ollama serves (written
	// by hack/tinymodel), seeded beside the other. Empty: hack/tools/build.sh
	// tinymodel writes it or finds it in its cache.
	GGUFDir string
}

// Names of the seeded model in the store.
const (
	ObjectStoreBucket = "models"
	// SeededModelPrefix is where the seeded model's files are in the bucket.
	SeededModelPrefix = "tiny-llama/"
	// SeededGGUFPrefix is where the seeded GGUF model is: model.gguf, random
	// weights and Llama 3.2's tokenizer (hack/tinymodel).
	SeededGGUFPrefix = "tinyllama-random/"
	// objectStoreSecretName is the Secret CredentialsSecret returns.
	objectStoreSecretName = "model-store-credentials"
	seededShardSize       = 64 << 20
)

// ObjectStore is a running store.
type ObjectStore struct {
	// Endpoint is the store's URL at the host's address: pods on real nodes and
	// the host reach it there.
	Endpoint string `json:"endpoint"`
	// Bucket and ModelPrefix locate the seeded model; ModelFiles and ModelBytes
	// describe it.
	Bucket      string `json:"bucket"`
	ModelPrefix string `json:"modelPrefix"`
	ModelFiles  int    `json:"modelFiles"`
	ModelBytes  int64  `json:"modelBytes"`
	// GGUFPrefix and GGUFBytes locate the seeded GGUF model (one file).
	GGUFPrefix string `json:"ggufPrefix"`
	GGUFBytes  int64  `json:"ggufBytes"`
	// Root is the folder behind the store (a bucket is a sub-folder): tests corrupt
	// an object by writing there, behind the store's back, as a failing disk would.
	Root string `json:"root"`
	// AccessLog is the store's S3 access log, one line per request.
	AccessLog string `json:"accessLog"`
	// Client is an S3 client with the store's root credentials.
	Client *s3.Client `json:"-"`
}

// ObjectStore is the cluster's store, nil unless Options.ObjectStore asked for one.
func (c *Cluster) ObjectStore() *ObjectStore {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.objectStore
}

// CredentialsSecret is a Secret, for namespace, holding the store's credentials
// under the keys the model loader reads by default.
func (s *ObjectStore) CredentialsSecret(namespace string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: objectStoreSecretName},
		StringData: map[string]string{
			loadspec.EnvAccessKeyID:     s3test.AccessKey,
			loadspec.EnvSecretAccessKey: s3test.SecretKey,
		},
	}
}

// ObjectGets counts the GET requests for objects under prefix in the store's
// access log: the downloads the store served (or refused).
func (s *ObjectStore) ObjectGets(bucket, prefix string) (int, error) {
	f, err := os.Open(s.AccessLog)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		// versitygw's access log: ... s3_GetObject KEY /BUCKET/KEY?QUERY STATUS ...
		if strings.Contains(line, " s3_GetObject ") && strings.Contains(line, " /"+bucket+"/"+prefix) {
			n++
		}
	}
	return n, scanner.Err()
}

// prepareObjectStore finds or builds versitygw and the GGUF model before the
// cluster starts, so that a cold build does not count against the start
// timeout.
func prepareObjectStore(ctx context.Context, opts Options, progress io.Writer) (*ObjectStoreOptions, error) {
	if opts.ObjectStore == nil || opts.ObjectStore.BinDir != "" && opts.ObjectStore.GGUFDir != "" {
		return opts.ObjectStore, nil
	}
	root := opts.RepoRoot
	if root == "" {
		var err error
		if root, err = FindRepoRoot("."); err != nil {
			return nil, err
		}
	}
	store := *opts.ObjectStore
	for _, tool := range []struct {
		dir   *string
		group string
	}{{&store.BinDir, "s3"}, {&store.GGUFDir, "tinymodel"}} {
		if *tool.dir != "" {
			continue
		}
		dir, err := runBuildScript(ctx, root, tool.group, progress)
		if err != nil {
			return nil, err
		}
		*tool.dir = dir
	}
	return &store, nil
}

// startObjectStore runs versitygw on the host's address and seeds the model.
func (c *Cluster) startObjectStore(ctx context.Context, opts Options) error {
	binDir := opts.ObjectStore.BinDir
	hostIP, err := defaultRouteIPv4()
	if err != nil {
		return fmt.Errorf("the host's address for the object store: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP.String(), "0"))
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()

	store := &ObjectStore{
		Endpoint:    "http://" + addr,
		Bucket:      ObjectStoreBucket,
		ModelPrefix: SeededModelPrefix,
		Root:        filepath.Join(c.dir, "object-store"),
		AccessLog:   filepath.Join(c.logsDir, "object-store-access.log"),
	}
	if err := os.MkdirAll(store.Root, 0o755); err != nil {
		return err
	}
	if err := c.start("versitygw", filepath.Join(binDir, "versitygw"),
		"--port", addr, "--access", s3test.AccessKey, "--secret", s3test.SecretKey,
		"--access-log", store.AccessLog, "--quiet", "--keep-alive", "posix", store.Root,
	); err != nil {
		return err
	}
	store.Client = s3test.NewClient(store.Endpoint, s3test.AccessKey, s3test.SecretKey)
	server := &s3test.Server{Endpoint: store.Endpoint, Root: store.Root, Client: store.Client}
	if err := c.poll(ctx, "the object store", func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return server.MakeBucket(ctx, store.Bucket) == nil, nil
	}); err != nil {
		return err
	}

	size := opts.ObjectStore.ModelBytes
	if size <= 0 {
		size = 256 << 20
	}
	started := time.Now()
	shards := int((size + seededShardSize - 1) / seededShardSize)
	files := s3test.ModelTree(shards, seededShardSize, size-int64(shards-1)*seededShardSize, 0)
	for i, f := range files {
		// Multipart above 16 MiB, with the checksum the store adds itself (CRC64-NVME);
		// the loader checks each file against it.
		layout := s3test.Layout{PartSize: 16 << 20}
		if err := server.UploadGenerated(ctx, store.Bucket, store.ModelPrefix+f.Path, f.Size, layout, uint64(i)); err != nil {
			return fmt.Errorf("seeding the object store with %s: %w", f.Path, err)
		}
		store.ModelFiles++
		store.ModelBytes += f.Size
	}
	if err := seedGGUF(ctx, server, store, filepath.Join(opts.ObjectStore.GGUFDir, "model.gguf")); err != nil {
		return err
	}
	fmt.Fprintf(c.progress, "Object store at %s seeded with s3://%s/%s (%d files, %d MiB) and s3://%s/%s (%d MiB of GGUF) in %s\n", store.Endpoint,
		store.Bucket, store.ModelPrefix, store.ModelFiles, store.ModelBytes>>20, store.Bucket, store.GGUFPrefix, store.GGUFBytes>>20,
		time.Since(started).Round(time.Millisecond))

	c.mu.Lock()
	c.objectStore = store
	c.mu.Unlock()
	return nil
}

// seedGGUF uploads the GGUF model at path under SeededGGUFPrefix, as
// model.gguf, in 16 MiB parts as the other model's shards.
func seedGGUF(ctx context.Context, server *s3test.Server, store *ObjectStore, path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("the GGUF model to seed the object store with (hack/tools/build.sh tinymodel): %w", err)
	}
	store.GGUFPrefix = SeededGGUFPrefix
	if err := server.Upload(ctx, store.Bucket, store.GGUFPrefix+"model.gguf", path, s3test.Layout{PartSize: 16 << 20}); err != nil {
		return fmt.Errorf("seeding the object store with the GGUF model: %w", err)
	}
	store.GGUFBytes = info.Size()
	return nil
}
