//! The log entry the loggers send: APISIX's default full format (request, response, upstream, latencies, route,
//! service, consumer, client) or a custom `log_format` (the plugin's own, else the `log_format` of its
//! plugin_metadata, as APISIX's `log-util.get_log_entry`). A custom value starting with `$` is that variable
//! (absent when unset), any other value is a literal; `route_id` and `service_id` are added, as APISIX does.
//! Built in the log phase, after the response was sent; the response part carries the headers as sent and, with
//! `include_resp_body`, the body (`response_part`); with `include_req_body` the request body the proxy read for the
//! logger ([`with_req_body`]).

use serde_json::{json, Map, Value};
use sluice_router::Var;

use crate::{CompileEnv, Ctx, LogInfo};

enum Field {
    Var(Var),
    Lit(Value),
}

/// A compiled `log_format`: output field -> variable or literal.
pub(crate) struct Format(Vec<(String, Field)>);

impl Format {
    pub(crate) fn compile(v: Option<&Value>) -> Result<Option<Format>, String> {
        let Some(v) = v else { return Ok(None) };
        let m = v.as_object().ok_or("log_format must be an object")?;
        let mut out = Vec::with_capacity(m.len());
        for (k, t) in m {
            let t = t
                .as_str()
                .ok_or_else(|| format!("log_format.{k} must be a string"))?;
            let f = match t.strip_prefix('$') {
                Some(name) => Field::Var(Var::parse(name)),
                None => Field::Lit(json!(t)),
            };
            out.push((k.clone(), f));
        }
        Ok(Some(Format(out)))
    }

    /// A logger's format: its own `log_format`, else a non-empty `log_format` in the plugin's plugin_metadata,
    /// else none (the full entry).
    pub(crate) fn resolve(
        own: Option<&Value>,
        env: &CompileEnv<'_>,
        plugin: &str,
    ) -> Result<Option<Format>, String> {
        if own.is_some() {
            return Format::compile(own);
        }
        let meta = env
            .metadata(plugin)
            .and_then(|m| m.get("log_format"))
            .filter(|f| f.as_object().is_some_and(|o| !o.is_empty()));
        Format::compile(meta).map_err(|e| format!("plugin_metadata {plugin}: {e}"))
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn entry(ctx: &Ctx<'_>, info: &LogInfo, format: Option<&Format>) -> Value {
    if let Some(Format(fields)) = format {
        let mut m = Map::new();
        for (k, f) in fields {
            match f {
                Field::Lit(v) => {
                    m.insert(k.clone(), v.clone());
                }
                Field::Var(var) => {
                    if let Some(v) = ctx.var(var) {
                        m.insert(k.clone(), json!(v));
                    }
                }
            }
        }
        m.insert("route_id".into(), json!(ctx.route_id));
        if let Some(s) = ctx.service_id() {
            m.insert("service_id".into(), json!(s));
        }
        return Value::Object(m);
    }
    let head = ctx.req.head;
    let mut headers = Map::new();
    for (n, v) in head.headers_iter() {
        headers.insert(
            String::from_utf8_lossy(n).to_ascii_lowercase(),
            json!(String::from_utf8_lossy(v)),
        );
    }
    let mut query = Map::new();
    for kv in head
        .query_str()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        query.insert(k.to_owned(), json!(v));
    }
    let host = ctx.req.host.as_deref().unwrap_or("");
    let latency = info.latency.as_secs_f64() * 1000.0;
    let upstream = info.upstream_latency.map(|u| u.as_secs_f64() * 1000.0);
    let mut e = json!({
        "request": {
            "url": format!("{}://{host}:{}{}", ctx.req.scheme, ctx.req.local.port(), head.target_str()),
            "uri": head.target_str(),
            "method": head.method_str(),
            "headers": headers,
            "querystring": query,
            "size": info.request_bytes,
        },
        "response": response_part(ctx, info),
        "server": {"hostname": std::env::var("HOSTNAME").unwrap_or_default(), "version": env!("CARGO_PKG_VERSION")},
        "client_ip": ctx.remote_ip().to_string(),
        "start_time": now_ms().saturating_sub(info.latency.as_millis() as u64),
        "latency": latency,
        "upstream_latency": upstream.map_or(-1.0, |u| u),
        "apisix_latency": latency - upstream.unwrap_or(0.0),
        "route_id": ctx.route_id,
        "service_id": ctx.service_id().unwrap_or(""),
    });
    if let Some(u) = info.upstream_addr {
        e["upstream"] = json!(u.to_string());
    }
    if let Some(c) = ctx.consumer_name() {
        e["consumer"] = json!({"username": c});
    }
    e
}

/// APISIX's `response` object: status, headers as sent (lower-case names, repeated ones joined as a list), size,
/// and `body` when a logger's `include_resp_body` (and its `include_resp_body_expr`) asked the runtime to keep it.
fn response_part(ctx: &Ctx<'_>, info: &LogInfo) -> Value {
    let mut headers = Map::new();
    for (n, v) in ctx.response_headers() {
        let name = String::from_utf8_lossy(n).to_ascii_lowercase();
        let v = json!(String::from_utf8_lossy(v));
        match headers.get_mut(&name) {
            Some(Value::Array(list)) => list.push(v),
            Some(first) => *first = json!([first.take(), v]),
            None => {
                headers.insert(name, v);
            }
        }
    }
    let mut r = json!({"status": info.status, "headers": headers, "size": info.response_bytes});
    if let Some(body) = ctx.response_body() {
        r["body"] = json!(String::from_utf8_lossy(body));
    }
    r
}

/// `include_req_body`: the request body (read whole because the logger asked, see `Plugin::needs_body`) as
/// `request.body` of a full entry, as APISIX's `get_full_log`; custom formats are left as they are.
pub(crate) fn with_req_body(e: &mut Value, ctx: &Ctx<'_>) {
    if let (Some(body), Some(req)) = (ctx.body, e.get_mut("request")) {
        req["body"] = json!(String::from_utf8_lossy(body));
    }
}
