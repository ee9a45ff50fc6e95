// End-to-end test of the dashboard in a real browser (Debian's chromium driven by playwright-core) against a real
// Sluice: a temp config with an embedded store, an admin and a viewer key, and a `sluice mock` origin. It logs in,
// creates an upstream and a route through the forms, sends traffic through the proxy and watches the live chart's
// request count move, edits a plugin and sees it applied, rolls back and sees it gone, and checks the viewer's
// read-only UI. Screenshots of the main screens go to docs/img/dashboard-*.png (SLUICE_E2E_SHOTS=docs).
//
//   node e2e/run.mjs                 (SLUICE_BIN=path/to/sluice, default ../target/debug/sluice)
//
// Every wait is bounded; the whole run takes well under two minutes.
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync, existsSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const BIN = resolve(process.env.SLUICE_BIN ?? join(repo, "target/debug/sluice"));
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
// Screenshots of the main screens: into docs/img with SLUICE_E2E_SHOTS=docs (`make ui-screenshots`), else a temp
// dir, so a test run leaves the committed images alone.
const IMG = process.env.SLUICE_E2E_SHOTS === "docs" ? join(repo, "docs/img") : join(tmpdir(), "sluice-ui-e2e-shots");
const ADMIN_KEY = "e2e-admin-key-0123456789abcdef";
const VIEWER_KEY = "e2e-viewer-key-0123456789abcdef";
const STEP_TIMEOUT = 15_000;
const JACK_KEY = "jack-secret-key-e2e-5ac1";
// SLUICE_E2E_SKIP_LIVE=1 is for UI work on a build without Sluice's data-plane endpoints (/stats, /match,
// /whoami); `make test` never sets it, so there a missing endpoint fails the run.
const SKIP_LIVE = process.env.SLUICE_E2E_SKIP_LIVE === "1";
const started = Date.now();

const procs = [];
let dir;
let failed = false;

function log(...a) {
  console.log(`[e2e ${((Date.now() - started) / 1000).toFixed(1)}s]`, ...a);
}

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
    s.on("error", rej);
  });
}

async function until(what, f, ms = STEP_TIMEOUT) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      const v = await f();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}${last ? `: ${last.message}` : ""}`);
}

function start(cmd, args) {
  const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  p.stdout.on("data", (d) => (out += d));
  p.stderr.on("data", (d) => (out += d));
  p.output = () => out;
  procs.push(p);
  return p;
}

function stopAll() {
  for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
}

async function admin(method, path, body, key = ADMIN_KEY) {
  const r = await fetch(`${ctx.admin}/apisix/admin${path}`, {
    method,
    headers: { "X-API-KEY": key, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {}
  return { status: r.status, data, headers: r.headers };
}

const ctx = {};

async function main() {
  if (!existsSync(BIN)) throw new Error(`${BIN} not found: build it first (cargo build -p sluice)`);
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} not found (apt-get install chromium)`);
  dir = mkdtempSync(join(tmpdir(), "sluice-ui-e2e-"));
  const [proxyPort, adminPort, mockPort, controlPort, metricsPort] = await Promise.all([freePort(), freePort(), freePort(), freePort(), freePort()]);
  mkdirSync(join(dir, "conf"));
  writeFileSync(
    join(dir, "conf/config.yaml"),
    `apisix:
  node_listen: [{ip: 127.0.0.1, port: ${proxyPort}}]
  enable_admin: true
  control: {ip: 127.0.0.1, port: ${controlPort}}
  ssl: {enable: false}
nginx_config:
  worker_processes: 1
  http:
    enable_access_log: false
deployment:
  role: traditional
  role_traditional:
    config_provider: embedded
  admin:
    admin_listen: {ip: 127.0.0.1, port: ${adminPort}}
    enable_admin_ui: true
    admin_key:
      - {name: admin, key: ${ADMIN_KEY}, role: admin}
      - {name: viewer, key: ${VIEWER_KEY}, role: viewer}
plugin_attr:
  prometheus:
    export_addr: {ip: 127.0.0.1, port: ${metricsPort}}
sluice:
  data_dir: ../data
  pid_file: sluice.pid
`,
  );
  ctx.admin = `http://127.0.0.1:${adminPort}`;
  ctx.proxy = `http://127.0.0.1:${proxyPort}`;
  ctx.mock = `127.0.0.1:${mockPort}`;
  const mock = start(BIN, ["mock", "--listen", ctx.mock, "--body-size", "64"]);
  const gw = start(BIN, ["start", "-c", join(dir, "conf/config.yaml")]);
  await until("the Admin API", async () => {
    if (gw.exitCode !== null) throw new Error(`sluice exited: ${gw.output()}`);
    return (await admin("GET", "/routes")).status === 200;
  }, 30_000);
  await until("the mock origin", async () => {
    if (mock.exitCode !== null) throw new Error(`mock exited: ${mock.output()}`);
    return new Promise((res) => {
      const s = net.connect(mockPort, "127.0.0.1", () => (s.end(), res(true)));
      s.on("error", () => res(false));
    });
  });
  log("gateway up", ctx.admin);

  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu"] });
  try {
    await adminFlow(browser);
    await viewerFlow(browser);
  } catch (e) {
    // What the page showed when it failed, for the log reader.
    const shotPath = join(tmpdir(), "sluice-ui-e2e-failure.png");
    await ctx.page?.screenshot({ path: shotPath, fullPage: true }).catch(() => {});
    const text = await ctx.page?.locator("main").innerText().catch(() => "");
    e.message += `\n(page ${ctx.page?.url()}; screenshot ${shotPath})\n${(text ?? "").slice(0, 1500)}`;
    throw e;
  } finally {
    await browser.close();
  }
}

