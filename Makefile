# AIInference operator. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

CONTROLLER_GEN ?= go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
# Real kube-apiserver, etcd and kubectl for envtest, built from the Go module proxy
# into a cache outside the repository (hack/tools/build.sh).
ENVTEST_ASSETS = $(shell hack/tools/build.sh envtest)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
# The webhook certificate's permissions (internal/webhook's markers) are a role of
# their own in config/webhook, which config/certmanager removes.
manifests: ## Generate the CRD, RBAC and webhook manifests under config/ (and copy what the chart shares)
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./internal/controller/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=webhook-cert-role webhook paths="./internal/webhook/..." output:rbac:artifacts:config=config/webhook output:webhook:artifacts:config=config/webhook
	cp config/crd/bases/serving.aiinference.io_aiinferences.yaml charts/aiinference-operator/files/crd.yaml
	cp config/prometheus/podmonitor.yaml config/prometheus/router_podmonitor.yaml config/prometheus/prometheusrule.yaml charts/aiinference-operator/files/
	go run ./hack/apidocs

.PHONY: api-docs
api-docs: ## Generate docs/api-reference.md from the CRD (make manifests runs it too; a test fails when it is stale)
	go run ./hack/apidocs

.PHONY: argocd-cm
argocd-cm: ## Generate the argocd-cm snippet (Argo CD health and actions for AIInference) from integrations/argocd (a test fails when it is stale)
	go run ./hack/argocdcm

.PHONY: gitops-capture
gitops-capture: ## Capture the Argo CD and Flux testdata from the operator on envtest (integrations/argocd, CAPTURE=1)
	CAPTURE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./integrations/argocd/ -run TestCapture -count=1 -v

.PHONY: generate
generate: ## Generate DeepCopy methods
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## gofmt every Go file (both modules)
	gofmt -w .

.PHONY: vet
vet: ## go vet
	go vet ./...

.PHONY: build
build: ## Build the operator, the model loader and the kubectl plugin (kubectl-aii) into bin/
	go build -o bin/manager ./cmd/manager
	go build -o bin/model-loader ./cmd/model-loader
	go build -o bin/kubectl-aii ./cmd/kubectl-aii

.PHONY: images
images: ## Build the operator's and the model loader's OCI images (amd64, arm64) into bin/images, no Docker needed
	hack/images/release.sh bin/images

.PHONY: run
# The operator serves its metrics over HTTPS, to a bearer token the API server
# lets GET /metrics (docs/metrics.md); run prints how to make and use one.
run: ## Run the operator against the cluster of the current KUBECONFIG (metrics: https://localhost:8443/metrics, with a token)
	@echo 'Metrics: https://localhost:8443/metrics, for a token allowed to GET /metrics. To read them:'
	@echo '  kubectl create clusterrole aiinference-metrics-reader --verb=get --non-resource-url=/metrics  # config/default has it'
	@echo '  kubectl create serviceaccount aiinference-metrics-reader -n default'
	@echo '  kubectl create clusterrolebinding aiinference-metrics-reader --clusterrole=aiinference-metrics-reader --serviceaccount=default:aiinference-metrics-reader'
	@echo '  curl -k -H "Authorization: Bearer $$(kubectl create token aiinference-metrics-reader -n default)" https://localhost:8443/metrics'
	go run ./cmd/manager

.PHONY: install
install: ## Install the CRD into the cluster of the current KUBECONFIG
	kubectl apply --server-side -f config/crd/bases

##@ Test

# The real-node tests (pods run for real by a kubelet, containerd and runc) need
# root and cgroup v1 (docs/real-node.md). make test runs them where the host can,
# installing the Debian packages they need as root, and elsewhere skips them and
# says why at its end; REQUIRE_REAL_NODE=1 (CI sets it) makes such a host fail.
REQUIRE_REAL_NODE ?= 0

