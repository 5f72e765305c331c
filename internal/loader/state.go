package loader

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// workDirName is the loader's bookkeeping folder inside the destination: partial
// files (data/...) and the journal of finished parts. It is removed once the model
// is complete.
const workDirName = ".model-loader"

// journalRecord is one line of the journal, an append-only log that survives a
// killed loader: a file's start (Kind "file"), a finished part ("part"), a file
// verified and moved into place ("done").
type journalRecord struct {
	Kind     string `json:"k"`
	Path     string `json:"f"`
	Size     int64  `json:"size,omitempty"`
	ETag     string `json:"etag,omitempty"`
	PartSize int64  `json:"ps,omitempty"`
	Part     int    `json:"p,omitempty"`
	// Check is the file's check (a "file" record); its parts' Sums are for it.
	Check string `json:"check,omitempty"`
	// Sums holds the hex digests the part gave (see partResult).
	Sums []string `json:"sums,omitempty"`
}

// fileState is what the journal says about one file.
type fileState struct {
	Size     int64
	ETag     string
	PartSize int64
	Check    string
	Parts    map[int][][]byte
	Done     bool
}

// readJournal replays the journal. A torn last line (the loader killed mid-write)
// and anything unreadable are skipped: the worst case is a part fetched again.
func readJournal(path string) map[string]*fileState {
	states := map[string]*fileState{}
	data, err := os.ReadFile(path)
	if err != nil {
		return states
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r journalRecord
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		switch r.Kind {
		case "file":
			states[r.Path] = &fileState{Size: r.Size, ETag: r.ETag, PartSize: r.PartSize, Check: r.Check, Parts: map[int][][]byte{}}
		case "part":
			if st := states[r.Path]; st != nil {
				if sums, ok := unhexAll(r.Sums); ok {
					st.Parts[r.Part] = sums
				}
			}
		case "done":
			if st := states[r.Path]; st != nil {
				st.Done = true
			}
		}
	}
	return states
}

func hexAll(sums [][]byte) []string {
	var out []string
	for _, s := range sums {
		out = append(out, hex.EncodeToString(s))
	}
	return out
}

func unhexAll(sums []string) ([][]byte, bool) {
	var out [][]byte
	for _, s := range sums {
		b, err := hex.DecodeString(s)
		if err != nil {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// journal appends records, one write per record, so a killed loader loses at most
// the record being written.
type journal struct {
	mu sync.Mutex
	f  *os.File
}

func openJournal(path string) (*journal, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fileErr("", err)
	}
	return &journal{f: f}, nil
}

func (j *journal) append(r journalRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(b); err != nil {
		return fileErr(r.Path, err)
	}
	return nil
}

func (j *journal) close() error { return j.f.Close() }

// markerFile is one file the complete marker vouches for.
type markerFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	ETag string `json:"etag,omitempty"`
	// Check names how the file was verified (see checkFor): sha256, crc64nvme, md5,
	// multipartETag, size, ...
	Check string `json:"check"`
	// Stamp is the file's inode and modification time once verified and in
	// place: a destination that outlives the pod (a PVC, the node's cache) can
	// be written by others afterwards, and a file written since is no longer
	// vouched for, whatever its size.
	Stamp string `json:"stamp,omitempty"`
}

// fileStamp is a file's inode and modification time (ns).
func fileStamp(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d:%d", st.Ino, fi.ModTime().UnixNano())
	}
	return fmt.Sprintf("%d", fi.ModTime().UnixNano())
}

// unchanged tells whether the file on disk is the one the marker vouched for:
// a regular file of its size, not written since (markers written before stamps
// vouch by size).
func (f markerFile) unchanged(fi os.FileInfo, size int64) bool {
	return fi.Mode().IsRegular() && fi.Size() == size && (f.Stamp == "" || f.Stamp == fileStamp(fi))
}

