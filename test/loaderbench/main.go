// Command bench compares the model loader with rclone on the same S3 server
// (versitygw) in one run: it makes a model-shaped tree of at least 4 GB, mostly
// large shards, once (cached across runs), downloads it several times with each
// tool in interleaved rounds, and prints two tables. `make bench-loader` runs it.
//
// The headline table puts a remote store's network path between the tools and the
// server (s3test.Link): a cap per connection, a cap on all connections together
// standing for the node's network card, and a first-byte latency. It gives each
// tool's throughput as a share of that aggregate cap, its CPU seconds per GB and
// its peak memory, and checks the loader against its targets. The second table is
// loopback, where both tools and the server share the processors and CPU seconds
// per GB are what differ.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/test/s3test"
)

const bucket = "bench"

// The remote store's shape, scaled to a 2-core machine (docs/model-loader.md says
// why): S3's 50-100 MB/s per connection and a 25 Gbit/s network card (3.1 GB/s),
// both divided by ten, so that a client needs as many connections as on a real
// node to fill the card (about 40), and the server, the link and the client
// together stay well within the two processors.
const (
	defaultLatency  = 30 * time.Millisecond
	defaultConnMBps = 8
	defaultNICMBps  = 320
)

// rcloneBest are rclone's best flags through the default link, found with
// -sweep-rclone (docs/model-loader.md has the sweep): all eight shards at once,
// 16 streams each, in 16 MiB chunks (the default 64 MiB chunks of a 512 MiB
// shard leave only 8 for its 16 streams).
var rcloneBest = []string{"--transfers", "16", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "16M"}

