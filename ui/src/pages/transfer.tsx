import { useState } from "react";
import { exportConfig, importConfig, toYaml, type ImportResult } from "../transfer";
import { useRole } from "../role";

export function Transfer() {
  const role = useRole();
  const [yamlText, setYamlText] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [results, setResults] = useState<ImportResult[]>([]);
  const [finished, setFinished] = useState(false);

  const doExport = async () => {
    setBusy(true);
    setError(null);
    try {
      const text = toYaml(await exportConfig());
      setYamlText(text);
      const url = URL.createObjectURL(new Blob([text], { type: "application/yaml" }));
      const a = document.createElement("a");
      a.href = url;
      a.download = "apisix.yaml";
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (e) {
      setError(String((e as Error).message));
    } finally {
      setBusy(false);
    }
  };
  const doImport = async () => {
    setBusy(true);
    setError(null);
    setResults([]);
    setFinished(false);
    try {
      await importConfig(yamlText, (r) => setResults((old) => [...old, r]));
      setFinished(true);
    } catch (e) {
      setError(String((e as Error).message));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section data-testid="transfer">
      <h2>Export and import</h2>
      <p className="muted">
        The whole configuration as APISIX's standalone <code>apisix.yaml</code>, built from the Admin API's lists. SSL
        private keys are never returned by the Admin API, so they are not in an export; a viewer key exports secrets as
        <code>&lt;redacted&gt;</code>.
      </p>
      <div className="toolbar">
        <button className="primary" onClick={doExport} disabled={busy} data-testid="export">Export apisix.yaml</button>
        {role === "admin" && (
          <>
            <input type="file" accept=".yaml,.yml,.json" data-testid="import-file"
              onChange={async (e) => { const f = e.target.files?.[0]; if (f) setYamlText(await f.text()); }} />
            <button onClick={doImport} disabled={busy || !yamlText.trim()} data-testid="import">Import (PUT every item)</button>
          </>
        )}
      </div>
      {error && <div className="error">{error}</div>}
      <textarea className="yaml" value={yamlText} onChange={(e) => setYamlText(e.target.value)} rows={18} spellCheck={false} data-testid="yaml" />
      {results.length > 0 && (
        <table className="list" data-testid="import-results">
          <thead><tr><th>item</th><th>result</th></tr></thead>
          <tbody>
            {results.map((r, i) => (
              <tr key={i} className={r.ok ? "" : "bad"}><td>{r.what}</td><td>{r.message}</td></tr>
            ))}
          </tbody>
        </table>
      )}
      {finished && (
        <p data-testid="import-summary">{results.filter((r) => r.ok).length} written, {results.filter((r) => !r.ok).length} failed.</p>
      )}
    </section>
  );
}
