package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/aiinference/operator/internal/loadspec"
)

// fileSource copies a model from a mounted path (a PVC), a folder or a single file.
type fileSource struct{ root string }

func (s *fileSource) List(ctx context.Context) ([]Object, error) {
	st, err := os.Stat(s.root)
	if err != nil {
		return nil, fileErr("", err)
	}
	tag := func(fi fs.FileInfo) string {
		return strconv.FormatInt(fi.Size(), 10) + "-" + strconv.FormatInt(fi.ModTime().UnixNano(), 10)
	}
	if !st.IsDir() {
		return []Object{{Key: s.root, Path: filepath.Base(s.root), Size: st.Size(), ETag: tag(st)}}, nil
	}
	var objs []Object
	err = filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.root, p)
		objs = append(objs, Object{Key: p, Path: filepath.ToSlash(rel), Size: fi.Size(), ETag: tag(fi)})
		return nil
	})
	if err != nil {
		return nil, fileErr("", err)
	}
	if len(objs) == 0 {
		return nil, failf(loadspec.ReasonNotFound, "", "no files under %s", s.root)
	}
	return objs, nil
}

func (s *fileSource) Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error) {
	f, err := os.Open(obj.Key)
	if err != nil {
		return nil, fileErr(obj.Path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, n), f}, nil
}

// fileErr classifies a local file system error.
func fileErr(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &Error{Reason: loadspec.ReasonNotFound, Path: path, Err: err}
	case errors.Is(err, fs.ErrPermission):
		return &Error{Reason: loadspec.ReasonAccessDenied, Path: path, Err: err}
	}
	return &Error{Reason: loadspec.ReasonTransient, Path: path, Err: fmt.Errorf("local file system: %w", err)}
}
