import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";
import { fileURLToPath } from "node:url";

// Served by the gateway at /ui/ (crates/sluice-admin/src/ui.rs): hashed names under assets/ are cached as
// immutable, index.html is revalidated. `npm run dev` proxies the Admin API to a local gateway.
export default defineConfig({
  base: "/ui/",
  plugins: [react()],
  resolve: {
    alias: { "@rjsf/validator-ajv8": fileURLToPath(new URL("./src/no-ajv.ts", import.meta.url)) },
  },
  build: {
    outDir: "dist",
    assetsDir: "assets",
    // Never inline assets as data: URIs in scripts; the CSP allows data: images only.
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 1500,
    sourcemap: false,
  },
  server: {
    proxy: { "/apisix": "http://127.0.0.1:9180" },
  },
});
