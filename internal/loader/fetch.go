package loader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// job is one part of one file, as queued for the workers.
type job struct {
	t *fileTask
	p part
}

// fileTask is one file being fetched into dest/.model-loader/data/PATH.
type fileTask struct {
	obj      *Object
	check    check
	parts    []part
	partSize int64
	tmp      string
	final    string
	enqueue  func(job)
	finished func()

	mu        sync.Mutex
	writeMu   sync.Mutex // see writeAt
	f         *os.File
	done      []bool
	remaining int
	// uploadSums holds the digest of each upload part (kindUploadParts), partCRCs
	// the CRC of each download part (kindCRC).
	uploadSums, partCRCs [][]byte
	// resumed is set when some parts came from an earlier run; restarted once the
	// file has been fetched again from scratch after a failed check.
	resumed, restarted bool
	// stream: the whole-file hash is computed while the file's single part streams.
	// Otherwise seq hashes the finished prefix of the file as it grows.
	stream    bool
	streamSum []byte
	seq       *seqHasher
}

// prepare decides what to do about one listed object: nothing (already in place and
// vouched for by the journal or an earlier marker), or a task with the parts still
// missing. A new task goes into the journal once download has settled its part
// size (see shrinkTail).
func (l *run) prepare(ctx context.Context, obj *Object, st *fileState, old *marker) (*fileTask, error) {
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
		// The journal, like the file, is in a folder others may write (see
		// recheckKept): the file is kept only if its content passes.
		if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == obj.Size &&
			l.passes(ctx, final, obj) {
			l.recordDone(obj, cmp.Or(st.Check, check.name), fi) // the check it passed
			l.present.Add(obj.Size)
			return nil, nil
		}
	}
	if mf, ok := old.vouchesFor(*obj); ok {
		if fi, err := os.Stat(final); err == nil && mf.unchanged(fi, obj.Size) {
			l.recordDone(obj, mf.Check, fi)
			l.present.Add(obj.Size)
			return nil, nil
		}
	}

	t := &fileTask{obj: obj, check: check, tmp: tmp, final: final}
	partSize := l.opts.PartSizeBytes
	byUploadPart := check.kind == kindUploadParts
	if byUploadPart {
		partSize = alignedPartSize(partSize, obj.UploadPartSize)
		t.uploadSums = make([][]byte, obj.UploadParts)
	}
	if obj.NoRanges {
		partSize = obj.Size
	}
	resume := same && !st.Done && st.Check == check.name && st.PartSize > 0 && len(st.Parts) > 0 &&
		(!byUploadPart || st.PartSize%obj.UploadPartSize == 0) &&
		(!obj.NoRanges || st.PartSize == obj.Size)
	if resume {
		if fi, err := os.Stat(tmp); err != nil || fi.Size() != obj.Size {
			resume = false
		}
	}
	if resume {
		partSize = st.PartSize
	}
	t.setParts(partSize)
	if resume {
		buf := make([]byte, bufSize)
		for i := range st.Parts {
			if i < 0 || i >= len(t.parts) || t.done[i] {
				continue
			}
			// The digests come from the bytes on disk, not from the journal,
			// which others sharing the folder may have written (see recheckKept).
			sums, err := t.sumsOnDisk(ctx, t.parts[i], buf)
			if err != nil {
				return nil, err
			}
			if !t.takeSums(t.parts[i], sums) {
				continue
			}
			t.done[i] = true
			t.remaining--
			t.resumed = true
			l.present.Add(t.parts[i].Len)
		}
	}
	if t.resumed {
		t.stream = false // the parts kept were not hashed as they streamed
	} else if err := os.Remove(tmp); err != nil && !isNotExist(err) {
		return nil, fileErr(obj.Path, err)
	}
	return t, nil
}

