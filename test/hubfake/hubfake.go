// Package hubfake is a FAKE of the Hugging Face Hub's HTTP API, for tests: the
// Hub cannot be reached from here. It serves what the model loader reads, as
// the Hub does (its documented API and what huggingface_hub expects of it):
//
//   - GET /api/models/{repo}/revision/{rev}: the model's metadata, "sha" the
//     commit the revision names, "siblings" its files, "gated" and "private";
//   - GET /api/models/{repo}/tree/{rev}?recursive=true: the files, each with its
//     git blob id ("oid"), size and, for LFS files, "lfs": {"oid": sha256, "size"},
//     paginated with a Link: <...>; rel="next" header;
//   - GET and HEAD /{repo}/resolve/{rev}/{path}: a file kept in git is served in
//     place (ETag its blob id); an LFS file answers 302 to a different host (the
//     CDN) with X-Linked-Etag (its sha256), X-Linked-Size and X-Repo-Commit; the
//     CDN serves byte ranges;
//   - errors as the Hub gives them, with X-Error-Code: RepoNotFound (401 without
//     a token, 404 with one: a private repository is not told apart from a
//     missing one), RevisionNotFound and EntryNotFound (404), GatedRepo (401
//     without a token, 403 for an account not granted access), 401 for an
//     unknown token, and 429 with Retry-After when throttled.
//
// It is not kinder than the Hub: the CDN's URLs are signed and checked, and a
// throttled client is throttled on every host.
package hubfake

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// File is one file of a commit.
type File struct {
	Path string
	Data []byte
	// LFS files are served from the CDN through a redirect, with their sha256.
	LFS bool
}

// Repo is one model repository.
type Repo struct {
	// Name is "org/name".
	Name string
	// Gated repositories serve their metadata and tree to anyone, and their
	// files only to a token Granted access.
	Gated bool
	// Private repositories answer as missing ones to anyone but Granted tokens.
	Private bool
	// Refs maps branch and tag names to commits.
	Refs map[string]string
	// Commits maps a commit id (40 hex) to its files.
	Commits map[string][]File
	// Granted are the tokens that may read a gated or private repository.
	Granted []string
}

// Server is the fake Hub: API on one host, the LFS CDN on another.
type Server struct {
	API *httptest.Server
	CDN *httptest.Server

	// PageSize is how many entries one tree page holds (the Hub: 1000).
	PageSize int

	mu        sync.Mutex
	repos     map[string]*Repo
	tokens    map[string]bool
	throttled int
	retry     time.Duration
	key       []byte
	corrupt   map[string]bool

	// Requests counts every request, CDNBytes the bytes the CDN served.
	Requests, CDNBytes, Throttled atomic.Int64
}

// New starts a fake Hub with no repositories on the loopback address; tokens
// are the valid tokens.
func New(tokens ...string) *Server {
	s, err := NewAt("127.0.0.1", tokens...)
	if err != nil {
		panic(fmt.Sprintf("hubfake: %v", err)) // as httptest.NewServer does
	}
	return s
}

// NewAt starts a fake Hub with both hosts listening on host (an address of
// the host that a real node's pods reach, rather than its loopback).
func NewAt(host string, tokens ...string) (*Server, error) {
	s := &Server{PageSize: 1000, repos: map[string]*Repo{}, tokens: map[string]bool{}, key: []byte(strconv.FormatInt(time.Now().UnixNano(), 10))}
	for _, t := range tokens {
		s.tokens[t] = true
	}
	start := func(h http.HandlerFunc) (*httptest.Server, error) {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		srv := httptest.NewUnstartedServer(h)
		srv.Listener.Close()
		srv.Listener = l
		srv.Start()
		return srv, nil
	}
	var err error
	if s.API, err = start(s.serveAPI); err != nil {
		return nil, err
	}
	if s.CDN, err = start(s.serveCDN); err != nil {
		s.API.Close()
		return nil, err
	}
	return s, nil
}

// Close stops both hosts.
func (s *Server) Close() {
	s.API.Close()
	s.CDN.Close()
}

// Add adds or replaces a repository.
func (s *Server) Add(r *Repo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[r.Name] = r
}

// Move points a ref of a repository at another commit (a push to a branch).
func (s *Server) Move(repo, ref, commit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repos[repo].Refs[ref] = commit
}

// Throttle answers the next n requests (on either host) with 429 and a
// Retry-After of after (whole seconds, as the Hub sends it).
func (s *Server) Throttle(n int, after time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttled, s.retry = n, after
}

// Corrupt makes the hosts serve the content data with one byte changed (a
// CDN's bad copy), while the tree keeps the digests of the true content.
func (s *Server) Corrupt(data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.corrupt == nil {
		s.corrupt = map[string]bool{}
	}
	s.corrupt[sha256Hex(data)] = true
}

