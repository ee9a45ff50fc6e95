// Whole-configuration export and import as APISIX's standalone apisix.yaml, through the ordinary Admin API only:
// export lists every collection; import PUTs every item, dependencies first, and reports each item's result.
import YAML from "yaml";
import { api, idOf, listAll } from "./api";
import { writable } from "./resources";

/** apisix.yaml's sections, in the order an import must write them (references before their users). */
export const ORDER = [
  "secrets", "protos", "upstreams", "services", "plugin_configs", "consumer_groups", "consumers", "ssls",
  "plugin_metadata", "global_rules", "routes",
] as const;

export async function exportConfig(): Promise<Record<string, any[]>> {
  const out: Record<string, any[]> = {};
  for (const res of ORDER) {
    const items = await listAll(`/${res}`);
    const list: any[] = [];
    for (const it of items) {
      const id = idOf(res, it.key);
      const v = writable(it.value);
      if (res === "consumers") {
        list.push({ ...v, username: v.username ?? id });
        // APISIX's standalone form of a credential: an item of `consumers` whose id is "{user}/credentials/{id}".
        for (const c of await listAll(`/consumers/${id}/credentials`)) {
          const cid = c.key.split("/credentials/")[1];
          list.push({ ...writable(c.value), id: `${id}/credentials/${cid}` });
        }
      } else {
        list.push({ ...v, id: v.id ?? id });
      }
    }
    if (list.length) out[res] = list;
  }
  return out;
}

export function toYaml(cfg: Record<string, any[]>): string {
  return YAML.stringify(cfg) + "#END\n";
}

export interface ImportResult {
  what: string;
  ok: boolean;
  message: string;
}

/** The PUT that recreates one item of a section. */
export function plan(cfg: Record<string, any[]>): { what: string; path: string; body: any }[] {
  const out: { what: string; path: string; body: any }[] = [];
  for (const res of ORDER) {
    const list = cfg[res];
    if (!Array.isArray(list)) continue;
    // Consumers before their credentials.
    const items = res === "consumers" ? [...list].sort((a, b) => Number(String(a.id ?? "").includes("/credentials/")) - Number(String(b.id ?? "").includes("/credentials/"))) : list;
    for (const item of items) {
      if (!item || typeof item !== "object") continue;
      const body = writable(item);
      if (res === "consumers" && typeof body.id === "string" && body.id.includes("/credentials/")) {
        const [user, cid] = body.id.split("/credentials/");
        delete body.id;
        out.push({ what: `credential ${user}/${cid}`, path: `/consumers/${user}/credentials/${cid}`, body });
        continue;
      }
      const id = res === "consumers" ? body.username : body.id;
      if (id === undefined || id === null || id === "") {
        out.push({ what: `${res} (no id)`, path: "", body });
        continue;
      }
      if (res !== "consumers") delete body.id;
      out.push({ what: `${res.replace(/s$/, "")} ${id}`, path: `/${res}/${id}`, body });
    }
  }
  return out;
}

export async function importConfig(text: string, onItem: (r: ImportResult) => void): Promise<void> {
  const cfg = YAML.parse(text.replace(/#END\s*$/, "")) ?? {};
  if (typeof cfg !== "object" || Array.isArray(cfg)) throw new Error("not an apisix.yaml: the top level must be a map of sections");
  for (const step of plan(cfg)) {
    if (!step.path) {
      onItem({ what: step.what, ok: false, message: "skipped: the item has no id" });
      continue;
    }
    try {
      const r = await api("PUT", step.path, step.body);
      onItem({ what: step.what, ok: true, message: r.status === 201 ? "created" : "updated" });
    } catch (e) {
      onItem({ what: step.what, ok: false, message: String((e as Error).message) });
    }
  }
}
