// Upstream node health (Sluice mirrors the control API's /v1/healthcheck at /apisix/admin/healthcheck) and the
// node's written vs applied revision (/apisix/admin/status). Refreshed every 2 s.
import { useEffect, useState } from "react";
import { api, ApiError } from "../api";

interface Node {
  ip: string;
  port: number;
  status: string;
  counter?: Record<string, number>;
}
interface Checker {
  name: string;
  type: string;
  nodes: Node[];
}

export function Health() {
  const [status, setStatus] = useState<any>(null);
  const [checks, setChecks] = useState<Checker[] | null>(null);
  const [note, setNote] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    let stop = false;
    const load = async () => {
      try {
        setStatus((await api("GET", "/status")).data);
        setError(null);
      } catch (e) {
        setError(String((e as Error).message));
      }
      try {
        const r = await api("GET", "/healthcheck");
        setChecks(Array.isArray(r.data) ? r.data : []);
      } catch (e) {
        setNote(e instanceof ApiError && e.status === 404 ? "This gateway has no /apisix/admin/healthcheck endpoint." : String((e as Error).message));
      }
    };
    load();
    const t = setInterval(() => !stop && load(), 2000);
    return () => {
      stop = true;
      clearInterval(t);
    };
  }, []);

  return (
    <section data-testid="health">
      <h2>Node status</h2>
      {error && <div className="error">{error}</div>}
      {status && (
        <table className="kv" data-testid="status">
          <tbody>
            <tr><th>store</th><td>{status.backend}</td></tr>
            <tr><th>written revision</th><td>{status.revision}</td></tr>
            <tr>
              <th>applied revision</th>
              <td>
                {status.applied}{" "}
                {status.applied >= status.revision ? <span className="tag create">in sync</span> : <span className="tag delete">applying</span>}
              </td>
            </tr>
            <tr><th>store healthy</th><td>{String(status.healthy)}</td></tr>
            {Object.entries(status)
              .filter(([k]) => !["backend", "revision", "applied", "healthy"].includes(k))
              .map(([k, v]) => (
                <tr key={k}><th>{k}</th><td><code>{typeof v === "object" ? JSON.stringify(v) : String(v)}</code></td></tr>
              ))}
          </tbody>
        </table>
      )}
      <h2>Upstream health</h2>
      {note && <p className="muted">{note}</p>}
      {checks && checks.length === 0 && <p className="muted">No upstream has health checks (`checks`) configured.</p>}
      {checks && checks.length > 0 && (
        <table className="list" data-testid="checks">
          <thead>
            <tr><th>upstream of</th><th>type</th><th>node</th><th>status</th><th>success</th><th>http failures</th><th>tcp failures</th><th>timeouts</th></tr>
          </thead>
          <tbody>
            {checks.flatMap((c) =>
              c.nodes.map((n) => (
                <tr key={`${c.name}-${n.ip}:${n.port}`}>
                  <td>{c.name.replace(/^\/apisix\//, "")}</td>
                  <td>{c.type}</td>
                  <td>{n.ip}:{n.port}</td>
                  <td><span className={`tag ${n.status}`}>{n.status}</span></td>
                  <td>{n.counter?.success ?? ""}</td>
                  <td>{n.counter?.http_failure ?? ""}</td>
                  <td>{n.counter?.tcp_failure ?? ""}</td>
                  <td>{n.counter?.timeout_failure ?? ""}</td>
                </tr>
              )),
            )}
          </tbody>
        </table>
      )}
    </section>
  );
}
