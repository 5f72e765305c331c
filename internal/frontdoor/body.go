package frontdoor

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

// Body is a request body the router keeps until a replica began its
// answer (until then the request may go to another replica), counted against
// the router's bounds of bodies and their bytes for its model and namespace.
type Body struct {
	// Data is the body; nil once released.
	Data  []byte
	bytes Holding
	count Holding
}

// Release forgets the body and gives its share of the bounds back.
func (b *Body) Release() {
	b.Data = nil
	b.bytes.Release()
	b.count.Release()
}

// ToModel counts the body against the model its request names, once read.
func (b *Body) ToModel(model string) string {
	if refusal := b.count.ToModel(model); refusal != "" {
		return refusal
	}
	return b.bytes.ToModel(model)
}

// BodyLimits bound the bodies a front door reads.
type BodyLimits struct {
	// MaxBytes bounds one body.
	MaxBytes int64
	// ReadTimeout bounds the reading of one.
	ReadTimeout time.Duration
	// Bytes bounds the bytes of the bodies held at once, Count the bodies.
	Bytes, Count *Quota
}

// ReadBody reads the request's body within the bounds of key (a model, or a
// namespace whose address the request came to) and the read timeout. The
// bytes are counted as they arrive, in what is allocated for them, not as
// the request declares them: a client that declares 8 MiB and trickles a few
// bytes holds a few KiB. A non-zero status is the answer when the body cannot
// be taken.
func ReadBody(w http.ResponseWriter, r *http.Request, key types.NamespacedName, limits BodyLimits) (body *Body, status int, message string) {
	body = &Body{bytes: limits.Bytes.Hold(key), count: limits.Count.Hold(key)}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return body, 0, ""
	}
	limit := limits.MaxBytes
	if r.ContentLength > limit {
		return body, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is %d bytes, over the router's %d", r.ContentLength, limit)
	}
	if refusal := body.count.Grow(1); refusal != "" {
		return body, http.StatusTooManyRequests, refusal + "; try again"
	}
	// What is not read is not worth waiting for: after a refusal the
	// connection closes rather than reading on (the deadline stays passed).
	fail := func(status int, message string) (*Body, int, string) {
		w.Header().Set("Connection", "close")
		body.Release()
		return body, status, message
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(limits.ReadTimeout))
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
			if refusal := body.bytes.Grow(grown - int64(cap(data))); refusal != "" {
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
			return fail(http.StatusRequestTimeout, fmt.Sprintf("reading the request body within %s: %v", limits.ReadTimeout, err))
		}
	}
	_ = rc.SetReadDeadline(time.Time{})
	body.Data = data
	return body, 0, ""
}