// setParts lays the file out in parts of partSize bytes, none of them in yet.
func (t *fileTask) setParts(partSize int64) {
	t.partSize = partSize
	t.parts = planParts(t.obj.Size, partSize)
	t.done = make([]bool, len(t.parts))
	t.remaining = len(t.parts)
	t.partCRCs = nil
	if t.check.kind == kindCRC {
		t.partCRCs = make([][]byte, len(t.parts))
	}
	t.stream = t.check.kind == kindWhole && len(t.parts) == 1
}

// partSizeIsFree tells whether the file may be laid out in parts of any size: its
// check does not follow the upload parts, the source serves it in ranges, and no
// part of it is kept from an earlier run (the journal's parts are in the part
// size the file was started with).
func (t *fileTask) partSizeIsFree() bool {
	return t.check.kind != kindUploadParts && !t.obj.NoRanges && !t.resumed
}

// fileRecord starts the file in the journal: the part records after it hold
// digests for the file's check, at its part size.
func (t *fileTask) fileRecord() journalRecord {
	return journalRecord{Kind: "file", Path: t.obj.Path, Size: t.obj.Size, ETag: t.obj.ETag, PartSize: t.partSize, Check: t.check.name}
}

// takeSums stores the digests a finished part p gave (from this run or the
// journal of an earlier one), and reports whether they were all there.
func (t *fileTask) takeSums(p part, sums [][]byte) bool {
	switch t.check.kind {
	case kindCRC:
		if len(sums) != 1 {
			return false
		}
		t.partCRCs[p.Index] = sums[0]
	case kindUploadParts:
		first := int(p.Off / t.obj.UploadPartSize)
		last := int((p.Off + p.Len - 1) / t.obj.UploadPartSize)
		if len(sums) != last-first+1 {
			return false
		}
		copy(t.uploadSums[first:], sums)
	}
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
	if t.check.kind == kindWhole && !t.stream {
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
		// The run's first failure comes back to every other worker as the cause of
		// the cancelled context: it is not this part's, and other goroutines read it.
		if errors.As(err, &le) && error(le) != context.Cause(ctx) {
			annotated := *le
			annotated.Path = cmp.Or(le.Path, t.obj.Path)
			annotated.Err = fmt.Errorf("part %d (bytes %d-%d): %w", p.Index, p.Off, p.Off+p.Len-1, le.Err)
			return &annotated
		}
		return err
	}
	return l.partDone(ctx, t, p, res)
}

