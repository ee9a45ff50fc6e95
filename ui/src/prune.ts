/**
 * What a form leaves behind when a field is cleared: empty strings, empty objects and arrays, undefined. Removed before
 * saving so an untouched section is not sent as `"timeout": {}`. A plugin's `{}` means "enabled with defaults" and
 * is kept.
 */
export function prune(v: any, keepEmpty = false): any {
  if (Array.isArray(v)) return v.filter((x) => x !== undefined).map((x) => prune(x));
  if (!v || typeof v !== "object") return v;
  const out: any = {};
  for (const [k, x] of Object.entries(v)) {
    if (x === undefined || x === "") continue;
    const p = k === "plugins" ? pruneMap(x) : prune(x);
    if (!keepEmpty && p && typeof p === "object" && !Array.isArray(p) && Object.keys(p).length === 0 && k !== "plugins") continue;
    out[k] = p;
  }
  return out;
}

function pruneMap(m: any): any {
  if (!m || typeof m !== "object" || Array.isArray(m)) return m;
  const out: any = {};
  for (const [k, x] of Object.entries(m)) out[k] = prune(x, true);
  return out;
}
