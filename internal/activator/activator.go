// Package activator holds the requests for a model that runs no replica, while
// the autoscaler starts one, as Knative's activator and KubeAI's proxy do. The
// operator points the model's Service at it (an EndpointSlice of its own beside
// the Service's) while the model is at zero and until a replica serves. A
// request is held in a bounded queue per model; past the bound it is refused
// at once (429), past the timeout it is answered 503, both with Retry-After.
// A streaming request (`"stream": true`) gets its response headers at once and
// an SSE comment every so often while it waits, so that proxies and clients do
// not time it out. When the operator stops, held requests are answered 503 at
// once: none hangs.
package activator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

// Resolver finds the model a request is for and where it is served.
type Resolver interface {
	// Route names the AIInference that the Host of a request (its Service's
	// name or ClusterIP, with or without the port) is for.
	Route(ctx context.Context, host string) (types.NamespacedName, bool)
	// Backend is host:port of a serving replica of the model; "" while none serves.
	Backend(ctx context.Context, key types.NamespacedName) (string, error)
}

// Options bound the activator.
type Options struct {
	// MaxHeld is how many requests per model may wait; more are refused (429).
	MaxHeld int
	// Timeout is how long a request waits for a replica before it is answered 503.
	Timeout time.Duration
	// Keepalive is how often a waiting streaming request gets an SSE comment.
	Keepalive time.Duration
	// Poll is how often a waiting request looks for a serving replica.
	Poll time.Duration
	// MaxBody bounds the request body the activator reads and keeps to replay.
	MaxBody int64
	// Metrics records the held requests; nil: none.
	Metrics *Metrics
}

// Defaults.
const (
	DefaultMaxHeld   = 100
	DefaultTimeout   = 5 * time.Minute
	DefaultKeepalive = 15 * time.Second
	DefaultPoll      = 100 * time.Millisecond
	DefaultMaxBody   = 8 << 20
)

func (o Options) withDefaults() Options {
	if o.MaxHeld <= 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Keepalive <= 0 {
		o.Keepalive = DefaultKeepalive
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	return o
}

// Activator is an http.Handler that holds requests for models at zero.
type Activator struct {
	opts     Options
	resolver Resolver
	// wake asks for a reconcile of the model at once: a request is waiting.
	wake func(types.NamespacedName)
	log  logr.Logger

	mu   sync.Mutex
	held map[types.NamespacedName]int
	// stopping is closed when the operator stops: held requests are answered.
	stopping chan struct{}
	stopOnce sync.Once
}

// New makes an activator; wake is called with the model of each request it holds.
func New(opts Options, resolver Resolver, wake func(types.NamespacedName), log logr.Logger) *Activator {
	return &Activator{opts: opts.withDefaults(), resolver: resolver, wake: wake, log: log,
		held: map[types.NamespacedName]int{}, stopping: make(chan struct{})}
}

// Held is how many requests for the model wait now.
func (a *Activator) Held(key types.NamespacedName) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[key]
}

// Stop answers every held request (503, Retry-After) and refuses new ones.
func (a *Activator) Stop() { a.stopOnce.Do(func() { close(a.stopping) }) }

// ServeHTTP holds the request until a replica of its model serves, then
// passes it on.
func (a *Activator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, ok := a.resolver.Route(r.Context(), r.Host)
	if !ok {
		http.Error(w, fmt.Sprintf("the activator knows no AIInference behind host %q", r.Host), http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, a.opts.MaxBody+1))
	if err != nil {
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if int64(len(body)) > a.opts.MaxBody {
		http.Error(w, fmt.Sprintf("the request body is over %d bytes, more than the activator holds", a.opts.MaxBody), http.StatusRequestEntityTooLarge)
		return
	}
	if !a.hold(key) {
		a.opts.Metrics.ended(resultFull, 0)
		refuse(w, http.StatusTooManyRequests, 5, fmt.Sprintf("%d requests for %s already wait for a replica to start; try again", a.opts.MaxHeld, key))
		return
	}
	defer a.release(key)
	a.wake(key)
	if streaming(body) {
		a.serveStream(w, r, key, body)
		return
	}
	backend, status, why := a.waitForBackend(r.Context(), key, nil)
	if backend == "" {
		refuse(w, status, 10, why)
		return
	}
	proxy(w, r, backend, body)
}

// resultOf names how a wait ended, for the metrics.
func resultOf(status int) string {
	switch status {
	case 0:
		return resultServed
	case 499:
		return resultGone
	}
	return resultTimedOut
}

func (a *Activator) hold(key types.NamespacedName) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held[key] >= a.opts.MaxHeld {
		return false
	}
	a.held[key]++
	a.opts.Metrics.setHeld(key, a.held[key])
	return true
}

