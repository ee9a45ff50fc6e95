#!/usr/bin/env bash
# HTTP/2 front-end cost: requests/s and CPU microseconds per request of Sluice (one or more builds), nginx and
# HAProxy, each with one worker in front of the same `sluice mock` (1 KiB body), measured with h2load in one run:
#   h1      h2load --h1 -c 64 -n N              (HTTP/1.1 keep-alive, 64 connections)
#   h2c     h2load -c 8 -m 8 -n N               (prior knowledge, 8 connections x 8 streams)
#   h1-tls  h2load --h1 -c 64 -n N  https://    (TLS 1.3, ECDSA P-256)
#   h2-tls  h2load -c 8 -m 8 -n N   https://    (ALPN h2)
# CPU us/request = the front end's process CPU time (utime + stime from /proc/PID/stat, all threads) over the
# measured run / requests. Each target gets N/10 warm-up requests per mode first; rounds interleave the targets so
# load from other processes on the machine spreads over all of them. The last table gives min-max over rounds.
#
# Needs: a release build (cargo build --release -p sluice), h2load (nghttp2-client), nginx, haproxy, openssl.
# Usage: scripts/h2-bench.sh [OUTDIR]
#   SLUICE_BINS="before=/path/a after=/path/b"  Sluice builds to compare (default: now=target/release/sluice)
#   N=200000 ROUNDS=3 MODES="h1 h2c h1-tls h2-tls" PEERS=1 (0: Sluice only) BASE=19300 (ports BASE..BASE+29)
#   PERF=1 (default when perf is installed): a syscalls/request column, counted with perf stat
#   CALLGRIND=1: instead, user-space instructions per request of each Sluice build under valgrind's callgrind
#     (needs valgrind; N defaults to 20000 there, after 2,000 warm-up requests), per mode.
set -euo pipefail
OUT=${1:-/tmp/sluice-h2-bench}
CALLGRIND=${CALLGRIND:-0}
if [ "$CALLGRIND" = 1 ]; then N=${N:-20000}; PEERS=0; ROUNDS=1; else N=${N:-200000}; fi
ROUNDS=${ROUNDS:-3}
# Syscalls per request (the kernel half of the CPU figure) with perf's raw_syscalls tracepoint, when perf can
# attach (linux-perf, perf_event_paranoid <= 2 for one's own processes): a load-independent check on the CPU column.
PERF=${PERF:-$(command -v perf > /dev/null 2>&1 && echo 1 || echo 0)}
MODES=${MODES:-"h1 h2c h1-tls h2-tls"}
PEERS=${PEERS:-1}
BASE=${BASE:-19300}
SLUICE_BINS=${SLUICE_BINS:-"now=$(pwd)/target/release/sluice"}
MOCK_BIN=${MOCK_BIN:-${SLUICE_BINS##*=}}
TCK=$(getconf CLK_TCK)
rm -rf "$OUT"; mkdir -p "$OUT"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.local \
  -keyout "$OUT/key.pem" -out "$OUT/cert.pem" > /dev/null 2>&1
cat "$OUT/cert.pem" "$OUT/key.pem" > "$OUT/both.pem"

MOCK=$BASE
"$MOCK_BIN" mock --listen 127.0.0.1:$MOCK --body-size 1024 > "$OUT/mock.log" 2>&1 & pids+=($!)

# target name -> "pid plain-port h2c-port tls-port" (a port may serve both HTTP/1.1 and h2c)
declare -A PID PLAIN H2C TLS
i=0
for spec in $SLUICE_BINS; do
  name=sluice-${spec%%=*}; bin=${spec#*=}; d="$OUT/$name"; mkdir -p "$d"
  p=$((BASE + 10 + 2 * i)); t=$((p + 1)); i=$((i + 1))
  cat > "$d/config.yaml" <<EOC
apisix:
  node_listen: [{ip: 127.0.0.1, port: $p}]
  enable_admin: false
  ssl: {enable: true, listen: [{ip: 127.0.0.1, port: $t}], fallback_sni: bench.local}
nginx_config: {worker_processes: 1, http: {enable_access_log: false}}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
EOC
  {
    echo "routes:"
    echo "  - {id: 1, uri: /hello, upstream: {type: roundrobin, nodes: {\"127.0.0.1:$MOCK\": 1}, keepalive_pool: {size: 1024, requests: 1000000}}}"
    echo "ssls:"
    echo "  - id: bench"
    echo "    sni: bench.local"
    echo "    cert: |"; sed 's/^/      /' "$OUT/cert.pem"
    echo "    key: |"; sed 's/^/      /' "$OUT/key.pem"
    echo "#END"
  } > "$d/apisix.yaml"
  if [ "$CALLGRIND" = 1 ]; then
    valgrind --tool=callgrind --callgrind-out-file="$d/cg" "$bin" start -c "$d/config.yaml" > "$d/out.log" 2>&1 &
  else
    "$bin" start -c "$d/config.yaml" > "$d/out.log" 2>&1 &
  fi
  pids+=($!)
  PID[$name]=$!; PLAIN[$name]=$p; H2C[$name]=$p; TLS[$name]=$t
done

if [ "$PEERS" = 1 ]; then
  d="$OUT/nginx"; mkdir -p "$d"/{tmp-body,tmp-proxy,tmp-fcgi,tmp-uwsgi,tmp-scgi}
  cat > "$d/nginx.conf" <<EOC
worker_processes 1; daemon off; master_process off;
pid $d/nginx.pid; error_log $d/error.log warn;
events { worker_connections 8192; }
http {
  access_log off; keepalive_requests 1000000;
  client_body_temp_path $d/tmp-body; proxy_temp_path $d/tmp-proxy;
  fastcgi_temp_path $d/tmp-fcgi; uwsgi_temp_path $d/tmp-uwsgi; scgi_temp_path $d/tmp-scgi;
  upstream backend { server 127.0.0.1:$MOCK; keepalive 64; keepalive_requests 1000000; }
  ssl_certificate $OUT/cert.pem; ssl_certificate_key $OUT/key.pem;
  server {
    listen 127.0.0.1:$((BASE + 1));
    listen 127.0.0.1:$((BASE + 2)) http2;
    listen 127.0.0.1:$((BASE + 3)) ssl http2;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOC
  nginx -p "$d" -c "$d/nginx.conf" > "$d/out.log" 2>&1 & pids+=($!)
  PID[nginx]=$!; PLAIN[nginx]=$((BASE + 1)); H2C[nginx]=$((BASE + 2)); TLS[nginx]=$((BASE + 3))

  d="$OUT/haproxy"; mkdir -p "$d"
  cat > "$d/haproxy.cfg" <<EOC
global
  nbthread 1
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend h1
  bind 127.0.0.1:$((BASE + 4))
  default_backend be
frontend h2c
  bind 127.0.0.1:$((BASE + 5)) proto h2
  default_backend be
frontend tls
  bind 127.0.0.1:$((BASE + 6)) ssl crt $OUT/both.pem alpn h2,http/1.1
  default_backend be
backend be
  server s1 127.0.0.1:$MOCK
EOC
  haproxy -db -f "$d/haproxy.cfg" > "$d/out.log" 2>&1 & pids+=($!)
  PID[haproxy]=$!; PLAIN[haproxy]=$((BASE + 4)); H2C[haproxy]=$((BASE + 5)); TLS[haproxy]=$((BASE + 6))
fi

targets=$(printf '%s\n' "${!PID[@]}" | sort)
for t in $targets; do
  for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:${PLAIN[$t]}/hello" && break; sleep 0.2; done
  curl -sf -o /dev/null "http://127.0.0.1:${PLAIN[$t]}/hello" || { echo "$t does not answer"; exit 1; }
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

load() { # target mode n -> h2load output
  local t=$1 mode=$2 n=$3
  case $mode in
    h1) h2load --h1 -c 64 -n "$n" "http://127.0.0.1:${PLAIN[$t]}/hello" ;;
    h2c) h2load -c 8 -m 8 -n "$n" "http://127.0.0.1:${H2C[$t]}/hello" ;;
    h1-tls) h2load --h1 -c 64 -n "$n" "https://127.0.0.1:${TLS[$t]}/hello" ;;
    h2-tls) h2load -c 8 -m 8 -n "$n" "https://127.0.0.1:${TLS[$t]}/hello" ;;
  esac
}

if [ "$CALLGRIND" = 1 ]; then
  for t in $targets; do
    for m in $MODES; do
      load "$t" "$m" 2000 > /dev/null 2>&1 || true
      callgrind_control -z "${PID[$t]}" > /dev/null 2>&1
      load "$t" "$m" "$N" > "$OUT/$t.$m.h2load" 2>&1 || true
      callgrind_control --dump="$m" "${PID[$t]}" > /dev/null 2>&1
      ok=$(grep -oE '[0-9]+ 2xx' "$OUT/$t.$m.h2load" | cut -d' ' -f1 || true)
      f=$(ls -t "$OUT/$t"/cg.* | head -1)
      ir=$(grep -E '^summary:' "$f" | awk '{print $2}')
      printf '%-14s %-7s %8d instructions/request  (%s of %s answered 2xx; %s)\n' "$t" "$m" $((ir / N)) \
        "${ok:-0}" "$N" "$f"
    done
  done
  exit 0
fi

printf '%-14s %-7s %5s %10s %10s %9s %s %s\n' target mode round req/s us/req 2xx loadavg syscalls/req \
  | tee "$OUT/runs.txt"
for r in $(seq 1 "$ROUNDS"); do
  for t in $targets; do
    for m in $MODES; do
      load "$t" "$m" $((N / 10)) > /dev/null 2>&1 || true
      c0=$(ticks "${PID[$t]}")
      if [ "$PERF" = 1 ]; then
        perf stat -x, -e raw_syscalls:sys_enter -p "${PID[$t]}" -o "$OUT/perf.txt" 2>/dev/null & pp=$!
        sleep 0.2
      fi
      load "$t" "$m" "$N" > "$OUT/$t.$m.$r.h2load" 2>&1 || true
      c1=$(ticks "${PID[$t]}")
      sc=-
      if [ "$PERF" = 1 ]; then
        kill -INT "$pp" 2>/dev/null; wait "$pp" 2>/dev/null || true
        sc=$(awk -F, -v n="$N" '/raw_syscalls/ && $1 ~ /^[0-9]+$/ {printf "%.2f", $1 / n}' "$OUT/perf.txt")
      fi
      rps=$(grep -oE 'finished in [0-9.]+m?s, [0-9.]+ req/s' "$OUT/$t.$m.$r.h2load" | awk '{print $4}' || true)
      ok=$(grep -oE '[0-9]+ 2xx' "$OUT/$t.$m.$r.h2load" | cut -d' ' -f1 || true)
      us=$(awk -v d=$((c1 - c0)) -v n="$N" -v k="$TCK" 'BEGIN{printf "%.1f", d / k * 1e6 / n}')
      printf '%-14s %-7s %5d %10.0f %10s %9s %s %s\n' "$t" "$m" "$r" "${rps:-0}" "$us" "${ok:-0}" \
        "$(cut -d' ' -f1 /proc/loadavg)" "${sc:--}" | tee -a "$OUT/runs.txt"
    done
  done
done

echo
echo "min-max over $ROUNDS rounds (N=$N; CPU us/request and req/s):" | tee "$OUT/summary.txt"
awk 'NR > 1 {
  k = $1 " " $2
  if (!(k in lo)) { lo[k] = hi[k] = $5; rlo[k] = rhi[k] = $4; order[++n] = k }
  if ($5 < lo[k]) lo[k] = $5; if ($5 > hi[k]) hi[k] = $5
  if ($4 < rlo[k]) rlo[k] = $4; if ($4 > rhi[k]) rhi[k] = $4
  sc[k] = sc[k] (sc[k] == "" ? "" : " ") $8
} END { for (i = 1; i <= n; i++) { k = order[i]; split(k, p, " ")
  printf "%-14s %-7s %6.1f-%-6.1f us/req  %7.0f-%-7.0f req/s  syscalls/req %s\n", p[1], p[2], lo[k], hi[k],
    rlo[k], rhi[k], sc[k] } }' \
  "$OUT/runs.txt" | tee -a "$OUT/summary.txt"
