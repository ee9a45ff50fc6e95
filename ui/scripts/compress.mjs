// Writes NAME.br and NAME.gz next to every compressible file of the build, so the gateway serves them as they are
// (crates/sluice-admin/src/ui.rs picks by Accept-Encoding) and never compresses at run time.
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const dir = process.argv[2] ?? "dist";
const compressible = /\.(js|mjs|css|html|svg|json|txt|map|wasm)$/;

function walk(d) {
  for (const name of readdirSync(d)) {
    const p = join(d, name);
    if (statSync(p).isDirectory()) walk(p);
    else if (compressible.test(name)) {
      const data = readFileSync(p);
      writeFileSync(`${p}.gz`, gzipSync(data, { level: 9 }));
      writeFileSync(
        `${p}.br`,
        brotliCompressSync(data, { params: { [constants.BROTLI_PARAM_QUALITY]: 11, [constants.BROTLI_PARAM_SIZE_HINT]: data.length } }),
      );
    }
  }
}
walk(dir);
