//! Request hygiene, limits and health checks through the real proxy over raw sockets.
//!
//! Every malformed shape of docs/http-conformance.md is written byte for byte to a cleartext listener; the test
//! asserts the status the gateway answers and that the in-process origin accepted no byte (the request was never
//! forwarded). Also: 413/414/431, the header-read timeout (slowloris), the connection cap, a malicious upstream
//! (response splitting) and active/passive health checks with an origin that goes down and comes back.

mod early;
#[path = "../common/head.rs"]
mod head;
mod health;
mod limits;
mod malformed;
mod paths;
mod retries;
mod smuggling;
mod upstream;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Running, Snapshot};

/// An origin that counts every byte it receives and answers `200` + `body` to each complete head (bodies by
/// Content-Length only: enough for the well-formed requests these tests send).
pub struct Origin {
    pub addr: SocketAddr,
    pub bytes: Arc<AtomicUsize>,
    pub conns: Arc<AtomicUsize>,
}

impl Origin {
    pub fn start(body: &'static str) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let bytes = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(AtomicUsize::new(0));
        let (b2, c2) = (bytes.clone(), conns.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                c2.fetch_add(1, Ordering::SeqCst);
                let b = b2.clone();
                std::thread::spawn(move || serve(c, b, body));
            }
        });
        Origin { addr, bytes, conns }
    }

    pub fn received(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }
}

fn serve(mut c: TcpStream, bytes: Arc<AtomicUsize>, body: &'static str) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() < end + 4 + len {
                break;
            }
            buf.drain(..end + 4 + len);
            let r = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if c.write_all(r.as_bytes()).is_err() {
                return;
            }
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                bytes.fetch_add(n, Ordering::SeqCst);
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// A gateway on a cleartext 127.0.0.1 listener, stopped on drop.
pub struct Gw {
    pub gw: Gateway,
    pub addr: SocketAddr,
    running: Option<Running>,
}

pub fn resources(v: Value) -> Resources {
    serde_json::from_value(v).unwrap()
}

/// One route `/*` to `nodes`.
pub fn route_to(nodes: Value, extra: Value) -> Value {
    let mut up = json!({"nodes": nodes});
    if let (Some(u), Some(e)) = (up.as_object_mut(), extra.as_object()) {
        u.extend(e.clone());
    }
    json!({"routes": [{"id": "1", "uri": "/*", "upstream": up}]})
}

impl Gw {
    pub fn start(res: Value, cfg: ProxyConfig) -> Gw {
        let snap = Snapshot::compile(&resources(res), 1).expect("compiles");
        let gw = Gateway::new(cfg, snap);
        let l = Listeners::bind(&["127.0.0.1:0".parse().unwrap()], 1).unwrap();
        let addr = l.local_addrs[0];
        let running = Some(gw.start(l).unwrap());
        Gw { gw, addr, running }
    }

    pub fn to(origin: &Origin) -> Gw {
        Self::start(
            route_to(json!({origin.addr.to_string(): 1}), json!({})),
            ProxyConfig::default(),
        )
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

/// Writes `raw` on a fresh connection and reads until the gateway closes (or 5 s pass).
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> Vec<u8> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The gateway may answer and close before everything is written.
    let _ = c.write_all(raw);
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The status of the first response in `out`.
pub fn status(out: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(out.get(9..12)?).ok()?;
    out.starts_with(b"HTTP/1.1 ")
        .then(|| s.parse().ok())
        .flatten()
}

/// How many responses (status lines) `out` holds.
pub fn responses(out: &[u8]) -> usize {
    out.windows(9).filter(|w| *w == b"HTTP/1.1 ").count()
}