function watchPage(page, name) {
  const problems = [];
  page.on("console", (m) => {
    // The browser logs every non-2xx answer; the flows provoke some on purpose and check what the UI shows.
    if (m.type() === "error" && !/^Failed to load resource: the server responded with a status of/.test(m.text())) problems.push(`${name} console: ${m.text()}`);
  });
  if (process.env.SLUICE_E2E_VERBOSE) page.on("response", (r) => r.status() >= 400 && log(`${name}: ${r.status()} ${r.request().method()} ${r.url()}`));
  page.on("pageerror", (e) => problems.push(`${name} page error: ${e.message}`));
  return problems;
}

async function login(page, key) {
  await page.goto(`${ctx.admin}/ui/`);
  // A figure for docs/dashboard.md, not an assertion: load of the login screen on loopback (debug build).
  const t = await page.evaluate(() => performance.getEntriesByType("navigation")[0]?.loadEventEnd ?? 0);
  log(`first screen loaded in ${Math.round(t)} ms`);
  await page.getByTestId("key").fill(key);
  await page.getByTestId("login-submit").click();
  await page.getByTestId("role").waitFor();
}

async function shot(page, name) {
  mkdirSync(IMG, { recursive: true });
  await page.screenshot({ path: join(IMG, `dashboard-${name}.png`), fullPage: false });
}

