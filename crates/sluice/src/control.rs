//! APISIX's control API health-check view (`apisix.control`, 127.0.0.1:9090 by default): `GET /v1/healthcheck`
//! and `GET /v1/healthcheck/{routes|services|upstreams}/{id}`, in the JSON shape of APISIX's
//! docs/en/latest/control-api.md and apisix/control/v1.lua (`name`, `type`, `nodes[].ip/port/status/counter`),
//! so dashboards and scripts that read APISIX's checker state read Sluice's. Node state comes from
//! [`Gateway::node_health`] (the serving snapshot), which resources have `checks` from the provider's
//! configuration. A minimal HTTP/1.1 responder (one request per connection, `Connection: close`): this is a
//! loopback operator endpoint, not a data path. Not here: APISIX's other control endpoints (schema, dumps, gc,
//! plugin reload) and the HTML rendering APISIX gives browsers.

use std::collections::HashMap;

use serde_json::{json, Value};
use sluice_model::{Resources, Upstream};
use sluice_proxy::{Gateway, NodeHealth, UpstreamHealth};
use sluice_store::ConfigRx;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// This node's `server_info` and the applied revision, when the server-info plugin is enabled.
pub type ServerInfo = (
    serde_json::Map<String, Value>,
    tokio::sync::watch::Receiver<u64>,
);

/// Serves the control API on `listener` until the process ends.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    config: ConfigRx,
    info: Option<ServerInfo>,
) {
    let info = std::sync::Arc::new(info);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (gw, cfg, info) = (gateway.clone(), config.clone(), info.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                one(stream, gw, cfg, &info),
            )
            .await;
        });
    }
}

async fn one(
    mut s: TcpStream,
    gw: Gateway,
    cfg: ConfigRx,
    info: &Option<ServerInfo>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 || buf.len() > 16 * 1024 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut line = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (line.next().unwrap_or(""), line.next().unwrap_or("/"));
    let path = target.split('?').next().unwrap_or("/");
    let (status, body) = if method == "GET" && path == "/v1/server_info" {
        // APISIX's server-info control API: the node's info as the registry reports it.
        match info {
            Some((i, applied)) => (
                200,
                Value::Object(sluice_store::node::report(i, *applied.borrow())),
            ),
            None => (404, json!({"error_msg": "not found"})),
        }
    } else if method == "GET" {
        let res = cfg.borrow().clone();
        route(path, &res.resources, &gw.node_health())
    } else {
        (404, json!({"error_msg": "not found"}))
    };
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        _ => "Not Found",
    };
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await
}

/// The response for `GET path`.
pub fn route(path: &str, res: &Resources, health: &[UpstreamHealth]) -> (u16, Value) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let by_key: HashMap<&str, &UpstreamHealth> =
        health.iter().map(|h| (h.key.as_str(), h)).collect();
    match segs.as_slice() {
        ["v1", "healthcheck"] => {
            let all = checkers(res).into_iter().map(|c| c.info(&by_key)).collect();
            (200, Value::Array(all))
        }
        ["v1", "healthcheck", kind] => (
            404,
            json!({"error_msg": format!("missing src id for src type {kind}")}),
        ),
        ["v1", "healthcheck", kind, id, ..] => {
            if !matches!(*kind, "routes" | "services" | "upstreams") {
                return (
                    400,
                    json!({"error_msg": format!("invalid src type {kind}")}),
                );
            }
            if !exists(res, kind, id) {
                return (404, json!({"error_msg": format!("{kind}[{id}] not found")}));
            }
            match checkers(res)
                .into_iter()
                .find(|c| c.kind == *kind && c.id == *id)
            {
                Some(c) => (200, c.info(&by_key)),
                None => (
                    404,
                    json!({"error_msg": format!("no checker for {kind}[{id}]")}),
                ),
            }
        }
        _ => (404, json!({"error_msg": "not found"})),
    }
}

/// One resource with `checks`, and where its runtime lives in the snapshot.
struct Checker<'a> {
    kind: &'static str,
    id: &'a str,
    upstream: &'a Upstream,
    /// `u:<id>` or `r:<route id>`; a service's inline upstream runs per route, so the first route using it.
    runtime_key: Option<String>,
}

impl Checker<'_> {
    fn info(&self, health: &HashMap<&str, &UpstreamHealth>) -> Value {
        let checks = self.upstream.checks.as_ref();
        let kind = checks
            .and_then(|c| {
                c.pointer("/active/type")
                    .or_else(|| c.pointer("/passive/type"))
            })
            .cloned()
            .unwrap_or_else(|| json!("http"));
        let https = self.upstream.scheme == "https" || self.upstream.scheme == "grpcs";
        let nodes: Vec<Value> = self
            .runtime_key
            .as_deref()
            .and_then(|k| health.get(k))
            .map(|h| h.nodes.iter().map(|n| node_json(n, https)).collect())
            .unwrap_or_default();
        json!({"name": format!("/apisix/{}/{}", self.kind, self.id), "type": kind, "nodes": nodes})
    }
}

