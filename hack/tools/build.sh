#!/usr/bin/env bash
# Builds the real binaries that tests, benchmarks and the local cluster run
# (kube-apiserver, etcd, kwok, versitygw, rclone, ...) from the Go module proxy,
# into a cache folder outside the repository, keyed by the pinned version.
# A binary already in the cache is reused, so only the first run pays the build.
#
# Usage: hack/tools/build.sh GROUP...
#   groups: envtest cluster s3 rclone registry node node-packages coredns sim images tinymodel promtool helm traefik keda lws karmada ollama netpol kube-network-policies all
#   node: kubelet, kube-proxy, containerd, runc and CNI plugins of a real node, and coredns;
#   node-packages: only the Debian packages a real node needs (apt-get, as root);
#   coredns: CoreDNS with the plugins the cluster DNS of the real nodes' pods uses;
#   sim: llm-d-inference-sim; images: the real node's image tarballs (pause, model-loader,
#   llm-d-inference-sim behind fake-vllm, router, ollama behind ollama-start) for `ctr images import`;
#   promtool: Debian's prometheus package (promtool checks metric names and unit-tests the alerts);
#   traefik: the local cluster's Gateway API data plane (docs/gateway.md);
#   keda: KEDA's operator, run on the host by the bring-your-own autoscaler test;
#   lws: the LeaderWorkerSet controller, run on the host for replicas that span nodes;
#   karmada: Karmada's control plane (controller manager, scheduler, webhook,
#   aggregated API server), run on the host by test/multicluster (about 20 minutes the first time);
#   ollama: Ollama, the real CPU engine (llama.cpp), linked statically (about 9 minutes the first time);
#   tinymodel: the GGUF model hack/tinymodel writes (random weights, 43 MB) that Ollama serves in the tests;
#   registry: a real OCI registry (distribution), for the oci model source's tests.
# Prints the folder of the last group built, e.g. for KUBEBUILDER_ASSETS.
# AIINFERENCE_CACHE overrides the cache root (default ~/.cache/aiinference-operator).
set -euo pipefail
shopt -s inherit_errexit

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${AIINFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aiinference-operator}

# version_of MODULE_DIR MODULE: the version pinned in that tools module's go.mod.
version_of() {
	awk -v m="$2" '$1 == "require" {$1 = ""; $0 = $0} $1 == m && $2 ~ /^v/ {print $2; exit}' "$tools_dir/$1/go.mod"
}

# build MODULE_DIR MODULE PACKAGE BINARY [GO_BUILD_FLAG...]: build one binary into
# the versioned cache folder. Static (CGO_ENABLED=0) unless called as cgo=1 build ...;
# called as nice=N build ..., the compiler runs at that niceness.
build() {
	local dir=$1 module=$2 pkg=$3 bin=$4
	shift 4
	local version out
	version=$(version_of "$dir" "$module")
	[ -n "$version" ] || { echo "build.sh: no version of $module in $dir/go.mod" >&2; exit 1; }
	out="$cache_root/bin/$dir-$version"
	if [ ! -x "$out/$bin" ]; then
		mkdir -p "$out"
		# One build of a binary at a time: a second caller (another test package,
		# make tools beside a test) waits for the first and takes its result,
		# rather than compiling the same packages again beside it.
		local lock
		exec {lock}>"$out/.$bin.lock"
		flock "$lock"
		if [ ! -x "$out/$bin" ]; then
			echo "Building $bin $version into $out (first run only; this can take minutes)" >&2
			# Build to a temporary name and rename, so a killed build never leaves a half binary.
			(cd "$tools_dir/$dir" && CGO_ENABLED=${cgo:-0} ${nice:+nice -n "$nice"} go build -trimpath "$@" -o "$out/.$bin.$$.tmp" "$pkg")
			mv "$out/.$bin.$$.tmp" "$out/$bin"
		fi
		exec {lock}>&-
	fi
	echo "$out"
}

# link_into DIR BINARY_PATH...: gather binaries of several groups in one folder.
link_into() {
	local dir=$1
	shift
	mkdir -p "$dir"
	for path in "$@"; do ln -sfn "$path" "$dir/$(basename "$path")"; done
}

