// Live traffic from Sluice's in-process counters: GET /apisix/admin/stats?seconds=900 for the last 15 minutes, then
// GET /apisix/admin/stats/stream (server-sent events, one point per second). EventSource cannot send the X-API-KEY
// header, so the stream is read with fetch() and parsed here; if it drops, the page polls /stats every second.
import { useEffect, useMemo, useRef, useState } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { api, ApiError, BASE, getKey } from "../api";

export interface S {
  req: number; s1xx: number; s2xx: number; s3xx: number; s4xx: number; s5xx: number;
  bytes_in: number; bytes_out: number; lat_p50: number; lat_p99: number; up_p50: number; up_p99: number;
}
export interface Point {
  t: number;
  total: S;
  routes?: Record<string, S>;
  services?: Record<string, S>;
  nodes?: Record<string, S>;
}

const WINDOW = 900;

/** Splits a text/event-stream into events' data (the `data:` lines of each blank-line-terminated block). */
export function sseEvents(buffer: string): [string[], string] {
  const out: string[] = [];
  const blocks = buffer.replace(/\r\n/g, "\n").split("\n\n");
  const rest = blocks.pop() ?? "";
  for (const b of blocks) {
    const data = b
      .split("\n")
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).replace(/^ /, ""))
      .join("\n");
    if (data) out.push(data);
  }
  return [out, rest];
}

function useStats() {
  const [points, setPoints] = useState<Point[]>([]);
  const [state, setState] = useState<"loading" | "live" | "polling" | "unavailable">("loading");
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    let stopped = false;
    const ctl = new AbortController();
    const merge = (more: Point[]) =>
      setPoints((old) => {
        const byT = new Map(old.map((p) => [p.t, p]));
        for (const p of more) byT.set(p.t, p);
        const all = [...byT.values()].sort((a, b) => a.t - b.t);
        return all.slice(-WINDOW);
      });
    const poll = async () => {
      setState("polling");
      while (!stopped) {
        try {
          const r = await api("GET", "/stats?seconds=5");
          merge(r.data?.series ?? []);
        } catch (e) {
          setError(String((e as Error).message));
        }
        await new Promise((r) => setTimeout(r, 1000));
      }
    };
    (async () => {
      try {
        const r = await api("GET", `/stats?seconds=${WINDOW}`);
        merge(r.data?.series ?? []);
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) {
          setState("unavailable");
          return;
        }
        setError(String((e as Error).message));
      }
      try {
        const res = await fetch(`${BASE}/stats/stream`, { headers: { "X-API-KEY": getKey(), Accept: "text/event-stream" }, signal: ctl.signal, cache: "no-store" });
        if (!res.ok || !res.body) throw new Error(`stream: HTTP ${res.status}`);
        setState("live");
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        while (!stopped) {
          const { value, done } = await reader.read();
          if (done) break;
          const [events, rest] = sseEvents(buf + value);
          buf = rest;
          const pts: Point[] = [];
          for (const d of events) {
            try {
              pts.push(JSON.parse(d));
            } catch {
              /* a comment or keep-alive */
            }
          }
          if (pts.length) merge(pts);
        }
      } catch (e) {
        if (stopped) return;
        setError(String((e as Error).message));
      }
      if (!stopped) await poll();
    })();
    return () => {
      stopped = true;
      ctl.abort();
    };
  }, []);
  return { points, state, error };
}

const ZERO: S = { req: 0, s1xx: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, bytes_in: 0, bytes_out: 0, lat_p50: 0, lat_p99: 0, up_p50: 0, up_p99: 0 };

function pick(p: Point, scope: string): S {
  if (scope === "total") return p.total ?? ZERO;
  const [kind, ...rest] = scope.split(":");
  const id = rest.join(":");
  const m = (p as any)[kind] as Record<string, S> | undefined;
  return m?.[id] ?? ZERO;
}

function Chart(props: { title: string; xs: number[]; series: { label: string; values: number[]; stroke: string }[]; unit: string; testId: string }) {
  const el = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const labels = props.series.map((s) => s.label).join("|");
  useEffect(() => {
    const opts: uPlot.Options = {
      width: Math.max(320, (el.current?.clientWidth ?? 600) - 10),
      height: 180,
      legend: { show: true },
      scales: { x: { time: true } },
      axes: [{}, { label: props.unit, size: 60 }],
      series: [{}, ...props.series.map((s) => ({ label: s.label, stroke: s.stroke, width: 1.5, points: { show: false } }))],
    };
    const u = new uPlot(opts, [props.xs, ...props.series.map((s) => s.values)] as uPlot.AlignedData, el.current!);
    plot.current = u;
    return () => u.destroy();
  }, [labels]);
  useEffect(() => {
    plot.current?.setData([props.xs, ...props.series.map((s) => s.values)] as uPlot.AlignedData);
  }, [props.xs, props.series]);
  return (
    <div className="chart" data-testid={props.testId}>
      <h4>{props.title}</h4>
      <div ref={el} />
    </div>
  );
}

