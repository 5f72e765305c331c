// Package activator holds the requests for a model that runs no replica, while
// the autoscaler starts one, as Knative's activator and KubeAI's proxy do. The
// operator points the model's Service at it (an EndpointSlice of its own beside
// the Service's, to a port the activator opens for that model alone) while the
// model is at zero and until a replica serves. A request is taken only from a
// client the model's network policy lets reach its pods, checked before its
// body is read and again when a replica comes: a client the policy refuses by
// then is answered 403 (an error event in a stream) and the replica never
// sees its request.
//
// What requests hold is bounded as the router bounds it (internal/frontdoor):
// the requests in the activator, the bodies being read or kept and their
// bytes, each in all (MaxHeldTotal, MaxHeldBytes), per namespace
// (NamespaceShare of it) and per model (ModelShare of it), so that one tenant
// that floods, trickles its bodies or waits on a slow start fills its own
// share, not the others'. A body's bytes are counted as they arrive, not as
// its Content-Length declares them, and given back once the replica's answer
// begins; each model's queue is bounded too (MaxHeld). Past a bound a request
// is refused at once (429), past the timeout it is answered 503, both with
// Retry-After. A streaming request (`"stream": true`) gets its response
// headers at once and an SSE comment every so often while it waits, so that
// proxies and clients do not time it out. When the operator stops, held
// requests are answered 503 at once: none hangs.
package activator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aiinference/operator/internal/frontdoor"
)

// Resolver tells the activator about the models and where they are served.
type Resolver interface {
	// Admit tells whether a request for the model from the client at ip may be
	// held and passed on: the model may go to zero and its network policy lets
	// the client reach its pods directly (the activator passes requests on from
	// the operator's address, which every model's policy lets in). When it may
	// not, why is said to the client.
	Admit(ctx context.Context, key types.NamespacedName, ip net.IP) (ok bool, why string, err error)
	// Readmit tells whether a request held for the model may still be passed
	// on, once a replica serves: the model's network policy lets the client
	// reach its pods now. The model need no longer go to zero (a replica
	// serves it); its policy may have changed while the request waited.
	Readmit(ctx context.Context, key types.NamespacedName, ip net.IP) (ok bool, why string, err error)
	// Backend is host:port of a serving replica of the model; "" while none serves.
	Backend(ctx context.Context, key types.NamespacedName) (string, error)
}

// Options bound the activator.
type Options struct {
	// BindAddress is host:port: each model at zero is served on a port of its
	// own, the first free one from this port up (at most PortSpan of them; port
	// 0: one the kernel picks), so that the port a request arrives on names its
	// model: the Host header a client writes names nothing.
	BindAddress string
	// MaxHeld is how many requests per model may wait; more are refused (429).
	MaxHeld int
	// MaxHeldTotal is how many requests of all models may be in the activator
	// at once, from their headers to the end of their answer (being checked,
	// read, held or passed on); more are refused (429).
	MaxHeldTotal int
	// MaxHeldBytes bounds the bytes of the request bodies of all models read
	// or kept at once, counted as they arrive, not as declared: a body that
	// no longer fits is cut (429), and a client that declares 8 MiB and
	// trickles holds what it sent.
	MaxHeldBytes int64
	// NamespaceShare and ModelShare are how much of MaxHeldTotal and of
	// MaxHeldBytes (and of the bodies being read, bounded by MaxHeldTotal
	// too) one namespace's models, and one model, may hold: a tenant that
	// floods, trickles or waits long fills its own share, not the others'.
	// 0.5 and 0.25 by default, as the router's.
	NamespaceShare, ModelShare float64
	// Timeout is how long a request waits for a replica before it is answered 503.
	Timeout time.Duration
	// BodyTimeout is how long a client may take to send its request's body; a
	// body trickled slower is cut (408).
	BodyTimeout time.Duration
	// Keepalive is how often a waiting streaming request gets an SSE comment.
	Keepalive time.Duration
	// Poll is how often a waiting request looks for a serving replica.
	Poll time.Duration
	// MaxBody bounds the request body the activator reads and keeps to replay;
	// at most a model's share of MaxHeldBytes.
	MaxBody int64
	// Metrics records the held requests; nil: none.
	Metrics *Metrics
}

