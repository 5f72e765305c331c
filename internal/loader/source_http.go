package loader

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/aiinference/operator/internal/loadspec"
)

// httpSource reads a model over plain HTTP(S) with range requests. A URL naming a
// file is a one-file model. A URL ending in "/" is a folder: its files are the ones
// the sha256 manifest (a file in that folder) names, so that every file it lists is
// also checked.
type httpSource struct {
	base     string
	manifest string
	client   *http.Client
	token    string
	retry    retryPolicy
}

func newHTTPSource(su sourceURL, o Options, c credentials) *httpSource {
	return &httpSource{
		base:     su.URL,
		manifest: o.SHA256Manifest,
		client:   &http.Client{Transport: newHTTPTransport(o.Concurrency, o.StallTimeout.Duration)},
		token:    c.HTTPToken,
		retry:    defaultRetry,
	}
}

func (s *httpSource) request(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "%v", err)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	return req, nil
}

func (s *httpSource) List(ctx context.Context) ([]Object, error) {
	var objs []Object
	if !strings.HasSuffix(s.base, "/") {
		u, _ := url.Parse(s.base)
		name := path.Base(u.Path)
		if name == "/" || name == "." {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "source %s names no file", s.base)
		}
		objs = []Object{{Key: s.base, Path: name}}
	} else {
		if s.manifest == "" {
			return nil, failf(loadspec.ReasonInvalidConfig, "",
				"an http(s) folder source (URL ending in /) needs a sha256 manifest to list its files")
		}
		mobj := Object{Key: s.resolve(s.manifest), Path: s.manifest}
		if err := s.stat(ctx, &mobj); err != nil {
			return nil, fmt.Errorf("sha256 manifest %s: %w", s.manifest, err)
		}
		entries, err := readManifest(ctx, s, &mobj)
		if err != nil {
			return nil, err
		}
		objs = append(objs, mobj)
		for p := range entries {
			if p != s.manifest {
				objs = append(objs, Object{Key: s.resolve(p), Path: p})
			}
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range objs {
		if objs[i].Size > 0 || objs[i].ETag != "" {
			continue
		}
		g.Go(func() error {
			if err := s.stat(gctx, &objs[i]); err != nil {
				return fmt.Errorf("%s: %w", objs[i].Path, err)
			}
			return nil
		})
	}
	return objs, g.Wait()
}

func (s *httpSource) resolve(rel string) string {
	esc := strings.Split(rel, "/")
	for i := range esc {
		esc[i] = url.PathEscape(esc[i])
	}
	return s.base + strings.Join(esc, "/")
}

// stat learns a file's size, ETag and whether the server honours ranges, with a
// one-byte ranged GET (HEAD is not always allowed, and says nothing about ranges).
func (s *httpSource) stat(ctx context.Context, o *Object) error {
	return s.retry.do(ctx, func(ctx context.Context) error {
		req, err := s.request(ctx, http.MethodGet, o.Key)
		if err != nil {
			return err
		}
		req.Header.Set("Range", "bytes=0-0")
		resp, err := s.client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusPartialContent:
			// Content-Range: bytes 0-0/SIZE
			cr := resp.Header.Get("Content-Range")
			i := strings.LastIndexByte(cr, '/')
			size, err := strconv.ParseInt(cr[i+1:], 10, 64)
			if i < 0 || err != nil {
				return fmt.Errorf("unreadable Content-Range %q from %s", cr, o.Key)
			}
			o.Size = size
		case http.StatusOK, http.StatusRequestedRangeNotSatisfiable:
			// No range support, or an empty file.
			o.NoRanges = resp.StatusCode == http.StatusOK
			if resp.ContentLength < 0 {
				return failf(loadspec.ReasonInvalidConfig, o.Path, "the server gives no length for %s", o.Key)
			}
			o.Size = max(resp.ContentLength, 0)
			if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
				o.Size = 0
			}
		default:
			return &httpStatusError{Status: resp.StatusCode, URL: o.Key}
		}
		o.ETag = strings.Trim(resp.Header.Get("ETag"), `"`)
		if strings.HasPrefix(o.ETag, "W/") {
			o.ETag = "" // a weak tag names no bytes
		}
		o.Checksum, o.MD5 = httpDigests(resp.Header)
		return nil
	}, nil)
}

// httpDigests reads the digests of the whole file a server sends with any response
// for it, ranged or not: Repr-Digest (RFC 9530) sha-256, and Google Cloud
// Storage's x-goog-hash crc32c and md5. (Content-MD5 and Content-Digest describe
// the bytes of this response only, not the file.)
func httpDigests(h http.Header) (sum *StoreChecksum, md5hex string) {
	consider := func(alg, b64 string) {
		if sc, ok := parseStoreChecksum(alg, b64); ok && sc.Parts == 0 {
			sum = cheaper(sum, sc)
		}
	}
	for _, v := range h.Values("Repr-Digest") {
		for _, item := range strings.Split(v, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(item), "=")
			if strings.EqualFold(name, "sha-256") {
				consider("SHA256", strings.Trim(value, ":"))
			}
		}
	}
	for _, v := range h.Values("X-Goog-Hash") {
		for _, item := range strings.Split(v, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(item), "=")
			switch strings.ToLower(name) {
			case "crc32c":
				consider("CRC32C", value)
			case "md5":
				if b, err := base64.StdEncoding.DecodeString(value); err == nil && len(b) == md5.Size {
					md5hex = hex.EncodeToString(b)
				}
			}
		}
	}
	return sum, md5hex
}

func (s *httpSource) Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error) {
	req, err := s.request(ctx, http.MethodGet, obj.Key)
	if err != nil {
		return nil, err
	}
	whole := off == 0 && n == obj.Size
	if !obj.NoRanges {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	}
	if obj.ETag != "" {
		req.Header.Set("If-Match", `"`+obj.ETag+`"`)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	ok := resp.StatusCode == http.StatusPartialContent || (resp.StatusCode == http.StatusOK && whole)
	if !ok {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "the server ignored a range request")
		}
		return nil, &httpStatusError{Status: resp.StatusCode, URL: obj.Key}
	}
	return resp.Body, nil
}