kube_version=$(version_of kube k8s.io/kubernetes)
etcd_version=$(version_of etcd go.etcd.io/etcd/server/v3)
kwok_version=$(version_of kwok sigs.k8s.io/kwok)
containerd_version=$(version_of containerd github.com/containerd/containerd/v2)
runc_version=$(version_of runc github.com/opencontainers/runc)
cni_version=$(version_of cni github.com/containernetworking/plugins)
sim_version=$(version_of sim github.com/llm-d/llm-d-inference-sim)
coredns_version=$(version_of coredns github.com/coredns/coredns)
# Without these, the binaries built from the module report v0.0.0-master, which
# a kubelet cannot join a cluster with.
kube_ldflags="-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"

envtest() {
	local kube etcd
	kube=$(build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver)
	build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kubectl kubectl >/dev/null
	etcd=$(build etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 etcd)
	local dir="$cache_root/bin/envtest-$kube_version-etcd-$etcd_version"
	link_into "$dir" "$kube/kube-apiserver" "$kube/kubectl" "$etcd/etcd"
	echo "$dir"
}

cluster() {
	local kube kwok dir
	envtest >/dev/null
	kube=$(build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager)
	build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler >/dev/null
	kwok=$(build kwok sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok kwok)
	dir="$cache_root/bin/cluster-$kube_version-etcd-$etcd_version-kwok-$kwok_version"
	link_into "$dir" "$cache_root/bin/envtest-$kube_version-etcd-$etcd_version"/* \
		"$kube/kube-controller-manager" "$kube/kube-scheduler" "$kwok/kwok"
	echo "$dir"
}

s3() { build versitygw github.com/versity/versitygw github.com/versity/versitygw/cmd/versitygw versitygw; }
rclone() { build rclone github.com/rclone/rclone github.com/rclone/rclone rclone; }
# registry: the reference OCI registry (distribution's cmd/registry), which the
# oci model source's tests and the local cluster's real node pull from.
registry() {
	build distribution github.com/distribution/distribution/v3 github.com/distribution/distribution/v3/cmd/registry registry
}

# apt_install WHAT PACKAGE...: install Debian packages that WHAT needs (as root).
apt_install() {
	local what=$1
	shift
	[ "$(id -u)" = 0 ] || { echo "build.sh: $what needs $* (apt-get install $*, as root)" >&2; exit 1; }
	echo "Installing $* for $what" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq "$@" >&2 || { apt-get update -qq >&2 && apt-get install -y -qq "$@" >&2; }
}

# need_libseccomp: runc's seccomp support links libseccomp through pkg-config.
need_libseccomp() {
	pkg-config --exists libseccomp 2>/dev/null || apt_install runc libseccomp-dev pkg-config
}

# need_iptables: kube-proxy writes the real nodes' Service rules with iptables;
# their teardown deletes the tables iptables-nft made with nft.
need_iptables() {
	{ command -v iptables-restore && command -v nft; } >/dev/null || apt_install kube-proxy iptables nftables
}

# node_packages: what node installs, without building anything.
node_packages() {
	need_libseccomp
	need_iptables
}

node() {
	local kube containerd runc cni bin plugin dir dns
	for bin in containerd containerd-shim-runc-v2 ctr; do
		containerd=$(build containerd github.com/containerd/containerd/v2 "github.com/containerd/containerd/v2/cmd/$bin" "$bin" \
			-tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
			-ldflags "-X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}")
	done
	need_libseccomp
	need_iptables
	runc=$(cgo=1 build runc github.com/opencontainers/runc github.com/opencontainers/runc runc -tags "seccomp urfave_cli_no_docs")
	for plugin in main/bridge main/loopback ipam/host-local meta/portmap; do
		cni=$(build cni github.com/containernetworking/plugins "github.com/containernetworking/plugins/plugins/$plugin" "$(basename "$plugin")")
	done
	# Last: they share most packages with kube-apiserver, so its build makes them quick.
	kube=$(build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kubelet kubelet -ldflags "$kube_ldflags")
	build kube k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-proxy kube-proxy -ldflags "$kube_ldflags" >/dev/null
	# The cluster DNS of the nodes' pods, which the first real node starts.
	dns=$(coredns_tool)
	dir="$cache_root/bin/node-$kube_version-containerd-$containerd_version-runc-$runc_version-cni-$cni_version-coredns-$coredns_version"
	link_into "$dir" "$kube/kubelet" "$kube/kube-proxy" "$containerd/containerd" \
		"$containerd/containerd-shim-runc-v2" "$containerd/ctr" "$runc/runc" "$dns/coredns"
	link_into "$dir/cni" "$cni/bridge" "$cni/loopback" "$cni/host-local" "$cni/portmap"
	echo "$dir"
}

# coredns_tool: CoreDNS, the cluster DNS of the real nodes' pods
# (test/localcluster/dns.go), built from hack/tools/coredns/main.go: CoreDNS's
# main with only the plugins the cluster's Corefile names, which keeps the
# cloud providers' SDKs that its full build links out of it.
coredns_tool() {
	build coredns github.com/coredns/coredns github.com/aiinference/operator/hack/tools/coredns coredns
}

sim() {
	build sim github.com/llm-d/llm-d-inference-sim github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim llm-d-inference-sim
}

# image NAME BINARY USER [TAG_PREFIX [ADDED_BINARY...]]: write the image tarball
# of one static binary, its entrypoint (and any added binaries beside it, at
# /<base name>), named after the content that goes into it (the binaries, the
# image writer's source, the settings), and print its path. The image is
# localcluster.local/NAME:TAG_PREFIX<content key>, so a changed binary gets a new
# image reference. Called as links="/NAME=TARGET ..." image ..., the image holds
# those symbolic links too.
image() {
	local name=$1 binary=$2 user=$3 tag_prefix=${4:-}
	shift 4 2>/dev/null || shift $#
	local key out added=() b l
	for b in "$@"; do added+=(-add "$b"); done
	for l in ${links:-}; do added+=(-link "$l"); done
	key=$({ for b in "$binary" "$@"; do sha256sum <"$b"; done; cat "$images_src"/go.sum "$images_src"/*.go; echo "$user $tag_prefix ${links:-}"; } | sha256sum | cut -c1-16)
	out="$cache_root/images/$name-$key.tar"
	if [ ! -f "$out" ]; then
		mkdir -p "$cache_root/images"
		echo "Writing image localcluster.local/$name:$tag_prefix$key into $out" >&2
		[ -x "$work/image-writer" ] || (cd "$images_src" && CGO_ENABLED=0 go build -trimpath -o "$work/image-writer" .)
		"$work/image-writer" -binary "$binary" "${added[@]}" -tag "localcluster.local/$name:$tag_prefix$key" -user "$user" -out "$out.$$.tmp"
		mv "$out.$$.tmp" "$out"
	fi
	echo "$out"
}

images() {
	local sim_bin ollama_bin ollama_version images_src work pause loader engine router ollama dir
	sim_bin=$(sim)/llm-d-inference-sim
	ollama_bin=$(ollama_tool)/ollama
	ollama_version=$(version_of ollama github.com/ollama/ollama)
	images_src=$(cd "$tools_dir/../images" && pwd)
	work=$(mktemp -d)
	# shellcheck disable=SC2064 # expand work now: it is local to this function.
	trap "rm -rf '$work'" EXIT
	(cd "$images_src" && CGO_ENABLED=0 go build -trimpath -o "$work/pause" ./pause)
	(cd "$images_src" && CGO_ENABLED=0 go build -trimpath -o "$work/fake-vllm" ./fakevllm)
	(cd "$tools_dir/../.." && CGO_ENABLED=0 go build -trimpath -o "$work/model-loader" ./cmd/model-loader)
	(cd "$tools_dir/../.." && CGO_ENABLED=0 go build -trimpath -o "$work/router" ./cmd/router)
	(cd "$tools_dir/../.." && CGO_ENABLED=0 go build -trimpath -o "$work/ollama-start" ./cmd/ollama-start)
	pause=$(image pause "$work/pause" 65535:65535)
	loader=$(image model-loader "$work/model-loader" 65532:65532)
	# The engine image's entrypoint is fake-vllm (hack/images/fakevllm), which
	# drops the few vLLM flags the simulator does not know (--enable-lora, the
	# parallel layout) and runs /llm-d-inference-sim with the rest. Its links
	# are the stand-ins for the vllm-openai image's bash, python3 and ray, for
	# a replica that spans nodes: fake-vllm plays the one it is called as.
	engine=$(links="/bin/bash=/fake-vllm /bash=/fake-vllm /python3=/fake-vllm /ray=/fake-vllm" \
		image llm-d-inference-sim "$work/fake-vllm" 65532:65532 "$sim_version-" "$sim_bin")
	router=$(image router "$work/router" 65532:65532)
	# The Ollama engine image (engine.type Ollama): ollama-start registers the
	# model folder's GGUF file in a store and execs /ollama serve.
	ollama=$(image ollama "$work/ollama-start" 65532:65532 "$ollama_version-" "$ollama_bin")
	dir="$cache_root/images/set-$(basename "$pause" .tar)-$(basename "$loader" .tar)-$(basename "$engine" .tar)-$(basename "$router" .tar)-$(basename "$ollama" .tar)"
	mkdir -p "$dir"
	ln -sfn "$pause" "$dir/pause.tar"
	ln -sfn "$loader" "$dir/model-loader.tar"
	ln -sfn "$engine" "$dir/llm-d-inference-sim.tar"
	ln -sfn "$router" "$dir/router.tar"
	ln -sfn "$ollama" "$dir/ollama.tar"
	echo "$dir"
}

# promtool_dir: the folder of promtool, installed from Debian's prometheus package.
# helm: helm v4 built from its Go module (the chart's lint and template tests);
# -X stamps the version `helm version` prints.
helm_tool() {
	local version
	version=$(version_of helm helm.sh/helm/v4)
	build helm helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm helm -ldflags "-X helm.sh/helm/v4/internal/version.version=$version"
}

# traefik_tool: Traefik v3, the Gateway API implementation the local cluster runs
# on the host (its kubernetesGateway provider); -X stamps `traefik version`.
traefik_tool() {
	local version
	version=$(version_of traefik github.com/traefik/traefik/v3)
	build traefik github.com/traefik/traefik/v3 github.com/traefik/traefik/v3/cmd/traefik traefik \
		-ldflags "-X github.com/traefik/traefik/v3/pkg/version.Version=$version"
}

# netpol_tool: kube-router's network policy controller (its firewall alone:
# iptables and ipset), the local cluster's NetworkPolicy implementation on the
# real nodes (Cluster.StartNetworkPolicy, docs/security.md); it runs the ipset
# command, which node-packages does not install. -X stamps its version.
netpol_tool() {
	local version
	version=$(version_of kube-router github.com/cloudnativelabs/kube-router/v2)
	command -v ipset >/dev/null || apt_install kube-router ipset
	build kube-router github.com/cloudnativelabs/kube-router/v2 github.com/cloudnativelabs/kube-router/v2/cmd/kube-router kube-router \
		-ldflags "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$version"
}

# kube_network_policies_tool: sigs.k8s.io/kube-network-policies, built to verify
# it on this kernel: it queues packets with nftables' queue expression, which
# this kernel lacks (CONFIG_NFT_QUEUE is not set), so it enforces nothing here
# and the local cluster runs kube-router instead (docs/security.md).
kube_network_policies_tool() {
	build kube-network-policies sigs.k8s.io/kube-network-policies sigs.k8s.io/kube-network-policies/cmd kube-network-policies
}

# keda_tool: KEDA's operator (cmd/operator), built in its own tools module that
# repeats KEDA's replaces (k8s.io v0.35, controller-runtime v0.23); TestKEDA
# runs it on the host against the local cluster. -X stamps the version it logs.
keda_tool() {
	local version
	version=$(version_of keda github.com/kedacore/keda/v2)
	build keda github.com/kedacore/keda/v2 github.com/kedacore/keda/v2/cmd/operator keda \
		-ldflags "-X github.com/kedacore/keda/v2/version.Version=$version"
}

# lws_tool: the LeaderWorkerSet controller (sigs.k8s.io/lws's cmd), in its own
# module (k8s.io v0.33, controller-runtime v0.21); the local cluster runs it on
# the host with its webhooks (test/localcluster/lws.go).
lws_tool() {
	local version
	version=$(version_of lws sigs.k8s.io/lws)
	build lws sigs.k8s.io/lws sigs.k8s.io/lws/cmd lws-manager \
		-ldflags "-X sigs.k8s.io/lws/pkg/version.GitVersion=$version"
}

# karmada_tool: Karmada's control plane from its module (github.com/karmada-io/karmada's
# cmd/controller-manager, cmd/scheduler, cmd/webhook, cmd/aggregated-apiserver),
# in its own module (k8s.io v0.34, controller-runtime v0.22); its API server is
# the local cluster's kube-apiserver with an etcd of its own
# (test/localcluster/karmada.go). Built under nice: they are large, and the
# machines here have two cores that other work shares. -X stamps the version
# they log.
karmada_tool() {
	local version out bin
	version=$(version_of karmada github.com/karmada-io/karmada)
	for bin in controller-manager scheduler webhook aggregated-apiserver; do
		out=$(nice=10 build karmada github.com/karmada-io/karmada "github.com/karmada-io/karmada/cmd/$bin" "karmada-$bin" \
			-ldflags "-X github.com/karmada-io/karmada/pkg/version.gitVersion=$version")
	done
	echo "$out"
}

# ollama_tool: Ollama (llama.cpp's CPU backend through cgo), the real engine
# that runs on the real nodes (engine.type Ollama). Linked statically, so its
# image needs no C or C++ runtime beside it; under nice, since its C++ takes
# about 9 minutes of two cores the first time.
ollama_tool() {
	local version
	version=$(version_of ollama github.com/ollama/ollama)
	cgo=1 nice=10 build ollama github.com/ollama/ollama github.com/ollama/ollama ollama \
		-tags netgo,osusergo -ldflags "-X github.com/ollama/ollama/version.Version=${version#v} -linkmode external -extldflags -static"
}

# tinymodel: the GGUF model hack/tinymodel writes at its defaults (random
# weights, Llama 3.2's tokenizer, 43 MB), which engine.type Ollama serves in the
# tests; cached by the generator's source, which fixes its bytes.
tinymodel() {
	local src key out
	src=$(cd "$tools_dir/../tinymodel" && pwd)
	key=$(cat "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
	out="$cache_root/models/tinyllama-random-$key"
	if [ ! -f "$out/model.gguf" ]; then
		mkdir -p "$out"
		echo "Writing the tiny Ollama model into $out (first run only)" >&2
		(cd "$src" && go run . -out "$out/.model.gguf.$$.tmp")
		mv "$out/.model.gguf.$$.tmp" "$out/model.gguf"
	fi
	echo "$out"
}

promtool_dir() {
	command -v promtool >/dev/null || apt_install promtool prometheus
	dirname "$(command -v promtool)"
}

[ $# -gt 0 ] || { sed -n '2,/^# AIINFERENCE_CACHE/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
for group in "$@"; do
	case "$group" in
	envtest | cluster | s3 | rclone | registry | node | sim | images | tinymodel) last=$("$group") ;;
	promtool) last=$(promtool_dir) ;;
	node-packages) node_packages; last="" ;;
	helm) last=$(helm_tool) ;;
	traefik) last=$(traefik_tool) ;;
	netpol) last=$(netpol_tool) ;;
	kube-network-policies) last=$(kube_network_policies_tool) ;;
	keda) last=$(keda_tool) ;;
	lws) last=$(lws_tool) ;;
	coredns) last=$(coredns_tool) ;;
	karmada) last=$(karmada_tool) ;;
	ollama) last=$(ollama_tool) ;;
	all) cluster >/dev/null; s3 >/dev/null; rclone >/dev/null; registry >/dev/null; node >/dev/null; last=$(images) ;;
	*) echo "build.sh: unknown group $group" >&2; exit 2 ;;
	esac
done
echo "$last"
