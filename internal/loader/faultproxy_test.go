package loader

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
	"sync/atomic"
	"time"

	"github.com/aiinference/operator/test/s3test"
)

// fault is what faultProxy does to one ranged GET.
type fault int

const (
	passThrough  fault = iota
	answer503          // 503 SlowDown, as a throttling S3 store answers
	resetConn          // the connection reset before any response
	cutBody            // headers and part of the body, then the connection dropped
	delayHeaders       // the response held back a while, then passed
	stallBody          // part of the body, then nothing until the client gives up
)

// faultProxy is a reverse proxy on loopback between the loader and the S3 server
// that breaks ranged GETs as plan says (the n-th ranged GET, from 1). It keeps the
// Host header, so the loader's signatures stay valid.
type faultProxy struct {
	srv      *httptest.Server
	plan     func(n int) fault
	rate     atomic.Int64 // bytes per second per response, 0 for no limit
	gets     atomic.Int64
	mu       sync.Mutex
	faults   map[fault]int
	stallGap []time.Duration // for each stall: from the last byte sent to the client giving up
	arrivals []time.Time     // when each request, of any kind, arrived
}

func newFaultProxy(target string, plan func(n int) fault) *faultProxy {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	p := &faultProxy{plan: plan, faults: map[fault]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0)
	rp.ModifyResponse = func(resp *http.Response) error {
		f, _ := resp.Request.Context().Value(faultKey{}).(fault)
		ctx := resp.Request.Context()
		switch {
		case f == cutBody && resp.ContentLength > 1:
			resp.Body = &cutReader{r: resp.Body, left: resp.ContentLength / 2}
		case f == stallBody && resp.ContentLength > 1:
			resp.Body = &stallReader{r: resp.Body, left: resp.ContentLength / 3, done: ctx.Done(), record: p.recordStall}
		case p.rate.Load() > 0:
			resp.Body = s3test.LimitRate(resp.Body, p.rate.Load())
		}
		return nil
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.arrivals = append(p.arrivals, time.Now())
		p.mu.Unlock()
		f := passThrough
		if r.Method == http.MethodGet && r.Header.Get("Range") != "" && p.plan != nil {
			f = p.plan(int(p.gets.Add(1)))
		}
		if f != passThrough {
			p.mu.Lock()
			p.faults[f]++
			p.mu.Unlock()
		}
		switch f {
		case answer503:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
			return
		case resetConn:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					tc.SetLinger(0) // RST, not FIN
				}
				conn.Close()
			}
			return
		case delayHeaders:
			time.Sleep(300 * time.Millisecond)
		}
		ctx := r.Context()
		if f == cutBody || f == stallBody {
			ctx = contextWithFault(ctx, f)
		}
		rp.ServeHTTP(w, r.WithContext(ctx))
	}))
	return p
}

func (p *faultProxy) URL() string { return p.srv.URL }
func (p *faultProxy) Close()      { p.srv.CloseClientConnections(); p.srv.Close() }

func (p *faultProxy) count(f fault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[f]
}

// requests returns when each request so far arrived.
func (p *faultProxy) requests() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.arrivals...)
}

func (p *faultProxy) recordStall(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stallGap = append(p.stallGap, d)
}

func (p *faultProxy) stalls() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.stallGap...)
}

// cutReader ends the body with an error after left bytes: the proxy then drops the
// connection in the middle of the response.
type cutReader struct {
	r    io.ReadCloser
	left int64
}

func (c *cutReader) Read(b []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(b)) > c.left {
		b = b[:c.left]
	}
	n, err := c.r.Read(b)
	c.left -= int64(n)
	return n, err
}

func (c *cutReader) Close() error { return c.r.Close() }

// stallReader passes left bytes, then blocks until the client goes away, and
// records how long that took.
type stallReader struct {
	r      io.ReadCloser
	left   int64
	done   <-chan struct{}
	record func(time.Duration)
}

func (s *stallReader) Read(b []byte) (int, error) {
	if s.left <= 0 {
		begin := time.Now()
		<-s.done
		s.record(time.Since(begin))
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(b)) > s.left {
		b = b[:s.left]
	}
	n, err := s.r.Read(b)
	s.left -= int64(n)
	return n, err
}

func (s *stallReader) Close() error { return s.r.Close() }

type faultKey struct{}

func contextWithFault(ctx context.Context, f fault) context.Context {
	return context.WithValue(ctx, faultKey{}, f)
}
