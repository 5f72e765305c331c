package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// bodyChunk is the first allocation of a body, and the least it grows by.
const bodyChunk = 64 << 10

// heldBody is a request body the router keeps until a replica began its
// answer (until then the request may go to another replica), counted against
// the router's bounds of bodies and their bytes for its model and namespace.
type heldBody struct {
	data  []byte
	bytes holding
	count holding
}

// release forgets the body and gives its share of the bounds back.
func (b *heldBody) release() {
	b.data = nil
	b.bytes.release()
	b.count.release()
}

// toModel counts the body against the model its request names, once read.
func (b *heldBody) toModel(model string) string {
	if refusal := b.count.toModel(model); refusal != "" {
		return refusal
	}
	return b.bytes.toModel(model)
}

// readBody reads the request's body within the bounds of key (a model, or a
// namespace whose address the request came to) and the read timeout. The
// bytes are counted as they arrive, in what is allocated for them, not as
// the request declares them: a client that declares 8 MiB and trickles a few
// bytes holds a few KiB. A non-zero status is the answer when the body cannot
// be taken.
func (rt *Router) readBody(w http.ResponseWriter, r *http.Request, key types.NamespacedName) (body *heldBody, status int, message string) {
	body = &heldBody{bytes: holding{q: rt.bodyBytes, key: key}, count: holding{q: rt.bodies, key: key}}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return body, 0, ""
	}
	limit := rt.opts.MaxBodyBytes
	if r.ContentLength > limit {
		return body, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is %d bytes, over the router's %d", r.ContentLength, limit)
	}
	if refusal := body.count.grow(1); refusal != "" {
		return body, http.StatusTooManyRequests, refusal + "; try again"
	}
	// What is not read is not worth waiting for: after a refusal the
	// connection closes rather than reading on (the deadline stays passed).
	fail := func(status int, message string) (*heldBody, int, string) {
		w.Header().Set("Connection", "close")
		body.release()
		return body, status, message
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(rt.opts.BodyReadTimeout))
	var data []byte
	for {
		if len(data) == cap(data) {
			if r.ContentLength > 0 && int64(len(data)) == r.ContentLength {
				break // all of it: the server's reader allows no more
			}
			// One byte past the limit tells a body that is over it.
			grown := min(max(2*int64(cap(data)), bodyChunk), limit+1)
			if r.ContentLength > 0 {
				grown = min(grown, r.ContentLength)
			}
			if refusal := body.bytes.grow(grown - int64(cap(data))); refusal != "" {
				return fail(http.StatusTooManyRequests, refusal+"; try again")
			}
			next := make([]byte, len(data), grown)
			copy(next, data)
			data = next
		}
		n, err := r.Body.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if int64(len(data)) > limit {
			return fail(http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over the router's %d bytes", limit))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(http.StatusRequestTimeout, fmt.Sprintf("reading the request body within %s: %v", rt.opts.BodyReadTimeout, err))
		}
	}
	_ = rc.SetReadDeadline(time.Time{})
	body.data = data
	return body, 0, ""
}
