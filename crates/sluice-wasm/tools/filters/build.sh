#!/usr/bin/env bash
# Builds every filter in assembly/ into OUT/<name>.wasm with the pinned AssemblyScript (run after `npm ci`).
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
for f in assembly/*.ts; do
  n=$(basename "$f" .ts)
  node_modules/.bin/asc "$f" -b "$out/$n.wasm" --use abort=abort_proc_exit -O3 --noAssert >/dev/null 2>"$out/$n.log" \
    || { cat "$out/$n.log" >&2; exit 1; }
done
