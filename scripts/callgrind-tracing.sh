#!/usr/bin/env bash
# Instructions per proxied request (callgrind, user space, every thread of the gateway: the span exporter's
# encoding and POSTs included) for one route with: no plugin, opentelemetry sampling every request, opentelemetry
# sampling none (propagation only), zipkin sampling every request, zipkin sampling none. Same method as
# scripts/callgrind-chain.sh: one worker, a 1 KiB mock on 127.0.0.1:1980, 2,000 warm-up requests, then
# `h2load --h1 -n 20000 -c 8`. Spans go to the test trace receiver (tools/trace-receiver) on 127.0.0.1:4318 and
# :9411; the script prints how many spans each one received.
# Needs: a release build (make build), valgrind, h2load (nghttp2-client), curl, Go (builds the receiver).
# Usage: scripts/callgrind-tracing.sh [OUTDIR]   (ports 1980, 4318, 9411, 19081-19085 must be free)
set -euo pipefail
B=${SLUICE_BIN:-$(pwd)/target/release/sluice}
OUT=${1:-/tmp/sluice-callgrind-tracing}
N=20000
rm -rf "$OUT"; mkdir -p "$OUT"
(cd crates/sluice-proxy/tools/trace-receiver && go build -o "$OUT/trace-receiver" .)
"$B" mock --listen 127.0.0.1:1980 --body-size 1024 > "$OUT/mock.log" 2>&1 & mock=$!
# The receivers exit when their stdin ends: a FIFO whose only writer is this script (fd 3).
mkfifo "$OUT/hold"
"$OUT/trace-receiver" -listen 127.0.0.1:4318 < "$OUT/hold" > "$OUT/otlp.log" 2>&1 & otlp=$!
"$OUT/trace-receiver" -listen 127.0.0.1:9411 < "$OUT/hold" > "$OUT/zipkin.log" 2>&1 & zipkin=$!
exec 3> "$OUT/hold"
trap 'exec 3>&-; kill $mock $otlp $zipkin 2>/dev/null || true' EXIT
for p in 4318 9411; do
  for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$p/api/traces" && break; sleep 0.1; done
done

spans() { # receiver port -> spans received so far
  curl -s "http://127.0.0.1:$1/api/traces" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]))'
}

measure() { # name port command...
  local name=$1 port=$2; shift 2
  local before_o before_z; before_o=$(spans 4318); before_z=$(spans 9411)
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.cg" "$@" > "$OUT/$name.log" 2>&1 & local vp=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$port/hello" && break; sleep 0.3; done
  h2load --h1 -n 2000 -c 8 "http://127.0.0.1:$port/hello" > /dev/null 2>&1
  callgrind_control -z $vp > /dev/null 2>&1
  h2load --h1 -n $N -c 8 "http://127.0.0.1:$port/hello" > "$OUT/$name.h2load" 2>&1
  # The exporter's last batches are part of the cost: let them go before the dump.
  sleep 3
  callgrind_control -d $vp > /dev/null 2>&1
  sleep 1; kill $vp; wait $vp 2>/dev/null || true
  local ok; ok=$(grep -oE '[0-9]+ 2xx' "$OUT/$name.h2load" | cut -d' ' -f1)
  local ir; ir=$(grep -E '^summary:' "$OUT/$name.cg.1" | awk '{print $2}')
  printf '%-24s %8d instructions/request  (%s of %s answered 2xx; spans received: otlp %d, zipkin %d)\n' \
    "$name" $((ir / N)) "$ok" "$N" $(($(spans 4318) - before_o)) $(($(spans 9411) - before_z))
}

sluice_conf() { # name port plugins
  local d="$OUT/$1"; mkdir -p "$d"
  cat > "$d/config.yaml" <<EOC
apisix: {node_listen: [{ip: 127.0.0.1, port: $2}], ssl: {enable: false}}
nginx_config: {worker_processes: 1}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
plugin_attr:
  prometheus: {enable_export_server: false}
  opentelemetry: {collector: {address: "127.0.0.1:4318"}, batch_span_processor: {max_queue_size: 65536}}
EOC
  cat > "$d/apisix.yaml" <<EOC
routes:
  - {id: 1, uri: /hello, plugins: $3, upstream: {type: roundrobin, nodes: {"127.0.0.1:1980": 1}, keepalive_pool: {size: 1024, requests: 1000000}}}
#END
EOC
  echo "$d/config.yaml"
}

ZIP='"endpoint": "http://127.0.0.1:9411/api/v2/spans"'
measure no-plugin 19081 "$B" start -c "$(sluice_conf none 19081 '{}')"
measure otel-sampled 19082 "$B" start -c "$(sluice_conf otel-on 19082 '{"opentelemetry": {"sampler": {"name": "always_on"}}}')"
measure otel-unsampled 19083 "$B" start -c "$(sluice_conf otel-off 19083 '{"opentelemetry": {}}')"
measure zipkin-sampled 19084 "$B" start -c "$(sluice_conf zipkin-on 19084 "{\"zipkin\": {$ZIP, \"sample_ratio\": 1}}")"
measure zipkin-unsampled 19085 "$B" start -c "$(sluice_conf zipkin-off 19085 "{\"zipkin\": {$ZIP, \"sample_ratio\": 0.00001}}")"
