// The Admin API's collections as the dashboard shows them (docs/admin-api.md, "Resources").

export interface ResourceDef {
  /** URL segment: /apisix/admin/{path} */
  path: string;
  label: string;
  /** name for GET /apisix/admin/schema/{schema} */
  schema: string;
  /** POST creates with a generated id */
  post: boolean;
  /** a hint for the id field when creating */
  idHint: string;
  /** the key field when it is not `id` */
  keyField?: string;
  /** columns of the list: [header, value] */
  columns: [string, (v: any) => string][];
  /** secret ids are "{manager}/{id}" */
  twoPartId?: boolean;
  /** the consumer schema of auth plugins applies */
  consumerPlugins?: boolean;
}

const nodes = (u: any): string => {
  if (!u) return "";
  if (Array.isArray(u.nodes)) return u.nodes.map((n: any) => `${n.host}:${n.port}`).join(", ");
  if (u.nodes && typeof u.nodes === "object") return Object.keys(u.nodes).join(", ");
  return u.service_name ?? "";
};
const plugins = (v: any) => Object.keys(v?.plugins ?? {}).join(", ");
const labels = (v: any) =>
  Object.entries(v?.labels ?? {})
    .map(([k, x]) => `${k}=${x}`)
    .join(" ");

export const RESOURCES: ResourceDef[] = [
  {
    path: "routes", label: "Routes", schema: "route", post: true, idHint: "1",
    columns: [
      ["name", (v) => v.name ?? ""],
      ["uri", (v) => v.uri ?? (v.uris ?? []).join(" ")],
      ["methods", (v) => (v.methods ?? []).join(",")],
      ["host", (v) => v.host ?? (v.hosts ?? []).join(" ")],
      ["upstream", (v) => v.upstream_id ?? (v.service_id ? `service ${v.service_id}` : nodes(v.upstream))],
      ["plugins", plugins],
      ["status", (v) => (v.status === 0 ? "disabled" : "")],
    ],
  },
  {
    path: "services", label: "Services", schema: "service", post: true, idHint: "1",
    columns: [["name", (v) => v.name ?? ""], ["upstream", (v) => v.upstream_id ?? nodes(v.upstream)], ["plugins", plugins]],
  },
  {
    path: "upstreams", label: "Upstreams", schema: "upstream", post: true, idHint: "1",
    columns: [["name", (v) => v.name ?? ""], ["type", (v) => v.type ?? "roundrobin"], ["nodes", nodes], ["labels", labels]],
  },
  {
    path: "consumers", label: "Consumers", schema: "consumer", post: false, idHint: "jack", keyField: "username",
    consumerPlugins: true,
    columns: [["desc", (v) => v.desc ?? ""], ["group", (v) => v.group_id ?? ""], ["plugins", plugins]],
  },
  {
    path: "consumer_groups", label: "Consumer groups", schema: "consumer_group", post: false, idHint: "group1",
    columns: [["name", (v) => v.name ?? ""], ["plugins", plugins]],
  },
  {
    path: "ssls", label: "SSLs", schema: "ssl", post: true, idHint: "1",
    columns: [["snis", (v) => (v.snis ?? (v.sni ? [v.sni] : [])).join(" ")], ["type", (v) => v.type ?? "server"], ["status", (v) => (v.status === 0 ? "disabled" : "")]],
  },
  {
    path: "global_rules", label: "Global rules", schema: "global_rule", post: false, idHint: "1",
    columns: [["plugins", plugins]],
  },
  {
    path: "plugin_configs", label: "Plugin configs", schema: "plugin_config", post: false, idHint: "1",
    columns: [["name", (v) => v.name ?? ""], ["plugins", plugins]],
  },
  {
    path: "plugin_metadata", label: "Plugin metadata", schema: "plugin_metadata", post: false, idHint: "http-logger",
    columns: [["fields", (v) => Object.keys(v ?? {}).filter((k) => k !== "id").join(", ")]],
  },
  {
    path: "protos", label: "Protos", schema: "proto", post: true, idHint: "1",
    columns: [["name", (v) => v.name ?? ""], ["desc", (v) => v.desc ?? ""]],
  },
  {
    path: "secrets", label: "Secrets", schema: "secret", post: false, idHint: "vault/1", twoPartId: true,
    columns: [["uri", (v) => v.uri ?? v.region ?? ""], ["prefix", (v) => v.prefix ?? ""]],
  },
];

export const byPath = (p: string) => RESOURCES.find((r) => r.path === p);

/** Fields the server sets, refused on PUT/POST. */
export function writable(v: any): any {
  if (!v || typeof v !== "object") return v;
  const { create_time: _c, update_time: _u, ...rest } = v;
  return rest;
}