// served is what the hosts send for data.
func (s *Server) served(data []byte) []byte {
	s.mu.Lock()
	bad := s.corrupt[sha256Hex(data)]
	s.mu.Unlock()
	if !bad || len(data) == 0 {
		return data
	}
	out := bytes.Clone(data)
	out[len(out)/2] ^= 0xff
	return out
}

// Commit is a commit id for a name, as a test writes its repositories.
func Commit(name string) string {
	sum := sha1.Sum([]byte(name))
	return hex.EncodeToString(sum[:])
}

// GitBlobID is git's id of a file's content.
func GitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func (s *Server) throttle(w http.ResponseWriter) bool {
	s.Requests.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.throttled <= 0 {
		return false
	}
	s.throttled--
	s.Throttled.Add(1)
	w.Header().Set("Retry-After", strconv.Itoa(int(s.retry.Seconds())))
	hubError(w, http.StatusTooManyRequests, "", "You have exceeded our hourly quotas for action: resolve. We invite you to retry later.")
	return true
}

func hubError(w http.ResponseWriter, status int, code, message string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": message})
}

// access finds the repository and the commit a request may see, or answers
// the error the Hub gives. files tells whether the request reads file content
// (which a gated repository refuses without access).
func (s *Server) access(w http.ResponseWriter, r *http.Request, name, rev string, files bool) (*Repo, string, bool) {
	token, hasToken := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if hasToken && !s.tokens[token] {
		hubError(w, http.StatusUnauthorized, "", "Invalid credentials in Authorization header")
		return nil, "", false
	}
	s.mu.Lock()
	repo := s.repos[name]
	s.mu.Unlock()
	granted := repo != nil && contains(repo.Granted, token)
	if repo == nil || repo.Private && !granted {
		status := http.StatusNotFound
		if !hasToken {
			status = http.StatusUnauthorized
		}
		hubError(w, status, "RepoNotFound", "Repository not found")
		return nil, "", false
	}
	if repo.Gated && files && !granted {
		if !hasToken {
			hubError(w, http.StatusUnauthorized, "GatedRepo", fmt.Sprintf("Access to model %s is restricted. You must have access to it and be authenticated to access it. Please log in.", name))
		} else {
			hubError(w, http.StatusForbidden, "GatedRepo", fmt.Sprintf("Access to model %s is restricted and you are not in the authorized list. Visit https://huggingface.co/%s to ask for access.", name, name))
		}
		return nil, "", false
	}
	s.mu.Lock()
	commit, ok := repo.Refs[rev]
	s.mu.Unlock()
	if !ok {
		if _, isCommit := repo.Commits[rev]; isCommit {
			commit, ok = rev, true
		}
	}
	if !ok {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return nil, "", false
	}
	return repo, commit, true
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v && v != "" {
			return true
		}
	}
	return false
}

// splitRepo takes "org/name/rest..." apart.
func splitRepo(p string) (repo, rest string, ok bool) {
	parts := strings.SplitN(p, "/", 3)
	if len(parts) < 3 {
		return "", "", false
	}
	return parts[0] + "/" + parts[1], parts[2], true
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	if s.throttle(w) {
		return
	}
	if p, ok := strings.CutPrefix(r.URL.Path, "/api/models/"); ok {
		repo, rest, ok := splitRepo(p)
		kind, rev, _ := strings.Cut(rest, "/")
		switch {
		case !ok || r.Method != http.MethodGet:
			http.NotFound(w, r)
		case kind == "revision":
			s.serveInfo(w, r, repo, rev)
		case kind == "tree":
			rev, _, _ = strings.Cut(rev, "/")
			s.serveTree(w, r, repo, rev)
		default:
			http.NotFound(w, r)
		}
		return
	}
	repo, rest, ok := splitRepo(strings.TrimPrefix(r.URL.Path, "/"))
	verb, rest, _ := strings.Cut(rest, "/")
	rev, file, _ := strings.Cut(rest, "/")
	if !ok || verb != "resolve" || file == "" || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		http.NotFound(w, r)
		return
	}
	s.serveResolve(w, r, repo, rev, file)
}

func (s *Server) serveInfo(w http.ResponseWriter, r *http.Request, name, rev string) {
	repo, commit, ok := s.access(w, r, name, rev, false)
	if !ok {
		return
	}
	type sibling struct {
		RFilename string `json:"rfilename"`
	}
	var siblings []sibling
	for _, f := range repo.Commits[commit] {
		siblings = append(siblings, sibling{f.Path})
	}
	var gated any = false
	if repo.Gated {
		gated = "manual"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"_id": Commit(name)[:24], "id": name, "modelId": name, "sha": commit, "private": repo.Private,
		"gated": gated, "disabled": false, "siblings": siblings,
	})
}

type treeEntry struct {
	Type string   `json:"type"`
	OID  string   `json:"oid"`
	Size int64    `json:"size"`
	Path string   `json:"path"`
	LFS  *lfsInfo `json:"lfs,omitempty"`
}

