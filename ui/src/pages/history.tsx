// Config history (Sluice's /apisix/admin/history): revisions newest first, any revision's changes, the net diff of
// any two revisions, and rollback with confirmation (a second one when the target state has no resource at all).
import { useEffect, useState } from "react";
import { api, ApiError } from "../api";
import { useRole } from "../role";

interface Change {
  key: string;
  action: string;
  old?: unknown;
  new?: unknown;
}
interface Rev {
  revision: number;
  time: number;
  changes: Change[];
}

export function History() {
  const role = useRole();
  const [revs, setRevs] = useState<Rev[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [from, setFrom] = useState<number | null>(null);
  const [to, setTo] = useState<number | null>(null);
  const [diff, setDiff] = useState<{ title: string; changes: Change[] } | null>(null);
  const [confirm, setConfirm] = useState<{ rev: number; empty?: string } | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const [tick, setTick] = useState(0);

  useEffect(() => {
    (async () => {
      const st = await api("GET", "/status");
      const latest = Number(st.data?.revision ?? 0);
      const r = await api("GET", `/history?after=${Math.max(0, latest - 200)}&limit=1000`);
      const list: Rev[] = r.data?.list ?? [];
      setRevs([...list].reverse());
      if (list.length >= 2) {
        setTo(list[list.length - 1].revision);
        setFrom(list[list.length - 2].revision);
      }
    })().catch((e) => setError(String(e.message)));
  }, [tick]);

  const show = async (rev: number) => {
    try {
      const r = await api("GET", `/history/${rev}`);
      setDiff({ title: `Revision ${rev}`, changes: r.data?.changes ?? [] });
    } catch (e) {
      setError(String((e as Error).message));
    }
  };
  const compare = async () => {
    if (from === null || to === null) return;
    try {
      const r = await api("GET", `/history/diff?from=${from}&to=${to}`);
      setDiff({ title: `From revision ${from} to ${to}`, changes: r.data?.changes ?? [] });
    } catch (e) {
      setError(String((e as Error).message));
    }
  };
  const rollback = async (rev: number, empty: boolean) => {
    setError(null);
    try {
      const r = await api("POST", `/history/${rev}/rollback${empty ? "?confirm=empty" : ""}`);
      setConfirm(null);
      setDone(`Rolled back to revision ${rev}: new revision ${r.data?.revision}, ${r.data?.changes} change(s).`);
      setTick((t) => t + 1);
    } catch (e) {
      const msg = String((e as Error).message);
      if (!empty && e instanceof ApiError && e.status === 400 && msg.includes("confirm=empty")) {
        setConfirm({ rev, empty: msg });
      } else {
        setConfirm(null);
        setError(msg);
      }
    }
  };

  return (
    <section data-testid="history">
      <h2>Config history</h2>
      {error && <div className="error" data-testid="error">{error}</div>}
      {done && <div className="ok" data-testid="rolled-back">{done}</div>}
      {confirm && (
        <div className="confirm" data-testid="confirm">
          {confirm.empty ? (
            <p>
              <strong>{confirm.empty}</strong>
            </p>
          ) : (
            <p>
              Roll back the whole configuration to revision <strong>{confirm.rev}</strong>? Every resource changed
              since then is restored to its value at that revision, as one new revision.
            </p>
          )}
          <button className="danger" onClick={() => rollback(confirm.rev, !!confirm.empty)} data-testid="confirm-rollback">
            {confirm.empty ? "Delete everything" : "Roll back"}
          </button>{" "}
          <button onClick={() => setConfirm(null)}>Cancel</button>
        </div>
      )}
      <div className="toolbar">
        <label>
          from <input className="narrow" type="number" value={from ?? ""} onChange={(e) => setFrom(Number(e.target.value))} data-testid="diff-from" />
        </label>
        <label>
          to <input className="narrow" type="number" value={to ?? ""} onChange={(e) => setTo(Number(e.target.value))} data-testid="diff-to" />
        </label>
        <button onClick={compare} data-testid="diff">
          Diff
        </button>
        <button onClick={() => setTick((t) => t + 1)}>Refresh</button>
      </div>
      <div className="split">
        <div className="pane">
          <table className="list">
            <thead>
              <tr>
                <th>rev</th>
                <th>time</th>
                <th>changes</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {(revs ?? []).map((r) => (
                <tr key={r.revision} data-testid={`rev-${r.revision}`}>
                  <td>
                    <button className="link" onClick={() => show(r.revision)}>
                      {r.revision}
                    </button>
                  </td>
                  <td className="muted">{new Date(r.time * 1000).toLocaleString()}</td>
                  <td>
                    {r.changes.map((c) => (
                      <div key={c.key}>
                        <span className={`tag ${c.action}`}>{c.action}</span> {c.key.replace(/^\/apisix\//, "")}
                      </div>
                    ))}
                  </td>
                  <td>
                    {role === "admin" && (
                      <button className="small" onClick={() => setConfirm({ rev: r.revision })} data-testid={`rollback-${r.revision}`}>
                        Roll back to here
                      </button>
                    )}
                  </td>
                </tr>
              ))}
              {revs && revs.length === 0 && (
                <tr>
                  <td colSpan={4} className="muted">
                    No history (etcd keeps its own; this needs the embedded store).
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        </div>
        <div className="pane" data-testid="diff-view">
          {diff && (
            <>
              <h3>{diff.title}</h3>
              {diff.changes.length === 0 && <p className="muted">No change.</p>}
              {diff.changes.map((c) => (
                <div key={c.key} className="change">
                  <div>
                    <span className={`tag ${c.action}`}>{c.action}</span> <code>{c.key}</code>
                  </div>
                  <JsonDiff a={c.old} b={c.new} />
                </div>
              ))}
            </>
          )}
        </div>
      </div>
    </section>
  );
}

/** A line diff of two pretty-printed values (LCS over lines; resources are small). */
export function JsonDiff(props: { a: unknown; b: unknown }) {
  const a = props.a === undefined || props.a === null ? [] : JSON.stringify(props.a, null, 2).split("\n");
  const b = props.b === undefined || props.b === null ? [] : JSON.stringify(props.b, null, 2).split("\n");
  const n = a.length, m = b.length;
  const L: number[][] = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out: [string, string][] = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (j < m && (i === n || L[i][j + 1] >= L[i + 1][j])) { out.push(["+", b[j]]); j++; }
    else { out.push(["-", a[i]]); i++; }
  }
  return (
    <pre className="diff">
      {out.map(([t, l], k) => (
        <div key={k} className={t === "+" ? "add" : t === "-" ? "del" : ""}>
          {t} {l}
        </div>
      ))}
    </pre>
  );
}
