package router

import (
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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/frontdoor"
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
	// ClientNamespace is the namespace of the pod at addr, the client's
	// tenant by default; "" when no pod has it.
	ClientNamespace(ctx context.Context, addr netip.Addr) string
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

// EndpointHeader names, on each answer a replica gave, the replica (its
// pod's name): which one served a request, or held a stream that broke off.
const EndpointHeader = "X-Aiinference-Endpoint"

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
	// bodyBytes, bodies and requests bound what the router holds, in all,
	// per namespace and per model.
	bodyBytes, bodies, requests *frontdoor.Quota
	// stopping is closed when the router stops: waiting requests are answered.
	stopping chan struct{}
	stopOnce sync.Once
	// draining is set once Serve's context ends: each answer closes its
	// connection, so that clients connect again, to another router.
	draining atomic.Bool
}

// modelState is what the router keeps of a model it has routed to.
type modelState struct {
	picker *Picker
	flow   *flowQueue
	// waiting counts the requests held for want of a serving replica.
	waiting  int
	lastUsed time.Time
	// endpoints and engine are the replicas last seen and the model's engine
	// type, for the scraper.
	endpoints []Endpoint
	engine    servingv1.EngineType
	// sending counts the requests being sent to a replica, and retrying
	// those of them on a retry: the retry budget's share.
	sending, retrying int
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
		bodyBytes: frontdoor.NewQuota("bytes of request bodies", opts.MaxBodiesBytes, opts.NamespaceShare, opts.ModelShare),
		bodies:    frontdoor.NewQuota("request bodies", opts.MaxBodies, opts.NamespaceShare, opts.ModelShare),
		requests:  frontdoor.NewQuota("requests", opts.MaxRequests, opts.NamespaceShare, opts.ModelShare)}
}

// maxResponseHeaderBytes bounds a replica's response headers: an engine's
// image is its user's, and Go's default lets each answer hold 10 MiB.
const maxResponseHeaderBytes = 64 << 10

func newUpstreamTransport(headerTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:            (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  headerTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
}

// copyBuffers are the buffers answers are copied through: 8 KiB each, taken
// only while a copy runs (ReverseProxy's own are 32 KiB per request).
var copyBuffers = bufferPool{sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}}

type bufferPool struct{ sync.Pool }

func (p *bufferPool) Get() []byte  { return *p.Pool.Get().(*[]byte) }
func (p *bufferPool) Put(b []byte) { p.Pool.Put(&b) }

// Stop answers every waiting request (503, Retry-After) and refuses new waits.
func (rt *Router) Stop() { rt.stopOnce.Do(func() { close(rt.stopping) }) }