type lfsInfo struct {
	OID         string `json:"oid"`
	Size        int64  `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

// serveTree lists the commit's files and folders, folders first on each
// level as the Hub lists them, a page at a time.
func (s *Server) serveTree(w http.ResponseWriter, r *http.Request, name, rev string) {
	repo, commit, ok := s.access(w, r, name, rev, false)
	if !ok {
		return
	}
	var entries []treeEntry
	dirs := map[string]bool{}
	for _, f := range repo.Commits[commit] {
		for d := f.Path; strings.Contains(d, "/"); {
			d = d[:strings.LastIndexByte(d, '/')]
			dirs[d] = true
		}
		e := treeEntry{Type: "file", OID: GitBlobID(f.Data), Size: int64(len(f.Data)), Path: f.Path}
		if f.LFS {
			pointer := lfsPointer(f.Data)
			e.OID, e.Size = GitBlobID(pointer), int64(len(f.Data))
			e.LFS = &lfsInfo{OID: sha256Hex(f.Data), Size: int64(len(f.Data)), PointerSize: len(pointer)}
		}
		entries = append(entries, e)
	}
	if r.URL.Query().Get("recursive") == "true" || r.URL.Query().Get("recursive") == "1" {
		for d := range dirs {
			entries = append(entries, treeEntry{Type: "directory", OID: Commit(d), Path: d})
		}
	} else {
		// Not recursive: the top level only.
		top := entries[:0]
		for _, e := range entries {
			if !strings.Contains(e.Path, "/") {
				top = append(top, e)
			}
		}
		entries = top
		for d := range dirs {
			if !strings.Contains(d, "/") {
				entries = append(entries, treeEntry{Type: "directory", OID: Commit(d), Path: d})
			}
		}
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Type != entries[j].Type {
			return entries[i].Type == "directory"
		}
		return entries[i].Path < entries[j].Path
	})
	start := 0
	if c := r.URL.Query().Get("cursor"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 || n > len(entries) {
			hubError(w, http.StatusBadRequest, "", "Invalid cursor")
			return
		}
		start = n
	}
	end := min(start+s.PageSize, len(entries))
	if end < len(entries) {
		next := *r.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, s.API.URL, next.RequestURI()))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(entries[start:end])
}

// lfsPointer is the pointer file git keeps for an LFS file.
func lfsPointer(data []byte) []byte {
	return fmt.Appendf(nil, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sha256Hex(data), len(data))
}

func (s *Server) serveResolve(w http.ResponseWriter, r *http.Request, name, rev, path string) {
	path, err := url.PathUnescape(path)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	repo, commit, ok := s.access(w, r, name, rev, true)
	if !ok {
		return
	}
	var file *File
	for i, f := range repo.Commits[commit] {
		if f.Path == path {
			file = &repo.Commits[commit][i]
		}
	}
	if file == nil {
		w.Header().Set("X-Repo-Commit", commit)
		hubError(w, http.StatusNotFound, "EntryNotFound", fmt.Sprintf("%s does not exist on %q", path, rev))
		return
	}
	h := w.Header()
	h.Set("X-Repo-Commit", commit)
	if !file.LFS {
		h.Set("ETag", `"`+GitBlobID(file.Data)+`"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(s.served(file.Data)))
		return
	}
	sum := sha256Hex(file.Data)
	h.Set("X-Linked-Etag", `"`+sum+`"`)
	h.Set("X-Linked-Size", strconv.Itoa(len(file.Data)))
	h.Set("ETag", `"`+GitBlobID(lfsPointer(file.Data))+`"`)
	expires := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	h.Set("Location", fmt.Sprintf("%s/%s?Expires=%s&Signature=%s", s.CDN.URL, sum, expires, s.sign(sum, expires)))
	w.WriteHeader(http.StatusFound)
}

func (s *Server) sign(object, expires string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(object + "\n" + expires))
	return hex.EncodeToString(m.Sum(nil))
}

// serveCDN serves LFS content by sha256 to signed, unexpired URLs, with ranges.
func (s *Server) serveCDN(w http.ResponseWriter, r *http.Request) {
	if s.throttle(w) {
		return
	}
	sum := strings.TrimPrefix(r.URL.Path, "/")
	q := r.URL.Query()
	exp, err := strconv.ParseInt(q.Get("Expires"), 10, 64)
	if err != nil || time.Now().Unix() > exp || !hmac.Equal([]byte(q.Get("Signature")), []byte(s.sign(sum, q.Get("Expires")))) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("<Error><Code>AccessDenied</Code><Message>Request has expired or is not signed</Message></Error>"))
		return
	}
	data := s.lfsContent(sum)
	if data == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("ETag", `"`+sum+`"`)
	cw := &countingWriter{ResponseWriter: w, n: &s.CDNBytes}
	http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(s.served(data)))
}

func (s *Server) lfsContent(sum string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, repo := range s.repos {
		for _, files := range repo.Commits {
			for _, f := range files {
				if f.LFS && sha256Hex(f.Data) == sum {
					return f.Data
				}
			}
		}
	}
	return nil
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}