async function adminFlow(browser) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  context.setDefaultTimeout(STEP_TIMEOUT);
  const page = await context.newPage();
  ctx.page = page;
  const problems = watchPage(page, "admin");

  // A wrong key is refused with the Admin API's own words.
  await page.goto(`${ctx.admin}/ui/`);
  await page.getByTestId("key").fill("wrong-key");
  await page.getByTestId("login-submit").click();
  await page.getByTestId("login-error").filter({ hasText: "wrong apikey" }).waitFor();
  await login(page, ADMIN_KEY);
  if ((await page.getByTestId("role").textContent()) !== "admin") throw new Error("admin key not seen as admin");
  log("logged in as admin");

  // Upstream through the form: name and type from the schema form, the nodes in the editor beside it.
  await page.goto(`${ctx.admin}/ui/upstreams/new`);
  await page.getByTestId("new-id").fill("u1");
  await page.locator("#f-upstreams-new__name").fill("e2e upstream");
  await setEditorJson(page, (v) => ({ ...v, type: "roundrobin", nodes: { [ctx.mock]: 1 } }));
  if ((await page.locator("#f-upstreams-new__name").inputValue()) !== "e2e upstream") throw new Error("editor edit lost the form's field");
  await page.getByTestId("save").click();
  await page.waitForURL(/\/ui\/upstreams\/u1$/);
  const u = await admin("GET", "/upstreams/u1");
  if (u.status !== 200 || u.data.value.name !== "e2e upstream" || !u.data.value.nodes[ctx.mock]) throw new Error(`upstream not stored: ${JSON.stringify(u.data)}`);
  log("upstream u1 created through the form");

  // A route through the form; first a bad uri to see the Admin API's error on the field.
  await page.goto(`${ctx.admin}/ui/routes/new`);
  await page.getByTestId("new-id").fill("r1");
  await page.locator("#f-routes-new__upstream_id").fill("u-missing");
  await page.locator("#f-routes-new__uri").fill("/e2e");
  await page.getByTestId("save").click();
  await page.getByTestId("error").filter({ hasText: "upstream" }).waitFor();
  await page.locator("#f-routes-new__upstream_id").fill("u1");
  await page.locator("#f-routes-new__name").fill("e2e route");
  await page.getByTestId("save").click();
  await page.waitForURL(/\/ui\/routes\/r1$/);
  const r = await admin("GET", "/routes/r1");
  if (r.status !== 200 || r.data.value.uri !== "/e2e" || r.data.value.upstream_id !== "u1") throw new Error(`route not stored: ${JSON.stringify(r.data)}`);
  log("route r1 created through the form");
  await page.locator('[data-testid="code"] .cm-content').filter({ hasText: "/e2e" }).waitFor();
  await shot(page, "route-editor");

  // A schema error lands on the field it names.
  await page.goto(`${ctx.admin}/ui/routes/r1`);
  await setEditorJson(page, (v) => ({ ...v, uri: 5 }));
  await page.getByTestId("save").click();
  await page.getByTestId("error").filter({ hasText: 'property "uri" validation failed' }).waitFor();
  // rjsf lists a field's errors in "<field id>__error".
  await page.locator("#f-routes-r1__uri__error").filter({ hasText: "wrong type" }).waitFor();
  log("schema error shown on the uri field");

  // The list with search.
  await page.goto(`${ctx.admin}/ui/routes`);
  await page.getByTestId("row-r1").waitFor();
  await page.getByTestId("search").fill("no-such-route");
  await page.getByTestId("row-r1").waitFor({ state: "detached" });
  await page.getByTestId("search").fill("e2e");
  await page.getByTestId("row-r1").waitFor();
  await shot(page, "routes");

  // Traffic through the proxy moves the live chart's request count.
  await page.goto(`${ctx.admin}/ui/traffic`);
  const stats = await admin("GET", "/stats?seconds=5");
  if (stats.status === 404 && SKIP_LIVE) log("SKIPPED the live-traffic step: no /stats in this build");
  else await liveTraffic(page, stats);

  // Edit a plugin: limit-count through its schema form; the proxy then sends its headers.
  await page.goto(`${ctx.admin}/ui/routes/r1`);
  await page.getByTestId("plugin-pick").selectOption("limit-count");
  await page.getByTestId("plugin-add").click();
  await page.locator("#p-limit-count__count").fill("1000");
  await page.locator("#p-limit-count__time_window").fill("60");
  await page.getByTestId("save").click();
  await page.getByTestId("saved").waitFor();
  const withPlugin = await admin("GET", "/routes/r1");
  if (withPlugin.data.value.plugins?.["limit-count"]?.count !== 1000) throw new Error(`plugin not stored: ${JSON.stringify(withPlugin.data)}`);
  await until("limit-count applied on the proxy", async () => (await fetch(`${ctx.proxy}/e2e`)).headers.get("x-ratelimit-limit") === "1000");
  log("limit-count edited through the plugin form and applied");
  // The route's effective chain names it, from the route.
  await page.reload();
  const eff = page.getByTestId("effective");
  await eff.locator("table, p").first().waitFor();
  const effText = await eff.innerText();
  if (SKIP_LIVE && effText.includes("not available")) log("SKIPPED the effective chain: no /routes/{id}/effective in this build");
  else if (!/limit-count/.test(effText) || !/route\s+r1/.test(effText)) throw new Error(`effective chain: ${effText}`);
  else log("effective chain lists limit-count from route r1");
  await page.getByTestId("plugins").scrollIntoViewIfNeeded();
  await shot(page, "plugin-editor");

  // Roll back to the revision before the plugin edit.
  const hist = await admin("GET", "/history?limit=1000");
  const revs = hist.data.list;
  const last = revs[revs.length - 1];
  if (!last.changes.some((c) => c.key === "/apisix/routes/r1")) throw new Error(`last revision is not the plugin edit: ${JSON.stringify(last)}`);
  const target = revs[revs.length - 2].revision;
  await page.goto(`${ctx.admin}/ui/history`);
  await page.getByTestId(`rev-${last.revision}`).waitFor();
  await page.getByTestId("diff-from").fill(String(target));
  await page.getByTestId("diff-to").fill(String(last.revision));
  await page.getByTestId("diff").click();
  await page.getByTestId("diff-view").getByText("limit-count").first().waitFor();
  await shot(page, "history");
  await page.getByTestId(`rollback-${target}`).click();
  await page.getByTestId("confirm-rollback").click();
  await page.getByTestId("rolled-back").waitFor();
  const after = await admin("GET", "/routes/r1");
  if (after.data.value.plugins?.["limit-count"]) throw new Error(`rollback left the plugin: ${JSON.stringify(after.data)}`);
  await until("the rollback applied on the proxy", async () => {
    const res = await fetch(`${ctx.proxy}/e2e`);
    return res.status === 200 && res.headers.get("x-ratelimit-limit") === null;
  });
  log(`rolled back to revision ${target}`);

  // The other screens render against the real gateway.
  await page.goto(`${ctx.admin}/ui/health`);
  await page.getByTestId("status").waitFor();
  // The embedded store: the node list is this one node, at the applied revision /status reports.
  await page.getByTestId("nodes").waitFor();
  {
    const nodes = (await admin("GET", "/nodes")).data;
    if (nodes.total !== 1) throw new Error(`nodes: ${JSON.stringify(nodes)}`);
    const row = page.getByTestId(`node-${nodes.list[0].id}`);
    await row.waitFor();
    const text = await row.innerText();
    if (!text.includes(String(nodes.list[0].applied_revision)) || !text.includes(nodes.list[0].version)) throw new Error(`node row: ${text}`);
    log("health lists node", nodes.list[0].id, "at revision", nodes.list[0].applied_revision);
  }
  await shot(page, "health");
  await page.goto(`${ctx.admin}/ui/tester`);
  await page.getByTestId("t-uri").fill("/e2e");
  await page.getByTestId("t-run").click();
  await page.locator('[data-testid="t-result"], [data-testid="t-error"]').first().waitFor();
  if (await page.getByTestId("t-result").count()) {
    const text = await page.getByTestId("t-result").innerText();
    if (!/Route r1/.test(text) || !text.includes(ctx.mock)) throw new Error(`tester: ${text}`);
    log("request tester matched r1 ->", ctx.mock);
  } else {
    const why = await page.getByTestId("t-error").textContent();
    if (!(SKIP_LIVE && /match/.test(why))) throw new Error(`request tester: ${why}`);
    log("SKIPPED the tester's match:", why);
  }
  if (!(await page.getByTestId("t-curl").textContent()).includes("/e2e")) throw new Error("no curl command");
  // Send it for real (POST /apisix/admin/match/send): the mock's answer, through the proxy, shows on the page.
  await page.getByTestId("t-send").click();
  await page.locator('[data-testid="t-sent"], [data-testid="t-send-error"]').first().waitFor();
  if (await page.getByTestId("t-send-error").count()) {
    const why = await page.getByTestId("t-send-error").textContent();
    if (!SKIP_LIVE) throw new Error(`request tester send: ${why}`);
    log("SKIPPED the tester's send:", why);
  } else {
    const status = await page.getByTestId("t-sent-status").textContent();
    const body = await page.getByTestId("t-sent-body").textContent();
    const sentText = await page.getByTestId("t-sent").innerText();
    if (status !== "200" || body !== "x".repeat(64) || !/content-length\s+64/.test(sentText)) throw new Error(`tester send: ${status} ${sentText}`);
    log("request tester sent GET /e2e: 200 with the mock's 64-byte body");
  }
  await shot(page, "tester");

  // Export, delete, import: the route comes back.
  await page.goto(`${ctx.admin}/ui/transfer`);
  const dl = page.waitForEvent("download");
  await page.getByTestId("export").click();
  await dl;
  const yamlText = await page.getByTestId("yaml").inputValue();
  if (!yamlText.includes("uri: /e2e") || !yamlText.trim().endsWith("#END")) throw new Error(`export: ${yamlText}`);
  await admin("DELETE", "/routes/r1");
  await page.getByTestId("import").click();
  await page.getByTestId("import-summary").waitFor();
  const summary = await page.getByTestId("import-summary").textContent();
  if (!/ 0 failed/.test(summary)) throw new Error(`import: ${summary}: ${await page.getByTestId("import-results").textContent()}`);
  if ((await admin("GET", "/routes/r1")).status !== 200) throw new Error("import did not restore r1");
  log("export/import round trip:", summary);
  if (process.env.SLUICE_E2E_VERBOSE) log(yamlText);

  // A consumer and its credential through the forms (the credential's key-auth form is the consumer schema).
  await page.goto(`${ctx.admin}/ui/consumers/new`);
  await page.getByTestId("new-id").fill("jack");
  await page.locator("#f-consumers-new__desc").fill("e2e consumer");
  await page.getByTestId("save").click();
  await page.waitForURL(/\/ui\/consumers\/jack$/);
  await page.getByTestId("list-consumers/jack/credentials").getByTestId("create").click();
  await page.waitForURL(/\/ui\/consumers\/jack\/credentials\/new$/);
  await page.getByTestId("new-id").fill("c1");
  await page.getByTestId("plugin-pick").selectOption("key-auth");
  await page.getByTestId("plugin-add").click();
  await page.locator("#p-key-auth__key").fill(JACK_KEY);
  await page.getByTestId("save").click();
  await page.waitForURL(/\/ui\/consumers\/jack\/credentials\/c1$/);
  await until("jack's credential to be stored", async () => {
    const cred = await admin("GET", "/consumers/jack/credentials/c1");
    return cred.status === 200 && cred.data.value.plugins?.["key-auth"];
  });
  await page.goto(`${ctx.admin}/ui/consumers/jack`);
  await page.getByTestId("row-c1").waitFor();
  log("consumer jack and credential c1 created through the forms");

  if (problems.length) throw new Error(problems.join("\n"));
  await context.close();
}

