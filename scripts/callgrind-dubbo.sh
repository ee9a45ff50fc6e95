#!/usr/bin/env bash
# Instructions per request (callgrind, user space, all of Sluice's threads) of dubbo-proxy's generic call in the
# shape of dubbo-go-pixiu's benchmark: POST {"types":"object","values":{"name":"tc"}} to a `generic: true` route,
# one worker, the dubbo-go provider of the `dubbo` bench scenario on an ephemeral loopback port, 2,000 warm-up
# requests, then `h2load --h1 -n 20000 -c 20`. Needs: a release build (non-LTO gives readable profiles:
# CARGO_PROFILE_RELEASE_LTO=false cargo build --release -p sluice), the provider built by `sluice bench -s dubbo`
# (or PROVIDER=path), valgrind, h2load, curl.
# Usage: scripts/callgrind-dubbo.sh [OUTDIR]      (callgrind_annotate OUTDIR/sluice.cg.1 | head -60 for the profile)
set -euo pipefail
T=${CARGO_TARGET_DIR:-$(pwd)/target}
B=${SLUICE_BIN:-$T/release/sluice}
PROVIDER=${PROVIDER:-$T/sluice-bench-tools/dubbo/bin/provider}
OUT=${1:-/tmp/sluice-callgrind-dubbo}
N=${N:-20000}
rm -rf "$OUT"; mkdir -p "$OUT"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PP=$(port); SP=$(port)
"$PROVIDER" "$PP" > "$OUT/provider.log" 2>&1 & prov=$!
vp=
trap 'kill $prov ${vp:-} 2>/dev/null || true' EXIT
cat > "$OUT/config.yaml" <<EOC
apisix: {node_listen: [{ip: 127.0.0.1, port: $SP}], ssl: {enable: false}}
nginx_config: {worker_processes: 1, http: {enable_access_log: false}}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
EOC
cat > "$OUT/apisix.yaml" <<EOC
routes:
  - id: 1
    uri: /api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService
    plugins: {dubbo-proxy: {service_name: org.apache.dubbo.backend.DemoService, service_version: 1.0.0, generic: true}}
    upstream: {type: roundrobin, nodes: {"127.0.0.1:$PP": 1}}
#END
EOC
printf '%s' '{"types":"object","values":{"name":"tc"}}' > "$OUT/body.json"
URL="http://127.0.0.1:$SP/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService?version=1.0.0&method=hello"
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PP) 2>/dev/null && break; sleep 0.3; done
valgrind --tool=callgrind --callgrind-out-file="$OUT/sluice.cg" "$B" start -c "$OUT/config.yaml" > "$OUT/sluice.log" 2>&1 & vp=$!
for _ in $(seq 1 100); do curl -s -o /dev/null -f -X POST -H 'Content-Type: application/json' -d @"$OUT/body.json" "$URL" && break; sleep 0.5; done
curl -sS -X POST -H 'Content-Type: application/json' -d @"$OUT/body.json" "$URL"; echo
H=(-H 'Content-Type: application/json' -d "$OUT/body.json")
h2load --h1 -n 2000 -c 20 "${H[@]}" "$URL" > /dev/null 2>&1
callgrind_control -z $vp > /dev/null 2>&1
h2load --h1 -n "$N" -c 20 "${H[@]}" "$URL" > "$OUT/h2load.txt" 2>&1
callgrind_control -d $vp > /dev/null 2>&1
sleep 1
ok=$(grep -oE '[0-9]+ 2xx' "$OUT/h2load.txt" | cut -d' ' -f1)
ir=$(grep -hE '^summary:' "$OUT"/sluice.cg.* | awk '{s+=$2} END {print s}')
printf 'dubbo-proxy generic: %d instructions/request  (%s of %s answered 2xx)\n' $((ir / N)) "$ok" "$N"
