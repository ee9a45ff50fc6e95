//! Sluice's own read endpoints over the running data plane, for the dashboard: live traffic (`/stats`, and
//! `/stats/stream` as server-sent events), the control API's health view (`/healthcheck`), a dry-run match
//! (`POST /match`), a route's effective plugin chain (`/routes/{id}/effective`) and the caller's role (`/whoami`).
//! The data plane is reached through [`DataPlane`], which the binary implements from its gateway, so this crate
//! still does not depend on the proxy. Same authentication as every read; `POST /match` is a read too (viewers may).
//! `POST /match/send` sends the request for real to this node's own proxy listener over loopback: a write (admin
//! keys only), since a request may have side effects.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use serde_json::{json, Map, Value};

use crate::config::Role;
use crate::handlers::{present, Req};
use crate::{AdminState, Reply};

/// What the Admin API reads of the data plane. Implemented by the binary over `sluice_proxy::Gateway`.
pub trait DataPlane: Send + Sync {
    /// The last `seconds` one-second samples, oldest first, each `{"t", "total", "routes", "services", "nodes"}`.
    fn stats(&self, seconds: usize) -> Vec<Value>;
    /// Stream routes' live counters (`[{route, active, total, bytes_in, bytes_out}]`), for `/stats`.
    fn stream_stats(&self) -> Vec<Value> {
        Vec::new()
    }
    /// The samples closed from now on, one per second.
    fn stats_feed(&self) -> Box<dyn StatsFeed>;
    /// What the control API's `GET /v1/healthcheck` answers.
    fn healthcheck(&self) -> Value;
    /// The route the serving snapshot's router picks for `q` (`Ok(None)`: none matches).
    fn match_request(&self, q: &MatchQuery) -> Result<Option<Matched>, String>;
    /// The plugins route `id` runs, in order (`Ok(None)`: the data plane does not serve that route).
    fn effective(
        &self,
        id: &str,
        consumer: Option<&str>,
    ) -> Result<Option<Vec<PluginRun>>, EffectiveError>;
    /// Where `POST /match/send` connects: this node's first plain HTTP listener (`apisix.node_listen`), as a
    /// loopback address when it listens on every address (`None`: no plain HTTP listener).
    fn proxy_addr(&self) -> Option<SocketAddr>;
}

/// A stream of closed seconds, each already serialized as JSON.
pub trait StatsFeed: Send {
    /// The next sample; `None` when the data plane stopped.
    fn next(&mut self) -> Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>>;
}

