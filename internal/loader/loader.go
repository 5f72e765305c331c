// Package loader is the model loader: it fetches a model's files from S3-compatible
// storage, HTTP(S) or a mounted path into a destination folder, fast (ranged parts
// of many files in parallel, written in place), verified (size, ETag or multipart
// ETag, sha256 manifest), resumable (a journal of finished parts), and never hung
// (retries with back-off, a stall watchdog per part, an overall timeout). It
// reports through its log and the loadspec.Summary it returns.
package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// bufSize is the size of one copy buffer; the pool holds one per request in flight
// plus a few for the hashers, so memory stays bounded whatever the model's size.
// It is also the size of each write: larger writes make the page cache allocate
// larger folios, which on a VM whose free memory goes back to the host cost a
// host fault per page on first touch; 128 KiB writes ran about twice as fast as
// 1 MiB ones in the benchmark (`make bench-loader`).
const bufSize = 128 << 10

// Run loads the model the options describe, within the budget if there is one.
// The summary is filled whether or not the load succeeds; the error, if any, is
// (or wraps) an *Error (see ExitCode).
func Run(ctx context.Context, o Options, log *slog.Logger) (loadspec.Summary, error) {
	if o.Budget != nil {
		return runBudgeted(ctx, o, *o.Budget, log)
	}
	return runOnce(ctx, o, log)
}

// runOnce is one attempt at the load, bounded by the options' timeout.
func runOnce(ctx context.Context, o Options, log *slog.Logger) (loadspec.Summary, error) {
	start := time.Now()
	l := &run{opts: o, log: log, start: start, stage: "listing"}
	o.Progress.post(l)
	ctx, cancel := context.WithTimeoutCause(ctx, o.Timeout.Duration, context.DeadlineExceeded)
	defer cancel()
	err := l.load(ctx)
	if err == nil && len(o.Adapters) > 0 {
		err = fetchAdapters(ctx, o, log)
	}
	l.mu.Lock()
	l.stage = "done"
	l.mu.Unlock()
	return l.summary(err), err
}

// fetchAdapters fetches, after the model, the adapters an engine takes only at
// start, one after the other, within what is left of the load's timeout.
func fetchAdapters(ctx context.Context, o Options, log *slog.Logger) error {
	for _, a := range o.Adapters {
		ao, err := o.AdapterOptions(a.Load)
		if err != nil {
			return fmt.Errorf("adapter %s: %w", a.Name, err)
		}
		log.Info("Fetching adapter", "adapter", a.Name, "source", ao.Source, "dest", ao.Dest)
		s, err := runOnce(ctx, ao, log.With("adapter", a.Name))
		if err != nil {
			return fmt.Errorf("adapter %s: %w", a.Name, err)
		}
		log.Info("Fetched adapter", "adapter", a.Name, "files", s.Files, "bytes", s.Bytes, "verified", s.Verified, "cacheHit", s.CacheHit)
	}
	return nil
}

// run is the state of one Run.
type run struct {
	opts  Options
	log   *slog.Logger
	start time.Time
	src   Source
	dest  string
	work  string // dest/.model-loader
	jrnl  *journal
	bufs  chan []byte

	objs     []Object
	total    int64
	cacheHit bool

	fetched atomic.Int64 // bytes received from the source in this run
	present atomic.Int64 // bytes of the model on disk (kept, resumed, or written now)
	retries atomic.Int64
	stalls  atomic.Int64

	mu     sync.Mutex
	stage  string // for the progress endpoint: listing, downloading, done
	checks map[string]int
	done   []markerFile
	err    error // the first permanent failure
	cancel context.CancelCauseFunc
}

