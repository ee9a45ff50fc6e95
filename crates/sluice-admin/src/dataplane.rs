//! Sluice's own read endpoints over the running data plane, for the dashboard: live traffic (`/stats`, and
//! `/stats/stream` as server-sent events), the control API's health view (`/healthcheck`), a dry-run match
//! (`POST /match`), a route's effective plugin chain (`/routes/{id}/effective`) and the caller's role (`/whoami`).
//! The data plane is reached through [`DataPlane`], which the binary implements from its gateway, so this crate
//! still does not depend on the proxy. Same authentication as every read; `POST /match` is a read too (viewers may).

use std::convert::Infallible;
use std::net::IpAddr;
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
        json!({"interval": 1, "now": now_unix(), "series": dp.stats(n)}),
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
        .map(|e| present(state, req.role, &key, &e.value))
        .unwrap_or(Value::Null);
    // The upstream as configured: the route's own (inline or id), else its service's.
    let service = route
        .get("service_id")
        .map(id_text)
        .and_then(|id| {
            let k = format!("services/{id}");
            snap.get(&k).map(|e| present(state, req.role, &k, &e.value))
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
}