/// A request to match, as the proxy would see it.
#[derive(Debug, Clone)]
pub struct MatchQuery {
    pub method: String,
    pub host: Option<String>,
    /// Path with an optional query string.
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub remote_addr: IpAddr,
    pub consumer: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Matched {
    pub route_id: String,
    pub plugins: Vec<PluginRun>,
    /// The node the balancer would pick next (`host:port`).
    pub node: Option<String>,
}

/// One plugin of a chain, where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRun {
    pub name: String,
    pub priority: i32,
    /// `global_rule`, `service`, `plugin_config`, `route`, `consumer` or `consumer_group`.
    pub source: &'static str,
    pub source_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectiveError {
    UnknownConsumer,
    Other(String),
}

/// At most this many `/stats/stream` answers at once; more get 503.
pub const MAX_STREAMS: usize = 32;
/// `?seconds=` upper bound (and default): the ring's length.
pub const MAX_SECONDS: usize = 900;
/// A comment line when no sample went out for this long (the data plane not closing seconds).
const HEARTBEAT: Duration = Duration::from_secs(5);

fn plugins_json(list: &[PluginRun]) -> Value {
    Value::Array(
        list.iter()
            .map(|p| {
                json!({"name": p.name, "priority": p.priority, "source": p.source,
                       "source_id": p.source_id})
            })
            .collect(),
    )
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The non-streaming endpoints (`None`: not one of them).
pub(crate) fn handle(state: &AdminState, req: &Req) -> Option<Reply> {
    let segs: Vec<&str> = req.segs.iter().map(String::as_str).collect();
    let get = req.method == "GET";
    let reply = match segs.as_slice() {
        ["whoami"] if get => Reply::json(
            200,
            json!({"role": match req.role { Role::Admin => "admin", Role::Viewer => "viewer" }}),
        ),
        ["stats"] if get => with_dp(state, |dp| stats(dp, req)),
        ["healthcheck"] if get => with_dp(state, |dp| Reply::json(200, dp.healthcheck())),
        ["match"] if req.method == "POST" => with_dp(state, |dp| match_route(state, dp, req)),
        ["routes", id, "effective"] if get => with_dp(state, |dp| effective(state, dp, req, id)),
        _ => return None,
    };
    Some(reply)
}

fn with_dp(state: &AdminState, f: impl FnOnce(&dyn DataPlane) -> Reply) -> Reply {
    match &state.data_plane {
        Some(dp) => f(dp.as_ref()),
        None => Reply::error(503, "the data plane is not available to the Admin API"),
    }
}

/// `?seconds=N`: a whole number of seconds, 1..=900 (default 900).
fn seconds_arg(req: &Req) -> Result<usize, Reply> {
    let Some(raw) = req.arg("seconds") else {
        return Ok(MAX_SECONDS);
    };
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(n),
        _ => Err(Reply::error(
            400,
            format!("invalid argument seconds: should be an integer from 1 to {MAX_SECONDS}"),
        )),
    }
}

fn stats(dp: &dyn DataPlane, req: &Req) -> Reply {
    let n = match seconds_arg(req) {
        Ok(n) => n,
        Err(r) => return r,
    };
    Reply::json(
        200,
        json!({"interval": 1, "now": now_unix(), "series": dp.stats(n), "stream": dp.stream_stats()}),
    )
}

fn parse_match(body: Option<&Value>) -> Result<MatchQuery, String> {
    let Some(Value::Object(b)) = body else {
        return Err("invalid request body: expected a JSON object".into());
    };
    for k in b.keys() {
        if !matches!(
            k.as_str(),
            "method" | "host" | "uri" | "headers" | "remote_addr" | "consumer"
        ) {
            return Err(format!("invalid request body: unknown property \"{k}\""));
        }
    }
    let text = |k: &str| -> Result<Option<String>, String> {
        match b.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("invalid request body: \"{k}\" must be a string")),
        }
    };
    let method = text("method")?.unwrap_or_else(|| "GET".into());
    if method.is_empty()
        || method.len() > 32
        || !method.bytes().all(|c| c.is_ascii_alphabetic() || c == b'-')
    {
        return Err(format!("invalid request body: invalid method \"{method}\""));
    }
    let uri = text("uri")?.ok_or("invalid request body: \"uri\" is required")?;
    if !uri.starts_with('/') {
        return Err("invalid request body: \"uri\" must start with /".into());
    }
    let host = text("host")?;
    let mut headers = Vec::new();
    match b.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(h)) => {
            for (k, v) in h {
                let Some(v) = v.as_str() else {
                    return Err(format!(
                        "invalid request body: header \"{k}\" must be a string"
                    ));
                };
                headers.push((k.clone(), v.to_owned()));
            }
        }
        Some(_) => return Err("invalid request body: \"headers\" must be an object".into()),
    }
    let remote_addr = match text("remote_addr")? {
        None => IpAddr::from([127, 0, 0, 1]),
        Some(a) => a.parse().map_err(|_| {
            format!("invalid request body: \"remote_addr\" is not an IP address: {a}")
        })?,
    };
    Ok(MatchQuery {
        method: method.to_ascii_uppercase(),
        host,
        uri,
        headers,
        remote_addr,
        consumer: text("consumer")?,
    })
}

