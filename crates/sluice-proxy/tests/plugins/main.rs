//! Plugin behaviour through the real proxy: an in-process gateway on 127.0.0.1:0, an in-process origin that
//! records what reaches it, and a blocking client. Each module covers one plugin family against APISIX's
//! documented behaviour (docs/en/latest/plugins/<name>.md, t/plugin/<name>.t).

mod auth;
mod body;
mod brotli;
#[path = "../common/ci.rs"]
mod ci;
mod conn_redis;
mod delays;
mod dubbo;
mod dubbo_java;
mod forward_auth;
mod groups;
#[path = "../common/head.rs"]
mod head;
mod jwt;
mod kafka;
mod limits;
mod loggers;
mod meta;
mod metrics;
mod mirror;
mod mocking;
mod oidc;
mod proxy_cache;
mod public_api;
mod redis;
mod req_redis;
mod restrict;
mod rewrite;
mod scale;
mod socket_loggers;
mod split;
#[path = "../common/trace_receiver.rs"]
mod trace_receiver;
mod tracing;
mod transform;
mod validation;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_plugins::Shared;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Running, Snapshot};

/// A request as the origin received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An origin answering `200 origin` to everything and recording requests.
pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Origin {
    pub fn start() -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = l.local_addr().expect("origin addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let seen = s2.clone();
                std::thread::spawn(move || serve_origin(c, seen));
            }
        });
        Origin { addr, seen }
    }

    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("origin saw a request")
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn serve_origin(mut c: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let body_len: usize = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .unwrap_or(0);
                let slow = req.path.is_some_and(|p| p.starts_with("/slow"));
                // `?code=NNN` answers NNN (api-breaker's failing upstream).
                let status = req
                    .path
                    .and_then(|p| p.split_once("code=")?.1.get(..3)?.parse::<u16>().ok())
                    .unwrap_or(200);
                let mut rec = Seen {
                    method: req.method.unwrap_or("").to_owned(),
                    target: req.path.unwrap_or("").to_owned(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_owned(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect(),
                    body: String::new(),
                };
                while buf.len() < n + body_len {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                }
                rec.body = String::from_utf8_lossy(&buf[n..n + body_len]).into_owned();
                seen.lock().unwrap().push(rec);
                buf.drain(..n + body_len);
                if slow {
                    std::thread::sleep(Duration::from_millis(400));
                }
                let resp = format!(
                    "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nX-Origin: 1\r\nContent-Length: 6\r\n\r\norigin",
                    if status == 200 { "OK" } else { "Status" }
                );
                if c.write_all(resp.as_bytes()).is_err() {
                    return;
                }
                continue;
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return,
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

/// A gateway serving `res`, stopped on drop.
pub struct Gw {
    pub gw: Gateway,
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    running: Option<Running>,
}

impl Gw {
    pub fn start(res: Value) -> Gw {
        Self::try_start(res).expect("config compiles")
    }

    pub fn try_start(res: Value) -> Result<Gw, String> {
        Self::start_with(res, Arc::new(Shared::default()), 2)
    }

    pub fn start_with(res: Value, shared: Arc<Shared>, workers: usize) -> Result<Gw, String> {
        let res: Resources = serde_json::from_value(res).map_err(|e| e.to_string())?;
        let snap = Snapshot::compile_with(&res, 1, &shared)?;
        let gw = Gateway::new(ProxyConfig::default(), snap);
        let listeners = Listeners::bind(&["127.0.0.1:0".parse().unwrap()], workers)
            .map_err(|e| e.to_string())?;
        let addr = listeners.local_addrs[0];
        let running = gw.start(listeners).map_err(|e| e.to_string())?;
        Ok(Gw {
            gw,
            addr,
            shared,
            running: Some(running),
        })
    }

    /// Recompiles with the same [`Shared`] and publishes (a reload).
    pub fn reload(&self, res: Value, rev: u64) {
        let res: Resources = serde_json::from_value(res).unwrap();
        self.gw
            .publish(Snapshot::compile_with(&res, rev, &self.shared).unwrap());
    }

    pub fn get(&self, target: &str, headers: &[(&str, &str)]) -> Resp {
        request(self.addr, "GET", target, headers, "")
    }

    /// A GET whose log phase has run when this returns: the gateway closes the connection only after it (a plain
    /// [`Gw::get`] returns at the body's last byte, and the next request may overtake the log phase on another
    /// worker).
    pub fn get_logged(&self, target: &str, headers: &[(&str, &str)]) -> Resp {
        send(self.addr, "GET", target, headers, "", true)
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One request on a fresh connection (`Connection: close`).
pub fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    send(addr, method, target, headers, body, false)
}

/// [`request`], returning at the response's last byte or, with `until_close`, once the gateway closed.
fn send(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
    until_close: bool,
) -> Resp {
    let mut c = TcpStream::connect(addr).expect("connect gateway");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str("Host: test.local\r\n");
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let len: Option<usize> = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok());
            let status = r.code.unwrap_or(0);
            let done = match len {
                Some(l) => buf.len() >= n + l,
                None => false,
            };
            if (done || method == "HEAD") && !until_close {
                let end = (n + len.unwrap_or(0)).min(buf.len());
                return Resp {
                    status,
                    headers,
                    body: String::from_utf8_lossy(&buf[n..end]).into_owned(),
                };
            }
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    // Closed without a complete framed response: report what we have.
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    match r.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => Resp {
            status: r.code.unwrap_or(0),
            headers: r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect(),
            body: String::from_utf8_lossy(&buf[n..]).into_owned(),
        },
        _ => Resp {
            status: 0,
            headers: Vec::new(),
            body: String::new(),
        },
    }
}

/// A route on `uri` to `origin` with `plugins`.
pub fn route(id: &str, uri: &str, origin: &Origin, plugins: Value) -> Value {
    json!({
        "id": id,
        "uri": uri,
        "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}}
    })
}

pub fn consumer(name: &str, plugins: Value) -> Value {
    json!({"username": name, "plugins": plugins})
}

/// Where cargo builds: the test peers' binaries are cached there, keyed by their sources.
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}
