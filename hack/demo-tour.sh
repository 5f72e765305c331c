#!/usr/bin/env bash
# Runs the shell blocks of docs/demo.md, in order, against the running demo
# (make demo): the walkthrough works as written, or this stops at the first
# command that does not.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tour=$(awk '/^```sh$/ {inside = 1; next} /^```$/ {inside = 0; next} inside' docs/demo.md)
exec bash -euo pipefail -x -c "$tour"
