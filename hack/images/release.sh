#!/usr/bin/env bash
# `make images`: the operator's, the model loader's and the router's images for linux/amd64 and
# linux/arm64, with no Docker daemon and no registry: static binaries on a base
# built here (CA certificates from Debian's ca-certificates package, a non-root
# user), each image as an OCI layout, a tar of it and one docker tarball per
# platform, with an SPDX SBOM per image and platform (hack/images/release.go).
# The images are tagged with the version `manager --version` prints.
#
# Usage: hack/images/release.sh [OUT]   (default bin/images)
# Reproducible: the same sources give the same digests (SOURCE_DATE_EPOCH, default 0).
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(mkdir -p "${1:-$root/bin/images}" && cd "${1:-$root/bin/images}" && pwd)
cache_root=${AIINFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aiinference-operator}
platforms=${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}

# Debian's ca-certificates, downloaded once per version into the cache.
ca_version=$(apt-cache policy ca-certificates | awk '/Candidate:/ {print $2}')
if [ -z "$ca_version" ] || [ "$ca_version" = "(none)" ]; then
	apt-get update -qq >&2
	ca_version=$(apt-cache policy ca-certificates | awk '/Candidate:/ {print $2}')
fi
ca_dir="$cache_root/debs/ca-certificates-$ca_version"
if [ ! -d "$ca_dir/usr/share/ca-certificates" ]; then
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get download -qq "ca-certificates=$ca_version" >&2 2>/dev/null || apt-get download "ca-certificates=$ca_version" >&2)
	mkdir -p "$ca_dir.tmp"
	dpkg-deb -x "$tmp"/ca-certificates_*.deb "$ca_dir.tmp"
	rm -rf "$tmp" "$ca_dir"
	mv "$ca_dir.tmp" "$ca_dir"
fi

# Static, trimmed binaries per platform: the same sources give the same bytes.
bins="$out/bin"
for platform in $platforms; do
	goos=${platform%/*} goarch=${platform#*/}
	for cmd in manager model-loader router; do
		(cd "$root" && CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch go build -trimpath -buildvcs=false -ldflags "-s -w" \
			-o "$bins/$goos-$goarch/$cmd" "./cmd/$cmd")
	done
done

host="$(go env GOOS)-$(go env GOARCH)"
version=$("$bins/$host/manager" --version)
for cmd in model-loader router; do
	[ "$("$bins/$host/$cmd" --version)" = "$version" ] || { echo "release.sh: manager and $cmd disagree on the version" >&2; exit 1; }
done

writer="$out/.image-writer"
(cd "$root/hack/images" && CGO_ENABLED=0 go build -trimpath -o "$writer" .)
for image in operator:manager model-loader:model-loader router:router; do
	name=${image%%:*} cmd=${image#*:}
	args=()
	for platform in $platforms; do args+=(--binary "$platform=$bins/${platform/\//-}/$cmd"); done
	"$writer" release --name "$name" --repository "aiinference/$name" --version "$version" \
		--entrypoint "/$cmd" --ca-dir "$ca_dir" --ca-version "$ca_version" --out "$out" "${args[@]}"
done
echo "Images in $out: <name>.oci (OCI layout), <name>.oci.tar, <name>-<os>-<arch>.docker.tar, <name>-<os>-<arch>.spdx.json" >&2