func (a *Activator) release(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held[key]--; a.held[key] <= 0 {
		delete(a.held, key)
	}
	a.opts.Metrics.setHeld(key, a.held[key])
}

// waitForBackend waits for a serving replica; "" with the status and reason
// to answer when none came. tick, when not nil, is called at each keepalive.
func (a *Activator) waitForBackend(ctx context.Context, key types.NamespacedName, tick func()) (backend string, status int, why string) {
	begin := time.Now()
	defer func() {
		result := resultOf(status)
		if status == http.StatusServiceUnavailable && why == stoppingMessage {
			result = resultStopping
		}
		a.opts.Metrics.ended(result, time.Since(begin).Seconds())
	}()
	deadline := time.NewTimer(a.opts.Timeout)
	defer deadline.Stop()
	poll := time.NewTicker(a.opts.Poll)
	defer poll.Stop()
	keepalive := time.NewTicker(a.opts.Keepalive)
	defer keepalive.Stop()
	for {
		backend, err := a.resolver.Backend(ctx, key)
		if err != nil {
			a.log.V(1).Info("Looking for a serving replica", "aiinference", key, "error", err.Error())
		}
		if backend != "" {
			return backend, 0, ""
		}
		select {
		case <-ctx.Done():
			return "", 499, "the client went away"
		case <-a.stopping:
			return "", http.StatusServiceUnavailable, stoppingMessage
		case <-deadline.C:
			return "", http.StatusServiceUnavailable, fmt.Sprintf("no replica of %s served within %s; send the request again", key, a.opts.Timeout)
		case <-keepalive.C:
			if tick != nil {
				tick()
			}
		case <-poll.C:
		}
	}
}

const stoppingMessage = "the operator is stopping; send the request again"

// refuse answers with status and a Retry-After.
func refuse(w http.ResponseWriter, status, retryAfter int, message string) {
	if status == 499 {
		return // nobody to answer
	}
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	http.Error(w, message, status)
}

// streaming tells an OpenAI request that asks for a stream of events.
func streaming(body []byte) bool {
	var req struct {
		Stream bool `json:"stream"`
	}
	return json.Unmarshal(body, &req) == nil && req.Stream
}

// proxy passes the request on to backend, with the body read before.
func proxy(w http.ResponseWriter, r *http.Request, backend string, body []byte) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", backend
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			pr.Out.ContentLength = int64(len(body))
			pr.SetXForwarded()
		},
		FlushInterval: -1, // streamed answers go out as they come
	}
	rp.ServeHTTP(w, r)
}

// serveStream answers a streaming request: the headers at once, an SSE comment
// at each keepalive while no replica serves, then the replica's events, or an
// error event when none came.
func (a *Activator) serveStream(w http.ResponseWriter, r *http.Request, key types.NamespacedName, body []byte) {
	flusher, _ := w.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, ": waiting for a replica of the model to start\n\n")
	flush()
	backend, status, why := a.waitForBackend(r.Context(), key, func() {
		_, _ = io.WriteString(w, ": still waiting for a replica\n\n")
		flush()
	})
	if backend == "" {
		if status != 499 {
			writeErrorEvent(w, status, why)
			flush()
		}
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+backend+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		writeErrorEvent(w, http.StatusBadGateway, err.Error())
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		writeErrorEvent(w, http.StatusBadGateway, "the replica did not answer: "+err.Error())
		flush()
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		writeErrorEvent(w, resp.StatusCode, string(msg))
		flush()
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			flush()
		}
		if err != nil {
			return
		}
	}
}

func writeErrorEvent(w io.Writer, status int, message string) {
	data, _ := json.Marshal(map[string]any{"error": map[string]any{"code": status, "message": message}})
	_, _ = fmt.Fprintf(w, "data: %s\n\n", data)
}

// Serve serves the activator on addr until ctx ends; then it answers what it
// holds and stops.
func (a *Activator) Serve(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("activator: %w", err)
	}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		a.Stop()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
