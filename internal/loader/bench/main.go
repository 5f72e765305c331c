// Command bench compares the model loader with rclone on the same local S3 server
// (versitygw on loopback) in one run: it makes a model-shaped tree of at least 4 GB,
// mostly large shards, once (cached across runs), downloads it several times with
// each tool, and prints the median throughput, peak memory and the ratio to the
// loader. `make bench-loader` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loader/s3test"
)

const bucket = "bench"

func main() {
	shards := flag.Int("shards", 8, "number of large shards")
	shardMiB := flag.Int64("shard-mib", 512, "size of one shard in MiB")
	small := flag.Int("small", 100, "number of small files")
	runs := flag.Int("runs", 3, "downloads per tool")
	cache := flag.String("cache", defaultCache(), "folder that keeps the S3 server's data between runs")
	only := flag.String("only", "", "run only the tools whose name contains this")
	linkMBps := flag.Float64("link-mbps", 0, "put a link between the tools and the server that passes each response at most this many MB/s, as a remote store's connections do (0: no link, loopback speed)")
	linkLatency := flag.Duration("link-latency", 20*time.Millisecond, "first-byte latency of each response on the link (with -link-mbps)")
	flag.Parse()
	var link *linkShape
	if *linkMBps > 0 {
		link = &linkShape{bytesPerSecond: int64(*linkMBps * 1e6), latency: *linkLatency}
	}
	if err := run(*shards, *shardMiB<<20, *small, *runs, *cache, *only, link); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func defaultCache() string {
	if c := os.Getenv("AIINFERENCE_CACHE"); c != "" {
		return filepath.Join(c, "bench-loader")
	}
	if c, err := os.UserCacheDir(); err == nil {
		return filepath.Join(c, "aiinference-operator", "bench-loader")
	}
	return filepath.Join(os.TempDir(), "aiinference-bench-loader")
}

// linkShape is the network path the -link flags ask for.
type linkShape struct {
	bytesPerSecond int64
	latency        time.Duration
}

// tool is one contender: a command line downloading the tree into a folder.
type tool struct {
	name string
	args func(dest string) []string
	env  []string
}

func run(shards int, shardSize int64, small, runs int, cache, only string, link *linkShape) error {
	ctx := context.Background()
	gw, err := s3test.Binary("s3", "versitygw")
	if err != nil {
		return err
	}
	rclone, err := s3test.Binary("rclone", "rclone")
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "bench-loader-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	loaderBin := filepath.Join(work, "model-loader")
	build := exec.Command("go", "build", "-o", loaderBin, "github.com/aiinference/operator/cmd/model-loader")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the loader: %w", err)
	}

	// The tree is made once and kept, keyed by its shape.
	files := s3test.ModelTree(shards, shardSize, 0, small)
	var total int64
	for _, f := range files {
		total += f.Size
	}
	key := fmt.Sprintf("tree-%dx%d-%d", shards, shardSize, small)
	root := filepath.Join(cache, key)
	ready := filepath.Join(root, ".ready")
	if _, err := os.Stat(ready); err != nil {
		os.RemoveAll(cache) // older shapes go
		fmt.Printf("Making the %.2f GB tree on the S3 server (first run only)\n", float64(total)/1e9)
		srv, err := s3test.Start(gw, root, nil)
		if err != nil {
			return err
		}
		err = func() error {
			if err := srv.MakeBucket(ctx, bucket); err != nil {
				return err
			}
			for i, f := range files {
				// Large files as 16 MiB multipart uploads, like common S3 tools do.
				if err := srv.UploadGenerated(ctx, bucket, "model/"+f.Path, f.Size, s3test.Layout{PartSize: 16 << 20}, uint64(i)); err != nil {
					return fmt.Errorf("uploading %s: %w", f.Path, err)
				}
			}
			return nil
		}()
		srv.Stop()
		if err != nil {
			return err
		}
		if err := os.WriteFile(ready, nil, 0o644); err != nil {
			return err
		}
	}
	srv, err := s3test.Start(gw, root, nil)
	if err != nil {
		return err
	}
	defer srv.Stop()
	endpoint, where := srv.Endpoint, "on loopback"
	if link != nil {
		l, err := s3test.NewLink(srv.Endpoint, s3test.LinkShape{Latency: link.latency, PerConnection: float64(link.bytesPerSecond)})
		if err != nil {
			return err
		}
		defer l.Close()
		endpoint = l.URL()
		where = fmt.Sprintf("through a link of %.0f MB/s per response and %s first-byte latency", float64(link.bytesPerSecond)/1e6, link.latency)
	}

	rcloneEnv := []string{
		"RCLONE_CONFIG=" + filepath.Join(work, "rclone.conf"),
		"RCLONE_S3_PROVIDER=Other", "RCLONE_S3_ENDPOINT=" + endpoint, "RCLONE_S3_REGION=us-east-1",
		"RCLONE_S3_ACCESS_KEY_ID=" + s3test.AccessKey, "RCLONE_S3_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"RCLONE_S3_FORCE_PATH_STYLE=true",
	}
	rcloneCmd := func(extra ...string) func(string) []string {
		return func(dest string) []string {
			return append([]string{rclone, "copy", ":s3:" + bucket + "/model", dest, "-q"}, extra...)
		}
	}
	loaderEnv := []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey, "AWS_EC2_METADATA_DISABLED=true"}
	loaderCmd := func(extra ...string) func(string) []string {
		return func(dest string) []string {
			return append([]string{loaderBin, "--source", "s3://" + bucket + "/model", "--dest", dest,
				"--endpoint", endpoint, "--path-style", "--termination-message-path", ""}, extra...)
		}
	}
	// The first row is the one the others are compared with.
	tools := []tool{
		{name: "model-loader (defaults: store CRC64NVME)", args: loaderCmd(), env: loaderEnv},
		{name: "model-loader (MD5 ETags, no store checksums)", args: loaderCmd("--store-checksums=false"), env: loaderEnv},
		{name: "model-loader (--fsync)", args: loaderCmd("--fsync"), env: loaderEnv},
		{name: "rclone (defaults)", args: rcloneCmd(), env: rcloneEnv},
		{name: "rclone (tuned: 16 transfers x 16 streams)", args: rcloneCmd(
			"--transfers", "16", "--checkers", "16", "--multi-thread-streams", "16", "--multi-thread-cutoff", "32M",
			"--multi-thread-chunk-size", "16M", "--buffer-size", "16M"), env: rcloneEnv},
		{name: "rclone (tuned: 4 transfers x 8 streams)", args: rcloneCmd(
			"--transfers", "4", "--multi-thread-streams", "8", "--multi-thread-cutoff", "32M",
			"--multi-thread-chunk-size", "32M", "--buffer-size", "32M"), env: rcloneEnv},
	}

	fmt.Printf("Tree: %d files, %.2f GB (%d shards of %d MiB); %d runs each; server %s %s\n",
		len(files), float64(total)/1e9, shards, shardSize>>20, runs, srv.Endpoint, where)
	type result struct {
		name                 string
		rates, cpus, srvCPUs []float64
		peakKB               int64
	}
	var results []*result
	var chosen []tool
	for _, tl := range tools {
		if only == "" || strings.Contains(tl.name, only) {
			chosen = append(chosen, tl)
			results = append(results, &result{name: tl.name})
		}
	}
	// Rounds, each tool once per round: a machine whose load changes over the run
	// weighs on every tool alike.
	for i := range runs {
		for k, tl := range chosen {
			r := results[k]
			dest := filepath.Join(work, "dest")
			os.RemoveAll(dest)
			syscall.Sync() // earlier runs' writeback must not slow this one
			args := tl.args(dest)
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = append(os.Environ(), tl.env...)
			out := &strings.Builder{}
			cmd.Stdout, cmd.Stderr = out, out
			srvBefore, srvErr := srv.CPUTime()
			start := time.Now()
			err := cmd.Run()
			secs := time.Since(start).Seconds()
			srvAfter, srvErr2 := srv.CPUTime()
			if err := errors.Join(srvErr, srvErr2); err != nil {
				return fmt.Errorf("the server's CPU time: %w", err)
			}
			if err != nil {
				return fmt.Errorf("%s: %v\n%s", tl.name, err, out.String())
			}
			got, err := treeSize(dest)
			if err != nil || got != total {
				return fmt.Errorf("%s fetched %d bytes, want %d (%v)", tl.name, got, total, err)
			}
			rate := float64(total) / 1e6 / secs
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			cpu := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
			srvCPU := (srvAfter - srvBefore).Seconds()
			r.rates = append(r.rates, rate)
			r.cpus = append(r.cpus, cpu)
			r.srvCPUs = append(r.srvCPUs, srvCPU)
			r.peakKB = max(r.peakKB, ru.Maxrss)
			fmt.Printf("  round %d  %-45s %7.1f MB/s in %5.1fs, CPU %4.1fs (server %4.1fs), peak RSS %4d MiB\n",
				i+1, tl.name, rate, secs, cpu, srvCPU, ru.Maxrss>>10)
			os.RemoveAll(dest)
		}
	}

	median := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(results) == 0 {
		return nil
	}
	base := median(results[0].rates)
	fmt.Println()
	fmt.Printf("%-45s %12s %14s %10s %14s %10s\n", "tool", "median MB/s", "peak RSS MiB", "CPU s", "server CPU s", "row1/tool")
	for _, r := range results {
		m := median(r.rates)
		fmt.Printf("%-45s %12.1f %14d %10.1f %14.1f %9.2fx\n", r.name, m, r.peakKB>>10, median(r.cpus), median(r.srvCPUs), base/m)
	}
	fmt.Printf("\nCPU s: the tool's user and system time; server CPU s: versitygw's meanwhile (medians). %d cores here.\n", runtime.NumCPU())
	return nil
}

// treeSize adds up the sizes of the files under dir, the loader's marker and work
// folder aside.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".model-") {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
