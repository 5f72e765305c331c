package loader

import (
	"context"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// A destination that outlives the pod (the node's cache, a PVC) can be written
// by others after the loader verified it, and the marker that vouches for its
// files lies in the same folder, writable by the same writers: a file
// overwritten in place with its modification time put back keeps its inode,
// mtime and size, and a forged marker can say anything. So a file is kept from
// an earlier run only after its content, read back from the disk, passes the
// check the source gives for it now. Reading back costs what reading the
// model from the page cache or the disk costs (docs/model-cache.md has the
// figures); nothing is fetched again unless the content changed.

// recheckKept checks the content of every file the old marker vouches for that
// is still in place, files in parallel. It returns the marker without the files
// whose content no longer passes, which are then fetched again.
func (l *run) recheckKept(ctx context.Context, old *marker, objs []Object) (*marker, error) {
	if old == nil {
		return nil, nil
	}
	var kept []*Object
	for i := range objs {
		o := &objs[i]
		mf, ok := old.vouchesFor(*o)
		if !ok {
			continue
		}
		if fi, err := os.Stat(filepath.Join(l.dest, filepath.FromSlash(o.Path))); err == nil && mf.unchanged(fi, o.Size) {
			kept = append(kept, o)
		}
	}
	if len(kept) == 0 {
		return old, nil
	}
	start := time.Now()
	changed := map[string]string{}
	var mu sync.Mutex
	var firstErr error
	var bytes int64
	work := make(chan *Object)
	var wg sync.WaitGroup
	for range min(runtime.NumCPU(), len(kept)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, bufSize)
			for o := range work {
				mismatch, err := contentMismatch(ctx, filepath.Join(l.dest, filepath.FromSlash(o.Path)), o, buf)
				mu.Lock()
				switch {
				case err != nil && firstErr == nil:
					firstErr = err
				case mismatch != "":
					changed[o.Path] = mismatch
				}
				bytes += o.Size
				mu.Unlock()
			}
		}()
	}
feed:
	for _, o := range kept {
		select {
		case work <- o:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, contextError(ctx, ctx.Err())
	}
	if firstErr != nil {
		return nil, firstErr
	}
	l.log.Info("Checked the files already in place against the source", "files", len(kept), "bytes", bytes,
		"seconds", round(time.Since(start).Seconds(), 3), "changed", len(changed))
	if len(changed) == 0 {
		return old, nil
	}
	still := *old
	still.Files = nil
	for _, f := range old.Files {
		if mismatch, ok := changed[f.Path]; ok {
			l.log.Info("A file changed since it was verified: fetching it again", "file", f.Path, "mismatch", mismatch)
			continue
		}
		still.Files = append(still.Files, f)
	}
	return &still, nil
}

// contentMismatch reads the file at path and checks it as a download of obj is
// checked; it describes a difference, or returns "" (also when the source
// gives nothing but the size, which the caller has already compared).
func contentMismatch(ctx context.Context, path string, obj *Object, buf []byte) (string, error) {
	c := checkFor(obj)
	if c.kind == kindSize {
		return "", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fileErr(obj.Path, err)
	}
	defer f.Close()
	var h hash.Hash
	var up *uploadHasher
	var sink func([]byte)
	if c.kind == kindUploadParts {
		up = newUploadHasher(c.newHash(), obj.UploadPartSize, obj.Size, 0)
		sink = up.write
	} else {
		h = c.newHash()
		sink = func(b []byte) { h.Write(b) }
	}
	var n int64
	for {
		if ctx.Err() != nil {
			return "", contextError(ctx, ctx.Err())
		}
		m, err := f.Read(buf)
		sink(buf[:m])
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fileErr(obj.Path, err)
		}
	}
	if n != obj.Size {
		return fmt.Sprintf("the source says %d bytes, the file has %d", obj.Size, n), nil
	}
	if up != nil {
		digests := c.newHash()
		for _, s := range up.sums {
			digests.Write(s)
		}
		return c.mismatch(digests.Sum(nil), len(up.sums)), nil
	}
	return c.mismatch(h.Sum(nil), 0), nil
}

// passes tells whether the file at path passes obj's check (a file that cannot
// be read does not).
func (l *run) passes(ctx context.Context, path string, obj *Object) bool {
	mismatch, err := contentMismatch(ctx, path, obj, make([]byte, bufSize))
	if err == nil && mismatch != "" {
		l.log.Info("A file the journal vouches for fails its check: fetching it again", "file", obj.Path, "mismatch", mismatch)
	}
	return err == nil && mismatch == ""
}

// sumsOnDisk computes, from the partial file, the digests a download of part p
// gives (see partResult): its CRC, or the digests of its upload parts. Whole-file
// checks need none: their hasher reads every part back anyway.
func (t *fileTask) sumsOnDisk(ctx context.Context, p part, buf []byte) ([][]byte, error) {
	var h hash.Hash
	var up *uploadHasher
	switch t.check.kind {
	case kindCRC:
		h = t.check.newHash()
	case kindUploadParts:
		up = newUploadHasher(t.check.newHash(), t.obj.UploadPartSize, t.obj.Size, p.Off)
	default:
		return nil, nil
	}
	f, err := os.Open(t.tmp)
	if err != nil {
		return nil, fileErr(t.obj.Path, err)
	}
	defer f.Close()
	for off, end := p.Off, p.Off+p.Len; off < end; {
		if ctx.Err() != nil {
			return nil, contextError(ctx, ctx.Err())
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
		if h != nil {
			h.Write(buf[:n])
		} else {
			up.write(buf[:n])
		}
		off += int64(n)
		if err != nil && !(err == io.EOF && off == end) {
			return nil, fileErr(t.obj.Path, err)
		}
	}
	if h != nil {
		return [][]byte{h.Sum(nil)}, nil
	}
	return up.sums, nil
}