async function liveTraffic(page, stats) {
  if (stats.status === 404) throw new Error("GET /apisix/admin/stats is 404: the live-traffic endpoints are not in this build");
  await page.getByTestId("stream-state").filter({ hasText: /live|polling/ }).waitFor();
  const before = Number(await page.getByTestId("total-requests").textContent());
  for (let i = 0; i < 30; i++) {
    const res = await fetch(`${ctx.proxy}/e2e`);
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`proxy answered ${res.status}`);
  }
  await until("the live request count to grow by 30", async () => Number(await page.getByTestId("total-requests").textContent()) >= before + 30);
  log("live chart counted the traffic");
  await shot(page, "traffic");
}

async function setEditorJson(page, edit) {
  // Playwright's CSS locators pierce the editor's shadow root.
  const content = page.locator('[data-testid="code"] .cm-content');
  const text = await content.innerText();
  const v = edit(JSON.parse(text || "{}"));
  await content.click();
  await page.keyboard.press("Control+A");
  await page.keyboard.press("Delete");
  // insertText: no auto-closed brackets doubling the typed ones.
  await page.keyboard.insertText(JSON.stringify(v));
}

async function viewerFlow(browser) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  context.setDefaultTimeout(STEP_TIMEOUT);
  const page = await context.newPage();
  ctx.page = page;
  const problems = watchPage(page, "viewer");
  await login(page, VIEWER_KEY);
  if ((await page.getByTestId("role").textContent()) !== "viewer") throw new Error("viewer key not seen as viewer");
  await page.goto(`${ctx.admin}/ui/routes`);
  await page.getByTestId("row-r1").waitFor();
  for (const id of ["create", "delete-r1"]) if (await page.getByTestId(id).count()) throw new Error(`viewer sees ${id}`);
  await page.goto(`${ctx.admin}/ui/routes/r1`);
  await page.getByTestId("read-only").waitFor();
  for (const id of ["save", "delete", "plugin-add"]) if (await page.getByTestId(id).count()) throw new Error(`viewer sees ${id}`);
  await page.goto(`${ctx.admin}/ui/history`);
  await page.getByTestId("history").waitFor();
  if (await page.locator('[data-testid^="rollback-"]').count()) throw new Error("viewer sees rollback buttons");
  await page.goto(`${ctx.admin}/ui/tester`);
  await page.getByTestId("t-run").waitFor();
  if (await page.getByTestId("t-send").count()) throw new Error("viewer sees the tester's Send button");
  await shot(page, "viewer");
  // The viewer sees secrets as the API shows them to a viewer: redacted, never the key.
  const secret = JACK_KEY;
  await page.goto(`${ctx.admin}/ui/consumers/jack/credentials/c1`);
  await page.locator('[data-testid="code"] .cm-content').filter({ hasText: "<redacted>" }).waitFor();
  await page.getByTestId("plugin-key-auth").click();
  await page.getByTestId("plugin-form-key-auth").waitFor();
  const everything = (await page.content()) + (await page.locator('[data-testid="code"] .cm-content').innerText());
  const fields = await page.locator("input").evaluateAll((els) => els.map((e) => e.value).join("\n"));
  if (everything.includes(secret) || fields.includes(secret)) throw new Error("the viewer's page shows the consumer's key");
  log("viewer UI is read-only and shows secrets redacted");
  if (problems.length) throw new Error(problems.join("\n"));
  await context.close();
}

const watchdog = setTimeout(() => {
  console.error("e2e: whole run exceeded 180 s");
  stopAll();
  process.exit(1);
}, 180_000);

try {
  await main();
  log("PASS");
} catch (e) {
  failed = true;
  console.error("e2e FAILED:", e.message);
  for (const p of procs) console.error(`--- ${p.spawnargs.slice(0, 2).join(" ")} output ---\n${p.output().slice(-3000)}`);
} finally {
  stopAll();
  clearTimeout(watchdog);
  if (dir) rmSync(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