// ServeHTTP routes one request. What it holds is bounded before it is
// taken: the policy is checked before the body is read wherever the address
// names the model, the body is counted against its tenant's share as it
// arrives, and only what routing needs is read from it.
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
	key := types.NamespacedName{Namespace: target.Namespace, Name: target.Model}
	inRouter := rt.requests.Hold(key)
	if refusal := inRouter.Grow(1); refusal != "" {
		rt.metrics.refused(key, reasonRequests)
		writeError(w, http.StatusTooManyRequests, 1, refusal+"; try again")
		return
	}
	defer func() { inRouter.Release() }()
	var obj *servingv1.AIInference
	if target.Model != "" {
		var err error
		obj, err = rt.dir.Model(r.Context(), key)
		if err != nil || obj == nil {
			writeError(w, http.StatusNotFound, 0, fmt.Sprintf("no AIInference %s", key))
			return
		}
		if !rt.admits(r.Context(), obj, client) {
			writeError(w, http.StatusForbidden, 0, fmt.Sprintf("spec.networkPolicy of %s/%s does not admit a client at %s", obj.Namespace, obj.Name, client))
			return
		}
	} else if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		rt.listModels(w, r, target.Namespace, client)
		return
	} else if !isCompletion(r) {
		writeError(w, http.StatusNotFound, 0, "a namespace's address serves POST /v1/completions, POST /v1/chat/completions and GET /v1/models")
		return
	}
	body, status, msg := frontdoor.ReadBody(w, r, key, frontdoor.BodyLimits{
		MaxBytes: rt.opts.MaxBodyBytes, ReadTimeout: rt.opts.BodyReadTimeout, Bytes: rt.bodyBytes, Count: rt.bodies})
	defer body.Release()
	if status != 0 {
		if status == http.StatusTooManyRequests {
			rt.metrics.refused(key, reasonBodies)
		}
		writeError(w, status, retryAfterOf(status), msg)
		return
	}
	req, err := parseRequest(body.Data)
	if err != nil {
		writeError(w, http.StatusBadRequest, 0, err.Error())
		return
	}
	if obj == nil {
		obj = rt.modelNamed(r.Context(), target.Namespace, req.Model, client)
		if obj == nil {
			writeError(w, http.StatusNotFound, 0, fmt.Sprintf("no model %q that you may call in namespace %s; GET /v1/models lists them", req.Model, target.Namespace))
			return
		}
		key.Name = obj.Name
		refusal := inRouter.ToModel(obj.Name)
		if refusal == "" {
			refusal = body.ToModel(obj.Name)
		}
		if refusal != "" {
			rt.metrics.refused(key, reasonRequests)
			writeError(w, http.StatusTooManyRequests, 1, refusal+"; try again")
			return
		}
		// The engine serves spec.model.name only (--served-model-name): a
		// request that named the AIInference goes on under the served name.
		if req.Model == obj.Name && req.Model != obj.Spec.Model.Name && adapterOf(obj, req.Model) == nil {
			body.Data, req.Model = withModel(body.Data, req, obj.Spec.Model.Name), obj.Spec.Model.Name
			if req, err = parseRequest(body.Data); err != nil {
				writeError(w, http.StatusBadRequest, 0, err.Error())
				return
			}
		}
	}
	priority, ok := obj.RequestPriority(r.Header.Get(servingv1.ObjectiveHeader))
	if !ok {
		writeError(w, http.StatusBadRequest, 0, fmt.Sprintf("%s %q is not among spec.routing.objectives of %s/%s",
			servingv1.ObjectiveHeader, r.Header.Get(servingv1.ObjectiveHeader), obj.Namespace, obj.Name))
		return
	}
	rt.route(w, r, obj, target.Track, body, req, sender{addr: client, tenant: rt.tenantOf(r, obj, client), priority: priority})
}

// sender is who sent a request, as the router serves it: from where (the
// policy), as which tenant (the fair queues) and how urgently.
type sender struct {
	addr     netip.Addr
	tenant   string
	priority servingv1.RequestPriority
}

// maxTenantBytes bounds a tenant named by a header.
const maxTenantBytes = 253

// tenantOf is the request's tenant: the header the model's spec names, else
// the client pod's namespace; "" for a client that is no pod.
func (rt *Router) tenantOf(r *http.Request, obj *servingv1.AIInference, client netip.Addr) string {
	if ro := obj.Spec.Routing; ro != nil && ro.TenantHeader != "" {
		if t := r.Header.Get(ro.TenantHeader); t != "" {
			return "header:" + t[:min(len(t), maxTenantBytes)]
		}
	}
	return "namespace:" + rt.dir.ClientNamespace(r.Context(), client)
}

