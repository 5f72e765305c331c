package s3test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"time"
)

// Link is a reverse proxy on loopback in front of a server that gives every
// response the network path of a remote object store: a first-byte latency, then
// at most a given rate per response (a store's per-connection throughput, tens of
// MB/s for S3, is why loaders open many connections). It keeps the Host header,
// so request signatures stay valid.
type Link struct {
	srv *httptest.Server
}

// NewLink starts a Link to target.
func NewLink(target string, latency time.Duration, bytesPerSecond int64) (*Link, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	rp.ModifyResponse = func(resp *http.Response) error {
		if bytesPerSecond > 0 {
			resp.Body = LimitRate(resp.Body, bytesPerSecond)
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(latency)
		rp.ServeHTTP(w, r)
	}))
	return &Link{srv: srv}, nil
}

// URL is the endpoint to give clients instead of the server's.
func (l *Link) URL() string { return l.srv.URL }

// Close ends the proxy and its connections.
func (l *Link) Close() { l.srv.CloseClientConnections(); l.srv.Close() }

// LimitRate passes a body at most bytesPerSecond.
func LimitRate(body io.ReadCloser, bytesPerSecond int64) io.ReadCloser {
	return &rateLimited{r: body, rate: bytesPerSecond}
}

type rateLimited struct {
	r    io.ReadCloser
	rate int64
}

// Read passes at most a fiftieth of a second's worth, then sleeps as long as that
// many bytes take at the rate.
func (s *rateLimited) Read(b []byte) (int, error) {
	if chunk := max(s.rate/50, 1); int64(len(b)) > chunk {
		b = b[:chunk]
	}
	n, err := s.r.Read(b)
	time.Sleep(time.Duration(int64(n) * int64(time.Second) / s.rate))
	return n, err
}

func (s *rateLimited) Close() error { return s.r.Close() }
