#!/usr/bin/env python3
"""Route-scale measurement (issue 16 item 1): memory and write latency of a traditional-mode gateway (embedded
store) holding N routes.

Phases, each reported with the gateway's RSS (VmRSS from /proc, MiB):
  idle     the gateway started with an empty store
  load     N routes loaded: `--load yaml` seeds apisix.yaml on first start (timed to ready), `--load admin`
           sends them in one `PUT /apisix/admin/configs` (timed to its answer, and to `/r/<N>` being routed)
  settled  RSS again 5 s after the load
  writes   W sequential `PUT /apisix/admin/routes/<id>?wait=applied` (each timed end to end by this client:
           median, p90, max), changing the upstream node weight (`--change upstream`) or the uri
           (`--change uri`) of existing routes spread over the id range, or adding new routes (`--change add`:
           ids `zz<n>`, after every existing id in the store's order; `--change add-mid`: ids `<i>-n<n>`, in the
           middle), or deleting routes spread over the id range (`--change delete`, DELETE ...?wait=applied)
  churn    C more such writes, then RSS again (the "flat across writes" check)

Usage: scripts/route-scale.py [--bin target/release/sluice] [--routes 100000] [--writes 50] [--churn 0]
                              [--load yaml|admin] [--upstreams 1] [--keep DIR]
Prints one line per phase and a JSON summary on the last line. Binds ephemeral loopback ports, works in a temp dir.
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KEY = "route-scale-admin-key-1c9e"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def cpu_s(pid):
    """CPU seconds (user + system, every thread) the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


DISTINCT = 1  # --upstreams


def node_of(i, upstream):
    """Route i's node: the one upstream, or one of DISTINCT loopback addresses (127.x.y.z refuses at once)."""
    if DISTINCT <= 1:
        return upstream
    k = i % DISTINCT
    return f"127.{(k >> 16) & 255}.{(k >> 8) & 255}.{(k & 255)}:{upstream.rsplit(':', 1)[1]}" if k else upstream


def route(i, upstream, port_bump=0):
    uri = "/hello" if i == 1 else f"/r/{i}"
    return {"uri": uri, "upstream": {"type": "roundrobin", "nodes": {node_of(i, upstream): 1 + port_bump}}}