func (l *run) summary(err error) loadspec.Summary {
	secs := time.Since(l.start).Seconds()
	s := loadspec.Summary{
		Files:        len(l.objs),
		Bytes:        l.total,
		BytesFetched: l.fetched.Load(),
		Seconds:      round(secs, 3),
		CacheHit:     l.cacheHit,
		Retries:      int(l.retries.Load()),
		Stalls:       int(l.stalls.Load()),
		Failure:      FailureOf(err),
	}
	if secs > 0 {
		s.ThroughputMBps = round(float64(s.BytesFetched)/1e6/secs, 1)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.checks) > 0 {
		s.Checks = l.checks
	}
	s.Verified = err == nil && l.checks["size"] == 0
	if r, ok := l.src.(resolver); ok {
		s.Resolved = r.Resolved()
	}
	return s
}

func round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}

func (l *run) load(ctx context.Context) error {
	o := l.opts
	var creds credentials
	var err error
	if !o.Anonymous {
		if creds, err = loadCredentials(o.CredentialsDir, os.Getenv); err != nil {
			return err
		}
	}
	l.dest, err = filepath.Abs(o.Dest)
	if err != nil {
		return failf(loadspec.ReasonInvalidConfig, "", "destination: %v", err)
	}
	if err := os.MkdirAll(l.dest, 0o755); err != nil {
		return fileErr("", fmt.Errorf("destination: %w", err))
	}
	// Two pods sharing a cache volume must not write the same model at once: the
	// second waits, then finds the first one's marker.
	unlock, err := lockDir(ctx, l.dest, l.log)
	if err != nil {
		return err
	}
	defer unlock()

	if l.src, err = newSource(ctx, o, creds); err != nil {
		return err
	}
	l.log.Info("Listing source", "source", o.Source)
	objs, err := l.src.List(ctx)
	if err != nil {
		return err
	}
	if err := l.applyManifest(ctx, objs); err != nil {
		return err
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Path < objs[j].Path })
	var total int64
	for i, obj := range objs {
		if err := checkRelPath(obj.Path); err != nil {
			return err
		}
		if i > 0 && objs[i-1].Path == obj.Path {
			return failf(loadspec.ReasonInvalidConfig, obj.Path, "listed twice")
		}
		total += obj.Size
	}
	// Under the lock: the progress endpoint reads them from another goroutine.
	l.mu.Lock()
	l.objs, l.total, l.stage = objs, total, "downloading"
	l.mu.Unlock()
	l.log.Info("Listed source", "files", len(objs), "bytes", l.total)

	old, _ := readMarker(l.dest)
	if old, err = l.recheckKept(ctx, old, objs); err != nil {
		return err
	}
	if old.matches(l.dest, objs) {
		l.cacheHit = true
		l.present.Store(l.total)
		l.mu.Lock()
		l.checks = map[string]int{}
		for _, f := range old.Files {
			l.checks[f.Check]++
		}
		l.mu.Unlock()
		l.log.Info("Destination already holds the complete model, its content checked; nothing to download", "dest", l.dest)
		return nil
	}
	// From here on the destination is being changed: the marker goes first, so the
	// engine never starts on a model half replaced.
	if err := os.Remove(filepath.Join(l.dest, loadspec.CompleteMarker)); err != nil && !isNotExist(err) {
		return fileErr("", err)
	}
	if o.Fsync {
		if err := syncDir(l.dest); err != nil {
			return fileErr("", err)
		}
	}
	return l.download(ctx, old)
}

// applyManifest fetches the sha256 manifest, if one is configured, and gives each
// listed object its digest. A file the manifest names but the source lacks is
// NotFound.
func (l *run) applyManifest(ctx context.Context, objs []Object) error {
	name := l.opts.SHA256Manifest
	if name == "" {
		return nil
	}
	var mobj *Object
	for i := range objs {
		if objs[i].Path == name {
			mobj = &objs[i]
		}
	}
	if mobj == nil {
		return failf(loadspec.ReasonNotFound, name, "the sha256 manifest is not in the source")
	}
	sums, err := readManifest(ctx, l.src, mobj)
	if err != nil {
		return err
	}
	for i := range objs {
		if sum, ok := sums[objs[i].Path]; ok {
			objs[i].SHA256 = sum
			delete(sums, objs[i].Path)
		}
	}
	for p := range sums {
		return failf(loadspec.ReasonNotFound, p, "the sha256 manifest names a file the source does not have")
	}
	return nil
}

