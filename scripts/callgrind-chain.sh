#!/usr/bin/env bash
# Instructions per proxied request (callgrind, user space) for: Sluice with no plugin, Sluice with
# key-auth + limit-count + prometheus, and nginx as a plain keep-alive proxy, by one method:
# one worker, a 1 KiB mock on 127.0.0.1:1980, 2,000 warm-up requests, then `h2load --h1 -n 20000 -c 8`.
# Needs: a release build (make build), valgrind, h2load (nghttp2-client), nginx, curl.
# Usage: scripts/callgrind-chain.sh [OUTDIR]
set -euo pipefail
B=${SLUICE_BIN:-$(pwd)/target/release/sluice}
OUT=${1:-/tmp/sluice-callgrind}
N=20000
rm -rf "$OUT"; mkdir -p "$OUT"
"$B" mock --listen 127.0.0.1:1980 --body-size 1024 > "$OUT/mock.log" 2>&1 & mock=$!
trap 'kill $mock 2>/dev/null || true' EXIT

measure() { # name port header command...
  local name=$1 port=$2 hdr=$3; shift 3
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.cg" "$@" > "$OUT/$name.log" 2>&1 & local vp=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null -H "$hdr" "http://127.0.0.1:$port/hello" && break; sleep 0.3; done
  h2load --h1 -n 2000 -c 8 -H "$hdr" "http://127.0.0.1:$port/hello" > /dev/null 2>&1
  callgrind_control -z $vp > /dev/null 2>&1
  h2load --h1 -n $N -c 8 -H "$hdr" "http://127.0.0.1:$port/hello" > "$OUT/$name.h2load" 2>&1
  callgrind_control -d $vp > /dev/null 2>&1
  sleep 1; kill $vp; wait $vp 2>/dev/null || true
  local ok; ok=$(grep -oE '[0-9]+ 2xx' "$OUT/$name.h2load" | cut -d' ' -f1)
  local ir; ir=$(grep -E '^summary:' "$OUT/$name.cg.1" | awk '{print $2}')
  printf '%-22s %8d instructions/request  (%s of %s answered 2xx)\n' "$name" $((ir / N)) "$ok" "$N"
}

sluice_conf() { # name port plugins
  local d="$OUT/$1"; mkdir -p "$d"
  cat > "$d/config.yaml" <<EOC
apisix: {node_listen: [{ip: 127.0.0.1, port: $2}], ssl: {enable: false}}
nginx_config: {worker_processes: 1}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
plugin_attr: {prometheus: {enable_export_server: false}}
EOC
  cat > "$d/apisix.yaml" <<EOC
routes:
  - {id: 1, uri: /hello, plugins: $3, upstream: {type: roundrobin, nodes: {"127.0.0.1:1980": 1}, keepalive_pool: {size: 1024, requests: 1000000}}}
consumers:
  - {username: jack, plugins: {key-auth: {key: auth-one}}}
#END
EOC
  echo "$d/config.yaml"
}

measure sluice-no-plugin 19081 "X-A: b" "$B" start -c "$(sluice_conf none 19081 '{}')"
measure sluice-3-plugins 19082 "apikey: auth-one" "$B" start -c "$(sluice_conf plugins 19082 \
  '{"key-auth": {}, "limit-count": {"count": 2000000000, "time_window": 60, "rejected_code": 503, "key": "remote_addr"}, "prometheus": {}}')"

mkdir -p "$OUT/nginx"/{tmp-body,tmp-proxy,tmp-fcgi,tmp-uwsgi,tmp-scgi}
cat > "$OUT/nginx/nginx.conf" <<EOC
worker_processes 1; daemon off; master_process off;
pid $OUT/nginx/nginx.pid; error_log $OUT/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off; keepalive_requests 1000000;
  client_body_temp_path $OUT/nginx/tmp-body; proxy_temp_path $OUT/nginx/tmp-proxy;
  fastcgi_temp_path $OUT/nginx/tmp-fcgi; uwsgi_temp_path $OUT/nginx/tmp-uwsgi; scgi_temp_path $OUT/nginx/tmp-scgi;
  upstream backend { server 127.0.0.1:1980; keepalive 64; keepalive_requests 1000000; }
  server { listen 127.0.0.1:19083;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
EOC
measure nginx-plain-proxy 19083 "X-A: b" nginx -p "$OUT/nginx" -c "$OUT/nginx/nginx.conf"
