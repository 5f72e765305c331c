package loader

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// Checks, strongest first: how a file is verified beyond its size.
const (
	checkSHA256    = "sha256"
	checkMD5       = "md5"
	checkMultipart = "multipartETag"
	checkSize      = "size"
)

// checkFor picks the strongest check the source offers for obj.
func checkFor(obj *Object) string {
	switch {
	case obj.SHA256 != "":
		return checkSHA256
	case obj.MD5 != "":
		return checkMD5
	case obj.UploadPartSize > 0:
		return checkMultipart
	}
	return checkSize
}

func newWholeHash(check string) hash.Hash {
	switch check {
	case checkSHA256:
		return sha256.New()
	case checkMD5:
		return md5.New()
	}
	return nil
}

// job is one part of one file, as queued for the workers.
type job struct {
	t *fileTask
	p part
}

// fileTask is one file being fetched into dest/.model-loader/data/PATH.
type fileTask struct {
	obj      *Object
	check    string
	parts    []part
	partSize int64
	tmp      string
	final    string
	enqueue  func(job)
	finished func()

	mu        sync.Mutex
	f         *os.File
	done      []bool
	remaining int
	// uploadMD5 holds the hex MD5 of each upload part (multipart ETag check).
	uploadMD5 []string
	// resumed is set when some parts came from an earlier run; restarted once the
	// file has been fetched again from scratch after a failed check.
	resumed, restarted bool
	// stream: the whole-file hash is computed while the file's single part streams.
	// Otherwise seq hashes the finished prefix of the file as it grows.
	stream    bool
	streamSum string
	seq       *seqHasher
}

// prepare decides what to do about one listed object: nothing (already in place and
// vouched for by the journal or an earlier marker), or a task with the parts still
// missing.
func (l *run) prepare(obj *Object, st *fileState, old *marker) (*fileTask, error) {
	final := filepath.Join(l.dest, filepath.FromSlash(obj.Path))
	tmp := filepath.Join(l.work, "data", filepath.FromSlash(obj.Path))
	same := st != nil && st.Size == obj.Size && st.ETag == obj.ETag
	check := checkFor(obj)
	if same && st.Done {
		if fi, err := os.Stat(tmp); err == nil && fi.Size() == obj.Size {
			// Verified, but killed before the rename.
			if err := moveIntoPlace(tmp, final); err != nil {
				return nil, fileErr(obj.Path, err)
			}
		}
		if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == obj.Size {
			l.recordDone(obj, check)
			l.present.Add(obj.Size)
			return nil, nil
		}
	}
	if mf, ok := old.vouchesFor(*obj); ok {
		if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == obj.Size {
			l.recordDone(obj, mf.Check)
			l.present.Add(obj.Size)
			return nil, nil
		}
	}

	t := &fileTask{obj: obj, check: check, tmp: tmp, final: final}
	t.partSize = l.opts.PartSizeBytes
	if obj.UploadPartSize > 0 {
		t.partSize = alignedPartSize(t.partSize, obj.UploadPartSize)
		t.uploadMD5 = make([]string, obj.UploadParts)
	}
	if obj.NoRanges {
		t.partSize = obj.Size
	}
	resume := same && !st.Done && st.PartSize > 0 && len(st.Parts) > 0 &&
		(obj.UploadPartSize == 0 || st.PartSize%obj.UploadPartSize == 0) &&
		(!obj.NoRanges || st.PartSize == obj.Size)
	if resume {
		if fi, err := os.Stat(tmp); err != nil || fi.Size() != obj.Size {
			resume = false
		}
	}
	if resume {
		t.partSize = st.PartSize
	}
	t.parts = planParts(obj.Size, t.partSize)
	t.done = make([]bool, len(t.parts))
	t.remaining = len(t.parts)
	if resume {
		for i, ums := range st.Parts {
			if i < 0 || i >= len(t.parts) || t.done[i] {
				continue
			}
			if obj.UploadPartSize > 0 && !t.takeUploadMD5(t.parts[i], ums) {
				continue
			}
			t.done[i] = true
			t.remaining--
			t.resumed = true
			l.present.Add(t.parts[i].Len)
		}
	}
	if !t.resumed {
		if err := os.Remove(tmp); err != nil && !isNotExist(err) {
			return nil, fileErr(obj.Path, err)
		}
		if err := l.jrnl.append(journalRecord{Kind: "file", Path: obj.Path, Size: obj.Size, ETag: obj.ETag, PartSize: t.partSize}); err != nil {
			return nil, err
		}
	}
	t.stream = newWholeHash(check) != nil && len(t.parts) == 1 && !t.resumed
	return t, nil
}

