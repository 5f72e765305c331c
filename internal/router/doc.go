// Package router sends each request for a model to the replica that serves it
// fastest: the one that holds its prompt's prefix in its KV cache, unless that
// one is past its share of the load, then the least loaded. It is the model's
// one data-path component: it also holds requests while the model has no
// serving replica (the activator's job at zero), with a bound.
//
// # Contract (read by the operator side: chart, kustomize, controller)
//
// Binary: cmd/router (thin; wiring in Main of this package). Flags:
//
//	--bind-address=:8080          requests (OpenAI API), plain HTTP
//	--metrics-bind-address=:9090  /metrics (Prometheus), /healthz, /readyz;
//	                              plain HTTP, which the router's NetworkPolicy
//	                              opens only to the operator, the monitoring
//	                              namespaces and the node (docs/routing.md)
//	--block-size=256              bytes of prompt per prefix block
//	--load-factor=1.25            bounded load: a replica takes at most
//	                              ceil(factor * (in flight + 1) / replicas)
//	--max-waiting=100             requests per model waiting for a replica,
//	                              or for room in one; more: 429 with
//	                              Retry-After
//	--hold-timeout=5m             longest wait for a serving replica; then 503
//	--max-body-bytes=8388608      one request body; more: 413
//	--max-bodies-bytes=100663296  all bodies' bytes held at once, counted in
//	                              what is allocated as they arrive; more: 429
//	                              with Retry-After
//	--max-bodies=1024             request bodies being read or kept at once
//	--max-requests=2048           requests in the router, headers to the
//	                              end of the answer
//	--namespace-share=0.5         of each of the three bounds above, what one
//	--model-share=0.25            namespace's models, and one model, may hold
//	--body-read-timeout=30s       time to read a request's headers and body
//	--header-timeout=10m          a replica's wait before the headers of an
//	                              answer not streamed (the whole answer)
//	--stream-header-timeout=10s   ... of a streamed one (sent before the first
//	                              token); then the replica is taken as silent
//	--max-retries=2               other replicas a request goes to after one
//	                              failed it before its answer began
//	--retry-budget=0.2            share of a model's requests being sent that
//	--min-retries=3               may be retries at once (at least this many)
//	--outlier-consecutive-failures=5, --outlier-base-ejection=10s,
//	--outlier-max-ejection=5m, --outlier-max-ejected-share=0.5
//	                              passive outlier detection (docs/router.md)
//	--saturation-queue=5          a replica carrying its engine's batch (from
//	--saturation-kv-cache=0.8     the spec's --max-num-seqs, or a reading with
//	                              a queue), else an engine queue this long,
//	                              or a KV cache this full, saturates it;
//	                              while all are, requests wait in fair
//	                              queues per tenant and priority (spec.routing)
//	--max-scrape-bytes=1048576    the most of one replica's /metrics read,
//	--scrape-parallel=4           and the replicas read at once
//	--session-header=X-Session-ID session affinity key, when a client sends it
//	--scrape-interval=1s          engines' /metrics, each serving pod
//	--otlp-endpoint=              traces (OTLP/HTTP); empty: none
//	--drain-delay=5s              after SIGTERM, new requests are still taken
//	                              (each answer with Connection: close) while
//	                              the pod leaves the Services' endpoints
//	--shutdown-timeout=50s        then the listener closes and requests in
//	                              flight may finish for this long; the rest is
//	                              cut. Both within terminationGracePeriodSeconds
//	                              (60 s in the chart)
//
// Topology: one Deployment of the router (two or more replicas, no leader,
// Pod Security restricted) in the operator's namespace, behind nothing: the
// model's Service leads to the router pods. When routing is on for a model,
// the operator keeps the Service's port but gives it no selector and writes
// an EndpointSlice (label kubernetes.io/service-name=<model>) whose endpoints
// are the router pods' IPs at the router's port 8080, as it does today for
// the activator at zero. Clients keep calling http://<model>.<namespace>:<port>.
// Router replicas share no state: each picks by consistent hashing over the
// same set of endpoints, so two routers send a prefix to the same replica.
// A NetworkPolicy on the router's pods (config/router/networkpolicy.yaml; the
// chart's router.networkPolicy, on by default) admits port 8080 from anywhere
// (the router applies each model's spec.networkPolicy itself) and port 9090
// only from the operator's pods, the namespaces of
// router.networkPolicy.metrics.namespaceSelector (monitoring by default), the
// blocks of router.networkPolicy.metrics.ipBlocks (none by default: the API
// server's pod proxy for kubectl aii status, where it does not run on the
// router pod's node) and the pod's own node (the kubelet's probes): what is
// served on 9090 must be fit for those readers only.
//
// What the router reads (a cache of watches, cluster-wide; ClusterRole verbs
// get, list, watch; it writes only Events, ReplicaEjected and ReplicaRestored
// on a model):
//   - aiinferences.serving.aiinference.io: spec.model.name (the `model` the
//     namespace address selects by, beside metadata.name),
//     spec.networkPolicy (who may call), status.rollout (canary weight and
//     trafficSplit).
//   - services: those labelled serving.aiinference.io/inference=<model> (the
//     model's Service and its -stable/-canary Services; a selector with
//     serving.aiinference.io/track restricts to that track, which is how a
//     Gateway's HTTPRoute split is kept; so does that label on the Service
//     itself, for a Service without a selector), and those labelled
//     serving.aiinference.io/openai=true (a namespace's one OpenAI address: the
//     `model` in the body picks the AIInference of that namespace).
//   - pods: the model's replicas (label serving.aiinference.io/inference,
//     servingv1.PodServes, not terminating, with an IP; the port is the engine
//     container's port named "http", whose /metrics is scraped); and clients,
//     by pod IP, to learn their namespace and labels.
//   - namespaces: their labels, for the policy's namespaceSelector.
//
// Host and `model`: the Host header (name, name.namespace,
// name.namespace.svc[.cluster.local] or the ClusterIP, with or without port)
// names a Service above; a bare name is looked up in the client pod's own
// namespace. On a model's Service the body is passed on as it is; on a
// namespace address `model` selects the AIInference (metadata.name or
// spec.model.name) in that namespace, and /v1/models lists the namespace's
// models; a body that named the AIInference goes on with `model` set to
// spec.model.name, the one name its engine serves. Either way the request is refused (403) unless the model's
// spec.networkPolicy admits the client's source address as the NetworkPolicy
// the operator renders would (IngressPolicy); a Host naming another
// namespace's model gains nothing. The operator's rendered ingress policy must
// admit the router pods to the engine port.
//
// Requests: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.
// Streaming answers are flushed per chunk; a client that goes away cancels the
// request to the replica; a replica that refuses the connection is tried
// again on another before any byte is sent, and one whose connection breaks
// before any byte of its answer (it died) is tried again on another once.
// Each answer a replica gave names it in the header X-Aiinference-Endpoint.
//
// Metrics (labels namespace, name = the AIInference; endpoint = pod name):
//
//	aiinference_router_requests_total{namespace,name,endpoint,code}
//	aiinference_router_picks_total{namespace,name,endpoint,reason}
//	    reason: prefix (longest cached prefix seen by this router), adapter
//	    (the request's LoRA adapter runs or waits in that replica's engine
//	    now: vllm:lora_requests_info), hash
//	    (the prefix's consistent-hash owner), spill (owner past the load
//	    bound: the next on the ring), session (header), load (least loaded),
//	    retry (the first pick refused the connection or broke it before
//	    answering)
//	aiinference_router_prefix_blocks_total{namespace,name}
//	aiinference_router_prefix_hit_blocks_total{namespace,name}
//	    estimated hit share = hit_blocks / blocks
//	aiinference_router_ttft_seconds{namespace,name,endpoint}   histogram
//	aiinference_router_queue_seconds{namespace,name}           histogram
//	aiinference_router_waiting_requests{namespace,name}        gauge: held
//	    for want of a serving replica; the autoscaler's signal at zero (sum
//	    over router pods), as aiinference_activator_held_requests is today
//	aiinference_router_in_flight_requests{namespace,name,endpoint} gauge
//	aiinference_router_upstream_errors_total{namespace,name,endpoint,kind}
//	    kind: refused, broken, server_error (a 5xx held back), silent (no
//	    streamed headers in time): tried again on another within the retry
//	    budget; failed
//	aiinference_router_ready_endpoints{namespace,name}          gauge
//	aiinference_router_ejected_endpoints{namespace,name,endpoint} gauge: 1
//	    while out of the picking for failing (outlier detection)
//	aiinference_router_ejections_total{namespace,name,endpoint}
//	aiinference_router_shed_requests_total{namespace,name,priority,reason}
//	    429 while saturated; reason: saturated (Sheddable), queue_full,
//	    for_room (a queued one shed for a more urgent or shorter-queued one)
//	aiinference_router_refused_requests_total{namespace,name,reason}
//	    429 for a share of the router's bounds; reason: requests, bodies
//
// Load generator for comparisons: package test/routingbench (a chat-shaped
// workload of tenants with long shared system prompts and multi-turn
// conversations, a runner that sends it to a list of base URLs round robin or
// to one URL, and a report of TTFT p50/p90/p99, output tokens/s, failures and
// the sims' prefix hit share); `go test ./test/routingbench -run
// TestCompareRouting -v` prints round robin and the router side by side on
// local simulators.
package router