fn match_route(state: &AdminState, dp: &dyn DataPlane, req: &Req) -> Reply {
    let q = match parse_match(req.body.as_ref()) {
        Ok(q) => q,
        Err(e) => return Reply::error(400, e),
    };
    let m = match dp.match_request(&q) {
        Ok(Some(m)) => m,
        Ok(None) => return Reply::error(404, "no route matched"),
        Err(e) => return Reply::error(400, e),
    };
    let snap = state.store.snapshot();
    let key = format!("routes/{}", m.route_id);
    let route = snap
        .get(&key)
        .map(|e| present(state, req.role, &key, &e.value()))
        .unwrap_or(Value::Null);
    // The upstream as configured: the route's own (inline or id), else its service's.
    let service = route
        .get("service_id")
        .map(id_text)
        .and_then(|id| {
            let k = format!("services/{id}");
            snap.get(&k)
                .map(|e| present(state, req.role, &k, &e.value()))
        })
        .unwrap_or(Value::Null);
    let upstream = [&route, &service]
        .into_iter()
        .find_map(|v| {
            v.get("upstream")
                .cloned()
                .or_else(|| v.get("upstream_id").cloned())
        })
        .unwrap_or(Value::Null);
    let mut out = Map::new();
    out.insert("route_id".into(), Value::String(m.route_id));
    out.insert("route".into(), route);
    out.insert("plugins".into(), plugins_json(&m.plugins));
    out.insert("upstream".into(), upstream);
    if let Some(n) = m.node {
        out.insert("node".into(), Value::String(n));
    }
    Reply::json(200, Value::Object(out))
}

/// `POST /match/send`: at most this much of the answer's body is returned (`truncated: true` beyond).
pub const SEND_BODY_CAP: usize = 64 * 1024;
/// `POST /match/send`: the connection to the listener, then the answer (head and captured body), each this long.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Fields the tester frames itself (one request, `Connection: close`): a caller's value could change where the
/// request ends or turn the connection into something else, so they are refused, never passed on.
const FRAMING: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "expect",
];

/// The `/match` body plus an optional `"body"` string; `remote_addr` and `consumer` cannot be sent (the request
/// comes from this node over loopback, and a consumer is whoever the request's credentials name).
fn parse_send(body: Option<&Value>) -> Result<(MatchQuery, Option<String>), String> {
    let Some(Value::Object(b)) = body else {
        return Err("invalid request body: expected a JSON object".into());
    };
    let mut rest = b.clone();
    let payload = match rest.remove("body") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err("invalid request body: \"body\" must be a string".into()),
    };
    for k in ["remote_addr", "consumer"] {
        if rest.get(k).is_some_and(|v| !v.is_null()) {
            return Err(format!(
                "invalid request body: \"{k}\" cannot be sent: a sent request comes from this node over \
                 loopback, with the credentials in its headers"
            ));
        }
    }
    let q = parse_match(Some(&Value::Object(rest)))?;
    if let Some((k, _)) = q
        .headers
        .iter()
        .find(|(k, _)| FRAMING.iter().any(|f| k.eq_ignore_ascii_case(f)))
    {
        return Err(format!(
            "invalid request body: header \"{k}\" cannot be set: the tester frames the request itself"
        ));
    }
    if q.method == "CONNECT" {
        return Err("invalid request body: CONNECT cannot be sent".into());
    }
    Ok((q, payload))
}

/// The request as it goes on the wire, every field checked by the `http` crate's strict parsers.
fn build_send(
    q: &MatchQuery,
    payload: Option<String>,
    addr: SocketAddr,
) -> Result<hyper::Request<http_body_util::Full<Bytes>>, String> {
    use hyper::header::{HeaderName, HeaderValue};
    let method = hyper::Method::from_bytes(q.method.as_bytes())
        .map_err(|_| format!("invalid request body: invalid method \"{}\"", q.method))?;
    let uri: hyper::Uri = q
        .uri
        .parse()
        .map_err(|e| format!("invalid request body: invalid uri: {e}"))?;
    let header_host = q
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.clone());
    // No host at all: the listener's address, as curl sends for http://127.0.0.1:9080/...
    let host = q
        .host
        .clone()
        .or(header_host)
        .unwrap_or_else(|| addr.to_string());
    let mut r = hyper::Request::builder().method(method).uri(uri);
    let h = r.headers_mut().ok_or("invalid request")?;
    h.insert(
        hyper::header::HOST,
        HeaderValue::from_bytes(host.as_bytes())
            .map_err(|_| format!("invalid request body: invalid host \"{host}\""))?,
    );
    for (k, v) in &q.headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("invalid request body: invalid header name \"{k}\""))?;
        if name == hyper::header::HOST {
            continue;
        }
        let value = HeaderValue::from_bytes(v.as_bytes())
            .map_err(|_| format!("invalid request body: invalid value of header \"{k}\""))?;
        h.append(name, value);
    }
    h.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    if let Some(p) = &payload {
        h.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(p.len()));
    }
    r.body(http_body_util::Full::new(Bytes::from(
        payload.unwrap_or_default(),
    )))
    .map_err(|e| format!("invalid request body: {e}"))
}