func main() {
	shards := flag.Int("shards", 8, "number of large shards")
	shardMiB := flag.Int64("shard-mib", 512, "size of one shard in MiB")
	small := flag.Int("small", 100, "number of small files")
	runs := flag.Int("runs", 3, "downloads per tool and table")
	cache := flag.String("cache", defaultCache(), "folder that keeps the S3 server's data between runs")
	only := flag.String("only", "", "run only the tools whose name contains this")
	tables := flag.String("tables", "remote,loopback", "tables to make: remote (through the link) and loopback")
	sweep := flag.Bool("sweep-rclone", false, "instead of the tables, try rclone's flags through the link and print each, best first")
	serve := flag.Bool("serve", false, "instead of the tables, start the server and the link, print their endpoints and wait (to run or profile a tool by hand)")
	var shape s3test.LinkShape
	flag.DurationVar(&shape.Latency, "latency", defaultLatency, "the link's first-byte latency of each response")
	connMBps := flag.Float64("conn-mbps", defaultConnMBps, "the link's cap per connection, MB/s")
	nicMBps := flag.Float64("nic-mbps", defaultNICMBps, "the link's cap on all connections together (the node's network card), MB/s")
	quietWait := flag.Duration("quiet-wait", 10*time.Minute, "before each run, wait up to this long for the machine to be quiet (other work under 10% of the processors over 2 s); 0: do not wait")
	flag.Parse()
	shape.PerConnection, shape.Aggregate = *connMBps*1e6, *nicMBps*1e6
	b := &bench{runs: *runs, only: *only, shape: shape, quietWait: *quietWait}
	mode := *tables
	switch {
	case *sweep:
		mode = "sweep"
	case *serve:
		mode = "serve"
	}
	if err := b.run(*shards, *shardMiB<<20, *small, *cache, mode); err != nil {
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

// bench is one run of the benchmark.
type bench struct {
	runs      int
	only      string
	shape     s3test.LinkShape
	quietWait time.Duration // see waitQuiet

	// Set by run.
	work, loaderBin, rcloneBin string
	srv                        *s3test.Server
	total                      int64 // bytes in the tree
	// Set by measure, for the current table: the CPU seconds the rest of the
	// machine used in each run, and how many runs started on a busy machine.
	others    []float64
	disturbed int
}

// tool is one contender: a command line downloading the tree into dest from the
// store at endpoint.
type tool struct {
	name   string
	cmd    func(endpoint, dest string) (args, env []string)
	loader bool // the model-loader: its summary must say every file was verified
}

// result is what the rounds measured of one tool, a value per round.
type result struct {
	name                   string
	secs, cpus, serverCPUs []float64
	peakKB                 int64
}

func (r *result) mbps(total int64) float64 { return float64(total) / 1e6 / median(r.secs) }

// cpuPerGB is the tool's median CPU seconds per GB (10^9 bytes).
func (r *result) cpuPerGB(total int64) float64 { return median(r.cpus) / (float64(total) / 1e9) }

// run makes the tree and the server, then the tables mode lists (or "sweep", or
// "serve").
func (b *bench) run(shards int, shardSize int64, small int, cache, mode string) error {
	gw, err := s3test.Binary("s3", "versitygw")
	if err != nil {
		return err
	}
	if b.rcloneBin, err = s3test.Binary("rclone", "rclone"); err != nil {
		return err
	}
	if b.work, err = os.MkdirTemp("", "bench-loader-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.work)
	b.loaderBin = filepath.Join(b.work, "model-loader")
	build := exec.Command("go", "build", "-o", b.loaderBin, "github.com/aiinference/operator/cmd/model-loader")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the loader: %w", err)
	}

	files := s3test.ModelTree(shards, shardSize, 0, small)
	for _, f := range files {
		b.total += f.Size
	}
	root := filepath.Join(cache, fmt.Sprintf("tree-%dx%d-%d", shards, shardSize, small))
	if err := makeTree(gw, cache, root, files, b.total); err != nil {
		return err
	}
	if b.srv, err = s3test.Start(gw, root, nil); err != nil {
		return err
	}
	defer b.srv.Stop()
	fmt.Printf("Tree: %d files, %.2f GB (%d shards of %d MiB, 16 MiB upload parts); %d rounds; %d cores\n",
		len(files), float64(b.total)/1e9, shards, shardSize>>20, b.runs, runtime.NumCPU())

	for _, t := range strings.Split(mode, ",") {
		switch t {
		case "sweep":
			err = b.sweepRclone()
		case "serve":
			err = b.serveForever()
		case "remote":
			err = b.remote()
		case "loopback":
			err = b.loopback()
		default:
			err = fmt.Errorf("unknown table %q (remote, loopback)", t)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// makeTree puts the tree on the S3 server once and keeps it, keyed by its shape.
func makeTree(gw, cache, root string, files []s3test.TreeFile, total int64) error {
	ready := filepath.Join(root, ".ready")
	if _, err := os.Stat(ready); err == nil {
		return nil
	}
	os.RemoveAll(cache) // older shapes go
	fmt.Printf("Making the %.2f GB tree on the S3 server (first run only)\n", float64(total)/1e9)
	srv, err := s3test.Start(gw, root, nil)
	if err != nil {
		return err
	}
	defer srv.Stop()
	ctx := context.Background()
	if err := srv.MakeBucket(ctx, bucket); err != nil {
		return err
	}
	for i, f := range files {
		// Large files as 16 MiB multipart uploads, like common S3 tools do.
		if err := srv.UploadGenerated(ctx, bucket, "model/"+f.Path, f.Size, s3test.Layout{PartSize: 16 << 20}, uint64(i)); err != nil {
			return fmt.Errorf("uploading %s: %w", f.Path, err)
		}
	}
	return os.WriteFile(ready, nil, 0o644)
}

// serveForever keeps the server and the link up until the process is stopped.
func (b *bench) serveForever() error {
	l, where, err := b.link()
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Printf("Server %s (bucket %s, prefix model/, access key %s, secret key %s)\nLink %s: %s\nStop with Ctrl-C.\n",
		b.srv.Endpoint, bucket, s3test.AccessKey, s3test.SecretKey, l.URL(), where)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	return nil
}

// loaderTool is the model-loader with extra flags.
func (b *bench) loaderTool(name string, extra ...string) tool {
	return tool{name: name, loader: true, cmd: func(endpoint, dest string) ([]string, []string) {
		args := append([]string{b.loaderBin, "--source", "s3://" + bucket + "/model", "--dest", dest,
			"--endpoint", endpoint, "--path-style", "--termination-message-path", filepath.Join(b.work, "summary.json")}, extra...)
		return args, []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey, "AWS_EC2_METADATA_DISABLED=true"}
	}}
}

// rcloneTool is rclone copy with extra flags.
func (b *bench) rcloneTool(name string, extra ...string) tool {
	return tool{name: name, cmd: func(endpoint, dest string) ([]string, []string) {
		args := append([]string{b.rcloneBin, "copy", ":s3:" + bucket + "/model", dest, "-q"}, extra...)
		return args, []string{
			"RCLONE_CONFIG=" + filepath.Join(b.work, "rclone.conf"),
			"RCLONE_S3_PROVIDER=Other", "RCLONE_S3_ENDPOINT=" + endpoint, "RCLONE_S3_REGION=us-east-1",
			"RCLONE_S3_ACCESS_KEY_ID=" + s3test.AccessKey, "RCLONE_S3_SECRET_ACCESS_KEY=" + s3test.SecretKey,
			"RCLONE_S3_FORCE_PATH_STYLE=true",
		}
	}}
}

func (b *bench) link() (*s3test.Link, string, error) {
	l, err := s3test.NewLink(b.srv.Endpoint, b.shape)
	if err != nil {
		return nil, "", err
	}
	where := fmt.Sprintf("each connection at most %.0f MB/s, all together at most %.0f MB/s (the node's network card), %s to the first byte",
		b.shape.PerConnection/1e6, b.shape.Aggregate/1e6, b.shape.Latency)
	return l, where, nil
}

// remote is the headline table: through the link, the loader and rclone at their
// defaults and rclone at its best flags.
func (b *bench) remote() error {
	l, where, err := b.link()
	if err != nil {
		return err
	}
	defer l.Close()
	best := "rclone (best: " + strings.Join(rcloneBest, " ") + ")"
	tools := []tool{
		b.loaderTool("model-loader (defaults)"),
		b.rcloneTool("rclone (defaults)"),
		b.rcloneTool(best, rcloneBest...),
	}
	fmt.Printf("\nRemote-store-shaped: %s\n", where)
	results, err := b.measure(l.URL(), tools)
	if err != nil || len(results) == 0 {
		return err
	}
	capMBps := b.shape.Aggregate / 1e6
	byName := map[string]*result{}
	for _, r := range results {
		byName[r.name] = r
	}
	var base float64 // the loader's, when it ran
	if r := byName[tools[0].name]; r != nil {
		base = r.mbps(b.total)
	}
	w := nameWidth(results)
	fmt.Printf("\n%-*s %8s %13s %9s %13s %12s\n", w, "tool", "MB/s", "share of cap", "CPU s/GB", "peak RSS MiB", "loader/tool")
	for _, r := range results {
		m := r.mbps(b.total)
		fmt.Printf("%-*s %8.1f %12.1f%% %9.2f %13d %11.2fx\n", w, r.name, m, 100*m/capMBps, r.cpuPerGB(b.total), r.peakKB>>10, base/m)
	}
	if byName[tools[0].name] != nil {
		fmt.Println("\nTargets for the loader at its defaults, every file verified:")
		target := func(what string, got, want float64, unit string) {
			verdict := "met"
			if got < want {
				verdict = "MISSED"
			}
			fmt.Printf("  %-36s %7.2f%s (target >= %.2f%s) %s\n", what, got, unit, want, unit, verdict)
		}
		target("share of the aggregate cap", 100*base/capMBps, 90, "%")
		if r := byName[tools[1].name]; r != nil {
			target("against rclone at its defaults", base/r.mbps(b.total), 1.5, "x")
		}
		if r := byName[tools[2].name]; r != nil {
			target("against rclone at its best flags", base/r.mbps(b.total), 1.0, "x")
		}
	}
	fmt.Println("CPU s/GB: the tool's user and system time per 10^9 bytes (medians); the link runs in this process.")
	b.printOthers()
	return nil
}

// loopback is the second table: no link, where both tools are bound by the two
// processors they share with the server.
func (b *bench) loopback() error {
	tools := []tool{
		b.loaderTool("model-loader (defaults: store CRC64NVME)"),
		b.loaderTool("model-loader (MD5 ETags, no store checksums)", "--store-checksums=false"),
		b.loaderTool("model-loader (--fsync)", "--fsync"),
		b.rcloneTool("rclone (defaults)"),
		b.rcloneTool("rclone (best through the link)", rcloneBest...),
	}
	fmt.Printf("\nLoopback: no link, the server on the same processors\n")
	results, err := b.measure(b.srv.Endpoint, tools)
	if err != nil || len(results) == 0 {
		return err
	}
	var rcloneCPU float64
	for _, r := range results {
		if r.name == "rclone (defaults)" {
			rcloneCPU = r.cpuPerGB(b.total)
		}
	}
	w := nameWidth(results)
	fmt.Printf("\n%-*s %8s %9s %16s %13s %13s\n", w, "tool", "MB/s", "CPU s/GB", "server CPU s/GB", "peak RSS MiB", "CPU/rclone's")
	for _, r := range results {
		ratio := "-"
		if rcloneCPU > 0 {
			ratio = fmt.Sprintf("%.2fx", r.cpuPerGB(b.total)/rcloneCPU)
		}
		fmt.Printf("%-*s %8.1f %9.2f %16.2f %13d %13s\n", w, r.name, r.mbps(b.total), r.cpuPerGB(b.total),
			median(r.serverCPUs)/(float64(b.total)/1e9), r.peakKB>>10, ratio)
	}
	fmt.Println("CPU/rclone's: the tool's CPU seconds per GB over rclone's at its defaults (lower is better).")
	b.printOthers()
	return nil
}

// sweepRclone tries rclone's flags through the link, to find its best.
func (b *bench) sweepRclone() error {
	l, where, err := b.link()
	if err != nil {
		return err
	}
	defer l.Close()
	// --s3-chunk-size sets the upload part size (one set shows it does nothing to
	// downloads). Files above --multi-thread-cutoff (256Mi) are fetched with
	// --multi-thread-streams ranged streams of --multi-thread-chunk-size each.
	sets := [][]string{
		nil,
		{"--transfers", "8"},
		{"--transfers", "16", "--checkers", "16"},
		{"--multi-thread-streams", "16"},
		{"--transfers", "8", "--multi-thread-streams", "8"},
		{"--transfers", "8", "--multi-thread-streams", "8", "--multi-thread-chunk-size", "16M"},
		{"--transfers", "8", "--multi-thread-streams", "16"},
		{"--transfers", "8", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "16M"},
		{"--transfers", "8", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "32M"},
		{"--transfers", "8", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "16M", "--s3-chunk-size", "16M"},
		{"--transfers", "8", "--multi-thread-streams", "32", "--multi-thread-chunk-size", "16M"},
		{"--transfers", "4", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "16M"},
		{"--transfers", "16", "--multi-thread-streams", "16", "--multi-thread-chunk-size", "16M"},
		{"--transfers", "16", "--multi-thread-streams", "8", "--multi-thread-cutoff", "32M", "--multi-thread-chunk-size", "32M"},
	}
	var tools []tool
	for _, s := range sets {
		name := "rclone " + strings.Join(s, " ")
		if s == nil {
			name = "rclone (defaults)"
		}
		tools = append(tools, b.rcloneTool(name, s...))
	}
	fmt.Printf("\nrclone's flags, remote-store-shaped: %s\n", where)
	results, err := b.measure(l.URL(), tools)
	if err != nil {
		return err
	}
	sort.Slice(results, func(i, j int) bool { return results[i].mbps(b.total) > results[j].mbps(b.total) })
	w := nameWidth(results)
	fmt.Printf("\n%-*s %8s %13s %9s %13s\n", w, "flags", "MB/s", "share of cap", "CPU s/GB", "peak RSS MiB")
	for _, r := range results {
		m := r.mbps(b.total)
		fmt.Printf("%-*s %8.1f %12.1f%% %9.2f %13d\n", w, r.name, m, 100*m/(b.shape.Aggregate/1e6), r.cpuPerGB(b.total), r.peakKB>>10)
	}
	b.printOthers()
	return nil
}

// measure downloads the tree with each tool (those -only selects) from endpoint,
// in rounds of each tool once: a machine whose load changes over the run weighs
// on every tool alike.
func (b *bench) measure(endpoint string, tools []tool) ([]*result, error) {
	var chosen []tool
	var results []*result
	b.others, b.disturbed = nil, 0
	for _, t := range tools {
		if strings.Contains(t.name, b.only) {
			chosen = append(chosen, t)
			results = append(results, &result{name: t.name})
		}
	}
	for i := range b.runs {
		for k, t := range chosen {
			r := results[k]
			dest := filepath.Join(b.work, "dest")
			os.RemoveAll(dest)
			os.Remove(filepath.Join(b.work, "summary.json"))
			syscall.Sync() // earlier runs' writeback must not slow this one
			args, env := t.cmd(endpoint, dest)
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = append(os.Environ(), env...)
			out := &strings.Builder{}
			cmd.Stdout, cmd.Stderr = out, out
			if !b.waitQuiet() {
				b.disturbed++
			}
			srvBefore, srvErr := b.srv.CPUTime()
			selfBefore, machineBefore := selfCPU(), machineCPU()
			start := time.Now()
			peak, err := runPeak(cmd)
			secs := time.Since(start).Seconds()
			self, machine := selfCPU()-selfBefore, machineCPU()-machineBefore
			srvAfter, srvErr2 := b.srv.CPUTime()
			if err := errors.Join(srvErr, srvErr2); err != nil {
				return nil, fmt.Errorf("the server's CPU time: %w", err)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %v\n%s", t.name, err, out.String())
			}
			got, err := treeSize(dest)
			if err != nil || got != b.total {
				return nil, fmt.Errorf("%s fetched %d bytes, want %d (%v)", t.name, got, b.total, err)
			}
			if t.loader {
				if err := b.checkSummary(); err != nil {
					return nil, fmt.Errorf("%s: %w\n%s", t.name, err, out.String())
				}
			}
			cpu := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
			srvCPU := (srvAfter - srvBefore).Seconds()
			others := max(0, machine.Seconds()-cpu-srvCPU-self.Seconds())
			b.others = append(b.others, others)
			r.secs = append(r.secs, secs)
			r.cpus = append(r.cpus, cpu)
			r.serverCPUs = append(r.serverCPUs, srvCPU)
			r.peakKB = max(r.peakKB, peak)
			fmt.Printf("  round %d  %-60s %7.1f MB/s in %5.1fs, CPU %4.1fs (server %4.1fs, link %4.1fs, rest of the machine %4.1fs), peak RSS %4d MiB\n",
				i+1, t.name, float64(b.total)/1e6/secs, secs, cpu, srvCPU, self.Seconds(), others, peak>>10)
			os.RemoveAll(dest)
		}
	}
	return results, nil
}

// runPeak runs cmd and returns its peak resident memory in KiB: the most
// /proc/PID/status's VmHWM said while it ran, read every 20 ms. (The rusage
// of wait4 will not do: a child started with vfork, as Go starts them, takes
// its parent's peak at exec, and the link makes this process the larger.)
func runPeak(cmd *exec.Cmd) (int64, error) {
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	var peak int64
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(status); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
					peak = max(peak, n)
				}
			}
		}
		select {
		case err := <-done:
			return peak, err
		case <-tick.C:
		}
	}
}

