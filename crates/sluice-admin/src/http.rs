//! The Admin API's HTTP side on hyper 1: accept loop, `allow_admin` filtering, API-key authentication (header
//! `X-API-KEY`, query `api_key`, cookie `x_api_key`; viewers may only GET), body decoding, URL dispatch, and the
//! response headers APISIX sends (`X-API-VERSION: v3`, JSON content type). Resource semantics live in
//! `handlers.rs`; this file knows no resource.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice_model::schema;
use tokio::net::TcpListener;

use crate::config::Role;
use crate::handlers::{self, Req};
use crate::{dataplane, history, resources, AdminState, Reply};

/// An answer's body: whole (every answer but one), or the `/stats/stream` event stream.
type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// APISIX's MAX_REQ_BODY: 1.5 MiB.
const MAX_BODY: usize = 1536 * 1024;

/// Serves the Admin API on an already-bound listener until the task is dropped.
pub async fn serve(listener: TcpListener, state: AdminState) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(&state, peer, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended");
            }
        });
    }
}

/// `GET /apisix/admin/stats/stream`: server-sent events, one `data:` line per closed second, until the client
/// goes. Same `allow_admin` and key checks as every read; bounded by [`dataplane::MAX_STREAMS`].
fn stream(state: &AdminState, peer: SocketAddr, req: &Request<Incoming>) -> Response<Body> {
    if !state.config.allowed(peer.ip()) {
        return boxed(respond(
            state,
            Reply::json(403, Value::String("403 Forbidden".into())),
        ));
    }
    let query = parse_query(req.uri().query().unwrap_or(""));
    if let Err(why) = check_token(state, true, token(req, &query)) {
        tracing::warn!(%peer, why, "admin: failed to check token");
        return boxed(respond(
            state,
            Reply::json(
                401,
                json!({"error_msg": "failed to check token", "description": why}),
            ),
        ));
    }
    let body = match dataplane::open_stream(state) {
        Ok(b) => b,
        Err(reply) => return boxed(respond(state, reply)),
    };
    let mut b = Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .header("x-api-version", "v3")
        .header("server", crate::server_header());
    if state.config.cors {
        b = b
            .header("access-control-allow-origin", "*")
            .header("access-control-allow-credentials", "true")
            .header("access-control-expose-headers", "*")
            .header("access-control-max-age", "3600");
    }
    b.body(BodyExt::boxed(body))
        .unwrap_or_else(|_| boxed(Response::new(Full::new(Bytes::new()))))
}

fn boxed(r: Response<Full<Bytes>>) -> Response<Body> {
    r.map(BodyExt::boxed)
}

fn respond(state: &AdminState, reply: Reply) -> Response<Full<Bytes>> {
    static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let (ctype, body) = match &reply.body {
        Value::Null => ("application/json", Bytes::new()),
        Value::String(s) => ("text/plain", Bytes::from(s.clone())),
        v => ("application/json", Bytes::from(v.to_string())),
    };
    let mut b = Response::builder()
        .status(reply.status)
        .header("content-type", ctype)
        .header("x-api-version", "v3")
        .header("server", SERVER.get_or_init(crate::server_header).as_str());
    if state.config.cors {
        // APISIX's cors_admin() for every non-OPTIONS answer.
        b = b
            .header("access-control-allow-origin", "*")
            .header("access-control-allow-credentials", "true")
            .header("access-control-expose-headers", "*")
            .header("access-control-max-age", "3600");
    }
    b.body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn respond_answer(state: &AdminState, a: crate::configs::Answer) -> Response<Full<Bytes>> {
    let mut r = respond(state, Reply::json(a.status, Value::Null));
    let h = r.headers_mut();
    if let Ok(v) = hyper::header::HeaderValue::from_str(a.ctype) {
        h.insert("content-type", v);
    }
    for (name, value) in a.headers {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    *r.body_mut() = Full::new(a.body);
    r
}

/// APISIX's preflight answer (`cors_admin()`): 200, empty, before authentication.
fn preflight() -> Response<Full<Bytes>> {
    Response::builder()
        .status(200)
        .header("server", crate::server_header())
        .header("access-control-allow-origin", "*")
        .header(
            "access-control-allow-methods",
            "POST, GET, PUT, OPTIONS, DELETE, PATCH",
        )
        .header("access-control-max-age", "3600")
        .header("access-control-allow-headers", "*")
        .header("access-control-allow-credentials", "true")
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn token<'a>(req: &'a Request<Incoming>, query: &'a [(String, String)]) -> Option<String> {
    if let Some((_, v)) = query.iter().find(|(k, _)| k == "api_key") {
        return Some(v.clone());
    }
    if let Some(v) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.to_owned());
    }
    req.headers()
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|c| c.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == "x_api_key")
        .map(|(_, v)| v.to_owned())
}

