// Upstream node health (Sluice mirrors the control API's /v1/healthcheck at /apisix/admin/healthcheck), the
// node's written vs applied revision (/apisix/admin/status) and every gateway node (/apisix/admin/nodes: the etcd
// node registry, or this node with the embedded store). Refreshed every 2 s.
import { useEffect, useState } from "react";
import { api, ApiError } from "../api";

interface Node {
  ip: string;
  port: number;
  status: string;
  counter?: Record<string, number>;
}
interface GatewayNode {
  id: string;
  hostname?: string;
  version?: string;
  boot_time?: number;
  last_report_time?: number;
  applied_revision?: number;
  alive?: boolean;
}
interface Checker {
  name: string;
  type: string;
  nodes: Node[];
}

export function Health() {
  const [status, setStatus] = useState<any>(null);
  const [checks, setChecks] = useState<Checker[] | null>(null);
  const [nodes, setNodes] = useState<GatewayNode[] | null>(null);
  const [nodesNote, setNodesNote] = useState<string | null>(null);
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
        const r = await api("GET", "/nodes");
        setNodes(Array.isArray(r.data?.list) ? r.data.list : []);
        setNodesNote(null);
      } catch (e) {
        setNodesNote(e instanceof ApiError && e.status === 404 ? "This gateway has no /apisix/admin/nodes endpoint." : String((e as Error).message));
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
      <h2>Gateway nodes</h2>
      {nodesNote && <p className="muted">{nodesNote}</p>}
      {nodes && (
        <table className="list" data-testid="nodes">
          <thead>
            <tr><th>id</th><th>hostname</th><th>version</th><th>boot time</th><th>last report</th><th>applied revision</th></tr>
          </thead>
          <tbody>
            {nodes.map((n) => (
              <tr key={n.id} data-testid={`node-${n.id}`}>
                <td><code>{n.id}</code></td>
                <td>{n.hostname ?? ""}</td>
                <td>{n.version ?? ""}</td>
                <td>{when(n.boot_time)}</td>
                <td>{when(n.last_report_time)}</td>
                <td>
                  {n.applied_revision ?? "?"}
                  {status && n.applied_revision !== undefined && " "}
                  {status && n.applied_revision !== undefined &&
                    (n.applied_revision >= status.revision ? (
                      <span className="tag create">current</span>
                    ) : (
                      <span className="tag delete">behind {status.revision}</span>
                    ))}
                </td>
              </tr>
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

function when(t?: number): string {
  return typeof t === "number" && t > 0 ? new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "";
}