.PHONY: tools
tools: ## Build (or reuse) every real binary and image the tests need (a real node's where the host can run one)
	hack/tools/build.sh envtest cluster s3 registry images helm keda lws karmada >/dev/null
	if [ "$(REQUIRE_REAL_NODE)" = 1 ] || hack/real-node-host.sh 2>/dev/null; then hack/tools/build.sh node traefik netpol >/dev/null; fi
	if [ "$$(id -u)" = 0 ] || command -v promtool >/dev/null; then hack/tools/build.sh promtool >/dev/null; fi

# Test binaries that run at once: two, the cores.
TEST_PARALLEL ?= 2
# Test binaries are linked without DWARF (-w): linking some twenty binaries of
# 80-100 MB took about 120 CPU-s of make test's 550, and a test binary needs its
# symbol table (kept) for stack traces, not debugging information.
TEST_LDFLAGS ?= -w

.PHONY: test
# What the host cannot run (the real-node tests without root and cgroup v1, the
# promtool checks without root to install promtool) is skipped and named at the
# end; REQUIRE_REAL_NODE=1 runs the real-node tests anyway, which then fail and
# name the missing piece. vet and the image builder's tests run beside the
# packages without a local cluster; the three packages that start local
# clusters (kwok and real nodes; Karmada and its members) run after them, alone: beside the router's and the
# routing bench's simulators, real-node pods went a minute without an address
# and a restarted kube-apiserver died (TestRealNodeModelCacheFaults,
# TestRealNodeFailureReasons, TestChaosOperatorKilledWhileItWorks failed in
# fresh-clone make test runs and passed alone).
test: tools ## Everything CI runs: gofmt, vet, unit, envtest integration, loader, end-to-end and (root, cgroup v1) real-node tests
	status=0; real_node=1; skipped=(); \
	if [ "$(REQUIRE_REAL_NODE)" != 1 ] && ! why=$$(hack/real-node-host.sh 2>&1); then \
		real_node=0; \
		skipped+=("the real-node tests (TestRealNode* of test/localcluster and test/e2e). $$why. They run as root on a cgroup v1 host (docs/real-node.md); REQUIRE_REAL_NODE=1 makes this a failure"); \
	fi; \
	if ! command -v promtool >/dev/null; then \
		skipped+=("the promtool checks (metric names, alert rules, dashboard queries): promtool is not installed, and installing it (apt-get install prometheus) needs root"); \
	fi; \
	for s in "$${skipped[@]}"; do echo "make test: skipping $$s" >&2; done; \
	unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then echo "make test: not formatted (make fmt):" $$unformatted >&2; status=1; fi; \
	go vet ./... & vet=$$!; \
	(cd hack/images && go test ./... -count=1 -timeout 5m && cd ../tinymodel && go test ./... -count=1 -timeout 5m) & images=$$!; \
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -p $(TEST_PARALLEL) -ldflags='$(TEST_LDFLAGS)' $$(go list ./... | grep -v -e '/test/e2e$$' -e '/test/localcluster$$' -e '/test/multicluster$$') -count=1 -timeout 30m || status=1; \
	wait $$vet || status=1; \
	wait $$images || status=1; \
	LOCALCLUSTER_REAL_NODE=$$real_node KARMADA_E2E=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -p $(TEST_PARALLEL) -ldflags='$(TEST_LDFLAGS)' ./test/e2e ./test/localcluster ./test/multicluster -count=1 -timeout 45m || status=1; \
	for s in "$${skipped[@]}"; do echo "make test: SKIPPED $$s" >&2; done; \
	exit $$status

.PHONY: test-karmada
test-karmada: ## The multi-cluster tests: two local clusters joined to a real Karmada (builds Karmada first: about 20 minutes once)
	hack/tools/build.sh cluster karmada >/dev/null
	KARMADA_E2E=1 go test ./test/multicluster/ -count=1 -timeout 20m -v

.PHONY: test-e2e
test-e2e: ## Only the end-to-end tests on a local cluster with simulated GPU nodes
	go test ./test/e2e/... -count=1 -timeout 30m -v