fn node_json(n: &NodeHealth, https: bool) -> Value {
    let (ip, port) = split_addr(&n.addr, if https { 443 } else { 80 });
    let st = &n.status;
    let failures =
        u32::from(st.http_failures) + u32::from(st.tcp_failures) + u32::from(st.timeouts);
    // lua-resty-healthcheck's four states: counters against the current state make it "mostly".
    let status = match (st.healthy, failures > 0, st.successes > 0) {
        (true, false, _) => "healthy",
        (true, true, _) => "mostly_healthy",
        (false, _, true) => "mostly_unhealthy",
        (false, _, false) => "unhealthy",
    };
    json!({"ip": ip, "port": port, "status": status, "counter": {
        "success": st.successes, "http_failure": st.http_failures,
        "tcp_failure": st.tcp_failures, "timeout_failure": st.timeouts}})
}

/// `host:port`, `[v6]:port` or a bare host (the scheme's default port).
fn split_addr(addr: &str, default_port: u16) -> (String, u16) {
    if let Some(rest) = addr.strip_prefix('[') {
        if let Some((host, port)) = rest.split_once("]:") {
            return (host.to_owned(), port.parse().unwrap_or(default_port));
        }
        return (rest.trim_end_matches(']').to_owned(), default_port);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            (host.to_owned(), port.parse().unwrap_or(default_port))
        }
        _ => (addr.to_owned(), default_port),
    }
}

fn exists(res: &Resources, kind: &str, id: &str) -> bool {
    match kind {
        "routes" => res.routes.iter().any(|r| r.id.0 == id),
        "services" => res.services.iter().any(|s| s.id.0 == id),
        _ => res
            .upstreams
            .iter()
            .any(|u| u.id.as_ref().is_some_and(|i| i.0 == id)),
    }
}

/// Every resource with checks, in APISIX's order: routes, services, upstreams.
fn checkers(res: &Resources) -> Vec<Checker<'_>> {
    let mut out = Vec::new();
    for r in &res.routes {
        if let Some(u) = r.upstream.as_ref().filter(|u| u.checks.is_some()) {
            out.push(Checker {
                kind: "routes",
                id: &r.id.0,
                upstream: u,
                runtime_key: Some(format!("r:{}", r.id)),
            });
        }
    }
    for s in &res.services {
        if let Some(u) = s.upstream.as_ref().filter(|u| u.checks.is_some()) {
            let user = res.routes.iter().find(|r| {
                r.service_id.as_ref() == Some(&s.id)
                    && r.upstream.is_none()
                    && r.upstream_id.is_none()
            });
            out.push(Checker {
                kind: "services",
                id: &s.id.0,
                upstream: u,
                runtime_key: user.map(|r| format!("r:{}", r.id)),
            });
        }
    }
    for u in res.upstreams.iter().filter(|u| u.checks.is_some()) {
        let id = u.id.as_ref().map_or("", |i| i.0.as_str());
        out.push(Checker {
            kind: "upstreams",
            id,
            upstream: u,
            runtime_key: Some(format!("u:{id}")),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_like_apisix_shows_them() {
        assert_eq!(split_addr("127.0.0.1:1980", 80), ("127.0.0.1".into(), 1980));
        assert_eq!(split_addr("example.com", 443), ("example.com".into(), 443));
        assert_eq!(split_addr("[::1]:8080", 80), ("::1".into(), 8080));
    }

    #[test]
    fn errors_and_empty_list_as_apisix() {
        let res: Resources = serde_json::from_value(json!({
            "routes": [{"id": "1", "uri": "/a", "upstream": {"nodes": {"127.0.0.1:1": 1}}}],
            "upstreams": [{"id": "u1", "nodes": {"127.0.0.1:2": 1},
                "checks": {"passive": {"type": "tcp"}}}]
        }))
        .expect("resources");
        let (st, v) = route("/v1/healthcheck", &res, &[]);
        assert_eq!(st, 200);
        assert_eq!(
            v,
            json!([{"name": "/apisix/upstreams/u1", "type": "tcp", "nodes": []}])
        );
        assert_eq!(route("/v1/healthcheck/foo/1", &res, &[]).0, 400);
        let (st, v) = route("/v1/healthcheck/routes/1", &res, &[]);
        assert_eq!(
            (st, v["error_msg"].as_str()),
            (404, Some("no checker for routes[1]"))
        );
        let (st, v) = route("/v1/healthcheck/routes/9", &res, &[]);
        assert_eq!(
            (st, v["error_msg"].as_str()),
            (404, Some("routes[9] not found"))
        );
        let (st, v) = route("/v1/healthcheck/upstreams", &res, &[]);
        assert_eq!(
            (st, v["error_msg"].as_str()),
            (404, Some("missing src id for src type upstreams"))
        );
    }
}