// Defaults.
const (
	DefaultMaxHeld      = 100
	DefaultMaxHeldTotal = 1000
	DefaultMaxHeldBytes = 64 << 20
	DefaultTimeout      = 5 * time.Minute
	DefaultBodyTimeout  = 30 * time.Second
	DefaultKeepalive    = 15 * time.Second
	DefaultPoll         = 100 * time.Millisecond
	DefaultMaxBody      = 8 << 20
	// DefaultNamespaceShare and DefaultModelShare are the router's.
	DefaultNamespaceShare = 0.5
	DefaultModelShare     = 0.25
	// PortSpan is how many ports from BindAddress's the models at zero may take.
	PortSpan = 1000
)

func (o Options) withDefaults() Options {
	if o.MaxHeld <= 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.MaxHeldTotal <= 0 {
		o.MaxHeldTotal = DefaultMaxHeldTotal
	}
	if o.MaxHeldBytes <= 0 {
		o.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
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
	if o.NamespaceShare <= 0 || o.NamespaceShare > 1 {
		o.NamespaceShare = DefaultNamespaceShare
	}
	if o.ModelShare <= 0 || o.ModelShare > 1 {
		o.ModelShare = DefaultModelShare
	}
	// A body must fit in its model's share of the bytes, with the byte past
	// MaxBody that a body of no declared length is read to, to tell it is over.
	if share := int64(float64(o.MaxHeldBytes) * o.ModelShare); o.MaxBody >= share {
		o.MaxBody = max(1, share-1)
	}
	return o
}

// Activator holds requests for models at zero, each model on a port of its own.
type Activator struct {
	opts     Options
	resolver Resolver
	// wake asks for a reconcile of the model at once: a request is waiting.
	wake func(types.NamespacedName)
	log  logr.Logger

	// requests, bodies and bodyBytes bound what the requests hold, in all,
	// per namespace and per model: the requests in the activator, and the
	// bodies being read or kept and their bytes.
	requests, bodies, bodyBytes *frontdoor.Quota

	mu   sync.Mutex
	held map[types.NamespacedName]int
	// models are the ports open for the models at zero.
	models map[types.NamespacedName]*modelPort
	// stopping is closed when the operator stops: held requests are answered.
	stopping chan struct{}
	stopOnce sync.Once
}

// modelPort is the port a model at zero is served on.
type modelPort struct {
	port     int32
	listener net.Listener
	server   *http.Server
}

// New makes an activator; wake is called with the model of each request it holds.
func New(opts Options, resolver Resolver, wake func(types.NamespacedName), log logr.Logger) *Activator {
	opts = opts.withDefaults()
	total := int64(opts.MaxHeldTotal)
	return &Activator{opts: opts, resolver: resolver, wake: wake, log: log,
		requests:  frontdoor.NewQuota("requests", total, opts.NamespaceShare, opts.ModelShare),
		bodies:    frontdoor.NewQuota("request bodies", total, opts.NamespaceShare, opts.ModelShare),
		bodyBytes: frontdoor.NewQuota("bytes of request bodies", opts.MaxHeldBytes, opts.NamespaceShare, opts.ModelShare),
		held:      map[types.NamespacedName]int{}, models: map[types.NamespacedName]*modelPort{}, stopping: make(chan struct{})}
}

// Held is how many requests for the model wait now, or are being passed on
// to the replica that came.
func (a *Activator) Held(key types.NamespacedName) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[key]
}