// marker is the content of loadspec.CompleteMarker, written last.
type marker struct {
	Source      string       `json:"source"`
	Files       []markerFile `json:"files"`
	Bytes       int64        `json:"bytes"`
	CompletedAt time.Time    `json:"completedAt"`
}

func readMarker(dest string) (*marker, error) {
	data, err := os.ReadFile(filepath.Join(dest, loadspec.CompleteMarker))
	if err != nil {
		return nil, err
	}
	var m marker
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// matches tells whether the marker vouches for exactly the listed objects, and the
// files are still there with their sizes: a cache hit, decided without reading data.
func (m *marker) matches(dest string, objs []Object) bool {
	if m == nil || len(m.Files) != len(objs) {
		return false
	}
	byPath := make(map[string]markerFile, len(m.Files))
	for _, f := range m.Files {
		byPath[f.Path] = f
	}
	for _, o := range objs {
		f, ok := byPath[o.Path]
		if !ok || f.Size != o.Size || f.ETag != o.ETag {
			return false
		}
		st, err := os.Stat(filepath.Join(dest, filepath.FromSlash(o.Path)))
		if err != nil || !f.unchanged(st, o.Size) {
			return false
		}
	}
	return true
}

// vouchesFor tells whether the marker of an earlier complete model covers this
// object unchanged (an incremental update keeps such files).
func (m *marker) vouchesFor(o Object) (markerFile, bool) {
	if m == nil {
		return markerFile{}, false
	}
	for _, f := range m.Files {
		if f.Path == o.Path {
			return f, f.Size == o.Size && f.ETag == o.ETag
		}
	}
	return markerFile{}, false
}

// writeMarker writes the marker atomically (temporary file, rename), flushed first
// when fsync is asked for.
func writeMarker(dest string, m marker, fsync bool) error {
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	final := filepath.Join(dest, loadspec.CompleteMarker)
	return writeFileAtomic(final, append(data, '\n'), fsync)
}

func writeFileAtomic(path string, data []byte, fsync bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fileErr("", err)
	}
	_, err = f.Write(data)
	if err == nil && fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && fsync {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fileErr("", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// maxManifestSize bounds the sha256 manifest, which is read into memory.
const maxManifestSize = 16 << 20

// readManifest fetches and parses a sha256 manifest in sha256sum format
// ("HEX  PATH" or "HEX *PATH" per line).
func readManifest(ctx context.Context, src Source, obj *Object) (map[string]string, error) {
	if obj.Size > maxManifestSize {
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "sha256 manifest is larger than %d bytes", maxManifestSize)
	}
	var data []byte
	err := defaultRetry.do(ctx, func(ctx context.Context) error {
		if obj.Size == 0 {
			data = nil
			return nil
		}
		body, err := src.Fetch(ctx, obj, 0, obj.Size)
		if err != nil {
			return err
		}
		defer body.Close()
		data, err = io.ReadAll(io.LimitReader(body, maxManifestSize+1))
		if err == nil && int64(len(data)) != obj.Size {
			err = io.ErrUnexpectedEOF
		}
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("reading sha256 manifest %s: %w", obj.Path, err)
	}
	return parseManifest(obj.Path, data)
}

func parseManifest(name string, data []byte) (map[string]string, error) {
	entries := map[string]string{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, p, ok := strings.Cut(line, " ")
		p = strings.TrimPrefix(strings.TrimPrefix(p, " "), "*")
		p = strings.TrimPrefix(p, "./")
		if b, err := hex.DecodeString(sum); !ok || err != nil || len(b) != 32 || p == "" {
			return nil, failf(loadspec.ReasonInvalidConfig, name, "line %d is not \"SHA256  PATH\"", n+1)
		}
		if err := checkRelPath(p); err != nil {
			return nil, err
		}
		entries[p] = strings.ToLower(sum)
	}
	if len(entries) == 0 {
		return nil, failf(loadspec.ReasonInvalidConfig, name, "sha256 manifest lists no file")
	}
	return entries, nil
}

// isNotExist reports a missing file.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
