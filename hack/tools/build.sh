#!/usr/bin/env bash
# Builds the real binaries that tests, benchmarks and the local cluster run
# (kube-apiserver, etcd, kwok, versitygw, rclone, ...) from the Go module proxy,
# into a cache folder outside the repository, keyed by the pinned version.
# A binary already in the cache is reused, so only the first run pays the build.
#
# Usage: hack/tools/build.sh GROUP...   (groups: envtest cluster s3 rclone all)
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

# build MODULE_DIR MODULE PACKAGE BINARY: build one binary into the versioned cache folder.
build() {
	local dir=$1 module=$2 pkg=$3 bin=$4
	local version out
	version=$(version_of "$dir" "$module")
	[ -n "$version" ] || { echo "build.sh: no version of $module in $dir/go.mod" >&2; exit 1; }
	out="$cache_root/bin/$dir-$version"
	if [ ! -x "$out/$bin" ]; then
		mkdir -p "$out"
		echo "Building $bin $version into $out (first run only; this can take minutes)" >&2
		# Build to a temporary name and rename, so a killed build never leaves a half binary.
		(cd "$tools_dir/$dir" && CGO_ENABLED=0 go build -trimpath -o "$out/.$bin.$$.tmp" "$pkg")
		mv "$out/.$bin.$$.tmp" "$out/$bin"
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

[ $# -gt 0 ] || { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
for group in "$@"; do
	case "$group" in
	envtest | cluster | s3 | rclone) last=$("$group") ;;
	all) cluster >/dev/null; s3 >/dev/null; last=$(rclone) ;;
	*) echo "build.sh: unknown group $group" >&2; exit 2 ;;
	esac
done
echo "$last"
