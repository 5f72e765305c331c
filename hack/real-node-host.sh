#!/usr/bin/env bash
# Can this host run real nodes (root, cgroup v1 and overlay: docs/real-node.md)?
# make tools, make test and make demo ask here. Exit status 0 when it can; as
# root it first installs the Debian packages a real node needs that are missing
# (apt-get, through hack/tools/build.sh node-packages). Otherwise exit status 1,
# having said why on stderr.
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/.."
go build -o bin/localcluster ./cmd/localcluster
status=0
why=$(bin/localcluster check-real-node 2>&1) || status=$?
case $status in
0) ;;
3)
	# Root, cgroup v1 and overlay are there; only packages are missing.
	echo "==> Installing the Debian packages a real node needs (hack/tools/build.sh node-packages)" >&2
	hack/tools/build.sh node-packages >/dev/null
	bin/localcluster check-real-node || exit 1
	;;
*)
	echo "$why" >&2
	exit 1
	;;
esac