.PHONY: test-real-node
test-real-node: ## Only the tests that run pods on a real node of the local cluster (root, cgroup v1)
	LOCALCLUSTER_REAL_NODE=1 go test ./test/localcluster -run 'TestRealNode' -count=1 -timeout 30m -v

##@ Demo

.PHONY: demo
demo: ## Local GPU cluster + operator + samples, shown going Pending -> Loading -> Ready
	hack/demo.sh

.PHONY: demo-tour
demo-tour: ## Run docs/demo.md's walkthrough (node cache, NetworkPolicy, scale to zero) on the running demo
	hack/demo-tour.sh

.PHONY: demo-down
demo-down: ## Stop the demo's operator and local cluster
	hack/demo.sh down

##@ Local cluster

LOCALCLUSTER_NODES ?= config/localcluster/nodepool.yaml

.PHONY: cluster-up
cluster-up: ## Start the local cluster with simulated GPU nodes in the background (LOCALCLUSTER_NODES=file)
	go run ./cmd/localcluster up --nodes $(LOCALCLUSTER_NODES)

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove its files
	go run ./cmd/localcluster down

##@ Loader

.PHONY: bench-scale
bench-scale: ## The operator at N objects beside plain Deployments on the local cluster (BENCH_SCALE_ARGS="-n 100,1000")
	go run ./test/scale $(BENCH_SCALE_ARGS)

.PHONY: bench-autoscale
bench-autoscale: tools ## The autoscaler: on a real node a step of load to a second replica and back, and from zero through the Service, beside the pod's own cold start (root, cgroup v1); a sawtooth load's changes per period
	LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeAutoscaler(FollowsAStepOfLoad|ScalesFromZero)$$' -count=1 -timeout 20m -v \
		| grep -E 'autoscale figure|^(--- |ok|FAIL)'
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./internal/controller/aiinference/integration/ -run 'TestSawtoothLoad' -count=1 -timeout 10m -v \
		| grep -E 'autoscale figure|^(--- |ok|FAIL)'

.PHONY: bench-gateway
bench-gateway: tools ## A canary's split through a real Gateway (Traefik) to real-node pods: the share at each step, failed requests during promotion, abort and a canary with no ready pod (root, cgroup v1)
	LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeGatewayCarriesTheCanarySplit' -count=1 -timeout 20m -v \
		| grep -E 'gateway figure|^(--- |ok|FAIL)'

.PHONY: bench-cache
bench-cache: tools ## The node-local model cache: a replica's start with a cold and a warm node cache for a 256 MiB and a 2 GiB model, beside the engine's own start, and the store bytes each read (root, cgroup v1)
	MODELCACHE_BENCH=1 LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeModelCacheColdAndWarm' -count=1 -timeout 30m -v \
		| grep -E 'cache figure|^(--- |ok|FAIL)'

.PHONY: bench-imagevolume
bench-imagevolume: tools ## A model as an OCI image volume on a real node: a replica's start cold (the node's containerd pulls 256 MiB from a real registry) and warm (root, cgroup v1); make bench-cache gives the loader's beside it
	IMAGEVOLUME_BENCH=1 LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeModelFromAnImageVolume' -count=1 -timeout 20m -v \
		| grep -E 'imagevolume figure|^(--- |ok|FAIL)'

.PHONY: bench-adapters
bench-adapters: tools ## LoRA adapters on a real node: seconds from an adapter added to the spec to its first answer on the running replica, beside a rolling restart for the same change, and the base model's failed requests meanwhile (root, cgroup v1)
	LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeAdaptersLoadWithoutRestart' -count=1 -timeout 20m -v \
		| grep -E 'adapters figure|^(--- |ok|FAIL)'

