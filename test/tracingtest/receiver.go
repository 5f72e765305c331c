// Package tracingtest is an OTLP/HTTP trace receiver for tests: it decodes each
// request with the OpenTelemetry collector's own generated ExportTraceServiceRequest,
// so a test checks the operator's encoding against the protocol's types.
package tracingtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver keeps the requests it accepted.
type Receiver struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	posts    int
	refuse   []int
}

// Start serves a Receiver until the test ends and returns it and its host:port.
func Start(t *testing.T) (*Receiver, string) {
	t.Helper()
	r := &Receiver{}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, strings.TrimPrefix(srv.URL, "http://")
}

// Refuse answers the next posts with these status codes, one each, before accepting.
func (r *Receiver) Refuse(codes ...int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse = append(r.refuse, codes...)
}

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusBadRequest)
		return
	}
	if len(r.refuse) > 0 {
		code := r.refuse[0]
		r.refuse = r.refuse[1:]
		http.Error(w, "refused by the test", code)
		return
	}
	body, err := io.ReadAll(req.Body)
	msg := &coltracepb.ExportTraceServiceRequest{}
	if err == nil {
		err = proto.Unmarshal(body, msg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.requests = append(r.requests, msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Requests are the accepted requests, decoded.
func (r *Receiver) Requests() []*coltracepb.ExportTraceServiceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*coltracepb.ExportTraceServiceRequest(nil), r.requests...)
}

// Posts counts every request, refused ones included.
func (r *Receiver) Posts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.posts
}

// Spans are every accepted span.
func (r *Receiver) Spans() []*tracepb.Span {
	var spans []*tracepb.Span
	for _, req := range r.Requests() {
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
	}
	return spans
}
