package router

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
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/ingresspolicy"
)

// Target is what the Host of a request leads to: a model's Service (Model
// set, Track set for a -stable or -canary Service), or a namespace's OpenAI
// address (Model empty: the body's `model` picks the AIInference).
type Target struct {
	Namespace, Model, Track string
}

// Directory is what the router knows of the cluster.
type Directory interface {
	// Target is the Service the host names, for a client at addr: a bare
	// name is looked up in the client pod's own namespace. ok is false when
	// the host names no model's Service nor namespace address.
	Target(ctx context.Context, host string, client netip.Addr) (t Target, ok bool)
	// Model is the AIInference; nil when there is none.
	Model(ctx context.Context, key types.NamespacedName) (*servingv1.AIInference, error)
	// Models are the AIInferences of a namespace.
	Models(ctx context.Context, namespace string) ([]servingv1.AIInference, error)
	// Endpoints are the model's serving replicas (servingv1.PodServes, not
	// terminating), each with its track.
	Endpoints(ctx context.Context, obj *servingv1.AIInference) ([]Endpoint, error)
}

// IngressPolicy decides whether a client may reach a model: the router must
// let through only a client that the model's spec.networkPolicy lets reach
// its pods directly, as the NetworkPolicy the operator renders would.
type IngressPolicy interface {
	Admits(ctx context.Context, obj *servingv1.AIInference, client netip.Addr) (bool, error)
}

// NetworkPolicyCheck is the IngressPolicy the router runs: a model's
// spec.networkPolicy evaluated as the NetworkPolicy the operator renders
// would (internal/ingresspolicy), the same check the activator makes. A
// model without a policy admits every client without a lookup.
type NetworkPolicyCheck struct {
	Clients ingresspolicy.Lookup
}

// Admits implements IngressPolicy.
func (p NetworkPolicyCheck) Admits(ctx context.Context, obj *servingv1.AIInference, addr netip.Addr) (bool, error) {
	if np := obj.Spec.NetworkPolicy; np == nil || !np.Enabled {
		return true, nil
	}
	c, err := p.Clients.Client(ctx, net.IP(addr.Unmap().AsSlice()))
	if err != nil {
		return false, err
	}
	return ingresspolicy.Admits(obj, c), nil
}

// Options bound and tune the router. Zero values take the defaults.
type Options struct {
	// BlockSize is how many bytes of prompt make a prefix block.
	BlockSize int
	// Picker tunes each model's picker.
	Picker PickerOptions
	// MaxWaiting bounds the requests per model waiting for a serving replica.
	MaxWaiting int
	// HoldTimeout bounds a request's wait for a serving replica.
	HoldTimeout time.Duration
	// Poll is how often a waiting request looks for a serving replica.
	Poll time.Duration
	// Keepalive is how often a waiting streaming request gets an SSE comment.
	Keepalive time.Duration
	// MaxBodyBytes bounds one request body.
	MaxBodyBytes int64
	// MaxBodiesBytes and MaxBodies bound the bodies held at once across models.
	MaxBodiesBytes, MaxBodies int64
	// BodyReadTimeout bounds reading a request's headers and body.
	BodyReadTimeout time.Duration
	// HeaderTimeout bounds a replica's wait before its response headers.
	HeaderTimeout time.Duration
	// SessionHeader names the header a client keeps a session by.
	SessionHeader string
	// ScrapeInterval is how often the engines' /metrics are read.
	ScrapeInterval time.Duration
	// DrainDelay is how long a stopping router still takes new requests
	// while its pod leaves the Services' endpoints (see Serve).
	DrainDelay time.Duration
	// ShutdownTimeout bounds, after the drain delay, the wait for the
	// requests in flight to finish; what is left then is cut. DrainDelay and
	// ShutdownTimeout together must fit in the pod's
	// terminationGracePeriodSeconds.
	ShutdownTimeout time.Duration
}

// Defaults.
const (
	DefaultBlockSize       = 256
	DefaultMaxWaiting      = 100
	DefaultHoldTimeout     = 5 * time.Minute
	DefaultMaxBodyBytes    = 8 << 20
	DefaultMaxBodiesBytes  = 256 << 20
	DefaultMaxBodies       = 1024
	DefaultBodyReadTimeout = 30 * time.Second
	DefaultHeaderTimeout   = 10 * time.Minute
	DefaultSessionHeader   = "X-Session-ID"
	DefaultScrapeInterval  = time.Second
	// The router's pods have terminationGracePeriodSeconds: 60.
	DefaultDrainDelay      = 5 * time.Second
	DefaultShutdownTimeout = 50 * time.Second
)

