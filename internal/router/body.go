package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// bodyBudget bounds the request bodies held in memory at once, across all
// models, in count and bytes. A request reserves its share before its body is
// read (its Content-Length, or the largest body when it sends none) and gives
// it back when it ends: a flood of large or slow bodies is refused, not read.
type bodyBudget struct {
	maxBytes, maxCount int64

	mu           sync.Mutex
	bytes, count int64
}

func (b *bodyBudget) reserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.count+1 > b.maxCount || b.bytes+n > b.maxBytes {
		return false
	}
	b.count++
	b.bytes += n
	return true
}

func (b *bodyBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.count--
	b.bytes -= n
}

// readBody reads the request's body within the budget and the read timeout.
// release gives the reservation back; a non-zero status is the answer when
// the body cannot be taken.
func (rt *Router) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), status int, message string) {
	nothing := func() {}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nothing, 0, ""
	}
	limit := rt.opts.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, nothing, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is %d bytes, over the router's %d", r.ContentLength, limit)
	}
	reserved := limit
	if r.ContentLength > 0 {
		reserved = r.ContentLength
	}
	if !rt.bodies.reserve(reserved) {
		return nil, nothing, http.StatusTooManyRequests, "the router holds as many request bodies as it may; try again"
	}
	release = func() { rt.bodies.release(reserved) }
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(rt.opts.BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, reserved))
	if err != nil {
		// The rest of the body is not worth waiting for: close the connection
		// after the answer rather than read on (the deadline stays passed).
		w.Header().Set("Connection", "close")
		release()
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, nothing, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over the router's %d bytes", reserved)
		}
		return nil, nothing, http.StatusRequestTimeout, fmt.Sprintf("reading the request body within %s: %v", rt.opts.BodyReadTimeout, err)
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, release, 0, ""
}