// checkSummary reads the loader's summary: every file verified, and every byte
// fetched in this run.
func (b *bench) checkSummary() error {
	data, err := os.ReadFile(filepath.Join(b.work, "summary.json"))
	if err != nil {
		return fmt.Errorf("the loader's summary: %w", err)
	}
	var s loadspec.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("the loader's summary: %w", err)
	}
	if !s.Verified || s.Failure != nil || s.BytesFetched != b.total {
		return fmt.Errorf("the loader's summary says verified %v, %d of %d bytes fetched, checks %v, failure %v",
			s.Verified, s.BytesFetched, b.total, s.Checks, s.Failure)
	}
	return nil
}

// selfCPU is this process's CPU time so far: the link's, while a tool runs.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the processor time every process on the machine has used so far
// (the first line of /proc/stat, in clock ticks of 1/100 s): less the tool's,
// the server's and the link's, the rest of the machine's during a run. That
// includes the kernel's writeback threads flushing the tool's writes.
func machineCPU() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var ticks int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// waitQuiet waits, at most quietWait, until other work takes under a tenth of
// the processors over 2 s, so that each run starts on a quiet machine; it
// reports whether it did. Between runs nothing of the benchmark's works (the
// server and the link are idle), so all that is busy is other work.
func (b *bench) waitQuiet() bool {
	if b.quietWait <= 0 {
		return true
	}
	deadline := time.Now().Add(b.quietWait)
	said := false
	for {
		before := machineCPU()
		time.Sleep(2 * time.Second)
		busy := (machineCPU() - before).Seconds() / 2 / float64(runtime.NumCPU())
		if busy < 0.1 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if !said {
			fmt.Printf("  (waiting for the machine to be quiet: %.0f%% of it busy with other work)\n", 100*busy)
			said = true
		}
	}
}

// printOthers says how much other work ran during the table's rounds.
func (b *bench) printOthers() {
	fmt.Printf("The rest of the machine (other work, and the kernel's writeback of the tools' files) used %.1f CPU-s per run (median; at most %.1f).\n",
		median(b.others), slices.Max(append(b.others, 0)))
	if b.disturbed > 0 {
		fmt.Printf("WARNING: %d runs started on a busy machine (after waiting %s); their figures are lower than on an idle one.\n", b.disturbed, b.quietWait)
	}
}

// nameWidth is the width of the tables' first column.
func nameWidth(results []*result) int {
	w := 4
	for _, r := range results {
		w = max(w, len(r.name))
	}
	return w
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
