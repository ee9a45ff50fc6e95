#!/usr/bin/env bash
# HTTP -> Dubbo shaped as dubbo-go-pixiu's benchmark report: now the `dubbo` scenario of `sluice bench`, which
# runs Sluice's dubbo-proxy, dubbo-go-pixiu v1.1.0 and a direct dubbo-go client side by side in one run (see
# docs/benchmark.md, "Dubbo: Sluice, Pixiu and a direct client"). This wrapper only keeps the old entry point.
# usage: scripts/dubbo-bench.sh [duration=10s] [rounds=3]   (needs target/release/sluice, Go, wrk, curl;
#        Pixiu also needs root for `unshare -n` and Debian's zookeeper)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLUICE_BIN:-${CARGO_TARGET_DIR:-target}/release/sluice}
export PATH=/usr/local/go/bin:$PATH
exec "$BIN" bench -s dubbo --duration "${1:-10s}" --warmup 3s --rounds "${2:-3}" --out "${OUT:-bench-out/dubbo}"