// takeUploadMD5 stores the upload-part digests a journal record kept for part p,
// and reports whether they were all there.
func (t *fileTask) takeUploadMD5(p part, sums []string) bool {
	first := int(p.Off / t.obj.UploadPartSize)
	last := int((p.Off + p.Len - 1) / t.obj.UploadPartSize)
	if len(sums) != last-first+1 {
		return false
	}
	copy(t.uploadMD5[first:], sums)
	return true
}

func (t *fileTask) pendingParts() []part {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ps []part
	for i, d := range t.done {
		if !d {
			ps = append(ps, t.parts[i])
		}
	}
	return ps
}

// openFile opens (creating and sizing) the partial file on first use, and starts
// the file's sequential hasher when it needs one.
func (l *run) openFile(ctx context.Context, t *fileTask) (*os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f != nil {
		return t.f, nil
	}
	if err := os.MkdirAll(filepath.Dir(t.tmp), 0o755); err != nil {
		return nil, fileErr(t.obj.Path, err)
	}
	f, err := os.OpenFile(t.tmp, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fileErr(t.obj.Path, err)
	}
	if !t.resumed {
		// Sized up front: every part writes in place, in any order.
		if err := allocate(f, t.obj.Size); err != nil {
			f.Close()
			return nil, fileErr(t.obj.Path, err)
		}
	}
	t.f = f
	if newWholeHash(t.check) != nil && !t.stream {
		t.seq = l.startSeqHasher(ctx, t)
	}
	return f, nil
}

func (t *fileTask) closeFile() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// fetchPart fetches one part, retrying transient failures with back-off.
func (l *run) fetchPart(ctx context.Context, t *fileTask, p part) error {
	f, err := l.openFile(ctx, t)
	if err != nil {
		return err
	}
	var res partResult
	attempt := 0
	err = defaultRetry.do(ctx, func(ctx context.Context) error {
		attempt++
		var n int64
		var err error
		res, n, err = l.fetchPartOnce(ctx, t, f, p)
		if err != nil {
			l.present.Add(-n)
		}
		return err
	}, func(err error, wait time.Duration) {
		l.retries.Add(1)
		if errors.Is(err, errStalled) {
			l.stalls.Add(1)
		}
		l.log.Info("Retrying part", "file", t.obj.Path, "part", p.Index, "offset", p.Off,
			"attempt", attempt, "wait", wait.Round(time.Millisecond).String(), "error", err.Error())
	})
	if err != nil {
		var le *Error
		if errors.As(err, &le) {
			if le.Path == "" {
				le.Path = t.obj.Path
			}
			le.Err = fmt.Errorf("part %d (bytes %d-%d): %w", p.Index, p.Off, p.Off+p.Len-1, le.Err)
		}
		return err
	}
	return l.partDone(ctx, t, p, res)
}

// partResult is what one successful attempt learnt besides the bytes.
type partResult struct {
	uploadMD5 []string // MD5 of each upload part within the part (multipart ETag)
	wholeSum  string   // the whole-file hash, for a single streamed part
}

// fetchPartOnce makes one attempt at a part: a ranged request streamed through a
// pooled buffer into the file at the part's offset, under a stall watchdog that
// cancels the request when no byte arrives for StallTimeout. It returns how many
// bytes it wrote, so that a failed attempt can take them back from the progress.
func (l *run) fetchPartOnce(ctx context.Context, t *fileTask, f *os.File, p part) (partResult, int64, error) {
	stall := l.opts.StallTimeout.Duration
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(stall, func() { cancel(errStalled) })
	defer watchdog.Stop()
	stalled := func(err error) error {
		if errors.Is(context.Cause(pctx), errStalled) && ctx.Err() == nil {
			return fmt.Errorf("%w (%s): %v", errStalled, stall, err)
		}
		return err
	}

	body, err := l.src.Fetch(pctx, t.obj, p.Off, p.Len)
	if err != nil {
		return partResult{}, 0, stalled(err)
	}
	defer body.Close()

	var whole hash.Hash
	if t.stream {
		whole = newWholeHash(t.check)
	}
	var up *uploadHasher
	if t.obj.UploadPartSize > 0 {
		up = newUploadHasher(t.obj.UploadPartSize, t.obj.Size, p.Off)
	}
	// The part is written as it arrives, one buffer at a time, straight from this
	// goroutine: while it writes, the socket's receive buffer holds what comes in.
	buf := <-l.bufs
	defer func() { l.bufs <- buf }()
	var got int64
	for got < p.Len {
		want := min(int64(len(buf)), p.Len-got)
		n, rerr := readFull(body, buf[:want], func() { watchdog.Reset(stall) })
		if n > 0 {
			if whole != nil {
				whole.Write(buf[:n])
			}
			if up != nil {
				up.write(buf[:n])
			}
			if _, err := f.WriteAt(buf[:n], p.Off+got); err != nil {
				return partResult{}, got, fileErr(t.obj.Path, err)
			}
			// A write held up by the kernel's writeback throttling is no stall of
			// the network: the watchdog counts from here.
			watchdog.Reset(stall)
			got += int64(n)
			l.fetched.Add(int64(n))
			l.present.Add(int64(n))
		}
		if rerr != nil {
			if rerr == io.EOF {
				if got < p.Len {
					return partResult{}, got, stalled(fmt.Errorf("body ended after %d of %d bytes: %w", got, p.Len, io.ErrUnexpectedEOF))
				}
				break
			}
			return partResult{}, got, stalled(rerr)
		}
	}
	var res partResult
	if whole != nil {
		res.wholeSum = hex.EncodeToString(whole.Sum(nil))
	}
	if up != nil {
		res.uploadMD5 = up.finish()
	}
	return res, got, nil
}