// download fetches every file not already in place, then writes the marker.
func (l *run) download(ctx context.Context, old *marker) error {
	l.work = filepath.Join(l.dest, workDirName)
	if err := os.MkdirAll(filepath.Join(l.work, "data"), 0o755); err != nil {
		return fileErr("", err)
	}
	jpath := filepath.Join(l.work, "journal")
	states := readJournal(jpath)
	var err error
	if l.jrnl, err = openJournal(jpath); err != nil {
		return err
	}
	defer l.jrnl.close()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l.cancel = cancel
	l.checks = map[string]int{}
	// A buffer per request in flight and a few for the hashers: memory is bounded
	// by the concurrency, not the model.
	l.bufs = make(chan []byte, l.opts.Concurrency+4)
	for range cap(l.bufs) {
		l.bufs <- make([]byte, bufSize)
	}

	var tasks []*fileTask
	for i := range l.objs {
		t, err := l.prepare(ctx, &l.objs[i], states[l.objs[i].Path], old)
		if err != nil {
			return err
		}
		if t != nil {
			tasks = append(tasks, t)
		}
	}
	shrunk := shrinkTail(tasks, l.opts.Concurrency, l.opts.PartSizeBytes)
	totalParts := 0
	for _, t := range tasks {
		if !t.resumed {
			if err := l.jrnl.append(t.fileRecord()); err != nil {
				return err
			}
		}
		totalParts += len(t.parts)
	}
	kept := l.present.Load()
	l.log.Info("Starting download", "files", len(tasks), "bytesToFetch", l.total-kept,
		"bytesAlreadyPresent", kept, "concurrency", l.opts.Concurrency, "partSizeBytes", l.opts.PartSizeBytes,
		"filesInTailParts", shrunk, "tailPartSizeBytes", tailPartSize(l.opts.PartSizeBytes))

	stopProgress := l.startProgress(ctx)
	defer stopProgress()

	// Every part of every file goes through one queue served by Concurrency
	// workers, a few files at a time (see interleave). A file whose verification
	// fails after a resume is fetched once more from scratch, hence room for every
	// part twice.
	jobs := make(chan job, 2*totalParts+1)
	var filesLeft atomic.Int64
	filesLeft.Store(int64(len(tasks)))
	var finals sync.WaitGroup
	var closeOnce sync.Once
	fileDone := func() {
		if filesLeft.Add(-1) == 0 {
			closeOnce.Do(func() { close(jobs) })
		}
	}
	// Ordered before any file is finalized: finalize may queue a file's parts again.
	queue := queueOrder(tasks)
	for _, t := range tasks {
		t.enqueue = func(j job) { jobs <- j }
		t.finished = func() {
			finals.Add(1)
			go func() {
				defer finals.Done()
				err := l.finalize(ctx, t)
				if errors.Is(err, errRequeued) {
					return // its parts are queued again; it finishes later
				}
				if err != nil {
					l.fail(err)
				}
				fileDone()
			}()
		}
		if t.remaining == 0 {
			t.finished()
		}
	}
	for _, j := range queue {
		jobs <- j
	}
	if len(tasks) == 0 {
		closeOnce.Do(func() { close(jobs) })
	}

	var workers sync.WaitGroup
	for range l.opts.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case j, ok := <-jobs:
					if !ok {
						return
					}
					if err := l.fetchPart(ctx, j.t, j.p); err != nil {
						l.fail(err)
						return
					}
				}
			}
		}()
	}
	workers.Wait()
	finals.Wait()
	for _, t := range tasks {
		t.closeFile()
	}
	if err := l.failure(ctx); err != nil {
		return err
	}

	if l.opts.Fsync {
		dirs := map[string]bool{}
		for _, f := range l.done {
			dirs[filepath.Dir(filepath.Join(l.dest, filepath.FromSlash(f.Path)))] = true
		}
		for d := range dirs {
			if err := syncDir(d); err != nil {
				return fileErr("", err)
			}
		}
	}
	m := marker{Source: l.opts.Source, Files: l.done, Bytes: l.total, CompletedAt: time.Now().UTC()}
	if err := writeMarker(l.dest, m, l.opts.Fsync); err != nil {
		return err
	}
	l.jrnl.close()
	if err := os.RemoveAll(l.work); err != nil {
		l.log.Info("Could not remove the loader's work folder", "dir", l.work, "error", err.Error())
	}
	l.log.Info("Model complete", "files", len(l.objs), "bytes", l.total, "checks", l.checks)
	return nil
}

