#!/usr/bin/env bash
# L4 (stream) proxy cost: CPU microseconds per short connection and per MB of bulk transfer of Sluice's
# `stream_routes` and HAProxy in `mode tcp`, each with one worker (one thread) in front of the same TCP echo origin,
# measured in one run, side by side:
#   short  N connections (8 at a time): connect, write 16 bytes, read the 16 echoed, close
#   bulk   C connections each writing MB MiB while reading the echo back (so 2 x C x MB MiB cross the proxy)
# CPU = the proxy's process CPU time (utime + stime from /proc/PID/stat, all threads) over the measured run, divided
# by connections or by MiB written by the client (each MiB crosses the proxy twice: up and echoed back). Rounds
# alternate the two proxies so other load on the machine spreads over both; every round is printed.
# The client and the echo origin are Python (their CPU is not counted).
#
# CALLGRIND=1: instead of CPU time, user-space instructions per connection / per MiB, both proxies under valgrind's
# callgrind (counters zeroed after the warm-up, dumped after the run; N=2000, C=2, MB=16, one round by default).
# Instruction counts do not move with other load on the machine; kernel work (the loopback floor) is not in them.
# Each measured dump is kept as OUTDIR/<proxy>-<mode>.callgrind for callgrind_annotate.
#
# Needs: a release build (cargo build --release -p sluice), haproxy, python3 (valgrind for CALLGRIND=1).
# Both proxies run pinned to the CPU(s) PIN (taskset list; default: the last CPU; PIN=none: not pinned), the client
# and the echo origin on the others (CLIENT_PIN; default: every CPU but PIN's).
# Usage: scripts/stream-bench.sh [OUTDIR]   N=20000 C=4 MB=256 ROUNDS=3 BASE=19400 (ports BASE..BASE+9)
set -euo pipefail
OUT=${1:-/tmp/sluice-stream-bench}
CALLGRIND=${CALLGRIND:-0}
if [ "$CALLGRIND" = 1 ]; then N=${N:-2000}; C=${C:-2}; MB=${MB:-16}; ROUNDS=${ROUNDS:-1}; fi
N=${N:-20000}; C=${C:-4}; MB=${MB:-256}; ROUNDS=${ROUNDS:-3}; BASE=${BASE:-19400}
NCPU=$(nproc)
PIN=${PIN:-$((NCPU - 1))}
if [ "$NCPU" -gt 1 ]; then CLIENT_PIN=${CLIENT_PIN:-0-$((NCPU - 2))}; else CLIENT_PIN=${CLIENT_PIN:-none}; fi
TS=(); CTS=()
if [ "$PIN" != none ]; then TS=(taskset -c "$PIN"); fi
if [ "$CLIENT_PIN" != none ]; then CTS=(taskset -c "$CLIENT_PIN"); fi
VG=()
if [ "$CALLGRIND" = 1 ]; then VG=(valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p.out"); fi
SLUICE=${SLUICE:-$(pwd)/target/release/sluice}
rm -rf "$OUT"; mkdir -p "$OUT"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
ECHO=$BASE; SL=$((BASE + 1)); HA=$((BASE + 2))

cat > "$OUT/echo.py" <<'EOP'
import socket, sys, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(4096)
def serve(c):
    try:
        while True:
            b = c.recv(262144)
            if not b: break
            c.sendall(b)
        c.shutdown(socket.SHUT_WR)
    except OSError: pass
    finally: c.close()
while True:
    c, _ = l.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
EOP
cat > "$OUT/load.py" <<'EOP'
import socket, sys, threading
mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
addr = ("127.0.0.1", port)
def short(k):
    for _ in range(k):
        s = socket.create_connection(addr); s.sendall(b"0123456789abcdef"); got = b""
        while len(got) < 16:
            b = s.recv(16 - len(got))
            if not b: raise SystemExit("closed early")
            got += b
        s.close()
def bulk(mib):
    s = socket.create_connection(addr); chunk = b"x" * (1 << 20); total = mib << 20
    def w():
        for _ in range(mib): s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=w); t.start(); got = 0
    while True:
        b = s.recv(1 << 20)
        if not b: break
        got += len(b)
    t.join(); s.close()
    if got != total: raise SystemExit(f"bulk: {got} of {total}")