// admits is the model's policy for the client; a failed lookup refuses.
func (rt *Router) admits(ctx context.Context, obj *servingv1.AIInference, client netip.Addr) bool {
	admitted, err := rt.policy.Admits(ctx, obj, client)
	return err == nil && admitted
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

// route waits for a serving replica, and for room in one while all are
// saturated, picks one and passes the request on. A replica that refuses the
// connection is left for the next (nothing was sent), as many times as there
// are replicas. One that fails before its answer began (its connection
// broke, it answered a 5xx, or a streamed answer's headers did not come in
// time) is left for the next up to MaxRetries times, within the model's retry
// budget: no byte of an answer has reached the client.
func (rt *Router) route(w http.ResponseWriter, r *http.Request, obj *servingv1.AIInference, track string, body *frontdoor.Body, req request, from sender) {
	begin := time.Now()
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	ctx, span := rt.tracer.Start(r.Context(), "router.route", trace.WithAttributes(
		attribute.String("aiinference.namespace", key.Namespace), attribute.String("aiinference.name", key.Name)))
	defer span.End()
	r = r.WithContext(ctx)

	adapter := adapterOf(obj, req.Model)
	var blocks []uint64
	if isCompletion(r) {
		prompt := req.prompt
		if adapter != nil {
			// An engine caches an adapter's prefixes apart from the base model's.
			prompt = append([][]byte{[]byte(adapter.Name + "\x00")}, prompt...)
		}
		blocks = blockHashesOf(prompt, rt.opts.BlockSize)
	}
	req.prompt = nil // pieces of the body, which goes once an answer begins
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
	fail := func(endpoint string, status int, message string) {
		rt.metrics.answered(key, endpoint, status)
		span.SetAttributes(attribute.Int("http.status_code", status))
		switch {
		case status == statusClientGone:
		case held != nil && held.started:
			held.errorEvent(status, message)
		default:
			writeError(w, status, retryAfterOf(status), message)
		}
	}
	obj, candidates, status, why := rt.waitForEndpoints(ctx, key, state, obj, track, blocks, session, from, onWait)
	if candidates == nil {
		fail("", status, why)
		return
	}
	released, status, why := rt.waitForRoom(ctx, key, state, obj, from, onWait)
	if status != 0 {
		fail("", status, why)
		return
	}
	if released {
		candidates = state.picker.Unsaturated(candidates)
		// Once this request is sent (or gives up), the next may be weighed.
		defer func() {
			if released {
				state.flow.sent()
				rt.kick(state)
			}
		}()
	}
	rt.metrics.queue.WithLabelValues(key.Namespace, key.Name).Observe(time.Since(begin).Seconds())
	rt.metrics.readyEndpoints.WithLabelValues(key.Namespace, key.Name).Set(float64(len(candidates)))
	if adapter != nil {
		if candidates = servingAdapter(obj, adapter.Name, candidates); len(candidates) == 0 {
			fail("", http.StatusServiceUnavailable, fmt.Sprintf("no serving replica of %s has loaded adapter %s yet (status.adapters says where it stands)", key, adapter.Name))
			return
		}
	}

	adapterName := ""
	if adapter != nil {
		adapterName = adapter.Name
	}
	tried := map[string]bool{}
	retries := 0
	rt.sending(state, 1)
	defer rt.sending(state, -1)
	for {
		var left []Endpoint
		for _, e := range candidates {
			if !tried[e.Name] {
				left = append(left, e)
			}
		}
		pick, ok := state.picker.PickForAdapter(left, blocks, session, adapterName)
		if !ok {
			fail("", http.StatusBadGateway, fmt.Sprintf("no serving replica of %s took the request (%d tried)", key, len(tried)))
			return
		}
		if len(tried) > 0 {
			pick.Reason = ReasonRetry
		}
		rt.metrics.picked(key, pick, len(blocks))
		span.SetAttributes(attribute.String("router.endpoint", pick.Endpoint.Name), attribute.String("router.reason", pick.Reason),
			attribute.Int("router.prefix_blocks", len(blocks)), attribute.Int("router.hit_blocks", pick.HitBlocks))
		// A failure may be left for another replica only while one is left
		// and the budget allows: else the client gets this replica's answer.
		mayRetry := retries < rt.opts.MaxRetries && len(left) > 1 && rt.retryAllowed(state)
		if released {
			// Picked: the room it takes counts in the saturation now.
			released = false
			state.flow.sent()
			rt.kick(state)
		}
		result := rt.forward(w, r, key, state, pick.Endpoint, body, req.Stream, begin, mayRetry)
		rt.kick(state)
		switch result {
		case answered:
			return
		case failedBeforeAnswer:
			if !rt.takeRetry(state) {
				fail(pick.Endpoint.Name, http.StatusBadGateway, fmt.Sprintf("replica %s of %s failed the request before answering, and the retry budget of %s is spent", pick.Endpoint.Name, key, key))
				return
			}
			retries++
			defer rt.endRetry(state)
		}
		tried[pick.Endpoint.Name] = true
	}
}

// sending counts a request being sent to a model's replicas.
func (rt *Router) sending(s *modelState, n int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s.sending += n
}

// retryAllowed tells whether the model's retry budget has room for one more
// retry now: at most RetryBudget of the requests being sent, and always
// MinRetries.
func (rt *Router) retryAllowed(s *modelState) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return s.retrying < max(rt.opts.MinRetries, int(rt.opts.RetryBudget*float64(s.sending)))
}

// takeRetry counts a retry in the budget; false when there is no room.
func (rt *Router) takeRetry(s *modelState) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if s.retrying >= max(rt.opts.MinRetries, int(rt.opts.RetryBudget*float64(s.sending))) {
		return false
	}
	s.retrying++
	return true
}