// EndpointHeader names, on each answer a replica gave, the replica (its
// pod's name): which one served a request, or held a stream that broke off.
const EndpointHeader = "X-Aiinference-Endpoint"

func (o Options) withDefaults() Options {
	set := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	setDuration := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.BlockSize <= 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.MaxWaiting <= 0 {
		o.MaxWaiting = DefaultMaxWaiting
	}
	set(&o.MaxBodyBytes, DefaultMaxBodyBytes)
	set(&o.MaxBodiesBytes, DefaultMaxBodiesBytes)
	set(&o.MaxBodies, DefaultMaxBodies)
	setDuration(&o.HoldTimeout, DefaultHoldTimeout)
	setDuration(&o.Poll, 100*time.Millisecond)
	setDuration(&o.Keepalive, 15*time.Second)
	setDuration(&o.BodyReadTimeout, DefaultBodyReadTimeout)
	setDuration(&o.HeaderTimeout, DefaultHeaderTimeout)
	setDuration(&o.ScrapeInterval, DefaultScrapeInterval)
	setDuration(&o.DrainDelay, DefaultDrainDelay)
	setDuration(&o.ShutdownTimeout, DefaultShutdownTimeout)
	if o.SessionHeader == "" {
		o.SessionHeader = DefaultSessionHeader
	}
	return o
}

// Router is the http.Handler of the request path.
type Router struct {
	opts      Options
	dir       Directory
	policy    IngressPolicy
	metrics   *Metrics
	log       logr.Logger
	transport http.RoundTripper
	tracer    trace.Tracer

	mu     sync.Mutex
	models map[types.NamespacedName]*modelState
	bodies bodyBudget
	// stopping is closed when the router stops: waiting requests are answered.
	stopping chan struct{}
	stopOnce sync.Once
	// draining is set once Serve's context ends: each answer closes its
	// connection, so that clients connect again, to another router.
	draining atomic.Bool
}

// modelState is what the router keeps of a model it has routed to.
type modelState struct {
	picker   *Picker
	waiting  int
	lastUsed time.Time
	// endpoints and engine are the replicas last seen and the model's engine
	// type, for the scraper.
	endpoints []Endpoint
	engine    servingv1.EngineType
}

// New makes a router. metrics may be nil (a private registry is used).
func New(opts Options, dir Directory, policy IngressPolicy, metrics *Metrics, log logr.Logger) *Router {
	opts = opts.withDefaults()
	if metrics == nil {
		metrics = NewMetrics(prometheus.NewRegistry())
	}
	return &Router{opts: opts, dir: dir, policy: policy, metrics: metrics, log: log,
		transport: newUpstreamTransport(opts.HeaderTimeout), tracer: otel.Tracer("aiinference-router"),
		models: map[types.NamespacedName]*modelState{}, stopping: make(chan struct{}),
		bodies: bodyBudget{maxBytes: opts.MaxBodiesBytes, maxCount: opts.MaxBodies}}
}

func newUpstreamTransport(headerTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: headerTimeout,
	}
}

// Stop answers every waiting request (503, Retry-After) and refuses new waits.
func (rt *Router) Stop() { rt.stopOnce.Do(func() { close(rt.stopping) }) }

