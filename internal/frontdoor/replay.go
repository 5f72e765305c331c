package frontdoor

import (
	"io"
	"net/http"
	"sync"
)

// Replay is a kept request body as it is sent to a replica. It holds the
// only reference to the body's bytes once the replica's answer begins (the
// transport keeps the request until the answer ends, the proxy its Rewrite):
// Forget drops them, so that their memory goes with their share of the
// bounds, not at the end of a long answer.
type Replay struct {
	mu   sync.Mutex
	data []byte
	size int64
}

// NewReplay sends data.
func NewReplay(data []byte) *Replay { return &Replay{data: data, size: int64(len(data))} }

// Body is what a request to the replica carries, and its length.
func (b *Replay) Body() (io.ReadCloser, int64) {
	if b.size == 0 {
		return http.NoBody, 0
	}
	return b, b.size
}

func (b *Replay) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.data) == 0 {
		b.data = nil
		return 0, io.EOF
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

// Close is the transport's: the body is sent, or never will be.
func (b *Replay) Close() error {
	b.Forget()
	return nil
}

// Forget drops what is left of the body; a replica that answered before it
// read it all gets no more.
func (b *Replay) Forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.data = nil
}