/// `POST /match/send`: the `/match` checks, then one request to this node's own HTTP listener over loopback.
pub(crate) async fn send(state: &AdminState, req: &Req) -> Reply {
    let Some(dp) = state.data_plane.clone() else {
        return Reply::error(503, "the data plane is not available to the Admin API");
    };
    let (q, payload) = match parse_send(req.body.as_ref()) {
        Ok(x) => x,
        Err(e) => return Reply::error(400, e),
    };
    // What the proxy's own parser and normaliser would refuse is refused here, with /match's messages.
    if let Err(e) = dp.match_request(&q) {
        return Reply::error(400, e);
    }
    let Some(addr) = dp.proxy_addr() else {
        return Reply::error(
            503,
            "this node has no plain HTTP listener (apisix.node_listen) to send to",
        );
    };
    let request = match build_send(&q, payload, addr) {
        Ok(r) => r,
        Err(e) => return Reply::error(400, e),
    };
    exchange(addr, request, SEND_TIMEOUT).await
}

async fn exchange(
    addr: SocketAddr,
    request: hyper::Request<http_body_util::Full<Bytes>>,
    limit: Duration,
) -> Reply {
    use http_body_util::BodyExt;
    let started = std::time::Instant::now();
    let unreachable =
        |e: String| Reply::error(502, format!("cannot reach the proxy listener {addr}: {e}"));
    let stream = match tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return unreachable(e.to_string()),
        Err(_) => return unreachable(format!("no connection within {limit:?}")),
    };
    let deadline = tokio::time::Instant::now() + limit;
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await {
            Ok(x) => x,
            Err(e) => return unreachable(e.to_string()),
        };
    // Aborted below whatever happens, which closes the socket (also when the body was cut short).
    let conn = AbortOnDrop(tokio::spawn(conn));
    let resp = match tokio::time::timeout_at(deadline, sender.send_request(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Reply::error(
                502,
                format!("the proxy listener {addr} gave no answer: {e}"),
            )
        }
        Err(_) => {
            return Reply::error(
                504,
                format!("the proxy listener {addr} gave no answer within {limit:?}"),
            )
        }
    };
    let (head, mut body) = resp.into_parts();
    let mut buf: Vec<u8> = Vec::new();
    let mut truncated = false;
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let room = SEND_BODY_CAP - buf.len();
                if data.len() > room {
                    buf.extend_from_slice(&data[..room]);
                    truncated = true;
                    break;
                }
                buf.extend_from_slice(&data);
            }
            // Ended early or too slow: what arrived is the answer, marked as cut.
            Ok(Some(Err(_))) | Err(_) => {
                truncated = true;
                break;
            }
        }
    }
    drop(conn);
    let headers: Vec<Value> = head
        .headers
        .iter()
        .map(|(k, v)| json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]))
        .collect();
    let elapsed = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
    Reply::json(
        200,
        json!({"status": head.status.as_u16(), "headers": headers,
               "body": String::from_utf8_lossy(&buf), "truncated": truncated, "elapsed_ms": elapsed}),
    )
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn effective(state: &AdminState, dp: &dyn DataPlane, req: &Req, id: &str) -> Reply {
    if state
        .store
        .snapshot()
        .get(&format!("routes/{id}"))
        .is_none()
    {
        return Reply::not_found();
    }
    match dp.effective(id, req.arg("consumer")) {
        Ok(Some(list)) => Reply::json(200, json!({"plugins": plugins_json(&list)})),
        Ok(None) => Reply::error(
            404,
            format!("route {id} is not served by the data plane (disabled, or not applied yet)"),
        ),
        Err(EffectiveError::UnknownConsumer) => Reply::error(404, "consumer not found"),
        Err(EffectiveError::Other(e)) => Reply::error(500, e),
    }
}