// ServeHTTP routes one request.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rt.draining.Load() {
		w.Header().Set("Connection", "close")
	}
	client := clientAddr(r)
	target, ok := rt.dir.Target(r.Context(), r.Host, client)
	if !ok {
		writeError(w, http.StatusNotFound, 0, fmt.Sprintf("no model's Service or namespace address is behind host %q", r.Host))
		return
	}
	body, release, status, msg := rt.readBody(w, r)
	if status != 0 {
		retry := 0
		if status == http.StatusTooManyRequests {
			retry = 1
		}
		writeError(w, status, retry, msg)
		return
	}
	defer release()
	req := parseRequest(body)
	var obj *servingv1.AIInference
	if target.Model == "" {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			rt.listModels(w, r, target.Namespace, client)
			return
		}
		if !isCompletion(r) {
			writeError(w, http.StatusNotFound, 0, "a namespace's address serves POST /v1/completions, POST /v1/chat/completions and GET /v1/models")
			return
		}
		obj = rt.modelNamed(r.Context(), target.Namespace, req.Model, client)
		if obj == nil {
			writeError(w, http.StatusNotFound, 0, fmt.Sprintf("no model %q that you may call in namespace %s; GET /v1/models lists them", req.Model, target.Namespace))
			return
		}
		// The engine serves spec.model.name only (--served-model-name): a
		// request that named the AIInference goes on under the served name.
		if req.Model == obj.Name && req.Model != obj.Spec.Model.Name && adapterOf(obj, req.Model) == nil {
			body, req.Model = withModel(body, obj.Spec.Model.Name), obj.Spec.Model.Name
		}
	} else {
		var err error
		obj, err = rt.dir.Model(r.Context(), types.NamespacedName{Namespace: target.Namespace, Name: target.Model})
		if err != nil || obj == nil {
			writeError(w, http.StatusNotFound, 0, fmt.Sprintf("no AIInference %s/%s", target.Namespace, target.Model))
			return
		}
		if admitted, err := rt.policy.Admits(r.Context(), obj, client); err != nil || !admitted {
			writeError(w, http.StatusForbidden, 0, fmt.Sprintf("spec.networkPolicy of %s/%s does not admit a client at %s", obj.Namespace, obj.Name, client))
			return
		}
	}
	rt.route(w, r, obj, target.Track, body, req)
}

// adapterOf is the LoRA adapter of obj that model names; nil when it names
// none (the base model).
func adapterOf(obj *servingv1.AIInference, model string) *servingv1.AdapterSpec {
	for i := range obj.Spec.Adapters {
		if obj.Spec.Adapters[i].Name == model {
			return &obj.Spec.Adapters[i]
		}
	}
	return nil
}

// servingAdapter are the candidates that serve the adapter, as the model's
// status.adapters reports them.
func servingAdapter(obj *servingv1.AIInference, adapter string, candidates []Endpoint) []Endpoint {
	var pods []string
	for _, st := range obj.Status.Adapters {
		if st.Name == adapter {
			pods = st.Pods
		}
	}
	var out []Endpoint
	for _, e := range candidates {
		if slices.Contains(pods, e.Name) {
			out = append(out, e)
		}
	}
	return out
}