// Open serves the model on a port of its own, from now until Close, and says
// which: the model's Service leads there while the model is at zero.
func (a *Activator) Open(key types.NamespacedName) (int32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.models[key]; ok {
		return m.port, nil
	}
	select {
	case <-a.stopping:
		return 0, errors.New("the activator is stopping")
	default:
	}
	host, portText, err := net.SplitHostPort(a.opts.BindAddress)
	if err != nil {
		return 0, fmt.Errorf("activator bind address %q: %w", a.opts.BindAddress, err)
	}
	first, err := strconv.Atoi(portText)
	if err != nil {
		return 0, fmt.Errorf("activator bind address %q: %w", a.opts.BindAddress, err)
	}
	taken := map[int32]bool{}
	for _, m := range a.models {
		taken[m.port] = true
	}
	last := first + PortSpan - 1
	if first == 0 {
		last = 0 // port 0: one the kernel picks, for each model
	}
	for port := int32(first); port <= int32(min(last, 65535)); port++ {
		if taken[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err != nil {
			continue // in use by another process: the next
		}
		port = int32(l.Addr().(*net.TCPAddr).Port)
		m := &modelPort{port: port, listener: l, server: &http.Server{
			Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.serve(w, r, key) }),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
		}}
		a.models[key] = m
		go func() { _ = m.server.Serve(l) }()
		return port, nil
	}
	return 0, fmt.Errorf("no port free for the activator from %d to %d", first, last)
}

// Close stops serving the model's port: a replica serves it, or it no longer
// goes to zero. The requests held go on to the replica; no new one is taken.
func (a *Activator) Close(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.models[key]; ok {
		delete(a.models, key)
		m.server.SetKeepAlivesEnabled(false) // idle connections close
		_ = m.listener.Close()
	}
}

// isOpen tells whether the model's port is open: the model needs holding.
func (a *Activator) isOpen(key types.NamespacedName) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.models[key]
	return ok
}

// Stop answers every held request (503, Retry-After) and refuses new ones.
func (a *Activator) Stop() { a.stopOnce.Do(func() { close(a.stopping) }) }

// serve holds a request that came on the model's port until a replica of the
// model serves, then passes it on. The client is checked against the model's
// policy before its body is read, and again before the request is passed on.
func (a *Activator) serve(w http.ResponseWriter, r *http.Request, key types.NamespacedName) {
	if !a.isOpen(key) {
		refuse(w, http.StatusServiceUnavailable, 1, fmt.Sprintf("%s no longer waits for a replica; send the request again", key))
		return
	}
	// The request counts from now: the checks and the body's read are
	// bounded as the wait is.
	inActivator := a.requests.Hold(key)
	if refusal := inActivator.Grow(1); refusal != "" {
		a.opts.Metrics.ended(resultFull, 0)
		refuse(w, http.StatusTooManyRequests, 5, asActivator(refusal)+"; try again")
		return
	}
	defer inActivator.Release()
	if ok, why := a.admit(r, key, a.resolver.Admit); !ok {
		http.Error(w, why, http.StatusForbidden)
		return
	}
	body, status, msg := frontdoor.ReadBody(w, r, key, frontdoor.BodyLimits{
		MaxBytes: a.opts.MaxBody, ReadTimeout: a.opts.BodyTimeout, Bytes: a.bodyBytes, Count: a.bodies})
	defer body.Release()
	switch status {
	case 0:
	case http.StatusTooManyRequests:
		a.opts.Metrics.ended(resultFull, 0)
		refuse(w, status, 5, asActivator(msg))
		return
	default:
		http.Error(w, asActivator(msg), status)
		return
	}
	if !a.hold(key) {
		a.opts.Metrics.ended(resultFull, 0)
		refuse(w, http.StatusTooManyRequests, 5, fmt.Sprintf("%d requests for %s already wait for a replica to start; try again", a.opts.MaxHeld, key))
		return
	}
	defer a.release(key)
	a.wake(key)
	if streaming(body.Data) {
		a.serveStream(w, r, key, body)
		return
	}
	backend, status, why := a.waitForBackend(r, key, nil)
	switch {
	case backend != "":
		proxy(w, r, backend, body)
	case status == http.StatusForbidden:
		http.Error(w, why, status)
	default:
		refuse(w, status, 10, why)
	}
}

