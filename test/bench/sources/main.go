// Command sources prints the model loader's throughput from a real OCI
// registry (distribution) beside a real S3 server (versitygw), both behind the
// same remote-store-shaped link (test/s3test.s Link, as make
// bench-loader uses), for the same model tree: make bench-sources.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/ocipush"
	"github.com/aiinference/operator/test/ociregistry"
	"github.com/aiinference/operator/test/s3test"
)

func main() {
	shards := flag.Int("shards", 4, "number of large shards")
	shardMiB := flag.Int64("shard-mib", 128, "size of one shard in MiB")
	runs := flag.Int("runs", 3, "loads per source")
	var shape s3test.LinkShape
	flag.DurationVar(&shape.Latency, "latency", 30*time.Millisecond, "the link's first-byte latency of each response")
	connMBps := flag.Float64("conn-mbps", 8, "the link's cap per connection, MB/s")
	nicMBps := flag.Float64("nic-mbps", 320, "the link's cap on all connections together, MB/s")
	flag.Parse()
	shape.PerConnection, shape.Aggregate = *connMBps*1e6, *nicMBps*1e6
	if err := run(*shards, *shardMiB<<20, *runs, shape); err != nil {
		fmt.Fprintln(os.Stderr, "bench-sources:", err)
		os.Exit(1)
	}
}

func run(shards int, shardSize int64, runs int, shape s3test.LinkShape) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "bench-sources-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "tree")
	files := s3test.ModelTree(shards, shardSize, shardSize/2, 20)
	if err := s3test.WriteTree(tree, files, 1); err != nil {
		return err
	}
	var total int64
	for _, f := range files {
		total += f.Size
	}

	versitygw, err := s3test.Binary("s3", "versitygw")
	if err != nil {
		return err
	}
	s3root := filepath.Join(work, "s3")
	if err := os.MkdirAll(filepath.Join(s3root, "models"), 0o755); err != nil {
		return err
	}
	srv, err := s3test.Start(versitygw, s3root, io.Discard)
	if err != nil {
		return err
	}
	defer srv.Stop()
	if err := srv.UploadTree(ctx, tree, "models", "model", s3test.Layout{PartSize: 16 << 20}); err != nil {
		return err
	}

	registryBin, err := ociregistry.Binary()
	if err != nil {
		return err
	}
	regDir := filepath.Join(work, "registry")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		return err
	}
	reg, err := ociregistry.Start(registryBin, regDir, ociregistry.Options{})
	if err != nil {
		return err
	}
	defer reg.Stop()
	if _, err := ocipush.Push(ctx, tree, reg.Host+"/models/bench:v1", ocipush.Options{PlainHTTP: true}); err != nil {
		return err
	}

	s3Link, err := s3test.NewLink(srv.Endpoint, shape)
	if err != nil {
		return err
	}
	defer s3Link.Close()
	regLink, err := s3test.NewLink("http://"+reg.Host, shape)
	if err != nil {
		return err
	}
	defer regLink.Close()

	os.Setenv(loadspec.EnvAccessKeyID, s3test.AccessKey)
	os.Setenv(loadspec.EnvSecretAccessKey, s3test.SecretKey)
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	fmt.Printf("Model: %d files, %.1f MB. Link: each connection at most %.0f MB/s, all together at most %.0f MB/s, %s to the first byte. %d loads each, medians.\n\n",
		len(files), float64(total)/1e6, shape.PerConnection/1e6, shape.Aggregate/1e6, shape.Latency, runs)
	fmt.Printf("%-44s %8s %13s %s\n", "source", "MB/s", "share of cap", "checks")
	for _, src := range []struct{ name, source, endpoint string }{
		{"S3 (versitygw), s3://", "s3://models/model", s3Link.URL()},
		{"OCI registry (distribution), oci://", "oci://" + hostOf(regLink.URL()) + "/models/bench:v1", ""},
	} {
		var mbps []float64
		var checks map[string]int
		for i := range runs {
			o := loader.Options{Config: loadspec.Config{
				Source: src.source, Dest: filepath.Join(work, fmt.Sprintf("dest-%d", i)),
				S3:          &loadspec.S3Options{Endpoint: src.endpoint, PathStyle: true, Region: "us-east-1"},
				OCI:         &loadspec.OCIOptions{PlainHTTP: true},
				Concurrency: loader.DefaultConcurrency, PartSizeBytes: loader.DefaultPartSize,
				Timeout: loadspec.Duration{Duration: 30 * time.Minute}, StallTimeout: loadspec.Duration{Duration: loader.DefaultStallTimeout},
			}, ProgressInterval: time.Minute, StoreChecksums: true, CheckMultipartETag: true}
			s, err := loader.Run(ctx, o, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				return fmt.Errorf("%s: %w", src.name, err)
			}
			if !s.Verified || s.BytesFetched != total {
				return fmt.Errorf("%s: fetched %d of %d bytes, verified %v", src.name, s.BytesFetched, total, s.Verified)
			}
			mbps, checks = append(mbps, s.ThroughputMBps), s.Checks
			os.RemoveAll(o.Dest)
		}
		m := median(mbps)
		fmt.Printf("%-44s %8.1f %12.1f%% %v\n", src.name, m, 100*m*1e6/shape.Aggregate, checks)
	}
	return nil
}

func hostOf(u string) string {
	const prefix = "http://"
	return u[len(prefix):]
}

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}