func (rt *Router) endRetry(s *modelState) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s.retrying--
}

// waitForRoom holds the request while every replica of the model is
// saturated, in its tenant's queue of its priority's band, until the flow
// queue releases it; a Sheddable request is shed at once instead. A non-zero
// status is the answer when it is not sent.
func (rt *Router) waitForRoom(ctx context.Context, key types.NamespacedName, state *modelState, obj *servingv1.AIInference, from sender, onWait func()) (released bool, status int, why string) {
	if eng, err := engine.For(obj.Spec.Engine.Type); err == nil {
		state.picker.SetConcurrency(eng.Concurrency(obj.Spec.Engine))
	}
	saturated := rt.saturation(state)
	if state.flow.length() == 0 && !saturated() {
		return false, 0, ""
	}
	if from.priority == servingv1.PrioritySheddable {
		rt.metrics.shed(key, from.priority, shedSaturated)
		return false, http.StatusTooManyRequests, fmt.Sprintf("every replica of %s is saturated, and the request is %s; try again later", key, from.priority)
	}
	me := &waiter{tenant: from.tenant, band: bandOf(from.priority), ready: make(chan struct{})}
	shed, ok := state.flow.enqueue(me)
	if shed != nil {
		rt.metrics.shed(key, priorityOf(shed.band), shedForRoom)
	}
	if !ok {
		rt.metrics.shed(key, from.priority, shedQueueFull)
		return false, http.StatusTooManyRequests, fmt.Sprintf("every replica of %s is saturated and %d requests wait for room; try again", key, rt.opts.MaxWaiting)
	}
	rt.setWaiting(key, state)
	defer rt.setWaiting(key, state)
	onWait()
	deadline := time.NewTimer(rt.opts.HoldTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(rt.opts.Poll)
	defer poll.Stop()
	keepalive := time.NewTicker(rt.opts.Keepalive)
	defer keepalive.Stop()
	state.flow.release(saturated)
	for {
		select {
		case <-me.ready:
			if me.shed {
				return false, http.StatusTooManyRequests, fmt.Sprintf("every replica of %s is saturated, and the request was shed for one of a higher priority or a shorter queue; try again", key)
			}
			// Released: the model's policy may have changed while it waited.
			if fresh, err := rt.dir.Model(ctx, key); err == nil && fresh != nil && !rt.admits(ctx, fresh, from.addr) {
				state.flow.sent()
				rt.kick(state)
				return false, http.StatusForbidden, fmt.Sprintf("spec.networkPolicy of %s no longer admits a client at %s", key, from.addr)
			}
			return true, 0, ""
		case <-ctx.Done():
		case <-rt.stopping:
		case <-deadline.C:
		case <-keepalive.C:
			onWait()
			continue
		case <-poll.C:
			state.flow.release(saturated)
			continue
		}
		if !state.flow.leave(me) {
			<-me.ready // released or shed meanwhile: pass the room on
			if !me.shed {
				state.flow.sent()
			}
			state.flow.release(saturated)
		}
		switch {
		case ctx.Err() != nil:
			return false, statusClientGone, "the client went away"
		case isClosed(rt.stopping):
			return false, http.StatusServiceUnavailable, "the router is stopping; send the request again"
		}
		return false, http.StatusServiceUnavailable, fmt.Sprintf("every replica of %s stayed saturated for %s; send the request again", key, rt.opts.HoldTimeout)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// saturation tells whether every replica the model's picker may pick is
// saturated now.
func (rt *Router) saturation(state *modelState) func() bool {
	return func() bool {
		rt.mu.Lock()
		eps := state.endpoints
		rt.mu.Unlock()
		return state.picker.Saturated(eps)
	}
}

// kick lets the model's queue release a request if there is room: called as
// a request ends and as the engines' load is read.
func (rt *Router) kick(state *modelState) {
	state.flow.release(rt.saturation(state))
}

// outcome is how a request sent to one replica ended.
type outcome int

const (
	// answered: the replica's answer, or an error, went to the client.
	answered outcome = iota
	// refused: the connection could not be made; nothing was sent.
	refused
	// failedBeforeAnswer: the connection broke before any byte of an
	// answer, the replica answered a 5xx, or a streamed answer's headers did
	// not come in time; nothing was written to the client.
	failedBeforeAnswer
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

// waitForEndpoints is the replicas to pick from, once one serves, and the
// model as it was then; nil with the status and reason to answer when none
// came within the hold timeout, or the model's policy no longer admits the
// client once one came.
func (rt *Router) waitForEndpoints(ctx context.Context, key types.NamespacedName, state *modelState, obj *servingv1.AIInference,
	track string, blocks []uint64, session string, from sender, onWait func()) (*servingv1.AIInference, []Endpoint, int, string) {
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
			if poll != nil && !rt.admits(ctx, obj, from.addr) {
				// It waited: the model's policy may have changed meanwhile.
				return obj, nil, http.StatusForbidden, fmt.Sprintf("spec.networkPolicy of %s no longer admits a client at %s", key, from.addr)
			}
			return obj, c, 0, ""
		}
		if poll == nil {
			if !rt.hold(key, state) {
				return obj, nil, http.StatusTooManyRequests, fmt.Sprintf("%d requests for %s already wait for a serving replica; try again", rt.opts.MaxWaiting, key)
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
			return obj, nil, statusClientGone, "the client went away"
		case <-rt.stopping:
			return obj, nil, http.StatusServiceUnavailable, "the router is stopping; send the request again"
		case <-deadline.C:
			return obj, nil, http.StatusServiceUnavailable, fmt.Sprintf("no replica of %s served within %s; send the request again", key, rt.opts.HoldTimeout)
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
// flushing each chunk, and tells the picker how the replica did. It writes
// nothing to the client when the replica refused the connection, nor, if
// mayRetry, when it failed before its answer began: the outcome says which.
// Once an answer is passed on the body is let go: it is sent nowhere else.
// The counts are kept in defers: ReverseProxy aborts the handler with a panic
// when the replica's answer breaks off midway.
func (rt *Router) forward(w http.ResponseWriter, r *http.Request, key types.NamespacedName, state *modelState, ep Endpoint, body *frontdoor.Body,
	stream bool, begin time.Time, mayRetry bool) (result outcome) {
	client := r.Context()
	code := 0
	healthy := false
	inFlight := rt.metrics.inFlight.WithLabelValues(key.Namespace, key.Name, ep.Name)
	inFlight.Inc()
	defer func() {
		inFlight.Dec()
		state.picker.Done(ep.Name)
		if client.Err() == nil {
			rt.report(key, state, ep.Name, healthy)
		}
		if result == answered {
			if code == 0 {
				code = statusClientGone
			}
			rt.metrics.answered(key, ep.Name, code)
		}
	}()
	// A streamed answer's headers come before its first token: a replica
	// silent past StreamHeaderTimeout is cut, and the request may go on.
	attempt, cancel := context.WithCancel(client)
	defer cancel()
	var silent atomic.Bool
	var headerTimer *time.Timer
	if stream {
		headerTimer = time.AfterFunc(rt.opts.StreamHeaderTimeout, func() { silent.Store(true); cancel() })
		defer headerTimer.Stop()
	}
	sent := frontdoor.NewReplay(body.Data)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", ep.Addr, ""
			pr.Out.Body, pr.Out.ContentLength = sent.Body()
			pr.SetXForwarded()
		},
		Transport:     rt.transport,
		FlushInterval: -1,
		BufferPool:    &copyBuffers,
		ModifyResponse: func(resp *http.Response) error {
			if headerTimer != nil && !headerTimer.Stop() && silent.Load() {
				return errSilent // the timer fired as the headers came: the attempt is cut anyway
			}
			healthy = resp.StatusCode < 500
			if !healthy && mayRetry {
				_ = resp.Body.Close()
				return errServerError{resp.StatusCode}
			}
			code = resp.StatusCode
			sent.Forget()
			body.Release()
			resp.Header.Set(EndpointHeader, ep.Name)
			resp.Body = &firstByte{ReadCloser: resp.Body, seen: func() {
				rt.metrics.ttft.WithLabelValues(key.Namespace, key.Name, ep.Name).Observe(time.Since(begin).Seconds())
			}}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var serverError errServerError
			switch {
			case client.Err() != nil:
				code = statusClientGone
			case isRefused(err):
				result = refused
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorRefused).Inc()
			case errors.As(err, &serverError):
				result = failedBeforeAnswer
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorServerError).Inc()
			case silent.Load() || errors.Is(err, errSilent):
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorSilent).Inc()
				if mayRetry {
					result = failedBeforeAnswer
					return
				}
				code = http.StatusGatewayTimeout
				writeError(w, code, 1, fmt.Sprintf("replica %s of %s sent no answer within %s", ep.Name, key, rt.opts.StreamHeaderTimeout))
			case mayRetry && isBroken(err):
				result = failedBeforeAnswer
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorBroken).Inc()
			default:
				code = http.StatusBadGateway
				rt.metrics.upstreamErrors.WithLabelValues(key.Namespace, key.Name, ep.Name, errorFailed).Inc()
				writeError(w, http.StatusBadGateway, 1, fmt.Sprintf("replica %s of %s: %v", ep.Name, key, err))
			}
		},
	}
	proxy.ServeHTTP(w, r.WithContext(attempt))
	return result
}