/// The body of a `/stats/stream` answer: frames from a feeding task, until either side goes.
pub(crate) struct EventBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Starts a stream: `Err` with the reply to send instead (no data plane, too many streams).
pub(crate) fn open_stream(state: &AdminState) -> Result<EventBody, Reply> {
    let Some(dp) = state.data_plane.clone() else {
        return Err(Reply::error(
            503,
            "the data plane is not available to the Admin API",
        ));
    };
    let Ok(permit) = state.streams.clone().try_acquire_owned() else {
        return Err(Reply::error(
            503,
            format!("too many stats streams (at most {MAX_STREAMS} at once)"),
        ));
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let _permit = permit;
        let mut feed = dp.stats_feed();
        // A first comment so the client sees the stream open before the first second closes.
        if tx.send(Bytes::from_static(b": stats\n\n")).await.is_err() {
            return;
        }
        loop {
            let frame = tokio::select! {
                next = feed.next() => match next {
                    Some(json) => Bytes::from(format!("data: {json}\n\n")),
                    None => return,
                },
                _ = tokio::time::sleep(HEARTBEAT) => Bytes::from_static(b": heartbeat\n\n"),
                // The answer's body was dropped: the client went away (or the connection ended).
                _ = tx.closed() => return,
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    Ok(EventBody { rx })
}

/// The semaphore bounding concurrent streams.
pub(crate) fn stream_slots() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_bodies_are_checked() {
        let ok = parse_match(Some(&json!({"uri": "/a?x=1", "method": "post",
            "headers": {"X-A": "1"}, "remote_addr": "10.0.0.1"})))
        .unwrap();
        assert_eq!(ok.method, "POST");
        assert_eq!(ok.remote_addr, IpAddr::from([10, 0, 0, 1]));
        let bad = |v: Value| parse_match(Some(&v)).unwrap_err();
        assert!(bad(json!({})).contains("\"uri\" is required"));
        assert!(bad(json!({"uri": 5})).contains("must be a string"));
        assert!(bad(json!({"uri": "a"})).contains("must start with /"));
        assert!(bad(json!({"uri": "/", "method": "G ET"})).contains("invalid method"));
        assert!(bad(json!({"uri": "/", "headers": []})).contains("must be an object"));
        assert!(bad(json!({"uri": "/", "headers": {"a": 1}})).contains("must be a string"));
        assert!(bad(json!({"uri": "/", "remote_addr": "x"})).contains("not an IP address"));
        assert!(bad(json!({"uri": "/", "bogus": 1})).contains("unknown property"));
        assert!(parse_match(Some(&json!([1]))).is_err());
        assert!(parse_match(None).is_err());
    }

    #[test]
    fn send_bodies_refuse_what_cannot_be_sent() {
        let addr: SocketAddr = ([127, 0, 0, 1], 9080).into();
        let (q, p) = parse_send(Some(&json!({"uri": "/a", "body": "x"}))).unwrap();
        assert_eq!(p.as_deref(), Some("x"));
        let r = build_send(&q, p, addr).unwrap();
        assert_eq!(r.headers()["host"], "127.0.0.1:9080");
        assert_eq!(r.headers()["content-length"], "1");
        assert_eq!(r.headers()["connection"], "close");
        let bad = |v: Value| match parse_send(Some(&v)) {
            Err(e) => e,
            Ok((q, p)) => build_send(&q, p, addr).unwrap_err(),
        };
        assert!(bad(json!({"uri": "/", "body": 1})).contains("must be a string"));
        assert!(bad(json!({"uri": "/", "consumer": "jack"})).contains("cannot be sent"));
        assert!(bad(json!({"uri": "/", "remote_addr": "10.0.0.1"})).contains("cannot be sent"));
        assert!(bad(json!({"uri": "/", "method": "CONNECT"})).contains("CONNECT"));
        for h in [
            "Content-Length",
            "transfer-encoding",
            "Connection",
            "Upgrade",
            "Expect",
        ] {
            let e = bad(json!({"uri": "/", "headers": {h: "1"}}));
            assert!(e.contains("frames the request itself"), "{h}: {e}");
        }
        assert!(
            bad(json!({"uri": "/", "headers": {"X-A": "1\r\nX-B: 2"}})).contains("invalid value")
        );
        assert!(bad(json!({"uri": "/", "headers": {"X A": "1"}})).contains("invalid header name"));
        assert!(bad(json!({"uri": "/a b"})).contains("invalid uri"));
        assert!(bad(json!({"uri": "/", "host": "h\r\nX: y"})).contains("invalid host"));
    }

    #[tokio::test]
    async fn send_to_a_closed_listener_is_502() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let (q, p) = parse_send(Some(&json!({"uri": "/"}))).unwrap();
        let r = exchange(addr, build_send(&q, p, addr).unwrap(), SEND_TIMEOUT).await;
        assert_eq!(r.status, 502);
        let msg = r.body["error_msg"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!("cannot reach the proxy listener {addr}: ")),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_listener_that_closes_without_answering_is_502() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b).await;
        });
        let (q, p) = parse_send(Some(&json!({"uri": "/"}))).unwrap();
        let r = exchange(addr, build_send(&q, p, addr).unwrap(), SEND_TIMEOUT).await;
        assert_eq!(r.status, 502, "{}", r.body);
    }

    /// A listener that accepts, reads the request and answers with `reply` (then holds the connection open).
    async fn answering(reply: &'static [u8], close: bool) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b).await;
            let _ = s.write_all(reply).await;
            if close {
                return;
            }
            // Held open (bounded) so that only the tester's timeout ends the exchange.
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        addr
    }

    async fn send_to(addr: SocketAddr) -> Reply {
        let (q, p) = parse_send(Some(&json!({"uri": "/"}))).unwrap();
        exchange(
            addr,
            build_send(&q, p, addr).unwrap(),
            Duration::from_millis(300),
        )
        .await
    }

    #[tokio::test]
    async fn no_answer_in_time_is_504() {
        let r = send_to(answering(b"", false).await).await;
        assert_eq!(r.status, 504, "{}", r.body);
        assert!(r.body["error_msg"]
            .as_str()
            .unwrap()
            .contains("gave no answer within"));
    }

    #[tokio::test]
    async fn a_body_cut_short_or_stalled_is_marked_truncated() {
        let head: &[u8] =
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-A: 1\r\nX-A: 2\r\n\r\n0123456789";
        for close in [false, true] {
            let r = send_to(answering(head, close).await).await;
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body["status"], 200);
            assert_eq!(r.body["body"], "0123456789");
            assert_eq!(r.body["truncated"], true, "close={close}");
            let h = &r.body["headers"];
            assert_eq!(h[0], json!(["content-length", "100"]), "{h}");
            assert_eq!(h[1], json!(["x-a", "1"]));
            assert_eq!(h[2], json!(["x-a", "2"]));
        }
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_cut_there() {
        static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let big = BIG.get_or_init(|| {
            let mut v = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                SEND_BODY_CAP
            )
            .into_bytes();
            v.extend(std::iter::repeat_n(b'a', SEND_BODY_CAP));
            v
        });
        let r = send_to(answering(big, true).await).await;
        assert_eq!(r.body["body"].as_str().map(str::len), Some(SEND_BODY_CAP));
        // Exactly the cap is whole, not cut.
        assert_eq!(r.body["truncated"], false, "{}", r.body["truncated"]);
    }
}