// readFull fills b unless the reader ends or fails first; progress is called after
// every read that returned bytes (it feeds the stall watchdog).
func readFull(r io.Reader, b []byte, progress func()) (int, error) {
	filled := 0
	for filled < len(b) {
		n, err := r.Read(b[filled:])
		if n > 0 {
			filled += n
			progress()
		}
		if err != nil {
			return filled, err
		}
	}
	return filled, nil
}

// uploadHasher computes the MD5 of each upload part a download part covers; a
// download part always starts on an upload part boundary.
type uploadHasher struct {
	h         hash.Hash
	pos, next int64 // file offset reached, and the end of the current upload part
	partSize  int64
	size      int64
	sums      []string
}

func newUploadHasher(partSize, size, off int64) *uploadHasher {
	return &uploadHasher{h: md5.New(), pos: off, next: min(off+partSize, size), partSize: partSize, size: size}
}

func (u *uploadHasher) write(b []byte) {
	for len(b) > 0 {
		n := min(int64(len(b)), u.next-u.pos)
		u.h.Write(b[:n])
		u.pos += n
		b = b[n:]
		if u.pos == u.next {
			u.sums = append(u.sums, hex.EncodeToString(u.h.Sum(nil)))
			u.h.Reset()
			u.next = min(u.pos+u.partSize, u.size)
		}
	}
}

func (u *uploadHasher) finish() []string { return u.sums }

// partDone records a finished part in memory and in the journal, and hands the
// file to finalize when it was the last one.
func (l *run) partDone(ctx context.Context, t *fileTask, p part, res partResult) error {
	if err := l.jrnl.append(journalRecord{Kind: "part", Path: t.obj.Path, Part: p.Index, UploadMD5: res.uploadMD5}); err != nil {
		return err
	}
	t.mu.Lock()
	if res.uploadMD5 != nil {
		t.takeUploadMD5(p, res.uploadMD5)
	}
	if t.stream {
		t.streamSum = res.wholeSum
	}
	t.done[p.Index] = true
	t.remaining--
	last := t.remaining == 0
	seq := t.seq
	t.mu.Unlock()
	if seq != nil {
		seq.poke()
	}
	if last {
		t.finished()
	}
	return nil
}

// finalize verifies a file whose parts are all there, flushes it if asked, records
// it in the journal and renames it into place.
func (l *run) finalize(ctx context.Context, t *fileTask) error {
	f, err := l.openFile(ctx, t)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return fileErr(t.obj.Path, err)
	}
	var mismatch string
	if fi.Size() != t.obj.Size {
		mismatch = fmt.Sprintf("the source says %d bytes, the file has %d", t.obj.Size, fi.Size())
	}
	if mismatch == "" {
		mismatch, err = t.verify(ctx)
		if err != nil {
			return err
		}
	}
	if mismatch != "" {
		t.mu.Lock()
		retry := t.resumed && !t.restarted
		t.mu.Unlock()
		if retry {
			// Parts kept from an earlier run may be what is wrong (a node crash can
			// lose written data the journal vouches for): fetch the file once more.
			l.log.Info("Fetching a resumed file again after a failed check", "file", t.obj.Path, "check", t.check, "mismatch", mismatch)
			return l.restart(ctx, t)
		}
		return failf(loadspec.ReasonChecksumMismatch, t.obj.Path, "%s check failed: %s", t.check, mismatch)
	}
	if l.opts.Fsync {
		if err := f.Sync(); err != nil {
			return fileErr(t.obj.Path, err)
		}
	}
	t.closeFile()
	if err := l.jrnl.append(journalRecord{Kind: "done", Path: t.obj.Path}); err != nil {
		return err
	}
	if err := moveIntoPlace(t.tmp, t.final); err != nil {
		return fileErr(t.obj.Path, err)
	}
	l.recordDone(t.obj, t.check)
	return nil
}