// errSilent is a streamed answer whose headers came too late.
var errSilent = errors.New("no answer in time")

// errServerError is a replica's 5xx answer, held back so that another
// replica may answer instead.
type errServerError struct{ status int }

func (e errServerError) Error() string { return fmt.Sprintf("the replica answered HTTP %d", e.status) }

// report tells the picker how a replica did, and the metrics and the
// model's events when that took it out of the picking or brought it back.
func (rt *Router) report(key types.NamespacedName, state *modelState, endpoint string, ok bool) {
	rt.mu.Lock()
	replicas := len(state.endpoints)
	rt.mu.Unlock()
	change, ejection := state.picker.Report(endpoint, ok, replicas)
	switch change {
	case Ejected:
		rt.metrics.ejected(key, endpoint, true)
		rt.log.Info("Replica taken out of the picking", "aiinference", key, "endpoint", endpoint, "for", ejection)
		rt.event(key, corev1.EventTypeWarning, servingv1.ReasonReplicaEjected, "Replica %s failed %d answers in a row (5xx, a refused or broken connection, or no answer in time): no request goes to it for %s, then one trial request",
			endpoint, state.picker.opts.Outliers.ConsecutiveFailures, ejection)
	case Restored:
		rt.metrics.ejected(key, endpoint, false)
		rt.log.Info("Replica back in the picking", "aiinference", key, "endpoint", endpoint)
		rt.event(key, corev1.EventTypeNormal, servingv1.ReasonReplicaRestored, "Replica %s answered its trial request: it is picked again", endpoint)
	}
}

