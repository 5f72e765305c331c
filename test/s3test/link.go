package s3test

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// LinkShape is the network path between a client and a remote object store, as a
// Link gives it. A zero field leaves that side unshaped.
type LinkShape struct {
	// Latency is each response's time to first byte: the store's request latency
	// (tens of milliseconds for S3) plus the round trip.
	Latency time.Duration
	// PerConnection caps each response stream, in bytes per second: a store serves
	// one connection some tens of MB/s (50-100 MB/s for S3), which is why loaders
	// open many.
	PerConnection float64
	// Aggregate caps all responses together, in bytes per second: the node's
	// network card, shared by every connection.
	Aggregate float64
}

// Link is a reverse proxy on loopback in front of a server that gives every
// response the network path of a remote object store (see LinkShape). It keeps
// the Host header, so request signatures stay valid.
type Link struct {
	srv *httptest.Server
}

// linkChunk is the most a shaped body passes in one read, and so the unit in
// which the link delivers bytes: 64 KiB, the most a network card's receive
// offload (GRO) hands the kernel at once. Smaller units would cost the clients
// more wakeups per byte than a real network does, and the link more waits.
const linkChunk = 64 << 10

// NewLink starts a Link to target with the given shape.
func NewLink(target string, shape LinkShape) (*Link, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	// Connections to the server are kept for reuse, as many as clients open
	// (the default keeps 2, and would dial anew for nearly every request).
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
		WriteBufferSize:     64 << 10,
	}
	rp.BufferPool = &chunkPool{}
	aggregate := newLimiter(shape.Aggregate)
	rp.ModifyResponse = func(resp *http.Response) error {
		if shape.PerConnection > 0 || aggregate != nil {
			resp.Body = &shapedBody{r: resp.Body, ctx: resp.Request.Context(),
				stream: newLimiter(shape.PerConnection), shared: aggregate}
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(shape.Latency):
		case <-r.Context().Done():
			return
		}
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
	return &shapedBody{r: body, ctx: context.Background(), stream: newLimiter(float64(bytesPerSecond))}
}

// newLimiter is a token bucket of bytesPerSecond (nil for none) holding at most
// 10 ms of bytes, and never less than one read: the cap holds over any stretch
// longer than that, and a waiter woken a little late loses no bytes.
func newLimiter(bytesPerSecond float64) *rate.Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(bytesPerSecond), max(linkChunk, int(bytesPerSecond/100)))
}

// shapedBody passes a response body through its own stream's limiter and the
// limiter all streams share, at most linkChunk bytes per read.
type shapedBody struct {
	r              io.ReadCloser
	ctx            context.Context
	stream, shared *rate.Limiter // either may be nil
}

func (s *shapedBody) Read(b []byte) (int, error) {
	if len(b) > linkChunk {
		b = b[:linkChunk]
	}
	n, err := s.r.Read(b)
	if n == 0 {
		return n, err
	}
	// Both limiters are asked at once, and the read waits for the later of the
	// two: one timer, not two in turn.
	now := time.Now()
	var delay time.Duration
	for _, l := range []*rate.Limiter{s.stream, s.shared} {
		if l != nil {
			delay = max(delay, l.ReserveN(now, n).DelayFrom(now))
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return 0, s.ctx.Err()
		}
	}
	return n, err
}

func (s *shapedBody) Close() error { return s.r.Close() }

// chunkPool gives the proxy copy buffers of linkChunk bytes (its own are 32 KiB,
// allocated per response).
type chunkPool struct{ p sync.Pool }

func (c *chunkPool) Get() []byte {
	if b, ok := c.p.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, linkChunk)
}

func (c *chunkPool) Put(b []byte) { c.p.Put(&b) }
