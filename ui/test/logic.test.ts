// The dashboard's pure logic: the SSE parser over arbitrary chunk boundaries, where an Admin API error belongs in
// a form, what a cleared form sends, ids of nested keys, and the order and shape of an import.
import { describe, expect, it } from "vitest";
import { fieldOfError, idOf } from "../src/api";
import { prune } from "../src/prune";
import { sseEvents } from "../src/pages/traffic";
import { ORDER, plan, toYaml } from "../src/transfer";
import YAML from "yaml";

describe("sseEvents", () => {
  it("yields each event's data whatever the chunking", () => {
    const stream = 'data: {"t":1}\n\n: keep-alive\n\ndata: {"t":2}\r\n\r\nevent: x\ndata: {"t":3}\n\n';
    for (let cut = 0; cut <= stream.length; cut++) {
      const got: string[] = [];
      let buf = "";
      for (const chunk of [stream.slice(0, cut), stream.slice(cut)]) {
        const [events, rest] = sseEvents(buf + chunk);
        got.push(...events);
        buf = rest;
      }
      expect(got).toEqual(['{"t":1}', '{"t":2}', '{"t":3}']);
    }
  });
  it("joins multi-line data and keeps an unfinished event for later", () => {
    expect(sseEvents("data: a\ndata: b\n\ndata: c")).toEqual([["a\nb"], "data: c"]);
  });
});

describe("fieldOfError", () => {
  it("finds the property an Admin API error names", () => {
    expect(fieldOfError('invalid configuration: property "uri" validation failed: wrong type: expected string, got number')).toEqual([
      "uri",
      "wrong type: expected string, got number",
    ]);
    expect(fieldOfError("failed to fetch upstream info by upstream id [u9], response code: 404")).toBeNull();
  });
});

describe("prune", () => {
  it("drops what a cleared form leaves, keeps plugins enabled with defaults", () => {
    expect(prune({ uri: "/a", name: "", timeout: {}, labels: {}, hosts: [], plugins: { "key-auth": {}, cors: { x: "" } }, upstream: { nodes: { "a:1": 1 }, tls: {} } })).toEqual({
      uri: "/a",
      hosts: [],
      plugins: { "key-auth": {}, cors: {} },
      upstream: { nodes: { "a:1": 1 } },
    });
    expect(prune({ status: 0, enable_websocket: false })).toEqual({ status: 0, enable_websocket: false });
  });
});

describe("idOf", () => {
  it("keeps the two-part ids of secrets and nested credentials", () => {
    expect(idOf("secrets", "/apisix/secrets/vault/1")).toBe("vault/1");
    expect(idOf("routes", "/apisix/routes/r1")).toBe("r1");
    expect(idOf("consumers/jack/credentials", "/apisix/consumers/jack/credentials/c1")).toBe("c1");
  });
});

describe("import plan", () => {
  it("writes dependencies first, consumers before their credentials, without server fields", () => {
    const cfg = {
      routes: [{ id: "r1", uri: "/", upstream_id: "u1", create_time: 1, update_time: 2 }],
      consumers: [{ id: "jack/credentials/c1", plugins: { "key-auth": { key: "k" } } }, { username: "jack" }],
      upstreams: [{ id: "u1", nodes: { "a:1": 1 } }],
      global_rules: [{ uri: "/no-id" }],
    };
    const steps = plan(cfg);
    expect(steps.map((s) => s.path)).toEqual(["/upstreams/u1", "/consumers/jack", "/consumers/jack/credentials/c1", "", "/routes/r1"]);
    expect(steps[4].body).toEqual({ uri: "/", upstream_id: "u1" });
    expect(steps[1].body).toEqual({ username: "jack" });
    expect(steps[2].body).toEqual({ plugins: { "key-auth": { key: "k" } } });
    expect(steps[3].what).toContain("no id");
  });
  it("exports in apisix.yaml's shape, ending with #END", () => {
    const text = toYaml({ routes: [{ id: "1", uri: "/" }] });
    expect(text.trimEnd().endsWith("#END")).toBe(true);
    expect(YAML.parse(text)).toEqual({ routes: [{ id: "1", uri: "/" }] });
    expect(ORDER[ORDER.length - 1]).toBe("routes");
  });
});
