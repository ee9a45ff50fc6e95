// The only way the dashboard talks to the gateway: the public Admin API (docs/admin-api.md) and Sluice's documented
// additions, with the user's key in X-API-KEY. The key lives in sessionStorage (gone when the tab closes).

export const BASE = "/apisix/admin";
const KEY = "sluice.admin_key";
const ROLE = "sluice.role";

export type Role = "admin" | "viewer";

export function getKey(): string {
  return sessionStorage.getItem(KEY) ?? "";
}
export function setKey(k: string, role: Role) {
  sessionStorage.setItem(KEY, k);
  sessionStorage.setItem(ROLE, role);
}
export function clearKey() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(ROLE);
}
/** The role found at login, so a reload does not probe again. */
export function savedRole(): Role | null {
  const r = sessionStorage.getItem(ROLE);
  return r === "admin" || r === "viewer" ? r : null;
}

export class ApiError extends Error {
  constructor(
    public status: number,
    public body: unknown,
    message: string,
  ) {
    super(message);
  }
}

export interface Reply<T = any> {
  status: number;
  data: T;
}

/** One Admin API call; a non-2xx answer throws ApiError with the API's own `error_msg` as the message. */
export async function api<T = any>(method: string, path: string, body?: unknown, key = getKey()): Promise<Reply<T>> {
  const headers: Record<string, string> = { "X-API-KEY": key };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(BASE + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  const text = await res.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!res.ok) {
    const why = data && typeof data === "object" ? String(data.description ?? "") : "";
    if (res.status === 401 && key && key === getKey() && /wrong apikey|missing apikey/.test(why)) {
      // The key stopped working (changed in config.yaml and reloaded): back to the login screen. A viewer's
      // refused write ("invalid method for role viewer") is not that.
      window.dispatchEvent(new Event("sluice:unauthorized"));
    }
    const msg =
      (data && typeof data === "object" && (data.error_msg || data.message || data.description)) ||
      (typeof data === "string" && data) ||
      `HTTP ${res.status}`;
    const desc = data && typeof data === "object" && data.description ? `: ${data.description}` : "";
    throw new ApiError(res.status, data, `${msg}${desc && !String(msg).includes(data.description) ? desc : ""}`);
  }
  return { status: res.status, data };
}

/**
 * The key's role. Sluice's `GET /apisix/admin/whoami` when the gateway has it; otherwise a harmless write probe: a
 * schema validation (stores nothing) is refused to a viewer with "invalid method for role viewer".
 */
export async function whoami(key: string): Promise<Role> {
  // Any GET checks the key (401 "wrong apikey").
  await api("GET", "/routes?page_size=10&page=1", undefined, key).catch((e) => {
    if (e instanceof ApiError && e.status === 401) throw e;
  });
  try {
    const r = await api<{ role?: Role }>("GET", "/whoami", undefined, key);
    if (r.data && (r.data.role === "admin" || r.data.role === "viewer")) return r.data.role;
  } catch {
    // no whoami on this gateway: probe below
  }
  try {
    await api("POST", "/schema/validate/routes", {}, key);
    return "admin";
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return "viewer";
    return "admin";
  }
}

/** `property "uri" validation failed: ...` -> ["uri", message]: where the API's error belongs in a form. */
export function fieldOfError(msg: string): [string, string] | null {
  const m = /property "([^"]+)" validation failed: (.*)$/s.exec(msg);
  return m ? [m[1], m[2]] : null;
}

export interface Envelope<V = any> {
  key: string;
  value: V;
  createdIndex?: number;
  modifiedIndex?: number;
}

/** Every item of a collection (the Admin API pages at 500 at most). */
export async function listAll(path: string): Promise<Envelope[]> {
  const out: Envelope[] = [];
  for (let page = 1; page < 1000; page++) {
    const sep = path.includes("?") ? "&" : "?";
    let r: Reply;
    try {
      r = await api("GET", `${path}${sep}page=${page}&page_size=500`);
    } catch (e) {
      // An empty nested collection (a consumer without credentials) is a 404, as in APISIX.
      if (e instanceof ApiError && e.status === 404) return out;
      throw e;
    }
    const list: Envelope[] = r.data?.list ?? [];
    out.push(...list);
    if (list.length < 500 || out.length >= (r.data?.total ?? 0)) break;
  }
  return out;
}

/** The id an envelope's key ends with (`/apisix/secrets/vault/1` -> `vault/1` for secrets). */
export function idOf(res: string, key: string): string {
  const marker = `/apisix/${res}/`;
  const i = key.indexOf(marker);
  if (i >= 0) return key.slice(i + marker.length);
  return key.split("/").pop() ?? key;
}
