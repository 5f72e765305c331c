#!/usr/bin/env bash
# The demo: a local cluster with simulated GPU nodes, the operator running against
# it, and the samples going Pending -> Loading -> Ready. Safe to run again.
#   hack/demo.sh        bring it all up (make demo)
#   hack/demo.sh down   stop the operator and the cluster (make demo-down)
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
state_dir=${AIINFERENCE_DEMO_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/aiinference-operator/localcluster}
operator_pid_file="$state_dir/operator.pid"
operator_log="$state_dir/operator.log"
namespace=demo
# The operator runs on the host as if in this namespace, where the router runs.
operator_namespace=aiinference-system

stop_operator() {
	if [ -f "$operator_pid_file" ]; then
		local pid
		pid=$(cat "$operator_pid_file")
		# Only end the process we started: check it is our operator binary.
		if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$root/bin/manager"; then
			kill "$pid" 2>/dev/null || true
			for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		fi
		rm -f "$operator_pid_file"
	fi
}

# gateway_pod asks the Gateway for one completion and prints the pod that
# answered (the simulator's x-inference-pod header), or nothing.
gateway_pod() {
	curl -sS --max-time 5 -o /dev/null -D - "$GATEWAY_URL/v1/completions" -H 'Content-Type: application/json' \
		-d '{"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4}' 2>/dev/null |
		tr -d '\r' | awk 'tolower($1) == "x-inference-pod:" {print $2}'
}

# canary_split shows the Gateway carrying tiny-real's canary split: a new
# revision starts as a canary at 20% (its first step, paused), 100 completions
# go through the Gateway, counted by the pod that answered; then the spec goes
# back to the stable revision and the canary is removed.
canary_split() {
	local revision="[{\"name\": \"POD_NAME\", \"valueFrom\": {\"fieldRef\": {\"fieldPath\": \"metadata.name\"}}}"
	echo
	echo "==> tiny-real's canary through the Gateway (Traefik at $GATEWAY_URL): a new revision at 20%"
	kubectl patch aii tiny-real -n "$namespace" --type=merge \
		-p "{\"spec\": {\"engine\": {\"env\": $revision, {\"name\": \"DEMO_REVISION\", \"value\": \"$(date +%s)\"}]}}}" >/dev/null
	kubectl wait aii/tiny-real -n "$namespace" --for=jsonpath='{.status.rollout.weight}'=20 --timeout=120s >/dev/null
	local deadline=$((SECONDS + 120))
	until gateway_pod | grep -q '^tiny-real-canary-'; do
		if [ $SECONDS -ge $deadline ]; then
			echo "No canary pod answered through the Gateway within 2 minutes; see kubectl aii status tiny-real -n $namespace" >&2
			exit 1
		fi
		sleep 0.5
	done
	local canary=0 stable=0 failed=0 pod
	for _ in $(seq 1 100); do
		pod=$(gateway_pod)
		case "$pod" in
		tiny-real-canary-*) canary=$((canary + 1)) ;;
		tiny-real-*) stable=$((stable + 1)) ;;
		*) failed=$((failed + 1)) ;;
		esac
	done
	echo "100 completions through the Gateway at the canary's weight of 20%: canary $canary, stable $stable, failed $failed"
	echo "==> Back to the stable revision: the canary is removed"
	kubectl patch aii tiny-real -n "$namespace" --type=merge -p "{\"spec\": {\"engine\": {\"env\": $revision]}}}" >/dev/null
	kubectl wait aii/tiny-real -n "$namespace" --for=condition=Ready --timeout=120s >/dev/null
	kubectl get aii tiny-real -n "$namespace"
}

