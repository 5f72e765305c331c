package loader

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"sync"

	"github.com/aiinference/operator/internal/loadspec"
)

// hfSource reads a model repository of the Hugging Face Hub (or of a mirror
// serving its API). List resolves the revision to a commit once, lists that
// commit's files (the tree API) and keeps those the include and exclude
// patterns select; every file is then read at that commit, so a branch that
// moves during the load cannot mix two revisions. A file stored with LFS is
// checked against its sha256, which the tree gives; a file kept in git against
// its git blob id.
type hfSource struct {
	endpoint string
	repo     string
	revision string
	include  []string
	exclude  []string
	token    string
	// api follows no redirect: a resolve answers with the CDN's location, which
	// is kept per file, so that the parts of a file go to the CDN directly.
	api, cdn *http.Client
	retry    retryPolicy

	// commit is what the revision resolved to (set by List).
	commit string

	mu        sync.Mutex
	locations map[string]string // file path -> the CDN's URL of its content
}

// maxTreePages bounds the tree listing (a page holds up to 1000 entries).
const maxTreePages = 1000

func newHFSource(su sourceURL, o Options, c credentials) *hfSource {
	hf := o.HuggingFace
	if hf == nil {
		hf = &loadspec.HuggingFaceOptions{}
	}
	revision := su.Revision
	if p := o.Resolved; p != nil && p.Source == o.Source && p.Revision != "" {
		// An earlier load resolved the revision: load the same commit.
		revision = p.Revision
	}
	transport := newHTTPTransport(o.Concurrency, o.StallTimeout.Duration)
	return &hfSource{
		endpoint:  strings.TrimSuffix(cmp.Or(hf.Endpoint, "https://huggingface.co"), "/"),
		repo:      su.Prefix,
		revision:  revision,
		include:   hf.Include,
		exclude:   hf.Exclude,
		token:     c.HFToken,
		api:       &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		cdn:       &http.Client{Transport: transport},
		retry:     defaultRetry,
		locations: map[string]string{},
	}
}

// Resolved is the commit the revision resolved to.
func (s *hfSource) Resolved() string { return s.commit }

func (s *hfSource) get(ctx context.Context, u string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "%v", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	return s.api.Do(req)
}

// getJSON reads one API answer into v, retrying what is worth retrying; it
// returns the response's Link header.
func (s *hfSource) getJSON(ctx context.Context, u string, v any) (link string, err error) {
	err = s.retry.do(ctx, func(ctx context.Context) error {
		resp, err := s.get(ctx, u, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return s.hubError(resp)
		}
		link = resp.Header.Get("Link")
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v); err != nil {
			return fmt.Errorf("reading %s: %w", u, err)
		}
		return nil
	}, nil)
	return link, err
}

// hubError turns an error answer into an *Error with the reason the Hub's
// X-Error-Code names, or an httpStatusError for classify.
func (s *hfSource) hubError(resp *http.Response) error {
	code, msg := resp.Header.Get("X-Error-Code"), resp.Header.Get("X-Error-Message")
	statusErr := &httpStatusError{Status: resp.StatusCode, URL: resp.Request.URL.Redacted(), RetryAfterHeader: resp.Header.Get("Retry-After")}
	switch {
	case code == "GatedRepo" && s.token == "":
		return failf(loadspec.ReasonGatedModel, "", "%s is a gated model and no token was given (%s): ask for access on its page at %s/%s, "+
			"then put a token of the account granted access in a Secret and name it in model.source.huggingface.tokenSecretRef", s.repo, msg, s.endpoint, s.repo)
	case code == "GatedRepo":
		return failf(loadspec.ReasonGatedModel, "", "%s is a gated model and the token's account has not been granted access (%s): ask for access on its page at %s/%s, "+
			"or use a token of an account that has it", s.repo, msg, s.endpoint, s.repo)
	case code == "RepoNotFound":
		return failf(loadspec.ReasonRepositoryNotFound, "", "%s has no repository %s: check model.source.huggingface.repository (organisation/name, as in the model's address); "+
			"a private repository needs a token that may read it in tokenSecretRef", s.endpoint, s.repo)
	case code == "RevisionNotFound":
		return failf(loadspec.ReasonRevisionNotFound, "", "repository %s has no revision %q: check model.source.huggingface.revision (a branch, tag or commit of the repository)", s.repo, s.revision)
	case code == "EntryNotFound":
		return failf(loadspec.ReasonNotFound, "", "%s: %s", statusErr.Error(), msg)
	case resp.StatusCode == http.StatusUnauthorized && s.token != "":
		return failf(loadspec.ReasonAccessDenied, "", "the Hub refused the token (%s): put a valid token in the Secret named by model.source.huggingface.tokenSecretRef", cmp.Or(msg, statusErr.Error()))
	}
	return statusErr
}