export function Traffic() {
  const { points, state, error } = useStats();
  const [scope, setScope] = useState("total");

  const scopes = useMemo(() => {
    const s = new Set<string>();
    for (const p of points.slice(-120))
      for (const kind of ["routes", "services", "nodes"]) for (const id of Object.keys((p as any)[kind] ?? {})) s.add(`${kind}:${id}`);
    return [...s].sort();
  }, [points]);

  const xs = useMemo(() => points.map((p) => p.t), [points]);
  const col = (f: (s: S) => number) => points.map((p) => f(pick(p, scope)));
  const charts = useMemo(
    () => ({
      rps: [{ label: "requests/s", values: col((s) => s.req), stroke: "#2563eb" }],
      status: [
        { label: "2xx", values: col((s) => s.s2xx), stroke: "#16a34a" },
        { label: "3xx", values: col((s) => s.s3xx), stroke: "#0891b2" },
        { label: "4xx", values: col((s) => s.s4xx), stroke: "#d97706" },
        { label: "5xx", values: col((s) => s.s5xx), stroke: "#dc2626" },
        { label: "1xx", values: col((s) => s.s1xx), stroke: "#6b7280" },
      ],
      lat: [
        { label: "p50", values: col((s) => s.lat_p50), stroke: "#2563eb" },
        { label: "p99", values: col((s) => s.lat_p99), stroke: "#7c3aed" },
        { label: "upstream p50", values: col((s) => s.up_p50), stroke: "#16a34a" },
        { label: "upstream p99", values: col((s) => s.up_p99), stroke: "#d97706" },
      ],
      bw: [
        { label: "in", values: col((s) => s.bytes_in), stroke: "#0891b2" },
        { label: "out", values: col((s) => s.bytes_out), stroke: "#7c3aed" },
      ],
    }),
    [points, scope],
  );

  const sum = (f: (s: S) => number, secs: number) => points.slice(-secs).reduce((a, p) => a + f(pick(p, scope)), 0);
  const total = sum((s) => s.req, WINDOW);
  const last60 = sum((s) => s.req, 60);

  // Per route/service/node over the last minute.
  const table = useMemo(() => {
    const acc = new Map<string, S>();
    for (const p of points.slice(-60))
      for (const kind of ["routes", "services", "nodes"])
        for (const [id, s] of Object.entries(((p as any)[kind] ?? {}) as Record<string, S>)) {
          const k = `${kind}:${id}`;
          const a = acc.get(k) ?? { ...ZERO };
          for (const f of ["req", "s2xx", "s4xx", "s5xx", "bytes_in", "bytes_out"] as const) a[f] += s[f] ?? 0;
          a.lat_p99 = Math.max(a.lat_p99, s.lat_p99 ?? 0);
          acc.set(k, a);
        }
    return [...acc.entries()].sort((a, b) => b[1].req - a[1].req);
  }, [points]);

  if (state === "unavailable")
    return (
      <section>
        <h2>Live traffic</h2>
        <p className="muted">This gateway has no /apisix/admin/stats endpoint.</p>
      </section>
    );

  return (
    <section data-testid="traffic">
      <h2>Live traffic</h2>
      <div className="toolbar">
        <span className={`tag ${state}`} data-testid="stream-state">{state}</span>
        <label>
          scope{" "}
          <select value={scope} onChange={(e) => setScope(e.target.value)} data-testid="scope">
            <option value="total">all traffic</option>
            {scopes.map((s) => (
              <option key={s} value={s}>
                {s.replace(":", " ")}
              </option>
            ))}
          </select>
        </label>
        <span>
          requests, last 15 min: <strong data-testid="total-requests">{total}</strong>
        </span>
        <span>
          last minute: <strong data-testid="minute-requests">{last60}</strong>
        </span>
        <span className="muted">{points.length ? `updated ${new Date(points[points.length - 1].t * 1000).toLocaleTimeString()}` : ""}</span>
      </div>
      {error && <div className="error">{error}</div>}
      <div className="charts">
        <Chart title="Requests per second" xs={xs} series={charts.rps} unit="req/s" testId="chart-rps" />
        <Chart title="Status classes" xs={xs} series={charts.status} unit="req/s" testId="chart-status" />
        <Chart title="Latency (ms)" xs={xs} series={charts.lat} unit="ms" testId="chart-latency" />
        <Chart title="Bandwidth (bytes/s)" xs={xs} series={charts.bw} unit="B/s" testId="chart-bandwidth" />
      </div>
      <h3>Last minute by route, service and upstream node</h3>
      <table className="list" data-testid="traffic-table">
        <thead>
          <tr>
            <th>what</th><th>requests</th><th>2xx</th><th>4xx</th><th>5xx</th><th>max p99 ms</th><th>in</th><th>out</th>
          </tr>
        </thead>
        <tbody>
          {table.map(([k, s]) => (
            <tr key={k}>
              <td>
                <button className="link" onClick={() => setScope(k)}>{k.replace(":", " ")}</button>
              </td>
              <td>{s.req}</td><td>{s.s2xx}</td><td>{s.s4xx}</td><td>{s.s5xx}</td><td>{s.lat_p99}</td><td>{s.bytes_in}</td><td>{s.bytes_out}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