/// APISIX's check_token: no configured key means no authentication (and full access). Returns the key's role.
/// `read`: a request a viewer may make (GET, and Sluice's read-only `POST /match`).
fn check_token(state: &AdminState, read: bool, tok: Option<String>) -> Result<Role, &'static str> {
    let cfg = &state.config;
    if !cfg.key_required || cfg.keys.is_empty() {
        return Ok(Role::Admin);
    }
    let tok = tok.ok_or("missing apikey")?;
    let key = cfg
        .keys
        .iter()
        .find(|k| !k.key.is_empty() && k.key == tok)
        .ok_or("wrong apikey")?;
    if key.role == Role::Viewer && !read {
        return Err("invalid method for role viewer");
    }
    Ok(key.role)
}

async fn handle(state: &AdminState, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    if req.method() == hyper::Method::GET && req.uri().path() == "/apisix/admin/stats/stream" {
        return stream(state, peer, &req);
    }
    boxed(handle_whole(state, peer, req).await)
}

async fn handle_whole(
    state: &AdminState,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if !state.config.allowed(peer.ip()) {
        return respond(
            state,
            Reply::json(403, Value::String("403 Forbidden".into())),
        );
    }
    if state.config.ui {
        if let Some(r) = crate::ui::handle(req.method().as_str(), req.uri().path(), req.headers()) {
            return r;
        }
    }
    let method = req.method().as_str().to_owned();
    if method == "OPTIONS" && state.config.cors {
        return preflight();
    }
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let Some(rest) = path
        .strip_prefix("/apisix/admin")
        .filter(|r| r.is_empty() || r.starts_with('/'))
    else {
        return respond(state, Reply::json(404, Value::Null));
    };
    if method == "HEAD" && rest.trim_matches('/').is_empty() {
        return respond(state, Reply::json(200, Value::Null));
    }
    let read = method == "GET" || (method == "POST" && rest.trim_end_matches('/') == "/match");
    let role = match check_token(state, read, token(&req, &query)) {
        Ok(role) => role,
        Err(why) => {
            tracing::warn!(%peer, why, "admin: failed to check token");
            return respond(
                state,
                Reply::json(
                    401,
                    json!({"error_msg": "failed to check token", "description": why}),
                ),
            );
        }
    };
    let cpath = rest.trim_end_matches('/');
    // `/configs`: API-driven standalone, or the bulk load of the traditional role (not file-driven standalone,
    // whose file is the configuration).
    let bulk = state.configs.is_none() && !state.config.standalone;
    if (cpath == "/configs" || cpath == "/configs/validate") && (state.configs.is_some() || bulk) {
        let header = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (ctype, accept, digest) =
            (header("content-type"), header("accept"), header("x-digest"));
        let max = crate::bulk::MAX_BODY;
        // Refused before reading when the length says it is too large (APISIX's `get_body` text).
        if let Some(len) = header("content-length").and_then(|l| l.parse::<u64>().ok()) {
            if len > max as u64 {
                return respond(
                    state,
                    Reply::error(
                        400,
                        format!(
                            "invalid request body: request size {len} is greater than the maximum size {max} allowed"
                        ),
                    ),
                );
            }
        }
        let body = match Limited::new(req.into_body(), max).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return respond(
                    state,
                    Reply::error(
                        400,
                        format!(
                            "invalid request body: request size is greater than the maximum size {max} allowed"
                        ),
                    ),
                )
            }
            Err(e) => {
                return respond(
                    state,
                    Reply::error(400, format!("invalid request body: {e}")),
                )
            }
        };
        let r = crate::configs::Request {
            method: &method,
            path: cpath,
            content_type: ctype.as_deref(),
            accept: accept.as_deref(),
            digest: digest.as_deref(),
            body,
        };
        let answer = match state.configs.clone() {
            Some(api) if method == "PUT" && cpath == "/configs" => {
                crate::configs::put(state, &api, r).await
            }
            Some(api) => crate::configs::handle(state, &api, r),
            None => crate::bulk::handle(state, role, r).await,
        };
        return respond_answer(state, answer);
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return respond(
                state,
                Reply::error(400, format!("invalid request body: {e}")),
            )
        }
    };
    let body = if body.is_empty() {
        None
    } else {
        match parse_body(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return respond(
                    state,
                    Reply::json(
                        400,
                        json!({"error_msg": format!("invalid request body: {e}"),
                           "req_body": String::from_utf8_lossy(&body)}),
                    ),
                )
            }
        }
    };
    if let Some((_, ttl)) = query.iter().find(|(k, _)| k == "ttl") {
        // APISIX's Lua `tonumber`: decimal, hex and exponent forms pass; the value is not used (no leases).
        let t = ttl.trim();
        let hex = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .is_some_and(|h| !h.is_empty() && u64::from_str_radix(h, 16).is_ok());
        let num = t.parse::<f64>().is_ok_and(f64::is_finite) && !t.contains(['n', 'N', 'i', 'I']);
        if !hex && !num {
            return respond(
                state,
                Reply::error(400, "invalid argument ttl: should be a number"),
            );
        }
    }
    let segs = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let req = Req {
        method,
        role,
        segs,
        query,
        body,
    };
    respond(state, dispatch(state, &req).await)
}