# apply_real_node_sample applies a sample for the real node with the values of
# the cluster (localcluster env) in place of its ${VARIABLES}.
apply_real_node_sample() {
	local sample var
	sample=$(cat "$1")
	for var in OBJECT_STORE_MODEL_BYTES OBJECT_STORE_BUCKET OBJECT_STORE_MODEL_PREFIX OBJECT_STORE_ENDPOINT IMAGE_LLM_D_INFERENCE_SIM \
		OBJECT_STORE_GGUF_PREFIX OBJECT_STORE_GGUF_BYTES IMAGE_OLLAMA GATEWAY_NAME GATEWAY_NAMESPACE; do
		sample=${sample//"\${$var}"/${!var}}
	done
	echo "$sample" | kubectl apply -n "$namespace" -f -
}

# install_router installs the router as the chart does (router.enabled), on
# the real node, into the operator's namespace, and waits for it.
install_router() {
	local helm_dir values
	helm_dir=$(hack/tools/build.sh helm)
	values=$(mktemp)
	cat >"$values" <<VALUES
router:
  enabled: true
  image: {repository: "${IMAGE_ROUTER%:*}", tag: "${IMAGE_ROUTER##*:}"}
  replicas: 1
  nodeSelector: {kubernetes.io/hostname: real-1}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
VALUES
	kubectl create namespace "$operator_namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
	"$helm_dir/helm" template aiinference charts/aiinference-operator --namespace "$operator_namespace" \
		--values "$values" --show-only templates/router.yaml | kubectl apply -n "$operator_namespace" -f - >/dev/null
	rm -f "$values"
	kubectl rollout status deployment/aiinference-router -n "$operator_namespace" --timeout=3m >/dev/null
}

if [ "${1:-up}" = down ]; then
	stop_operator
	go run ./cmd/localcluster down --state-dir "$state_dir"
	exit 0
fi

echo "==> Building the operator, the cluster command and the kubectl plugin"
go build -o bin/manager ./cmd/manager
go build -o bin/localcluster ./cmd/localcluster
go build -o bin/kubectl-aii ./cmd/kubectl-aii

# Two real nodes whose pods run for real, with an object store their samples load
# from and a Gateway (Traefik) that carries its canary's split, where the host
# can run one (root, cgroup v1; as root the Debian packages it needs are
# installed first); simulated nodes only where not.
nodes=config/localcluster/nodepool.yaml
store_flags=()
if hack/real-node-host.sh; then
	nodes=config/localcluster/demo-nodepool.yaml
	store_flags=(--object-store-model-bytes $((256 << 20)) --gateway --network-policy --model-cache 1Gi)
else
	echo "==> No real node on this host (see above): the demo runs on simulated nodes only"
fi

echo "==> Starting the local cluster (the first run builds Kubernetes from source: ~20 minutes on 2 cores)"
bin/localcluster up --state-dir "$state_dir" --nodes "$nodes" "${store_flags[@]}"
eval "$(bin/localcluster env --state-dir "$state_dir")"
export KUBECONFIG
PATH="$(hack/tools/build.sh cluster):$PATH"

echo "==> Installing the CRD"
kubectl apply --server-side -f config/crd/bases >/dev/null
kubectl wait --for=condition=Established crd/aiinferences.serving.aiinference.io --timeout=60s >/dev/null
# The canary sample's traffic: the Gateway API's HTTPRoute and the Inference
# Extension's InferencePool, from the module versions in go.mod. The operator
# watches them when they exist at its start.
gateway_api=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
inference_ext=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api-inference-extension)
kubectl apply --server-side -f "$gateway_api/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" \
	-f "$inference_ext/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" >/dev/null
kubectl wait --for=condition=Established crd/httproutes.gateway.networking.k8s.io crd/inferencepools.inference.networking.k8s.io --timeout=60s >/dev/null

echo "==> Starting the operator (log: $operator_log)"
stop_operator
# The loader image built here runs on the real node; simulated nodes run no image.
# With a real node, the activator (which holds the requests of a model at zero)
# listens on the host's address, where the real node's pods and kube-proxy reach
# the host (the object store's address).
activator_flags=()
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ]; then
	host_ip=${OBJECT_STORE_ENDPOINT#*://}
	activator_flags=(--activator-advertise-address="${host_ip%%:*}")
fi
POD_NAMESPACE=$operator_namespace nohup "$root/bin/manager" --metrics-bind-address=0 --health-probe-bind-address=127.0.0.1:0 \
	--loader-image="${IMAGE_MODEL_LOADER:-localcluster.local/model-loader:not-built}" "${activator_flags[@]}" >>"$operator_log" 2>&1 &
echo $! >"$operator_pid_file"

echo "==> Applying the samples in namespace $namespace"
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -f config/localcluster/demo-volume.yaml >/dev/null
kubectl apply -n "$namespace" -k config/samples
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ]; then
	kubectl create secret generic model-store-credentials -n "$namespace" --dry-run=client -o yaml \
		--from-literal=AWS_ACCESS_KEY_ID="$OBJECT_STORE_AWS_ACCESS_KEY_ID" \
		--from-literal=AWS_SECRET_ACCESS_KEY="$OBJECT_STORE_AWS_SECRET_ACCESS_KEY" | kubectl apply -f - >/dev/null
	apply_real_node_sample config/localcluster/demo-real-node.yaml
	echo "==> Installing the router on the real node (the chart's router.yaml), which tiny-ollama's requests go through"
	install_router
	apply_real_node_sample config/localcluster/demo-ollama.yaml
