package loader

import (
	"context"
	"io"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/aiinference/operator/internal/loadspec"
)

// Object is one file of the model as the source lists it.
type Object struct {
	// Key is the source's own name for it (S3 key, URL, absolute path).
	Key string
	// Path is where it goes, relative to the destination, with forward slashes.
	Path string
	Size int64
	// ETag is the source's version tag (S3 ETag, HTTP ETag, local size+mtime). The
	// complete marker records it, so a changed object is never taken for a cached one.
	ETag string
	// MD5 is the hex MD5 of the content when the source vouches for it (an S3
	// single-part ETag).
	MD5 string
	// Checksum is the store's own checksum of the content, when it keeps one.
	Checksum *StoreChecksum
	// UploadPartSize and UploadParts describe an S3 multipart upload, when known:
	// a multipart ETag or composite checksum is then checked by hashing each
	// upload part as it streams.
	UploadPartSize int64
	UploadParts    int
	// SHA256 is the hex digest the sha256 manifest gives, or the source's own
	// (a Hub LFS file's, an OCI layer's), if any.
	SHA256 string
	// GitBlobSHA1 is the hex git blob id of the content (a Hub file kept in git).
	GitBlobSHA1 string
	// NoRanges is set for an HTTP server that ignores Range: one request per file.
	NoRanges bool
}

// multipartETag reports whether the ETag has the "-N" suffix of a multipart upload.
func multipartETag(etag string) (parts int, ok bool) {
	i := strings.LastIndexByte(etag, '-')
	if i < 0 {
		return 0, false
	}
	n := 0
	for _, c := range etag[i+1:] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n > 0 && i+1 < len(etag)
}

// isHexMD5 reports whether s looks like a plain MD5 digest in hex.
func isHexMD5(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// Source lists a model's files and reads byte ranges of them.
type Source interface {
	// List returns the model's files. An empty model is a NotFound *Error.
	List(ctx context.Context) ([]Object, error)
	// Fetch returns bytes [off, off+n) of obj.
	Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error)
}

// sourceURL is a parsed --source.
type sourceURL struct {
	Scheme   string // s3, http, https, file, hf, oci
	Bucket   string // s3 only
	Prefix   string // s3 key prefix, file path, hf repository, oci reference
	URL      string // http(s): the whole URL
	Revision string // hf: the branch, tag or commit
}

// resolver is a source whose movable name (a branch, a tag) resolves to a
// fixed one in List.
type resolver interface {
	Resolved() string
}

func parseSource(s string) (sourceURL, error) {
	bad := func(why string) (sourceURL, error) {
		return sourceURL{}, failf(loadspec.ReasonInvalidConfig, "", "source %q: %s", s, why)
	}
	if rest, ok := strings.CutPrefix(s, "hf://"); ok {
		repo, rev, _ := strings.Cut(rest, "@")
		if !hfRepository.MatchString(repo) || strings.Contains(repo, "..") {
			return bad("want hf://ORGANISATION/NAME[@REVISION]")
		}
		if rev == "" {
			rev = "main"
		}
		if strings.Contains(rev, "..") || strings.ContainsAny(rev, " ?#") {
			return bad("unusable revision " + rev)
		}
		return sourceURL{Scheme: "hf", Prefix: repo, Revision: rev}, nil
	}
	if ref, ok := strings.CutPrefix(s, "oci://"); ok {
		if _, err := parseOCIReference(ref); err != nil {
			return bad(err.Error())
		}
		return sourceURL{Scheme: "oci", Prefix: ref}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad(err.Error())
	}
	switch u.Scheme {
	case "s3":
		if u.Host == "" {
			return bad("no bucket; want s3://BUCKET/PREFIX")
		}
		return sourceURL{Scheme: "s3", Bucket: u.Host, Prefix: strings.TrimPrefix(u.Path, "/")}, nil
	case "http", "https":
		if u.Host == "" {
			return bad("no host")
		}
		return sourceURL{Scheme: u.Scheme, URL: s}, nil
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return bad("want file:///ABSOLUTE/PATH")
		}
		if u.Path == "" || !path.IsAbs(u.Path) {
			return bad("want file:///ABSOLUTE/PATH")
		}
		return sourceURL{Scheme: "file", Prefix: path.Clean(u.Path)}, nil
	}
	return bad("scheme must be s3, http, https, file, hf or oci")
}

var hfRepository = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)

// newSource builds the Source for the options' --source.
func newSource(ctx context.Context, o Options, creds credentials) (Source, error) {
	su, err := parseSource(o.Source)
	if err != nil {
		return nil, err
	}
	switch su.Scheme {
	case "s3":
		return newS3Source(ctx, su, o, creds)
	case "http", "https":
		return newHTTPSource(su, o, creds), nil
	case "hf":
		return newHFSource(su, o, creds), nil
	case "oci":
		return newOCISource(su, o)
	default:
		return &fileSource{root: su.Prefix}, nil
	}
}

// checkRelPath refuses a listed path that would land outside the destination or on
// the loader's own bookkeeping.
func checkRelPath(p string) error {
	clean := path.Clean(p)
	switch {
	case p == "" || clean != p || path.IsAbs(p) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../"):
		return failf(loadspec.ReasonInvalidConfig, p, "refusing a file name that is not a clean relative path")
	case clean == loadspec.CompleteMarker || clean == workDirName || strings.HasPrefix(clean, workDirName+"/"):
		return failf(loadspec.ReasonInvalidConfig, p, "refusing a file name the loader uses for its own bookkeeping")
	}
	return nil
}
