package ollamastore

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// findGGUF returns the one *.gguf file at the top of dir, or, when the top
// has none, the one in its subfolders (a repository snapshot may keep it in a
// folder of its own). Hidden entries are bookkeeping (the model loader's
// .model-complete.json and .model-loader/, download tools' .cache/), not the model.
func findGGUF(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("reading the model folder (--model-dir): %w", err)
	}
	var top, nested, others []string
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Name(), "."): // skipped
		case isGGUF(e):
			top = append(top, e.Name())
		case e.IsDir():
			sub, err := os.ReadDir(filepath.Join(dir, e.Name()))
			if err != nil {
				return "", fmt.Errorf("reading the model folder (--model-dir): %w", err)
			}
			for _, s := range sub {
				if isGGUF(s) && !strings.HasPrefix(s.Name(), ".") {
					nested = append(nested, filepath.Join(e.Name(), s.Name()))
				}
			}
			others = append(others, e.Name()+"/")
		default:
			others = append(others, e.Name())
		}
	}
	found := top
	if len(found) == 0 {
		found = nested
	}
	switch {
	case len(found) == 1:
		return filepath.Join(dir, found[0]), nil
	case len(found) > 1:
		return "", fmt.Errorf("model folder %s holds %d .gguf files (%s): engine.type Ollama serves exactly one; "+
			"point spec.model.source at a folder or file with one (a model split in parts must be merged first, e.g. with llama-gguf-split --merge)",
			dir, len(found), strings.Join(found, ", "))
	case len(others) == 0:
		return "", fmt.Errorf("model folder %s is empty: engine.type Ollama serves a GGUF file; point spec.model.source at one", dir)
	default:
		return "", fmt.Errorf("model folder %s holds no .gguf file (it holds %s): engine.type Ollama serves a GGUF file; point spec.model.source at one",
			dir, summarize(others))
	}
}

// isGGUF: a regular file or a symbolic link (snapshots link to their blobs) named *.gguf.
func isGGUF(e os.DirEntry) bool {
	return strings.EqualFold(filepath.Ext(e.Name()), ".gguf") && (e.Type().IsRegular() || e.Type()&os.ModeSymlink != 0)
}

// summarize names up to 8 entries, so a large snapshot gives a short message.
func summarize(names []string) string {
	slices.Sort(names)
	if len(names) <= 8 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:8], ", "), len(names)-8)
}

// ggufInfo is what the store needs from the GGUF file.
type ggufInfo struct {
	digest       string // sha256:<hex> of the whole file
	size         int64
	architecture string // general.architecture, or "" when not found
}

// scanGGUF reads the file once: the header's metadata passes through the same
// reader that hashes, so a large model is read only once.
func scanGGUF(path string) (ggufInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return ggufInfo{}, err
	}
	defer f.Close()
	h := &countingHash{Hash: sha256.New()}
	r := bufio.NewReaderSize(io.TeeReader(f, h), 1<<20)
	if magic, err := r.Peek(4); err != nil || string(magic) != "GGUF" {
		return ggufInfo{}, fmt.Errorf("%s is not a GGUF file (it does not start with \"GGUF\"): engine.type Ollama serves a GGUF file", path)
	}
	// The metadata only names the family: a file whose metadata this cannot
	// read is still served, and Ollama says what it thinks of it.
	arch, _ := readArchitecture(r)
	if _, err := io.Copy(io.Discard, r); err != nil {
		return ggufInfo{}, fmt.Errorf("reading %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return ggufInfo{}, err
	}
	// A read error during the metadata is not returned twice by bufio: make
	// sure the digest covers the whole file.
	if h.n != fi.Size() {
		return ggufInfo{}, fmt.Errorf("reading %s: read %d of its %d bytes", path, h.n, fi.Size())
	}
	return ggufInfo{digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: h.n, architecture: arch}, nil
}

type countingHash struct {
	hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.Hash.Write(p)
}

// GGUF metadata value types (ggml's gguf_type).
const (
	ggufString = 8
	ggufArray  = 9
)

// ggufScalarSize is the size of the fixed-size value types, by type.
var ggufScalarSize = map[uint32]int64{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

var errBadGGUF = errors.New("malformed GGUF metadata")

// readArchitecture reads GGUF (version 2 or later) metadata up to
// general.architecture, usually the first key.
func readArchitecture(r *bufio.Reader) (string, error) {
	var header struct {
		Magic   [4]byte
		Version uint32
		Tensors uint64
		KVs     uint64
	}
	if err := binary.Read(r, binary.LittleEndian, &header); err != nil {
		return "", err
	}
	if header.Version < 2 {
		return "", errBadGGUF // version 1 used 32-bit lengths; no current tool writes it
	}
	for range header.KVs {
		key, err := readString(r, 1<<16)
		if err != nil {
			return "", err
		}
		var typ uint32
		if err := binary.Read(r, binary.LittleEndian, &typ); err != nil {
			return "", err
		}
		if key == "general.architecture" && typ == ggufString {
			arch, err := readString(r, 64)
			if err != nil || strings.IndexFunc(arch, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
				return "", errBadGGUF
			}
			return arch, nil
		}
		if err := skipValue(r, typ, 0); err != nil {
			return "", err
		}
	}
	return "", errBadGGUF
}

func readString(r *bufio.Reader, maxLen uint64) (string, error) {
	var n uint64
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return "", err
	}
	if n > maxLen {
		return "", errBadGGUF
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return string(b), err
}

func skipValue(r *bufio.Reader, typ uint32, depth int) error {
	if size, ok := ggufScalarSize[typ]; ok {
		_, err := r.Discard(int(size))
		return err
	}
	switch typ {
	case ggufString:
		var n uint64
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return err
		}
		_, err := io.CopyN(io.Discard, r, int64(n))
		return err
	case ggufArray:
		var elem uint32
		var count uint64
		if err := binary.Read(r, binary.LittleEndian, &elem); err != nil {
			return err
		}
		if err := binary.Read(r, binary.LittleEndian, &count); err != nil {
			return err
		}
		if size, ok := ggufScalarSize[elem]; ok {
			_, err := io.CopyN(io.Discard, r, int64(count)*size)
			return err
		}
		if depth > 2 {
			return errBadGGUF
		}
		for range count {
			if err := skipValue(r, elem, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return errBadGGUF
}