// queueOrder is the order in which the workers get the tasks' missing parts: files
// in order, interleaved (see interleave).
func queueOrder(tasks []*fileTask) []job {
	var files [][]job
	for _, t := range tasks {
		var fileJobs []job
		for _, p := range t.pendingParts() {
			fileJobs = append(fileJobs, job{t: t, p: p})
		}
		if len(fileJobs) > 0 {
			files = append(files, fileJobs)
		}
	}
	return interleave(files, filesInFlight)
}

// filesInFlight is how many files interleave spreads the parts in flight over.
const filesInFlight = 4

// interleave orders the files' parts for the workers: round robin over n files at
// a time, files in order, the next file joining as one runs out. Writes to one
// file go one at a time (see writeAt), so parts in flight spread over a few files
// let every processor write; a few rather than all, so that files still finish,
// and are verified, early. In the benchmark this took the median from 3.9 s to
// 3.5 s against files one after the other.
func interleave(files [][]job, n int) []job {
	var order []job
	active, next := []int{}, 0
	for {
		for len(active) < n && next < len(files) {
			active = append(active, next)
			next++
		}
		if len(active) == 0 {
			return order
		}
		still := active[:0]
		for _, f := range active {
			order = append(order, files[f][0])
			if files[f] = files[f][1:]; len(files[f]) > 0 {
				still = append(still, f)
			}
		}
		active = still
	}
}

// fail records the first permanent failure and stops the run.
func (l *run) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.cancel(err)
}

// failure is the run's outcome: the first failure recorded, else the context's end.
func (l *run) failure(ctx context.Context) error {
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return contextError(ctx, ctx.Err())
	}
	return nil
}

// recordDone notes a file verified and in place, as it is on disk now.
func (l *run) recordDone(obj *Object, check string, fi os.FileInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checks[check]++
	l.done = append(l.done, markerFile{Path: obj.Path, Size: obj.Size, ETag: obj.ETag, Check: check, Stamp: fileStamp(fi)})
}

// startProgress logs bytes, percent, rate and ETA at a steady interval.
func (l *run) startProgress(ctx context.Context) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(l.opts.ProgressInterval)
		defer t.Stop()
		begin := time.Now()
		startFetched := l.fetched.Load()
		lastFetched, last := startFetched, begin
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				fetched, present := l.fetched.Load(), l.present.Load()
				rate := float64(fetched-lastFetched) / now.Sub(last).Seconds()
				avg := float64(fetched-startFetched) / now.Sub(begin).Seconds()
				eta := "unknown"
				if avg > 0 {
					eta = (time.Duration(float64(l.total-present)/avg) * time.Second).Round(time.Second).String()
				}
				pct := 100.0
				if l.total > 0 {
					pct = float64(present) * 100 / float64(l.total)
				}
				l.log.Info("Progress", "bytes", present, "total", l.total, "percent", round(pct, 1),
					"rateMBps", round(rate/1e6, 1), "averageMBps", round(avg/1e6, 1), "eta", eta,
					"retries", l.retries.Load(), "stalls", l.stalls.Load())
				lastFetched, last = fetched, now
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

// lockDir takes an exclusive flock on the destination folder, waiting for another
// loader that holds it (until ctx ends).
func lockDir(ctx context.Context, dir string, log *slog.Logger) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fileErr("", err)
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			// A file system without locks: go on unlocked.
			f.Close()
			return func() {}, nil
		}
		if !logged {
			log.Info("Waiting for another loader writing the same destination", "dest", dir)
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, contextError(ctx, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
