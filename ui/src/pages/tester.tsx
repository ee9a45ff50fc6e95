// Request tester: POST /apisix/admin/match says which route a request would match, the plugins that would run (in
// order, with where each comes from) and the upstream node. The browser cannot call the proxy port itself (another
// origin, blocked by the page's CSP): "Send" asks the Admin API to send it (POST /apisix/admin/match/send, admin
// keys only, so viewers do not see the button), and the page also shows the equivalent curl command.
import { useState } from "react";
import { api, ApiError } from "../api";
import { useRole } from "../role";
import { Link } from "../router";

interface Sent {
  status: number;
  headers: [string, string][];
  body: string;
  truncated: boolean;
  elapsed_ms: number;
}

export function Tester() {
  const [method, setMethod] = useState("GET");
  const [host, setHost] = useState("");
  const [uri, setUri] = useState("/");
  const [headers, setHeaders] = useState("");
  const [remote, setRemote] = useState("127.0.0.1");
  const [consumer, setConsumer] = useState("");
  const [proxy, setProxy] = useState(`http://${location.hostname || "127.0.0.1"}:9080`);
  const [result, setResult] = useState<any>(null);
  const [error, setError] = useState<string | null>(null);
  const [body, setBody] = useState("");
  const [sent, setSent] = useState<Sent | null>(null);
  const [sendError, setSendError] = useState<string | null>(null);
  const [sending, setSending] = useState(false);
  const role = useRole();

  const hdrs = () => {
    const out: Record<string, string> = {};
    for (const line of headers.split("\n")) {
      const i = line.indexOf(":");
      if (i > 0) out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    return out;
  };
  const run = async () => {
    setError(null);
    setResult(null);
    try {
      const r = await api("POST", "/match", { method, host: host || undefined, uri, headers: hdrs(), remote_addr: remote || undefined, consumer: consumer || undefined });
      setResult(r.data);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && (e.body as any)?.error_msg) setError(String((e.body as any).error_msg));
      else setError(String((e as Error).message));
    }
  };
  const send = async () => {
    setSendError(null);
    setSent(null);
    setSending(true);
    try {
      const r = await api<Sent>("POST", "/match/send", { method, host: host || undefined, uri, headers: hdrs(), body: body || undefined });
      setSent(r.data);
    } catch (e) {
      setSendError(String((e as Error).message));
    } finally {
      setSending(false);
    }
  };
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  const curl = [
    "curl -i",
    method !== "GET" ? `-X ${method}` : "",
    host ? `-H ${q(`Host: ${host}`)}` : "",
    ...Object.entries(hdrs()).map(([k, v]) => `-H ${q(`${k}: ${v}`)}`),
    body ? `--data-binary ${q(body)}` : "",
    q(proxy.replace(/\/$/, "") + uri),
  ]
    .filter(Boolean)
    .join(" ");

  return (
    <section data-testid="tester">
      <h2>Request tester</h2>
      <div className="grid">
        <label>method<select value={method} onChange={(e) => setMethod(e.target.value)} data-testid="t-method">
          {["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"].map((m) => <option key={m}>{m}</option>)}
        </select></label>
        <label>host<input value={host} onChange={(e) => setHost(e.target.value)} placeholder="(any)" data-testid="t-host" /></label>
        <label>path and query<input value={uri} onChange={(e) => setUri(e.target.value)} data-testid="t-uri" /></label>
        <label>client address<input value={remote} onChange={(e) => setRemote(e.target.value)} /></label>
        <label>as consumer (optional)<input value={consumer} onChange={(e) => setConsumer(e.target.value)} placeholder="username" /></label>
        <label className="wide"><span>headers (one <code>Name: value</code> a line)</span><textarea value={headers} onChange={(e) => setHeaders(e.target.value)} rows={3} data-testid="t-headers" /></label>
        <label className="wide"><span>request body (sent only; matching ignores it)</span><textarea value={body} onChange={(e) => setBody(e.target.value)} rows={2} data-testid="t-body" /></label>
      </div>
      <div className="toolbar">
        <button className="primary" onClick={run} data-testid="t-run">Match</button>
      </div>
      {error && <div className="error" data-testid="t-error">{error}</div>}
      {result && (
        <div data-testid="t-result">
          <p>
            Route <Link to={`/routes/${result.route_id}`}>{String(result.route_id)}</Link>
            {result.node ? <> → node <code>{result.node}</code></> : null}
          </p>
          <h3>Plugins that would run</h3>
          {(result.plugins ?? []).length === 0 ? <p className="muted">none</p> : (
            <table className="list">
              <thead><tr><th>#</th><th>plugin</th><th>priority</th><th>from</th></tr></thead>
              <tbody>
                {result.plugins.map((p: any, i: number) => (
                  <tr key={i}><td>{i + 1}</td><td>{p.name}</td><td>{p.priority}</td><td>{p.source}{p.source_id ? ` ${p.source_id}` : ""}</td></tr>
                ))}
              </tbody>
            </table>
          )}
          <details><summary>route and upstream</summary><pre>{JSON.stringify({ route: result.route, upstream: result.upstream }, null, 2)}</pre></details>
        </div>
      )}
      <h3>Send it for real</h3>
      {role === "admin" ? (
        <>
          <p className="muted">
            The gateway sends the request to its own HTTP listener (first <code>node_listen</code> address) from
            127.0.0.1; routing picks the upstream as for any client. Client address and consumer are not sent.
          </p>
          <div className="toolbar">
            <button className="primary" onClick={send} disabled={sending} data-testid="t-send">{sending ? "Sending..." : "Send"}</button>
          </div>
          {sendError && <div className="error" data-testid="t-send-error">{sendError}</div>}
          {sent && (
            <div data-testid="t-sent">
              <p>
                Status <b data-testid="t-sent-status">{sent.status}</b> in {sent.elapsed_ms} ms
                {sent.truncated ? <span className="tag"> body cut at 64 KiB</span> : null}
              </p>
              <table className="list">
                <thead><tr><th>header</th><th>value</th></tr></thead>
                <tbody>
                  {sent.headers.map(([k, v], i) => <tr key={i}><td>{k}</td><td>{v}</td></tr>)}
                </tbody>
              </table>
              <pre data-testid="t-sent-body">{sent.body}</pre>
            </div>
          )}
        </>
      ) : (
        <p className="muted">Sending needs an admin key (a sent request may change things).</p>
      )}
      <p className="muted">
        Or from a shell (the page itself cannot call the proxy port: another origin, and its Content-Security-Policy
        allows the Admin API only):
      </p>
      <label>proxy address <input value={proxy} onChange={(e) => setProxy(e.target.value)} /></label>
      <pre className="curl" data-testid="t-curl">{curl}</pre>
      <button onClick={() => navigator.clipboard?.writeText(curl)}>Copy</button>
    </section>
  );
}
