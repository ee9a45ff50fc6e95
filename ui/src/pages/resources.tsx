// Every Admin API collection: a searchable list, and an editor made of a schema form, a JSON/YAML editor beside it
// and a plugin editor, saving through the Admin API and showing its error (on the field when it names one).
import { useEffect, useMemo, useState } from "react";
import type { ErrorSchema } from "@rjsf/utils";
import { api, ApiError, fieldOfError, idOf, listAll, type Envelope } from "../api";
import { CodeEditor, type Lang } from "../editor";
import { SchemaForm, formSchema, prune } from "../form";
import { Link, navigate } from "../router";
import { byPath, writable, type ResourceDef } from "../resources";
import { useRole } from "../role";

/** `res` is the collection path: `routes`, or `consumers/jack/credentials`. */
function defFor(res: string): ResourceDef {
  const cred = /^consumers\/[^/]+\/credentials$/.test(res);
  if (cred)
    return {
      path: res, label: "Credentials", schema: "credential", post: false, idHint: "cred-1", consumerPlugins: true,
      columns: [["desc", (v) => v.desc ?? ""], ["plugins", (v) => Object.keys(v?.plugins ?? {}).join(", ")]],
    };
  return byPath(res)!;
}

export function ResourceList(props: { res: string; embedded?: boolean }) {
  const def = defFor(props.res);
  const role = useRole();
  const [items, setItems] = useState<Envelope[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [q, setQ] = useState("");
  const [label, setLabel] = useState("");
  const [tick, setTick] = useState(0);

  useEffect(() => {
    setItems(null);
    setError(null);
    listAll(`/${props.res}`)
      .then(setItems)
      .catch((e) => setError(String(e.message ?? e)));
  }, [props.res, tick]);

  const shown = useMemo(() => {
    const needle = q.trim().toLowerCase();
    return (items ?? []).filter((it) => {
      if (label) {
        const [k, v] = label.split("=");
        const l = it.value?.labels ?? {};
        if (!(k in l) || (v !== undefined && l[k] !== v)) return false;
      }
      if (!needle) return true;
      return (idOf(def.twoPartId ? "secrets" : props.res, it.key) + " " + JSON.stringify(it.value)).toLowerCase().includes(needle);
    });
  }, [items, q, label, props.res, def.twoPartId]);

  const del = async (id: string) => {
    if (!window.confirm(`Delete ${def.label.toLowerCase()} ${id}?`)) return;
    try {
      await api("DELETE", `/${props.res}/${id}`);
      setTick((t) => t + 1);
    } catch (e) {
      setError(String((e as Error).message));
    }
  };

  return (
    <section data-testid={`list-${def.path}`}>
      {!props.embedded && <h2>{def.label}</h2>}
      <div className="toolbar">
        <input placeholder="Search id, name, uri, any field…" value={q} onChange={(e) => setQ(e.target.value)} data-testid="search" />
        <input placeholder="label (key or key=value)" value={label} onChange={(e) => setLabel(e.target.value)} className="narrow" />
        <button onClick={() => setTick((t) => t + 1)}>Refresh</button>
        {role === "admin" && (
          <button className="primary" data-testid="create" onClick={() => navigate(`/${props.res}/new`)}>
            Create
          </button>
        )}
      </div>
      {error && <div className="error" data-testid="error">{error}</div>}
      {items === null && !error ? (
        <p className="muted">Loading…</p>
      ) : (
        <table className="list">
          <thead>
            <tr>
              <th>id</th>
              {def.columns.map(([h]) => (
                <th key={h}>{h}</th>
              ))}
              <th>updated</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {shown.map((it) => {
              const id = idOf(def.twoPartId ? "secrets" : props.res, it.key);
              return (
                <tr key={it.key} data-testid={`row-${id}`}>
                  <td>
                    <Link to={`/${props.res}/${id}`}>{id}</Link>
                  </td>
                  {def.columns.map(([h, f]) => (
                    <td key={h}>{safe(() => f(it.value))}</td>
                  ))}
                  <td className="muted">{it.value?.update_time ? new Date(it.value.update_time * 1000).toLocaleString() : ""}</td>
                  <td>
                    {role === "admin" && (
                      <button className="danger small" onClick={() => del(id)} data-testid={`delete-${id}`}>
                        Delete
                      </button>
                    )}
                  </td>
                </tr>
              );
            })}
            {shown.length === 0 && (
              <tr>
                <td colSpan={def.columns.length + 3} className="muted">
                  Nothing here{q || label ? " matches" : " yet"}.
                </td>
              </tr>
            )}
          </tbody>
        </table>
      )}
      <p className="muted">{items ? `${shown.length} of ${items.length}` : ""}</p>
    </section>
  );
}

function safe(f: () => string): string {
  try {
    return f();
  } catch {
    return "";
  }
}

export function ResourceEdit(props: { res: string; id: string | null }) {
  const def = defFor(props.res);
  const role = useRole();
  const ro = role !== "admin";
  const [schema, setSchema] = useState<any>(null);
  const [value, setValue] = useState<any>(props.id ? null : {});
  const [newId, setNewId] = useState("");
  const [lang, setLang] = useState<Lang>("json");
  const [error, setError] = useState<string | null>(null);
  const [fieldErrors, setFieldErrors] = useState<ErrorSchema | undefined>();
  const [parseError, setParseError] = useState<string | null>(null);
  const [saved, setSaved] = useState<string | null>(null);

  useEffect(() => {
    api("GET", `/schema/${def.schema}`).then((r) => setSchema(r.data)).catch(() => setSchema({}));
  }, [def.schema]);
  useEffect(() => {
    setError(null);
    if (!props.id) {
      setValue({});
      return;
    }
    api("GET", `/${props.res}/${props.id}`)
      .then((r) => setValue(r.data?.value ?? {}))
      .catch((e) => setError(String(e.message)));
  }, [props.res, props.id]);

  const hasPlugins = !!schema?.properties?.plugins;
  const keyField = def.keyField ?? "id";
  const fs = useMemo(() => formSchema(schema, ["plugins", "create_time", "update_time", keyField]), [schema, keyField]);

  const save = async () => {
    setError(null);
    setFieldErrors(undefined);
    setSaved(null);
    const body = prune(writable(value ?? {}));
    const target = props.id ?? newId.trim();
    // Consumers are keyed by the username in the body; other resources take the id from the URL.
    if (keyField === "id") delete body.id;
    else if (target) body[keyField] = target;
    try {
      let r;
      if (target) r = await api("PUT", `/${props.res}/${target}`, body);
      else if (def.post) r = await api("POST", `/${props.res}`, body);
      else throw new Error(`an ${keyField} is required for ${def.label.toLowerCase()}`);
      const id = props.id ?? idOf(def.twoPartId ? "secrets" : props.res, r.data?.key ?? "");
      setSaved(`Saved ${id}`);
      if (!props.id) navigate(`/${props.res}/${id}`);
      else setValue(r.data?.value ?? value);
    } catch (e) {
      const msg = String((e as Error).message);
      setError(msg);
      const f = fieldOfError(msg);
      if (f) setFieldErrors({ [f[0]]: { __errors: [f[1]] } } as ErrorSchema);
    }
  };

  const del = async () => {
    if (!props.id || !window.confirm(`Delete ${props.id}?`)) return;
    try {
      await api("DELETE", `/${props.res}/${props.id}`);
      navigate(`/${props.res}`);
    } catch (e) {
      setError(String((e as Error).message));
    }
  };

  const title = props.id ? `${def.label}: ${props.id}` : `New ${def.label.toLowerCase().replace(/s$/, "")}`;
  return (
    <section data-testid="editor-page">
      <h2>
        <Link to={`/${props.res}`}>{def.label}</Link> / {props.id ?? "new"}
      </h2>
      <div className="toolbar">
        {!props.id && (
          <label>
            {keyField}{" "}
            <input
              value={newId}
              onChange={(e) => setNewId(e.target.value)}
              placeholder={def.post ? "(generated when empty)" : def.idHint}
              data-testid="new-id"
            />
          </label>
        )}
        <span className="spacer" />
        <label>
          editor{" "}
          <select value={lang} onChange={(e) => setLang(e.target.value as Lang)} data-testid="lang">
            <option value="json">JSON</option>
            <option value="yaml">YAML</option>
          </select>
        </label>
        {!ro && (
          <button className="primary" onClick={save} disabled={!!parseError || value === null} data-testid="save">
            Save
          </button>
        )}
        {!ro && props.id && (
          <button className="danger" onClick={del} data-testid="delete">
            Delete
          </button>
        )}
      </div>
      {error && <div className="error" data-testid="error">{error}</div>}
      {saved && <div className="ok" data-testid="saved">{saved}</div>}
      {ro && <p className="muted" data-testid="read-only">Read-only: this key has the viewer role.</p>}
      <h3 className="sr">{title}</h3>
      {value === null ? (
        <p className="muted">Loading…</p>
      ) : (
        <div className="split">
          <div className="pane" data-testid="form">
            {schema ? (
              <SchemaForm
                id={`f-${props.res}-${props.id ?? "new"}`}
                schema={fs}
                value={value}
                readOnly={ro}
                extraErrors={fieldErrors}
                onChange={(v) => setValue({ ...v, ...(value?.plugins ? { plugins: value.plugins } : {}) })}
              />
            ) : (
              <p className="muted">Loading schema…</p>
            )}
            {hasPlugins && (
              <PluginsEditor
                plugins={value?.plugins ?? {}}
                consumer={!!def.consumerPlugins}
                readOnly={ro}
                onChange={(p) => setValue({ ...value, plugins: p })}
              />
            )}
            {props.res === "routes" && props.id && <EffectiveChain id={props.id} />}
            {props.res === "consumers" && props.id && (
              <div className="sub">
                <h3>Credentials</h3>
                <ResourceList res={`consumers/${props.id}/credentials`} embedded />
              </div>
            )}
          </div>
          <div className="pane">
            {parseError && <div className="error">{parseError}</div>}
            <CodeEditor
              value={value}
              lang={lang}
              readOnly={ro}
              testId="code"
              onChange={(v) => setValue(v)}
              onError={setParseError}
            />
          </div>
        </div>
      )}
    </section>
  );
}

function PluginsEditor(props: {
  plugins: Record<string, any>;
  consumer: boolean;
  readOnly: boolean;
  onChange: (p: Record<string, any>) => void;
}) {
  const [names, setNames] = useState<string[]>([]);
  const [pick, setPick] = useState("");
  const [open, setOpen] = useState<string | null>(Object.keys(props.plugins)[0] ?? null);
  const [schema, setSchema] = useState<any>(null);

  useEffect(() => {
    api<string[]>("GET", "/plugins/list").then((r) => setNames(r.data ?? [])).catch(() => setNames([]));
  }, []);
  useEffect(() => {
    setSchema(null);
    if (!open) return;
    const plain = () => api("GET", `/schema/plugins/${open}`).then((r) => setSchema(r.data));
    (props.consumer ? api("GET", `/schema/plugins/${open}?schema_type=consumer`).then((r) => setSchema(r.data)) : Promise.reject())
      .catch(plain)
      .catch(() => setSchema({}));
  }, [open, props.consumer]);

  const enabled = Object.keys(props.plugins);
  const add = () => {
    if (!pick || props.plugins[pick]) return;
    props.onChange({ ...props.plugins, [pick]: {} });
    setOpen(pick);
    setPick("");
  };
  const remove = (n: string) => {
    const { [n]: _gone, ...rest } = props.plugins;
    props.onChange(rest);
    if (open === n) setOpen(null);
  };
  const fs = useMemo(() => formSchema(schema, ["_meta"]), [schema]);

  return (
    <div className="sub" data-testid="plugins">
      <h3>Plugins</h3>
      <div className="chips">
        {enabled.map((n) => (
          <span key={n} className={`chip ${open === n ? "on" : ""}`}>
            <button className="link" onClick={() => setOpen(n)} data-testid={`plugin-${n}`}>
              {n}
            </button>
            {!props.readOnly && (
              <button className="link danger" title={`remove ${n}`} onClick={() => remove(n)} data-testid={`remove-plugin-${n}`}>
                ×
              </button>
            )}
          </span>
        ))}
        {enabled.length === 0 && <span className="muted">none</span>}
      </div>
      {!props.readOnly && (
        <div className="toolbar">
          <select value={pick} onChange={(e) => setPick(e.target.value)} data-testid="plugin-pick">
            <option value="">add a plugin…</option>
            {names
              .filter((n) => !props.plugins[n])
              .map((n) => (
                <option key={n} value={n}>
                  {n}
                </option>
              ))}
          </select>
          <button onClick={add} disabled={!pick} data-testid="plugin-add">
            Add
          </button>
        </div>
      )}
      {open && props.plugins[open] !== undefined && (
        <div className="plugin-form" data-testid={`plugin-form-${open}`}>
          <h4>{open}</h4>
          {schema ? (
            <SchemaForm
              id={`p-${open}`}
              schema={fs}
              value={props.plugins[open]}
              readOnly={props.readOnly}
              onChange={(v) => props.onChange({ ...props.plugins, [open]: { ...v, ...(props.plugins[open]?._meta ? { _meta: props.plugins[open]._meta } : {}) } })}
            />
          ) : (
            <p className="muted">Loading schema…</p>
          )}
        </div>
      )}
    </div>
  );
}

interface ChainEntry {
  name: string;
  priority?: number;
  source?: string;
  source_id?: string;
}

function EffectiveChain(props: { id: string }) {
  const [chain, setChain] = useState<ChainEntry[] | null>(null);
  const [note, setNote] = useState<string | null>(null);
  useEffect(() => {
    api("GET", `/routes/${props.id}/effective`)
      .then((r) => {
        // A gateway without the endpoint answers a GET of a sub-path with the route itself.
        if (Array.isArray(r.data?.plugins) && !r.data?.key) setChain(r.data.plugins);
        else setNote("not available on this gateway");
      })
      .catch((e) => setNote(e instanceof ApiError && e.status === 404 ? "not available on this gateway" : String(e.message)));
  }, [props.id]);
  return (
    <div className="sub" data-testid="effective">
      <h3>Effective plugin chain</h3>
      {note && <p className="muted">{note}</p>}
      {chain && chain.length === 0 && <p className="muted">No plugin runs on this route.</p>}
      {chain && chain.length > 0 && (
        <table className="list">
          <thead>
            <tr>
              <th>#</th>
              <th>plugin</th>
              <th>priority</th>
              <th>from</th>
            </tr>
          </thead>
          <tbody>
            {chain.map((p, i) => (
              <tr key={i}>
                <td>{i + 1}</td>
                <td>{p.name}</td>
                <td>{p.priority ?? ""}</td>
                <td>
                  {p.source}
                  {p.source_id ? ` ${p.source_id}` : ""}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}