fi

echo "==> Watching them (kubectl get aii -n $namespace)"
last=""
deadline=$((SECONDS + 300))
while :; do
	table=$(kubectl get aii -n "$namespace" 2>&1)
	if [ "$table" != "$last" ]; then
		echo "$table"
		echo
		last=$table
	fi
	if kubectl wait --for=condition=Ready aii --all -n "$namespace" --timeout=1s >/dev/null 2>&1; then
		break
	fi
	if [ $SECONDS -ge $deadline ]; then
		echo "Not Ready after 5 minutes; see kubectl describe aii -n $namespace and $operator_log" >&2
		exit 1
	fi
	sleep 1
done
kubectl get aii -n "$namespace" -o wide
kubectl get pods -n "$namespace" -o wide
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ]; then
	echo
	echo "==> tiny-real ran for real on the real node: its load into the node's cache, and a completion through its Service"
	kubectl get aii tiny-real -n "$namespace" -o jsonpath='{.status.conditions[?(@.type=="ModelLoaded")].message}{"\n"}'
	service_ip=$(kubectl get service tiny-real -n "$namespace" -o jsonpath='{.spec.clusterIP}')
	curl -sS --max-time 10 --retry 5 --retry-all-errors --retry-delay 1 "http://$service_ip:8000/v1/completions" \
		-H 'Content-Type: application/json' -d '{"model": "tiny-llama", "prompt": "Hello", "max_tokens": 8}'
	echo
fi
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ]; then
	echo
	echo "==> tiny-ollama: a real engine (Ollama, llama.cpp on CPU) on the generated model, through the router"
	echo "    (random weights: the words are computed, token by token, but mean nothing; docs/ollama.md)"
	service_ip=$(kubectl get service tiny-ollama -n "$namespace" -o jsonpath='{.spec.clusterIP}')
	service_port=$(kubectl get service tiny-ollama -n "$namespace" -o jsonpath='{.spec.ports[0].port}')
	curl -sS --max-time 60 --retry 5 --retry-all-errors --retry-delay 1 -D - "http://$service_ip:$service_port/v1/chat/completions" \
		-H 'Content-Type: application/json' \
		-d '{"model": "tiny-chat", "messages": [{"role": "user", "content": "Tell me about war and peace."}], "max_tokens": 16}' |
		tr -d '\r' | grep -iE '^x-aiinference-endpoint:|^\{'
	echo
	bin/kubectl-aii status tiny-ollama -n "$namespace"
fi
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ] && [ -n "${GATEWAY_URL:-}" ]; then
	canary_split
fi
if [ -n "${OBJECT_STORE_ENDPOINT:-}" ]; then
	echo
	echo "==> tiny-zero: the same model on the real node, which goes to zero after a minute idle (docs/demo.md)"
	apply_real_node_sample config/localcluster/demo-scale-to-zero.yaml
	kubectl wait aii/tiny-zero -n "$namespace" --for=condition=Ready --timeout=3m >/dev/null
	kubectl get aii tiny-zero -n "$namespace"
	kubectl get aii tiny-zero -n "$namespace" -o jsonpath='{.status.conditions[?(@.type=="ModelLoaded")].message}{"\n"}'
fi

cat <<MSG

The cluster and the operator keep running. To use them:
  export KUBECONFIG=$KUBECONFIG
  export PATH=$(hack/tools/build.sh cluster):$root/bin:\$PATH
  kubectl get aii -A
  kubectl aii status -n $namespace llama-chat
The features on the real node, step by step: docs/demo.md (make demo-tour runs it)
To stop everything: make demo-down
MSG