.PHONY: bench-multinode
bench-multinode: tools ## Replicas that span nodes with the real LeaderWorkerSet controller: on simulated GPU nodes apply -> Ready for 8 groups of two 8-GPU nodes beside 8 one-node replicas, and a lost worker's group back; on the two real nodes (root, cgroup v1) a killed worker's group serving again, a group autoscaled to zero and back with requests held meanwhile, and a second group added on load
	MULTINODE_BENCH=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestBenchMultiNode' -count=1 -timeout 20m -v \
		| grep -E 'multinode figure|^(--- |ok|FAIL)'
	LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeMultiNodeGroupServesAndRecoversAsOne|TestRealNodeAutoscalerScalesAMultiNodeModelFromZeroAsOneGroup|TestRealNodeAutoscalerAddsAGroupOnLoadAndRemovesIt' -count=1 -timeout 20m -v \
		| grep -E 'multinode figure|^(--- |ok|FAIL)'

.PHONY: bench-karmada
bench-karmada: ## Karmada over two local clusters: apply -> aggregated Ready for 4 and 8 replicas beside the same applied to one cluster with the same free GPUs, and a stopped member's replicas Ready on the other (builds Karmada first: about 20 minutes once)
	hack/tools/build.sh cluster karmada >/dev/null
	KARMADA_E2E=1 KARMADA_BENCH=1 go test ./test/multicluster/ -run 'TestBenchKarmada' -count=1 -timeout 20m -v \
		| grep -E 'karmada figure|^(--- |ok|FAIL)'

.PHONY: test-netpol
test-netpol: tools ## NetworkPolicy enforced on a real node (kube-router): an allowed client served, a denied one refused, the loader and the Gateway still through (root, cgroup v1)
	LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeNetworkPolicyIsEnforced' -count=1 -timeout 20m -v \
		| grep -E 'netpol figure|^(--- |ok|FAIL)'

.PHONY: bench-routing
bench-routing: tools ## Routing: a chat workload (testdata) at a sweep of rates; 4 simulators round robin against the router and the bound (one simulator with all the cache), and the router's own cost; then on the real nodes (root, cgroup v1) 4 simulator pods, and 4 Ollama pods (real compute, prompt-heavy and answer-heavy shapes), through their Service (kube-proxy), the Gateway (Traefik) and the router, beside the bound
	ROUTING_BENCH=1 go test ./test/routingbench/ -run 'TestBenchRouting' -count=1 -timeout 60m -v \
		| grep -E 'routing (bench|figure)|^(routing|round robin|router|bound) |^(--- |ok|FAIL)'
	ROUTING_BENCH=1 LOCALCLUSTER_REAL_NODE=1 KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test ./test/e2e/ -run 'TestRealNodeRoutingBench|TestRealNodeOllamaRoutingBench' -count=1 -timeout 90m -v \
		| grep -E 'routing (bench|figure)|^(routing|service|gateway|router|bound) |^(--- |ok|FAIL)'

.PHONY: bench-router-faults
bench-router-faults: tools ## The router as its own process in a 512Mi memory cgroup (root, cgroup v1; else GOMEMLIMIT only) under attacks and faults: peak RSS against the limit (refused and held 8 MiB bodies, huge /metrics and response headers), another tenant's success beside a body trickle, failed and lost requests with a fast-failing or silent replica of four beside all healthy, a tenant's TTFT p90 beside a flood against alone, sheddable against critical 429s (simulators)
	ROUTERFAULTS_FLOW=1 go test ./test/routerfaults/ -count=1 -timeout 15m -v \
		| grep -E '^routerfaults|^(--- |ok|FAIL)|^    --- |^    [a-z_]+_test\.go:[0-9]+: '

.PHONY: bench-sources
bench-sources: ## The loader's throughput from a real OCI registry beside a real S3 server, through the same remote-store-shaped link (BENCH_SOURCES_ARGS="-shards 8 -shard-mib 512")
	hack/tools/build.sh s3 registry >/dev/null
	go run ./test/bench/sources $(BENCH_SOURCES_ARGS)

.PHONY: bench-loader
bench-loader: ## The model loader against rclone: through a remote-store-shaped link, then on loopback (4.3 GB tree, cached; BENCH_LOADER_ARGS="-runs 5")
	go run ./test/loaderbench $(BENCH_LOADER_ARGS)