// partResult is what one successful attempt learnt besides the bytes.
type partResult struct {
	// sums: the digest of each upload part within the part (kindUploadParts), or
	// the part's CRC (kindCRC).
	sums     [][]byte
	wholeSum []byte // the whole-file digest, for a single streamed part
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

	// whole hashes the content as it streams (a single-part kindWhole file, or
	// the part's CRC); up hashes each upload part it covers.
	var whole hash.Hash
	if t.stream || t.check.kind == kindCRC {
		whole = t.check.newHash()
	}
	var up *uploadHasher
	if t.check.kind == kindUploadParts {
		up = newUploadHasher(t.check.newHash(), t.obj.UploadPartSize, t.obj.Size, p.Off)
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
			if err := t.writeAt(f, buf[:n], p.Off+got); err != nil {
				return partResult{}, got, err
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
	switch {
	case t.check.kind == kindCRC:
		res.sums = [][]byte{whole.Sum(nil)}
	case whole != nil:
		res.wholeSum = whole.Sum(nil)
	case up != nil:
		res.sums = up.sums
	}
	return res, got, nil
}

// writeAt writes b at off. Writes to one file are taken one at a time here: the
// kernel takes the file's inode lock for each buffered write anyway, and writers
// queued on it spin on the processor (a seventh of the loader's time with 16
// parts of one file in flight on 2 cores), where goroutines queued on a mutex
// sleep.
func (t *fileTask) writeAt(f *os.File, b []byte, off int64) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if _, err := f.WriteAt(b, off); err != nil {
		return fileErr(t.obj.Path, err)
	}
	return nil
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

// uploadHasher computes the digest of each upload part a download part covers; a
// download part always starts on an upload part boundary.
type uploadHasher struct {
	h         hash.Hash
	pos, next int64 // file offset reached, and the end of the current upload part
	partSize  int64
	size      int64
	sums      [][]byte
}

func newUploadHasher(h hash.Hash, partSize, size, off int64) *uploadHasher {
	return &uploadHasher{h: h, pos: off, next: min(off+partSize, size), partSize: partSize, size: size}
}

func (u *uploadHasher) write(b []byte) {
	for len(b) > 0 {
		n := min(int64(len(b)), u.next-u.pos)
		u.h.Write(b[:n])
		u.pos += n
		b = b[n:]
		if u.pos == u.next {
			u.sums = append(u.sums, u.h.Sum(nil))
			u.h.Reset()
			u.next = min(u.pos+u.partSize, u.size)
		}
	}
}

// partDone records a finished part in memory and in the journal, and hands the
// file to finalize when it was the last one.
func (l *run) partDone(ctx context.Context, t *fileTask, p part, res partResult) error {
	if err := l.jrnl.append(journalRecord{Kind: "part", Path: t.obj.Path, Part: p.Index, Sums: hexAll(res.sums)}); err != nil {
		return err
	}
	t.mu.Lock()
	t.takeSums(p, res.sums)
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
			l.log.Info("Fetching a resumed file again after a failed check", "file", t.obj.Path, "check", t.check.name, "mismatch", mismatch)
			return l.restart(ctx, t)
		}
		return failf(loadspec.ReasonChecksumMismatch, t.obj.Path, "%s check failed: %s", t.check.name, mismatch)
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
	placed, err := os.Stat(t.final)
	if err != nil {
		return fileErr(t.obj.Path, err)
	}
	l.recordDone(t.obj, t.check.name, placed)
	return nil
}

// verify checks the file's content against the source's word; it returns a
// description of the mismatch, or "".
func (t *fileTask) verify(ctx context.Context) (string, error) {
	c := t.check
	switch c.kind {
	case kindWhole:
		if t.stream {
			return c.mismatch(t.streamSum, 0), nil
		}
		select {
		case <-t.seq.done:
		case <-ctx.Done():
			return "", contextError(ctx, ctx.Err())
		}
		if t.seq.err != nil {
			return "", t.seq.err
		}
		return c.mismatch(t.seq.sum, 0), nil
	case kindCRC:
		var crc uint64
		for i, p := range t.parts {
			if len(t.partCRCs[i]) != c.crc.width/8 {
				return fmt.Sprintf("no CRC of part %d", i), nil
			}
			crc = c.crc.combine(crc, c.crc.crcValue(t.partCRCs[i]), p.Len)
		}
		return c.mismatch(c.crc.digest(crc), 0), nil
	case kindUploadParts:
		h := c.newHash()
		for i, sum := range t.uploadSums {
			if sum == nil {
				return fmt.Sprintf("no digest of upload part %d", i+1), nil
			}
			h.Write(sum)
		}
		return c.mismatch(h.Sum(nil), len(t.uploadSums)), nil
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
	if err := l.jrnl.append(t.fileRecord()); err != nil {
		return err
	}
	l.present.Add(-t.obj.Size)
	t.restarted, t.resumed = true, false
	// In place, not with setParts: the hasher being replaced may still read t.parts.
	for i := range t.done {
		t.done[i] = false
	}
	clear(t.uploadSums)
	clear(t.partCRCs)
	t.remaining = len(t.parts)
	t.stream = t.check.kind == kindWhole && len(t.parts) == 1
	t.seq = nil
	if t.check.kind == kindWhole && !t.stream {
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
	sum  []byte
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
	h := t.check.newHash()
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
				s.sum = h.Sum(nil)
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
