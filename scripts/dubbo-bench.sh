#!/usr/bin/env bash
# HTTP -> Dubbo through Sluice, shaped as dubbo-go-pixiu's benchmark (wrk -c20 -t2, POST with a
# {"types","values"} body to a generic call; see docs/plugins/dubbo-proxy.md): Sluice's and the provider's CPU µs
# per request, and a direct run is not included (no Go client here yet).
# usage: scripts/dubbo-bench.sh [duration=10s]     (needs target/release/sluice, Go >= 1.25, wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-10s}
W=$(mktemp -d /tmp/sluice-dubbo-bench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
export PATH=/usr/local/go/bin:$PATH
(cd crates/sluice-proxy/tools/dubbo-go-peer && GOFLAGS=-mod=mod go build -o "$W/provider" .)
"$W/provider" 20991 >"$W/provider.log" 2>&1 & PP=$!
mkdir -p "$W/conf"
cat >"$W/conf/config.yaml" <<YAML
apisix:
  node_listen: 19080
  enable_admin: false
nginx_config:
  worker_processes: 1
deployment:
  role: data_plane
  role_data_plane:
    config_provider: yaml
YAML
cat >"$W/conf/apisix.yaml" <<YAML
routes:
  - id: pixiu-shape
    uri: /api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService
    plugins:
      dubbo-proxy:
        service_name: org.apache.dubbo.backend.DemoService
        service_version: 1.0.0
        generic: true
    upstream:
      type: roundrobin
      nodes:
        "127.0.0.1:20991": 1
#END
YAML
target/release/sluice start -c "$W/conf/config.yaml" >"$W/sluice.log" 2>&1 & SP=$!
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/20991) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/19080) 2>/dev/null && break; sleep 0.2; done
URL='http://127.0.0.1:19080/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService?version=1.0.0&method=hello'
curl -s -X POST "$URL" -H 'Content-Type: application/json' -d '{"types":"object","values":{"name":"tc"}}'; echo
cat >"$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"types":"object","values":{"name":"tc"}}'
wrk.headers["Content-Type"] = "application/json"
LUA
wrk -d3s -c20 -t2 -s "$W/post.lua" "$URL" >/dev/null
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
HZ=$(getconf CLK_TCK)
s0=$(ticks $SP); p0=$(ticks $PP)
wrk -d"$D" -c20 -t2 --latency -s "$W/post.lua" "$URL" | tee "$W/wrk.txt"
s1=$(ticks $SP); p1=$(ticks $PP)
req=$(awk '/requests in/{print $1}' "$W/wrk.txt")
awk -v r="$req" -v s="$((s1-s0))" -v p="$((p1-p0))" -v hz="$HZ" 'BEGIN {
  printf "requests %d  sluice CPU us/req %.1f  provider CPU us/req %.1f\n", r, s*1e6/hz/r, p*1e6/hz/r }'