// event records an Event on the model, when the router records events.
func (rt *Router) event(key types.NamespacedName, eventType, reason, note string, args ...any) {
	if rt.opts.Events == nil {
		return
	}
	obj, err := rt.dir.Model(context.Background(), key)
	if err != nil || obj == nil {
		return
	}
	rt.opts.Events.Eventf(obj, nil, eventType, reason, "Route", note, args...)
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
// answered what is not HTTP. A timeout of an answer not streamed is no such
// thing: the replica is slow, and another would be as slow for the same
// request.
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
		s = &modelState{picker: NewPicker(rt.opts.Picker), flow: &flowQueue{max: rt.opts.MaxWaiting}}
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
	if s.waiting >= rt.opts.MaxWaiting {
		rt.mu.Unlock()
		return false
	}
	s.waiting++
	rt.mu.Unlock()
	rt.setWaiting(key, s)
	return true
}

func (rt *Router) release(key types.NamespacedName, s *modelState) {
	rt.mu.Lock()
	s.waiting--
	rt.mu.Unlock()
	rt.setWaiting(key, s)
}

// setWaiting updates the gauge of the model's requests waiting in the
// router: held for a serving replica, or queued for room in one.
func (rt *Router) setWaiting(key types.NamespacedName, s *modelState) {
	rt.metrics.waiting.WithLabelValues(key.Namespace, key.Name).Set(float64(rt.waitingIn(s)))
}

func (rt *Router) waitingIn(s *modelState) int {
	rt.mu.Lock()
	held := s.waiting
	rt.mu.Unlock()
	return held + s.flow.length()
}

// Waiting is how many requests for the model wait in the router now: for a
// serving replica, or for room in one.
func (rt *Router) Waiting(key types.NamespacedName) int {
	rt.mu.Lock()
	s := rt.models[key]
	rt.mu.Unlock()
	if s == nil {
		return 0
	}
	return rt.waitingIn(s)
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