func isCompletion(r *http.Request) bool {
	return r.Method == http.MethodPost && (r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/chat/completions")
}

// modelNamed is the namespace's AIInference that `model` names (its name,
// spec.model.name or one of its spec.adapters) and that admits the client;
// nil when none.
func (rt *Router) modelNamed(ctx context.Context, namespace, model string, client netip.Addr) *servingv1.AIInference {
	models, err := rt.dir.Models(ctx, namespace)
	if err != nil {
		return nil
	}
	for i := range models {
		obj := &models[i]
		if obj.Name != model && obj.Spec.Model.Name != model && adapterOf(obj, model) == nil {
			continue
		}
		if admitted, err := rt.policy.Admits(ctx, obj, client); err == nil && admitted {
			return obj
		}
	}
	return nil
}

// listModels answers GET /v1/models on a namespace's address: the models the
// client may call, by the name the engines serve them under.
func (rt *Router) listModels(w http.ResponseWriter, r *http.Request, namespace string, client netip.Addr) {
	models, err := rt.dir.Models(r.Context(), namespace)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, 1, "listing the namespace's models: "+err.Error())
		return
	}
	type entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
		// Parent is the base model of a LoRA adapter, as vLLM lists it.
		Parent string `json:"parent,omitempty"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for i := range models {
		if admitted, err := rt.policy.Admits(r.Context(), &models[i], client); err == nil && admitted {
			base := models[i].Spec.Model.Name
			list.Data = append(list.Data, entry{ID: base, Object: "model", OwnedBy: namespace})
			for _, a := range models[i].Spec.Adapters {
				list.Data = append(list.Data, entry{ID: a.Name, Object: "model", OwnedBy: namespace, Parent: base})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// route waits for a serving replica, picks one and passes the request on.
// A replica that refuses the connection is left for the next (nothing was
// sent), as many times as there are replicas; one whose connection breaks
// before any byte of an answer (it died, or closed a kept-alive connection as
// the request went out) is left for the next once: no byte of an answer has
// reached the client, and a request that kills its replica kills one more at most.
func (rt *Router) route(w http.ResponseWriter, r *http.Request, obj *servingv1.AIInference, track string, body []byte, req request) {
	begin := time.Now()
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	ctx, span := rt.tracer.Start(r.Context(), "router.route", trace.WithAttributes(
		attribute.String("aiinference.namespace", key.Namespace), attribute.String("aiinference.name", key.Name)))
	defer span.End()
	r = r.WithContext(ctx)

	adapter := adapterOf(obj, req.Model)
	var blocks []uint64
	if isCompletion(r) {
		prompt := req.promptText()
		if adapter != nil {
			// An engine caches an adapter's prefixes apart from the base model's.
			prompt = append([]byte(adapter.Name+"\x00"), prompt...)
		}
		blocks = blockHashes(prompt, rt.opts.BlockSize)
	}
	session := r.Header.Get(rt.opts.SessionHeader)
	state := rt.state(key, obj.Spec.Engine.Type)
	// A streaming client that must wait gets its headers at once and an SSE
	// comment every keepalive, so that proxies and clients do not time it out.
	var held *heldStream
	onWait := func() {}
	if req.Stream {
		held = &heldStream{ResponseWriter: w}
		onWait = held.keepalive
		w = held
	}
	candidates, status, why := rt.waitForEndpoints(ctx, key, state, obj, track, blocks, session, onWait)
	if candidates == nil {
		rt.metrics.answered(key, "", status)
		span.SetAttributes(attribute.Int("http.status_code", status))
		switch {
		case status == statusClientGone:
		case held != nil && held.started:
			held.errorEvent(status, why)
		default:
			writeError(w, status, retryAfterOf(status), why)
		}
		return
	}
	rt.metrics.queue.WithLabelValues(key.Namespace, key.Name).Observe(time.Since(begin).Seconds())
	rt.metrics.readyEndpoints.WithLabelValues(key.Namespace, key.Name).Set(float64(len(candidates)))
	if adapter != nil {
		if candidates = servingAdapter(obj, adapter.Name, candidates); len(candidates) == 0 {
			rt.metrics.answered(key, "", http.StatusServiceUnavailable)
			msg := fmt.Sprintf("no serving replica of %s has loaded adapter %s yet (status.adapters says where it stands)", key, adapter.Name)
			if held != nil && held.started {
				held.errorEvent(http.StatusServiceUnavailable, msg)
			} else {
				writeError(w, http.StatusServiceUnavailable, 2, msg)
			}
			return
		}
	}

	adapterName := ""
	if adapter != nil {
		adapterName = adapter.Name
	}
	tried := map[string]bool{}
	resent := false
	for {
		var left []Endpoint
		for _, e := range candidates {
			if !tried[e.Name] {
				left = append(left, e)
			}
		}
		pick, ok := state.picker.PickForAdapter(left, blocks, session, adapterName)
		if !ok {
			rt.metrics.answered(key, "", http.StatusBadGateway)
			writeError(w, http.StatusBadGateway, 1, fmt.Sprintf("no serving replica of %s took the request (%d tried)", key, len(tried)))
			return
		}
		if len(tried) > 0 {
			pick.Reason = ReasonRetry
		}
		rt.metrics.picked(key, pick, len(blocks))
		span.SetAttributes(attribute.String("router.endpoint", pick.Endpoint.Name), attribute.String("router.reason", pick.Reason),
			attribute.Int("router.prefix_blocks", len(blocks)), attribute.Int("router.hit_blocks", pick.HitBlocks))
		switch rt.forward(w, r, key, state.picker, pick.Endpoint, body, begin, !resent) {
		case answered:
			return
		case broken:
			resent = true
		}
		tried[pick.Endpoint.Name] = true
	}
}

// outcome is how a request sent to one replica ended.
type outcome int

const (
	// answered: the replica's answer, or an error, went to the client.
	answered outcome = iota
	// refused: the connection could not be made; nothing was sent.
	refused
	// broken: the connection broke before any byte of an answer; nothing
	// was written to the client.
	broken
)

// statusClientGone marks a request whose client went away: nobody to answer.
const statusClientGone = 499

func retryAfterOf(status int) int {
	switch status {
	case http.StatusTooManyRequests:
		return 5
	case http.StatusServiceUnavailable:
		return 10
	}
	return 0
}

// waitForEndpoints is the replicas to pick from, once one serves; nil with
// the status and reason to answer when none came within the hold timeout.
func (rt *Router) waitForEndpoints(ctx context.Context, key types.NamespacedName, state *modelState, obj *servingv1.AIInference,
	track string, blocks []uint64, session string, onWait func()) ([]Endpoint, int, string) {
	deadline := time.NewTimer(rt.opts.HoldTimeout)
	defer deadline.Stop()
	var poll, keepalive *time.Ticker
	for {
		eps, err := rt.dir.Endpoints(ctx, obj)
		if err != nil {
			rt.log.V(1).Info("Listing the serving replicas", "aiinference", key, "error", err.Error())
		}
		rt.seen(key, state, eps)
		if c := candidatesFor(obj, track, eps, splitKey(blocks, session)); len(c) > 0 {
			return c, 0, ""
		}
		if poll == nil {
			if !rt.hold(key, state) {
				return nil, http.StatusTooManyRequests, fmt.Sprintf("%d requests for %s already wait for a serving replica; try again", rt.opts.MaxWaiting, key)
			}
			defer rt.release(key, state)
			poll = time.NewTicker(rt.opts.Poll)
			defer poll.Stop()
			keepalive = time.NewTicker(rt.opts.Keepalive)
			defer keepalive.Stop()
			onWait()
		}
		select {
		case <-ctx.Done():
			return nil, statusClientGone, "the client went away"
		case <-rt.stopping:
			return nil, http.StatusServiceUnavailable, "the router is stopping; send the request again"
		case <-deadline.C:
			return nil, http.StatusServiceUnavailable, fmt.Sprintf("no replica of %s served within %s; send the request again", key, rt.opts.HoldTimeout)
		case <-keepalive.C:
			onWait()
		case <-poll.C:
			if fresh, err := rt.dir.Model(ctx, key); err == nil && fresh != nil {
				obj = fresh
			}
		}
	}
}

// splitKey places a request in a canary split: the same prefix or session
// falls on the same side in every router, so the split keeps prefixes whole.
func splitKey(blocks []uint64, session string) uint64 {
	switch {
	case len(blocks) > 0:
		return blocks[0]
	case session != "":
		return blockHashes([]byte(session+"\x00\x00\x00\x00\x00\x00\x00\x00"), len(session)+8)[0]
	}
	return uint64(time.Now().UnixNano())
}

// candidatesFor are the replicas a request may go to: those of the Service's
// track; else, while a canary takes a share (status.rollout.weight), the
// canary's replicas for that share of the keys and the stable ones for the
// rest, as the HTTPRoute's weights would split them; else all that serve.
func candidatesFor(obj *servingv1.AIInference, track string, eps []Endpoint, key uint64) []Endpoint {
	byTrack := func(t string) []Endpoint {
		var out []Endpoint
		for _, e := range eps {
			if e.Track == t {
				out = append(out, e)
			}
		}
		return out
	}
	if track != "" {
		return byTrack(track)
	}
	ro := obj.Status.Rollout
	if ro == nil || len(byTrack(servingv1.TrackCanary)) == 0 {
		return eps
	}
	want := servingv1.TrackStable
	if int32(key%100) < ro.Weight {
		want = servingv1.TrackCanary
	}
	if picked := byTrack(want); len(picked) > 0 {
		return picked
	}
	return eps
}

// forward sends the request to one replica and copies its answer back,
// flushing each chunk. It writes nothing to the client when the replica
// refused the connection, nor, if mayResend, when the connection broke
// before any byte of an answer: the outcome says which.
// The counts are kept in defers: ReverseProxy aborts the handler with a panic
// when the replica's answer breaks off midway.
func (rt *Router) forward(w http.ResponseWriter, r *http.Request, key types.NamespacedName, picker *Picker, ep Endpoint, body []byte,
	begin time.Time, mayResend bool) (result outcome) {
	code := 0
	inFlight := rt.metrics.inFlight.WithLabelValues(key.Namespace, key.Name, ep.Name)
	inFlight.Inc()
	defer func() {
		inFlight.Dec()
		picker.Done(ep.Name)
		if result == answered {
			if code == 0 {
				code = statusClientGone
			}
			rt.metrics.answered(key, ep.Name, code)
		}
	}()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", ep.Addr, ""
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			pr.Out.ContentLength = int64(len(body))
			pr.SetXForwarded()
		},
		Transport:     rt.transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			code = resp.StatusCode
			resp.Header.Set(EndpointHeader, ep.Name)
			resp.Body = &firstByte{ReadCloser: resp.Body, seen: func() {
				rt.metrics.ttft.WithLabelValues(key.Namespace, key.Name, ep.Name).Observe(time.Since(begin).Seconds())
			}}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case r.Context().Err() != nil:
				code = statusClientGone
			case isRefused(err):
				result = refused
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorRefused).Inc()
			case mayResend && isBroken(err):
				result = broken
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorBroken).Inc()
			default:
				code = http.StatusBadGateway
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorFailed).Inc()
				writeError(w, http.StatusBadGateway, 1, fmt.Sprintf("replica %s of %s: %v", ep.Name, key, err))
			}
		},
	}
	proxy.ServeHTTP(w, r)
	return result
}

// isRefused tells a replica that could not be reached: nothing was sent, so
// another may take the request.
func isRefused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// isBroken tells a connection that broke before the replica's answer began
// (an error of the round trip, so no byte of an answer came): the replica
// went away, or closed a kept-alive connection as the request went out, or
// answered what is not HTTP. A timeout is no such thing: the replica is
// slow, and another would be as slow for the same request.
func isBroken(err error) bool {
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, context.DeadlineExceeded)
}

// firstByte calls seen once, when the first byte of the body arrives.
type firstByte struct {
	io.ReadCloser
	seen func()
	once sync.Once
}

func (f *firstByte) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 {
		f.once.Do(f.seen)
	}
	return n, err
}

// state is the router's record of a model, made at its first request.
func (rt *Router) state(key types.NamespacedName, engine servingv1.EngineType) *modelState {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s := rt.models[key]
	if s == nil {
		s = &modelState{picker: NewPicker(rt.opts.Picker)}
		rt.models[key] = s
	}
	s.lastUsed, s.engine = time.Now(), engine
	return s
}

// seen records the model's serving replicas, forgetting those gone.
func (rt *Router) seen(key types.NamespacedName, s *modelState, eps []Endpoint) {
	rt.mu.Lock()
	gone := map[string]bool{}
	for _, e := range s.endpoints {
		gone[e.Name] = true
	}
	names := make([]string, 0, len(eps))
	for _, e := range eps {
		delete(gone, e.Name)
		names = append(names, e.Name)
	}
	s.endpoints = eps
	rt.mu.Unlock()
	if len(gone) > 0 {
		s.picker.Forget(names)
		for name := range gone {
			rt.metrics.forgetEndpoint(key, name)
		}
	}
}

func (rt *Router) hold(key types.NamespacedName, s *modelState) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if s.waiting >= rt.opts.MaxWaiting {
		return false
	}
	s.waiting++
	rt.metrics.waiting.WithLabelValues(key.Namespace, key.Name).Set(float64(s.waiting))
	return true
}

func (rt *Router) release(key types.NamespacedName, s *modelState) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s.waiting--
	rt.metrics.waiting.WithLabelValues(key.Namespace, key.Name).Set(float64(s.waiting))
}

// Waiting is how many requests for the model wait for a serving replica now.
func (rt *Router) Waiting(key types.NamespacedName) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if s := rt.models[key]; s != nil {
		return s.waiting
	}
	return 0
}

// clientAddr is the address the request came from (the TCP peer, never a
// header a client can write).
func clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// writeError answers with an OpenAI-style error body, and Retry-After when
// retryAfter is positive.
func writeError(w http.ResponseWriter, status, retryAfter int, message string) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": message, "code": status}})
}

// heldStream is the response of a streaming request that waited for a
// replica: once it has sent its headers and a comment, the replica's answer
// follows as events, and a failure as an error event.
type heldStream struct {
	http.ResponseWriter
	started bool
	// failed is set when the replica answered with an error after the
	// stream started: its body is replaced by one error event.
	failed bool
}

func (h *heldStream) keepalive() {
	if !h.started {
		h.Header().Set("Content-Type", "text/event-stream")
		h.Header().Set("Cache-Control", "no-cache")
		h.ResponseWriter.WriteHeader(http.StatusOK)
		h.started = true
	}
	_, _ = io.WriteString(h.ResponseWriter, ": waiting for a replica of the model\n\n")
	h.Flush()
}

func (h *heldStream) WriteHeader(code int) {
	if !h.started {
		h.ResponseWriter.WriteHeader(code)
		return
	}
	if code != http.StatusOK {
		h.failed = true
		h.errorEvent(code, fmt.Sprintf("the replica answered HTTP %d", code))
	}
}

func (h *heldStream) Write(p []byte) (int, error) {
	if h.failed {
		return len(p), nil
	}
	return h.ResponseWriter.Write(p)
}

func (h *heldStream) Flush() { _ = http.NewResponseController(h.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the connection.
func (h *heldStream) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func (h *heldStream) errorEvent(status int, message string) {
	data, _ := json.Marshal(map[string]any{"error": map[string]any{"code": status, "message": message}})
	_, _ = fmt.Fprintf(h.ResponseWriter, "data: %s\n\n", data)
	h.Flush()
}