def admin(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if body is None or isinstance(body, bytes) else json.dumps(body)
    c.request(method, path, body=data, headers={"X-API-KEY": KEY, "Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def wait_ready(port, proc, limit):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"gateway exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/apisix/admin/routes/1", headers={"X-API-KEY": KEY})
            r = c.getresponse()
            r.read()
            if r.status in (200, 404):
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit("gateway not ready")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/sluice")
    ap.add_argument("--routes", type=int, default=100_000)
    ap.add_argument("--writes", type=int, default=50)
    ap.add_argument("--churn", type=int, default=0)
    ap.add_argument("--load", choices=["yaml", "admin"], default="yaml")
    ap.add_argument("--change", choices=["upstream", "uri", "add", "add-mid", "delete"], default="upstream",
                    help="what each write does: change a route's node weight (matching unchanged) or uri, add a "
                         "route (after the existing ids, or among them), delete one")
    ap.add_argument("--upstreams", type=int, default=1,
                    help="distinct inline upstreams over the routes (route i gets node i mod N; default 1: every "
                         "route names the same node, as most large configurations do; equal inline upstreams are "
                         "shared by the gateway, distinct ones are not)")
    ap.add_argument("--keep", help="work directory to use and keep (default: a temp dir, removed)")
    a = ap.parse_args()
    global DISTINCT
    DISTINCT = a.upstreams

    work = a.keep or tempfile.mkdtemp(prefix="route-scale-")
    os.makedirs(work, exist_ok=True)
    shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
    port, admin_port = free_port(), free_port()
    upstream = f"127.0.0.1:{free_port()}"  # never dialled: only writes and memory are measured
    with open(os.path.join(work, "config.yaml"), "w") as f:
        f.write(
            f"apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n"
            "  enable_control: false\n  ssl:\n    enable: false\nnginx_config:\n  worker_processes: 1\n  http:\n    enable_access_log: false\n"
            "deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n"
            f"  admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n"
            f"    admin_key:\n      - name: admin\n        key: {KEY}\n        role: admin\n"
            "plugin_attr:\n  prometheus:\n    enable_export_server: false\nsluice:\n  data_dir: data\n"
        )
    seed = os.path.join(work, "apisix.yaml")
    if a.load == "yaml":
        with open(seed, "w") as f:
            f.write("routes:\n")
            for i in range(1, a.routes + 1):
                r = route(i, upstream)
                f.write(f"  - id: {i}\n    uri: {r['uri']}\n    upstream:\n      type: roundrobin\n"
                        f"      nodes:\n        \"{node_of(i, upstream)}\": 1\n")
            f.write("#END\n")
    elif os.path.exists(seed):
        os.remove(seed)
    summary = {"routes": a.routes, "load": a.load, "change": a.change, "upstreams": a.upstreams}
    log = open(os.path.join(work, "sluice.log"), "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([os.path.abspath(a.bin), "start", "-c", os.path.join(work, "config.yaml")],
                            cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_ready(admin_port, proc, 300)
        if a.load == "admin":
            time.sleep(1.0)
            summary["idle_rss_mib"] = round(rss_mib(proc.pid), 1)
            summary["threads"] = threads(proc.pid)
            print(f"idle: rss {summary['idle_rss_mib']} MiB, {summary['threads']} threads", flush=True)
            doc = {"routes": [dict(route(i, upstream), id=str(i)) for i in range(1, a.routes + 1)]}
            # Serialized before the clock starts: the client's own encoding is not the gateway's time.
            doc = json.dumps(doc).encode()
            cpu0 = cpu_s(proc.pid)
            t = time.monotonic()
            st, body = admin(admin_port, "PUT", "/apisix/admin/configs?wait=applied", doc, timeout=600)
            summary["load_s"] = round(time.monotonic() - t, 3)
            # The gateway's CPU for the load (every thread): steadier than the wall clock on a busy machine.
            summary["load_cpu_s"] = round(cpu_s(proc.pid) - cpu0, 3)
            if st >= 300:
                sys.exit(f"bulk load failed: {st} {body[:300]!r}")
            # End to end: from the request to the last route answering on the proxy (502: its upstream is never
            # up; 404 would mean not routed yet).
            while time.monotonic() - t < 600:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("GET", f"/r/{a.routes}")
                code = c.getresponse().status
                c.close()
                if code != 404:
                    break
                time.sleep(0.001)
            summary["served_s"] = round(time.monotonic() - t, 3)
        else:
            summary["load_s"] = round(time.monotonic() - t0, 3)
        time.sleep(1.0)
        summary["loaded_rss_mib"] = round(rss_mib(proc.pid), 1)
        print(f"load: {a.routes} routes via {a.load} in {summary['load_s']} s "
              f"(gateway CPU {summary.get('load_cpu_s', '-')} s) "
              f"(last route served after {summary.get('served_s', '-')} s; ready after {ready:.2f} s), "
              f"rss {summary['loaded_rss_mib']} MiB", flush=True)
        # The gateway hands a large apply's freed peak back to the OS a moment after it (issue 16): RSS once settled.
        time.sleep(4.0)
        summary["settled_rss_mib"] = round(rss_mib(proc.pid), 1)
        print(f"settled: rss {summary['settled_rss_mib']} MiB 5 s after the load", flush=True)

        def put(n, k):
            i = 1 + (n * 7919) % a.routes
            method, body = "PUT", route(i, upstream, k)
            if a.change == "uri":
                body["uri"] = f"/w/{n}"
            elif a.change in ("add", "add-mid"):
                body["uri"] = f"/new/{n}"
                i = f"zz{n}" if a.change == "add" else f"{i}-n{n}"
            elif a.change == "delete":
                method, body = "DELETE", None
            t = time.monotonic()
            st, out = admin(admin_port, method, f"/apisix/admin/routes/{i}?wait=applied", body)
            dt = time.monotonic() - t
            if st >= 300:
                sys.exit(f"{method} routes/{i}: {st} {out[:300]!r}")
            return dt

        times = [put(n, 1 + n % 5) for n in range(a.writes)]
        if times:
            times.sort()
            summary["put_ms"] = {
                "median": round(statistics.median(times) * 1000, 2),
                "p90": round(times[int(len(times) * 0.9) - 1 if len(times) >= 10 else -1] * 1000, 2),
                "max": round(times[-1] * 1000, 2),
                "n": len(times),
            }
        time.sleep(0.5)
        summary["after_writes_rss_mib"] = round(rss_mib(proc.pid), 1)
        print(f"writes: {a.writes} PUTs ?wait=applied: {summary.get('put_ms')}, "
              f"rss {summary['after_writes_rss_mib']} MiB", flush=True)
        if a.churn:
            t = time.monotonic()
            for n in range(a.churn):
                put(a.writes + n, 1 + n % 5)
            summary["churn_s"] = round(time.monotonic() - t, 2)
            time.sleep(0.5)
            summary["after_churn_rss_mib"] = round(rss_mib(proc.pid), 1)
            print(f"churn: {a.churn} more PUTs in {summary['churn_s']} s, rss {summary['after_churn_rss_mib']} MiB",
                  flush=True)
        with open("/proc/loadavg") as f:
            summary["loadavg"] = f.read().split()[:3]
        summary["pid"] = proc.pid
        if os.environ.get("ROUTE_SCALE_HOLD"):
            print(f"holding gateway pid {proc.pid} for {os.environ['ROUTE_SCALE_HOLD']} s", flush=True)
            time.sleep(float(os.environ["ROUTE_SCALE_HOLD"]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