type hfModelInfo struct {
	SHA   string `json:"sha"`
	Gated any    `json:"gated"`
}

type hfTreeEntry struct {
	Type string `json:"type"`
	OID  string `json:"oid"`
	Size int64  `json:"size"`
	Path string `json:"path"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

var (
	commitID  = regexp.MustCompile(`^[0-9a-f]{40}$`)
	nextLink  = regexp.MustCompile(`<([^>]+)>;\s*rel="next"`)
	sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func (s *hfSource) List(ctx context.Context) ([]Object, error) {
	var info hfModelInfo
	if _, err := s.getJSON(ctx, fmt.Sprintf("%s/api/models/%s/revision/%s", s.endpoint, s.repo, url.PathEscape(s.revision)), &info); err != nil {
		return nil, err
	}
	if !commitID.MatchString(info.SHA) {
		return nil, failf(loadspec.ReasonInvalidConfig, "", "%s answered no commit for %s at %q: is model.source.huggingface.endpoint the Hub's API?", s.endpoint, s.repo, s.revision)
	}
	if gated := info.Gated; gated != nil && gated != false && s.token == "" {
		return nil, failf(loadspec.ReasonGatedModel, "", "%s is a gated model (%v) and no token was given: ask for access on its page at %s/%s, "+
			"then put a token of the account granted access in a Secret and name it in model.source.huggingface.tokenSecretRef", s.repo, gated, s.endpoint, s.repo)
	}
	s.commit = info.SHA

	var objs []Object
	next := fmt.Sprintf("%s/api/models/%s/tree/%s?recursive=true", s.endpoint, s.repo, s.commit)
	for page := 0; next != ""; page++ {
		if page == maxTreePages {
			return nil, failf(loadspec.ReasonInvalidConfig, "", "%s lists more than %d pages of files", s.repo, maxTreePages)
		}
		var entries []hfTreeEntry
		link, err := s.getJSON(ctx, next, &entries)
		if err != nil {
			return nil, err
		}
		next = ""
		if m := nextLink.FindStringSubmatch(link); m != nil {
			next = m[1]
			if !strings.HasPrefix(next, s.endpoint+"/") {
				return nil, failf(loadspec.ReasonInvalidConfig, "", "the tree's next page %q is not on %s", next, s.endpoint)
			}
		}
		for _, e := range entries {
			if e.Type != "file" || !s.selected(e.Path) {
				continue
			}
			obj := Object{Key: s.resolveURL(e.Path), Path: e.Path, Size: e.Size, ETag: e.OID, GitBlobSHA1: e.OID}
			if e.LFS != nil {
				if !sha256Hex.MatchString(e.LFS.OID) {
					return nil, failf(loadspec.ReasonInvalidConfig, e.Path, "the Hub gives no sha256 of this LFS file (%q)", e.LFS.OID)
				}
				obj.Size, obj.ETag, obj.SHA256, obj.GitBlobSHA1 = e.LFS.Size, e.LFS.OID, e.LFS.OID, ""
			}
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		return nil, failf(loadspec.ReasonNotFound, "", "no file of %s at %s (commit %s) matches include %q and exclude %q: check model.source.huggingface.include and exclude",
			s.repo, s.revision, s.commit, s.includePatterns(), s.excludePatterns())
	}
	return objs, nil
}

func (s *hfSource) includePatterns() []string {
	if len(s.include) == 0 {
		return loadspec.DefaultHuggingFaceInclude
	}
	return s.include
}

func (s *hfSource) excludePatterns() []string {
	if s.exclude == nil {
		return loadspec.DefaultHuggingFaceExclude
	}
	return s.exclude
}

// selected tells whether the patterns take the file.
func (s *hfSource) selected(p string) bool {
	return matchAny(s.includePatterns(), p) && !matchAny(s.excludePatterns(), p)
}

// matchAny: a pattern with a '/' matches the whole path (a trailing "/*"
// anything below that folder); one without matches the base name too.
func matchAny(patterns []string, p string) bool {
	for _, pat := range patterns {
		if dir, ok := strings.CutSuffix(pat, "/*"); ok && !strings.ContainsAny(dir, "*?[") && strings.HasPrefix(p, dir+"/") {
			return true
		}
		if ok, _ := path.Match(pat, p); ok {
			return true
		}
		if !strings.Contains(pat, "/") {
			if ok, _ := path.Match(pat, path.Base(p)); ok {
				return true
			}
		}
	}
	return false
}

func (s *hfSource) resolveURL(p string) string {
	esc := strings.Split(p, "/")
	for i := range esc {
		esc[i] = url.PathEscape(esc[i])
	}
	return fmt.Sprintf("%s/%s/resolve/%s/%s", s.endpoint, s.repo, s.commit, strings.Join(esc, "/"))
}

// Fetch reads a range of a file: from the CDN location an earlier part was
// redirected to, else through the Hub's resolve, which serves a git file
// itself and redirects for an LFS one.
func (s *hfSource) Fetch(ctx context.Context, obj *Object, off, n int64) (io.ReadCloser, error) {
	rng := http.Header{"Range": {fmt.Sprintf("bytes=%d-%d", off, off+n-1)}}
	s.mu.Lock()
	loc := s.locations[obj.Path]
	s.mu.Unlock()
	if loc != "" {
		body, err := s.fetchCDN(ctx, obj, loc, rng)
		if err == nil || !isStatus(err, http.StatusForbidden, http.StatusUnauthorized, http.StatusNotFound) {
			return body, err
		}
		// The signed location expired: ask the Hub again.
		s.mu.Lock()
		delete(s.locations, obj.Path)
		s.mu.Unlock()
	}
	resp, err := s.get(ctx, obj.Key, rng)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		return resp.Body, nil
	case http.StatusFound, http.StatusTemporaryRedirect, http.StatusMovedPermanently, http.StatusSeeOther, http.StatusPermanentRedirect:
		resp.Body.Close()
		target, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
		if err != nil || target.Scheme != "http" && target.Scheme != "https" {
			return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "the Hub redirected to an unusable location %q", resp.Header.Get("Location"))
		}
		if etag := strings.Trim(resp.Header.Get("X-Linked-Etag"), `"`); obj.SHA256 != "" && etag != "" && etag != obj.SHA256 {
			return nil, failf(loadspec.ReasonChecksumMismatch, obj.Path, "the tree gives sha256 %s, the resolve %s", obj.SHA256, etag)
		}
		s.mu.Lock()
		s.locations[obj.Path] = target.String()
		s.mu.Unlock()
		return s.fetchCDN(ctx, obj, target.String(), rng)
	case http.StatusOK:
		resp.Body.Close()
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "the Hub ignored a range request")
	}
	defer resp.Body.Close()
	return nil, s.hubError(resp)
}

// fetchCDN reads a range from the CDN, without the Hub's token: it is the
// Hub's, not the CDN's (a redirect to another host drops it too).
func (s *hfSource) fetchCDN(ctx context.Context, obj *Object, loc string, rng http.Header) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc, nil)
	if err != nil {
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "%v", err)
	}
	req.Header = rng.Clone()
	resp, err := s.cdn.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusPartialContent {
		return resp.Body, nil
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil, failf(loadspec.ReasonInvalidConfig, obj.Path, "the CDN ignored a range request")
	}
	// The signature in the query is a credential of sorts: left out of messages.
	shown := *req.URL
	shown.RawQuery = ""
	return nil, &httpStatusError{Status: resp.StatusCode, URL: shown.String(), RetryAfterHeader: resp.Header.Get("Retry-After")}
}

func isStatus(err error, codes ...int) bool {
	var sc statusCoder
	if !errors.As(err, &sc) {
		return false
	}
	for _, c := range codes {
		if sc.HTTPStatusCode() == c {
			return true
		}
	}
	return false
}
