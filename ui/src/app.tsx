import { lazy, Suspense, useEffect, useState } from "react";
import { ApiError, clearKey, getKey, savedRole, setKey, whoami, type Role } from "./api";
import { RESOURCES } from "./resources";
import { RoleContext } from "./role";
import { Link, navigate, usePath } from "./router";

// Each screen is its own chunk: the login screen and the first page load only what they use.
const History = lazy(() => import("./pages/history").then((m) => ({ default: m.History })));
const Health = lazy(() => import("./pages/health").then((m) => ({ default: m.Health })));
const ResourceEdit = lazy(() => import("./pages/resources").then((m) => ({ default: m.ResourceEdit })));
const ResourceList = lazy(() => import("./pages/resources").then((m) => ({ default: m.ResourceList })));
const Tester = lazy(() => import("./pages/tester").then((m) => ({ default: m.Tester })));
const Traffic = lazy(() => import("./pages/traffic").then((m) => ({ default: m.Traffic })));
const Transfer = lazy(() => import("./pages/transfer").then((m) => ({ default: m.Transfer })));

function Login(props: { onLogin: (r: Role) => void }) {
  const [key, setK] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const role = await whoami(key);
      setKey(key, role);
      props.onLogin(role);
    } catch (err) {
      setError(err instanceof ApiError ? `${err.message}` : String(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="login">
      <form onSubmit={submit} data-testid="login">
        <h1>Sluice</h1>
        <p className="muted">Log in with an Admin API key (<code>deployment.admin.admin_key</code>). A viewer key gives a read-only dashboard.</p>
        <input type="password" autoFocus placeholder="X-API-KEY" value={key} onChange={(e) => setK(e.target.value)} data-testid="key" />
        <button className="primary" disabled={busy} data-testid="login-submit">Log in</button>
        {error && <div className="error" data-testid="login-error">{error}</div>}
      </form>
    </div>
  );
}

function Page(props: { path: string }) {
  const segs = props.path.split("/").filter(Boolean);
  if (segs.length === 0) return <Traffic />;
  const [first, ...rest] = segs;
  switch (first) {
    case "traffic":
      return <Traffic />;
    case "history":
      return <History />;
    case "health":
      return <Health />;
    case "tester":
      return <Tester />;
    case "transfer":
      return <Transfer />;
  }
  if (first === "consumers" && rest[1] === "credentials") {
    const res = `consumers/${rest[0]}/credentials`;
    const id = rest.slice(2).join("/");
    return id ? <ResourceEdit key={`${res}/${id}`} res={res} id={id === "new" ? null : id} /> : <ResourceList res={res} />;
  }
  if (RESOURCES.some((r) => r.path === first)) {
    const id = rest.join("/");
    if (!id) return <ResourceList key={first} res={first} />;
    return <ResourceEdit key={`${first}/${id}`} res={first} id={id === "new" ? null : id} />;
  }
  return <p>Nothing at this address. <Link to="/">Back</Link></p>;
}

export function App() {
  const path = usePath();
  const [role, setRole] = useState<Role | null>(getKey() ? savedRole() : null);
  const [checking, setChecking] = useState(!!getKey() && !savedRole());

  useEffect(() => {
    const k = getKey();
    if (!k || savedRole()) return;
    whoami(k)
      .then((r) => {
        setKey(k, r);
        setRole(r);
      })
      .catch(() => clearKey())
      .finally(() => setChecking(false));
  }, []);
  useEffect(() => {
    const out = () => {
      clearKey();
      setRole(null);
    };
    window.addEventListener("sluice:unauthorized", out);
    return () => window.removeEventListener("sluice:unauthorized", out);
  }, []);

  if (checking) return <p className="muted">…</p>;
  if (!role) return <Login onLogin={setRole} />;
  const active = (p: string) => (path === p || path.startsWith(p + "/") ? "active" : "");
  return (
    <RoleContext.Provider value={role}>
      <div className="shell">
        <nav>
          <div className="brand">Sluice</div>
          <div className="group">Monitor</div>
          <Link to="/traffic" className={active("/traffic") || (path === "/" ? "active" : "")} testId="nav-traffic">Live traffic</Link>
          <Link to="/health" className={active("/health")} testId="nav-health">Health and status</Link>
          <Link to="/tester" className={active("/tester")} testId="nav-tester">Request tester</Link>
          <div className="group">Configuration</div>
          {RESOURCES.map((r) => (
            <Link key={r.path} to={`/${r.path}`} className={active(`/${r.path}`)} testId={`nav-${r.path}`}>
              {r.label}
            </Link>
          ))}
          <div className="group">Changes</div>
          <Link to="/history" className={active("/history")} testId="nav-history">History and rollback</Link>
          <Link to="/transfer" className={active("/transfer")} testId="nav-transfer">Export / import</Link>
          <div className="who">
            <span className={`tag ${role}`} data-testid="role">{role}</span>
            <button
              className="link"
              onClick={() => {
                clearKey();
                setRole(null);
                navigate("/");
              }}
              data-testid="logout"
            >
              Log out
            </button>
          </div>
        </nav>
        <main>
          <Suspense fallback={<p className="muted">Loading…</p>}>
            <Page path={path} />
          </Suspense>
        </main>
      </div>
    </RoleContext.Provider>
  );
}