pub(crate) async fn dispatch(state: &AdminState, req: &Req) -> Reply {
    let segs: Vec<&str> = req.segs.iter().map(String::as_str).collect();
    let get = req.method == "GET";
    if req.method == "POST" && segs == ["match", "send"] {
        return dataplane::send(state, req).await;
    }
    if let Some(reply) = dataplane::handle(state, req) {
        return reply;
    }
    if segs.first() == Some(&"stream_routes") && !state.config.stream {
        // As APISIX's admin router: `proxy_mode` without `stream`.
        return Reply::error(400, "stream mode is disabled, can not add stream routes");
    }
    match segs.as_slice() {
        ["plugins", "list"] if get => Reply::json(200, json!(state.plugins.names())),
        ["plugins", name] | ["schema", "plugins", name] if get => {
            plugin_schema(state, name, req.arg("schema_type") == Some("consumer"))
        }
        ["schema", "validate", res] if req.method == "POST" => validate(state, req, res),
        ["schema", res] if get => match schema::resource_schema(res) {
            Some(s) => Reply::json(200, s),
            None => Reply::error(400, format!("not found schema: {res}")),
        },
        ["status"] if get => history::status(state),
        ["nodes"] if get => history::nodes(state).await,
        ["history", ..] => history::handle(state, req, &req.segs[1..]).await,
        _ => {
            let Some(t) = handlers::target(&req.segs) else {
                let name = segs.first().copied().unwrap_or("");
                return Reply::error(404, format!("Unsupported resource type: {name}"));
            };
            if state.config.standalone {
                // As APISIX in yaml mode: resource URLs do not exist, the file is the configuration.
                return Reply::error(404, "not found");
            }
            handlers::resource(state, req, t).await
        }
    }
}

/// APISIX's `plugins.get`: the plugin's schema, or with `schema_type=consumer` its `consumer_schema`
/// (`400 not found schema` for a plugin without one).
fn plugin_schema(state: &AdminState, name: &str, consumer: bool) -> Reply {
    let Some(schema) = state.plugins.schema(name) else {
        return Reply::error(404, "plugin not found in subsystem http");
    };
    if !consumer {
        return Reply::json(200, schema);
    }
    match state.plugins.consumer_schema(name) {
        Some(s) => Reply::json(200, s),
        None => Reply::error(400, "not found schema"),
    }
}

/// `POST /apisix/admin/schema/validate/{resource}`: 200 with no body when valid, else 400 with the reason.
fn validate(state: &AdminState, req: &Req, res: &str) -> Reply {
    let Some(kind) = resources::find(res) else {
        return Reply::error(404, format!("Unsupported resource type: {res}"));
    };
    let body = req.body.clone().unwrap_or(Value::Null);
    if let Err(e) = schema::validate(&(kind.schema)(), &body) {
        return Reply::error(400, e);
    }
    if let Some(p) = body.get("plugins").and_then(Value::as_object) {
        if let Err(e) = resources::check_plugins(p, state.plugins.as_ref()) {
            return Reply::error(400, e);
        }
    }
    Reply::json(200, Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query("api_key=a%2Fb&name=x+y&force");
        assert_eq!(q[0], ("api_key".into(), "a/b".into()));
        assert_eq!(q[1].1, "x y");
        assert_eq!(q[2], ("force".into(), String::new()));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}

/// A request body as APISIX's cjson reads it: strict JSON, except that raw control characters (a newline inside a
/// string, as APISIX's own proto examples have) are taken as the characters they are.
fn parse_body(body: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Value>(body).or_else(|e| {
        let mut fixed = Vec::with_capacity(body.len() + 16);
        let (mut in_string, mut escaped, mut changed) = (false, false, false);
        for &b in body {
            if in_string && !escaped && b < 0x20 {
                fixed.extend_from_slice(format!("\\u{b:04x}").as_bytes());
                changed = true;
                continue;
            }
            fixed.push(b);
            if escaped {
                escaped = false;
            } else if in_string && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = !in_string;
            }
        }
        if !changed {
            return Err(e);
        }
        // The original error is the one to report if the body is still not JSON.
        serde_json::from_slice::<Value>(&fixed).map_err(|_| e)
    })
}

#[cfg(test)]
mod body_tests {
    use super::parse_body;

    #[test]
    fn raw_control_characters_in_strings_are_accepted_as_cjson_does() {
        let v = parse_body(b"{\"content\": \"a;\n  b;\tc\"}").unwrap();
        assert_eq!(v["content"], "a;\n  b;\tc");
        // Escapes still mean what they mean; quotes inside strings do not end them.
        let v = parse_body(b"{\"a\": \"x\\\"\n\\\\\", \"b\": 1}").unwrap();
        assert_eq!(v["a"], "x\"\n\\");
        assert_eq!(v["b"], 1);
        // Anything else that is not JSON is still refused with serde's message.
        assert!(parse_body(b"{\"a\": }").is_err());
        assert!(parse_body(b"{\n\"a\": 1,}").is_err());
    }
}