// asActivator words a message of internal/frontdoor, which names the router,
// as the activator's: the client talks to the activator. (Namespace and model
// names hold no space, so "the router" names the front door only.)
func asActivator(message string) string {
	return strings.ReplaceAll(message, "the router", "the activator")
}

// admit asks the resolver (check: its Admit or Readmit) whether the client
// may reach the model; an error while finding out refuses it (the policy may
// not be known to let it in).
func (a *Activator) admit(r *http.Request, key types.NamespacedName,
	check func(context.Context, types.NamespacedName, net.IP) (bool, string, error)) (bool, string) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return false, fmt.Sprintf("the client's address %q is not an IP address", r.RemoteAddr)
	}
	ok, why, err := check(r.Context(), key, ip)
	if err != nil {
		a.log.Info("Refusing a request: its client could not be checked against the model's network policy", "aiinference", key, "client", ip.String(), "error", err.Error())
		return false, fmt.Sprintf("the activator could not check %s against the network policy of %s; try again", ip, key)
	}
	return ok, why
}

// resultOf names how a wait ended, for the metrics.
func resultOf(status int) string {
	switch status {
	case 0:
		return resultServed
	case 499:
		return resultGone
	case http.StatusForbidden:
		return resultRefused
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

// waitForBackend waits for a serving replica, and checks the client against
// the model's policy again once one serves; "" with the status and reason to
// answer when none came or the client may no longer reach the model (403).
// tick, when not nil, is called at each keepalive.
func (a *Activator) waitForBackend(r *http.Request, key types.NamespacedName, tick func()) (backend string, status int, why string) {
	ctx := r.Context()
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
			if ok, why := a.admit(r, key, a.resolver.Readmit); !ok {
				a.log.Info("Refusing a held request: the model's network policy no longer lets its client in", "aiinference", key, "why", why)
				return "", http.StatusForbidden, why
			}
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

// proxy passes the request on to backend, with the body read before; the
// body is let go once the replica's answer begins.
func proxy(w http.ResponseWriter, r *http.Request, backend string, body *frontdoor.Body) {
	sent := frontdoor.NewReplay(body.Data)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", backend
			pr.Out.Body, pr.Out.ContentLength = sent.Body()
			pr.SetXForwarded()
		},
		ModifyResponse: func(*http.Response) error {
			sent.Forget()
			body.Release()
			return nil
		},
		FlushInterval: -1, // streamed answers go out as they come
	}
	rp.ServeHTTP(w, r)
}

// serveStream answers a streaming request: the headers at once, an SSE comment
// at each keepalive while no replica serves, then the replica's events, or an
// error event when none came or the client may no longer reach the model.
func (a *Activator) serveStream(w http.ResponseWriter, r *http.Request, key types.NamespacedName, body *frontdoor.Body) {
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
	backend, status, why := a.waitForBackend(r, key, func() {
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
	sent := frontdoor.NewReplay(body.Data)
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+backend+r.URL.RequestURI(), nil)
	if err != nil {
		writeErrorEvent(w, http.StatusBadGateway, err.Error())
		return
	}
	out.Body, out.ContentLength = sent.Body()
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	sent.Forget() // the answer began, or never will
	body.Release()
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

// Run serves the models' ports until ctx ends; then it answers what it holds
// and closes them.
func (a *Activator) Run(ctx context.Context) error {
	<-ctx.Done()
	a.Stop()
	a.mu.Lock()
	servers := make([]*http.Server, 0, len(a.models))
	for key, m := range a.models {
		servers = append(servers, m.server)
		delete(a.models, key)
	}
	a.mu.Unlock()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(func() { _ = srv.Shutdown(shutdown) })
	}
	wg.Wait()
	return nil
}
