#!/usr/bin/env bash
# Instructions per proxied request (callgrind, user space) for: Sluice with no plugin, Sluice with
# key-auth + limit-count + prometheus, and nginx as a plain keep-alive proxy, by one method:
# one worker, a 1 KiB mock on 127.0.0.1:1980, a warm-up, then a counted load of 8 keep-alive connections; access log
# off in both (nginx `access_log off`, Sluice `enable_access_log: false`).
# Needs: a release build (make build), valgrind, h2load (nghttp2-client) or wrk, nginx, curl.
# Usage: [CLIENT=h2load|wrk] [SPREAD=N] [WARM=S] scripts/callgrind-chain.sh [OUTDIR]
#   CLIENT=h2load (default): `h2load --h1 -n 20000 -c 8` after 2,000 warm-up requests.
#   CLIENT=wrk: `wrk -t1 -c8 -d${SECS:-15}s` after a ${WARM:-2} s warm-up; requests = wrk's own count (wrk sends
#     only Host and the one extra header, so its heads differ from h2load's).
#   SPREAD=N (wrk only; e.g. 100): N routes /r/0../r/N-1 and N consumers; the plugin run spreads requests over
#     every route and every key (a wrk Lua script), the no-plugin and nginx runs over every path. Under valgrind
#     the default 2 s warm-up sends fewer than N x N requests at N=100, so the counted run still meets label sets
#     prometheus has not seen (each a registry insert); WARM=8 covers a whole lap first (steady state).
set -euo pipefail
B=${SLUICE_BIN:-$(pwd)/target/release/sluice}
OUT=${1:-/tmp/sluice-callgrind}
N=20000
CLIENT=${CLIENT:-h2load}
SPREAD=${SPREAD:-0}
SECS=${SECS:-15}
WARM=${WARM:-2}
if [ "$SPREAD" -gt 0 ] && [ "$CLIENT" != wrk ]; then echo "SPREAD needs CLIENT=wrk" >&2; exit 2; fi
rm -rf "$OUT"; mkdir -p "$OUT"
"$B" mock --listen 127.0.0.1:1980 --body-size 1024 > "$OUT/mock.log" 2>&1 & mock=$!
trap 'kill $mock 2>/dev/null || true' EXIT

# wrk Lua: every request picks the next path (and, with keys, the next key) round-robin; N routes x N keys
# visited in a pattern that pairs every route with every key over N*N requests.
cat > "$OUT/spread.lua" <<EOL
local n, i, keys = $SPREAD, 0, false
function init(args) keys = args[1] == "keys" end
function request()
  local r, k = i % n, math.floor(i / n) % n
  i = i + 1
  local h = {}
  if keys then h["apikey"] = "auth-" .. k end
  return wrk.format("GET", "/r/" .. r, h)
end
EOL

load() { # port header phase(warm|run) [keys]
  local port=$1 hdr=$2 phase=$3 keys=${4:-}
  if [ "$CLIENT" = wrk ]; then
    local d=$SECS; [ "$phase" = warm ] && d=$WARM
    if [ "$SPREAD" -gt 0 ]; then
      wrk -t1 -c8 -d"${d}s" -s "$OUT/spread.lua" "http://127.0.0.1:$port/" -- $keys
    else
      wrk -t1 -c8 -d"${d}s" -H "$hdr" "http://127.0.0.1:$port/hello"
    fi
  else
    local n=$N; [ "$phase" = warm ] && n=2000
    h2load --h1 -n $n -c 8 -H "$hdr" "http://127.0.0.1:$port/hello"
  fi
}

measure() { # name port header keys command...
  local name=$1 port=$2 hdr=$3 keys=$4; shift 4
  local probe=/hello; [ "$SPREAD" -gt 0 ] && probe=/r/0
  valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$OUT/$name.cg" "$@" > "$OUT/$name.log" 2>&1 & local vp=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null -H "$hdr" "http://127.0.0.1:$port$probe" && break; sleep 0.3; done
  load "$port" "$hdr" warm "$keys" > /dev/null 2>&1
  callgrind_control -z $vp > /dev/null 2>&1
  load "$port" "$hdr" run "$keys" > "$OUT/$name.load" 2>&1
  callgrind_control -d $vp > /dev/null 2>&1
  sleep 1; kill $vp; wait $vp 2>/dev/null || true
  local ok n
  if [ "$CLIENT" = wrk ]; then
    n=$(grep -oE '^ *[0-9]+ requests in' "$OUT/$name.load" | awk '{print $1}' || true)
    local bad; bad=$(grep -oE 'Non-2xx or 3xx responses: [0-9]+' "$OUT/$name.load" | awk '{print $NF}' || true)
    ok=$((n - ${bad:-0}))
  else
    n=$N; ok=$(grep -oE '[0-9]+ 2xx' "$OUT/$name.load" | cut -d' ' -f1)
  fi
  local ir; ir=$(grep -E '^summary:' "$OUT/$name.cg.1" | awk '{print $2}')
  printf '%-22s %8d instructions/request  (%s of %s answered 2xx/3xx; %s)\n' "$name" $((ir / n)) "$ok" "$n" "$CLIENT"
}

sluice_conf() { # name port plugins
  local d="$OUT/$1"; mkdir -p "$d"
  cat > "$d/config.yaml" <<EOC
apisix: {node_listen: [{ip: 127.0.0.1, port: $2}], ssl: {enable: false}}
nginx_config: {worker_processes: 1, http: {enable_access_log: false}}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
plugin_attr: {prometheus: {enable_export_server: false}}
EOC
  local up='upstream: {type: roundrobin, nodes: {"127.0.0.1:1980": 1}, keepalive_pool: {size: 1024, requests: 1000000}}'
  {
    echo "routes:"
    if [ "$SPREAD" -gt 0 ]; then
      for i in $(seq 0 $((SPREAD - 1))); do echo "  - {id: $((i + 1)), uri: /r/$i, plugins: $3, $up}"; done
      echo "consumers:"
      for i in $(seq 0 $((SPREAD - 1))); do echo "  - {username: c$i, plugins: {key-auth: {key: auth-$i}}}"; done
    else
      echo "  - {id: 1, uri: /hello, plugins: $3, $up}"
      echo "consumers:"
      echo "  - {username: jack, plugins: {key-auth: {key: auth-one}}}"
    fi
    echo "#END"
  } > "$d/apisix.yaml"
  echo "$d/config.yaml"
}

measure sluice-no-plugin 19081 "X-A: b" "" "$B" start -c "$(sluice_conf none 19081 '{}')"
measure sluice-3-plugins 19082 "apikey: auth-one" keys "$B" start -c "$(sluice_conf plugins 19082 \
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
measure nginx-plain-proxy 19083 "X-A: b" "" nginx -p "$OUT/nginx" -c "$OUT/nginx/nginx.conf"