// verify checks the file's content against the source's word; it returns a
// description of the mismatch, or "".
func (t *fileTask) verify(ctx context.Context) (string, error) {
	switch t.check {
	case checkSHA256, checkMD5:
		var got string
		if t.stream {
			got = t.streamSum
		} else {
			select {
			case <-t.seq.done:
			case <-ctx.Done():
				return "", contextError(ctx, ctx.Err())
			}
			if t.seq.err != nil {
				return "", t.seq.err
			}
			got = t.seq.sum
		}
		want := t.obj.SHA256
		if t.check == checkMD5 {
			want = t.obj.MD5
		}
		if !strings.EqualFold(got, want) {
			return fmt.Sprintf("the source says %s %s, the downloaded bytes give %s", t.check, want, got), nil
		}
	case checkMultipart:
		h := md5.New()
		for i, s := range t.uploadMD5 {
			b, err := hex.DecodeString(s)
			if err != nil || len(b) != md5.Size {
				return fmt.Sprintf("no digest of upload part %d", i+1), nil
			}
			h.Write(b)
		}
		got := hex.EncodeToString(h.Sum(nil)) + "-" + strconv.Itoa(len(t.uploadMD5))
		if !strings.EqualFold(got, t.obj.ETag) {
			return fmt.Sprintf("the store's ETag is %s, the downloaded parts give %s", t.obj.ETag, got), nil
		}
	}
	return "", nil
}

// restart throws a file's data away and queues all its parts again.
func (l *run) restart(ctx context.Context, t *fileTask) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.f.Truncate(0); err != nil {
		return fileErr(t.obj.Path, err)
	}
	if err := t.f.Truncate(t.obj.Size); err != nil {
		return fileErr(t.obj.Path, err)
	}
	if err := l.jrnl.append(journalRecord{Kind: "file", Path: t.obj.Path, Size: t.obj.Size, ETag: t.obj.ETag, PartSize: t.partSize}); err != nil {
		return err
	}
	l.present.Add(-t.obj.Size)
	t.restarted, t.resumed = true, false
	for i := range t.done {
		t.done[i] = false
	}
	for i := range t.uploadMD5 {
		t.uploadMD5[i] = ""
	}
	t.remaining = len(t.parts)
	t.stream = newWholeHash(t.check) != nil && len(t.parts) == 1
	t.seq = nil
	if newWholeHash(t.check) != nil && !t.stream {
		t.seq = l.startSeqHasher(ctx, t)
	}
	for _, p := range t.parts {
		t.enqueue(job{t: t, p: p})
	}
	return errRequeued
}

// errRequeued tells download that a file went back to the queue.
var errRequeued = errors.New("requeued")

func moveIntoPlace(tmp, final string) error {
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

// seqHasher hashes a file front to back while its parts arrive in any order: each
// time the finished prefix grows it reads the new bytes back (from the page cache,
// as they were just written) and hashes them, so that little is left to hash when
// the last part lands.
type seqHasher struct {
	kick chan struct{}
	done chan struct{}
	sum  string
	err  error
}

func (s *seqHasher) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// startSeqHasher runs the hasher of t; t.mu is held by the caller, and t.f is open.
func (l *run) startSeqHasher(ctx context.Context, t *fileTask) *seqHasher {
	s := &seqHasher{kick: make(chan struct{}, 1), done: make(chan struct{})}
	h := newWholeHash(t.check)
	f := t.f
	go func() {
		defer close(s.done)
		next := 0
		for {
			t.mu.Lock()
			if t.seq != s { // restarted: a new hasher took over
				t.mu.Unlock()
				s.err = errRequeued
				return
			}
			end := next
			for end < len(t.parts) && t.done[end] {
				end++
			}
			t.mu.Unlock()
			if end > next {
				from, to := t.parts[next].Off, t.parts[end-1].Off+t.parts[end-1].Len
				if err := l.hashRange(ctx, f, h, from, to); err != nil {
					s.err = fileErr(t.obj.Path, err)
					return
				}
				next = end
			}
			if next == len(t.parts) {
				s.sum = hex.EncodeToString(h.Sum(nil))
				return
			}
			select {
			case <-s.kick:
			case <-ctx.Done():
				s.err = contextError(ctx, ctx.Err())
				return
			}
		}
	}()
	return s
}

func (l *run) hashRange(ctx context.Context, f *os.File, h hash.Hash, from, to int64) error {
	buf := <-l.bufs
	defer func() { l.bufs <- buf }()
	for off := from; off < to; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
		h.Write(buf[:n])
		off += int64(n)
		if err != nil && !(err == io.EOF && off == to) {
			return err
		}
	}
	return nil
}

// allocate sizes a new file, with its blocks reserved when the file system can
// (fallocate). Parts land out of order; without reserved blocks the file system
// must allocate them at writeback time, scattered, and writeback (hence the
// kernel's dirty-page throttling of the loader) is several times slower.
func allocate(f *os.File, size int64) error {
	if size > 0 {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.ENOSYS) {
			return err
		}
	}
	return f.Truncate(size)
}