if mode == "short":
    ts = [threading.Thread(target=short, args=(n // 8,)) for _ in range(8)]
else:
    c, mib = n, int(sys.argv[4]); ts = [threading.Thread(target=bulk, args=(mib,)) for _ in range(c)]
for t in ts: t.start()
for t in ts: t.join()
EOP
"${CTS[@]}" python3 "$OUT/echo.py" $ECHO & pids+=($!)

mkdir -p "$OUT/sluice"
cat > "$OUT/sluice/config.yaml" <<EOC
apisix:
  proxy_mode: stream
  enable_admin: false
  enable_control: false
  stream_proxy: {tcp: ["127.0.0.1:$SL"]}
nginx_config: {worker_processes: 1, http: {enable_access_log: false}}
deployment: {role: data_plane, role_data_plane: {config_provider: yaml}}
plugin_attr: {prometheus: {enable_export_server: false}}
EOC
printf 'stream_routes:\n  - {id: 1, upstream: {type: roundrobin, nodes: {"127.0.0.1:%s": 1}}}\n#END\n' $ECHO \
  > "$OUT/sluice/apisix.yaml"
SLUICE_LOG=error "${TS[@]}" "${VG[@]}" "$SLUICE" start -c "$OUT/sluice/config.yaml" > "$OUT/sluice/log" 2>&1 & pids+=($!); SPID=$!

cat > "$OUT/haproxy.cfg" <<EOC
global
  nbthread 1
  maxconn 4000
defaults
  mode tcp
  timeout connect 60s
  timeout client 600s
  timeout server 600s
frontend f
  bind 127.0.0.1:$HA
  default_backend b
backend b
  server echo 127.0.0.1:$ECHO
EOC
"${TS[@]}" "${VG[@]}" haproxy -db -f "$OUT/haproxy.cfg" > "$OUT/haproxy.log" 2>&1 & pids+=($!); HPID=$!

for p in $ECHO $SL $HA; do
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.05; done
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
# Total Ir of the newest callgrind dump of PID.
irs() { # pid
  local f
  for _ in $(seq 100); do
    f=$(ls -t "$OUT"/cg."$1".out.* 2>/dev/null | head -1)
    if [ -n "$f" ] && grep -q '^totals:' "$f"; then grep '^totals:' "$f" | awk '{print $2}'; return; fi
    sleep 0.1
  done
  echo 0
}
measure() { # name pid port mode -> prints "us per unit"
  local name=$1 pid=$2 port=$3 mode=$4 t0 t1 w0 w1
  if [ "$CALLGRIND" = 1 ]; then
    callgrind_control -z "$pid" > /dev/null 2>&1
    if [ "$mode" = short ]; then "${CTS[@]}" python3 "$OUT/load.py" short "$port" "$N"; else "${CTS[@]}" python3 "$OUT/load.py" bulk "$port" "$C" "$MB"; fi
    rm -f "$OUT"/cg."$pid".out.*; callgrind_control -d "$pid" > /dev/null 2>&1
    local units=$N; [ "$mode" = bulk ] && units=$((C * MB))
    awk -v ir="$(irs "$pid")" -v u="$units" -v n="$name" -v m="$mode" \
      'BEGIN { printf "%-8s %-6s %14d Ir  %12.0f instructions/%s\n", n, m, ir, ir/u, (m=="short"?"conn":"MiB") }'
    # Kept for callgrind_annotate (OUTDIR/<proxy>-<mode>.callgrind).
    cp "$(ls -t "$OUT"/cg."$pid".out.* | head -1)" "$OUT/$name-$mode.callgrind"
    return
  fi
  t0=$(ticks "$pid"); w0=$(date +%s.%N)
  if [ "$mode" = short ]; then "${CTS[@]}" python3 "$OUT/load.py" short "$port" "$N"; else "${CTS[@]}" python3 "$OUT/load.py" bulk "$port" "$C" "$MB"; fi
  t1=$(ticks "$pid"); w1=$(date +%s.%N)
  local units=$N; [ "$mode" = bulk ] && units=$((C * MB))
  awk -v a="$t0" -v b="$t1" -v hz="$TCK" -v u="$units" -v w0="$w0" -v w1="$w1" -v n="$name" -v m="$mode" \
    -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN { printf "%-8s %-6s cpu %7.2f s  wall %6.2f s  %8.2f us/%s  (loadavg %s)\n", n, m, (b-a)/hz, w1-w0, (b-a)/hz*1e6/u, (m=="short"?"conn":"MiB"), l }'
}
# Warm-up.
"${CTS[@]}" python3 "$OUT/load.py" short $SL 800; "${CTS[@]}" python3 "$OUT/load.py" short $HA 800
echo "short: N=$N connections, 8 at a time; bulk: C=$C connections x MB=$MB MiB each way; 1 worker each; proxies on CPU $PIN, clients on $CLIENT_PIN" | tee "$OUT/runs.txt"
for r in $(seq "$ROUNDS"); do
  for mode in short bulk; do
    if [ $((r % 2)) = 1 ]; then order="sluice haproxy"; else order="haproxy sluice"; fi
    for t in $order; do
      if [ $t = sluice ]; then measure sluice $SPID $SL $mode; else measure haproxy $HPID $HA $mode; fi | tee -a "$OUT/runs.txt"
    done
  done
done
