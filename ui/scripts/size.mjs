// The dashboard's size as a browser downloads it: the sum over every file of the build, taking each file's .br
// (or .gz) form when it has one. `npm run size` after `npm run build`; docs/dashboard.md quotes it.
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

const dir = process.argv[2] ?? "dist";
let raw = 0, gz = 0, br = 0, files = 0;
function walk(d) {
  for (const name of readdirSync(d)) {
    const p = join(d, name);
    if (statSync(p).isDirectory()) { walk(p); continue; }
    if (name.endsWith(".gz") || name.endsWith(".br")) continue;
    files++;
    const size = statSync(p).size;
    raw += size;
    gz += existsSync(`${p}.gz`) ? statSync(`${p}.gz`).size : size;
    br += existsSync(`${p}.br`) ? statSync(`${p}.br`).size : size;
  }
}
walk(dir);
const kb = (n) => (n / 1024).toFixed(1) + " KiB";
console.log(`${files} files: ${kb(raw)} raw, ${kb(gz)} gzip, ${kb(br)} brotli`);
