//! HTTP/2 downstream through the real proxy: an in-process gateway on 127.0.0.1:0 (h2c by prior knowledge), an
//! in-process HTTP/1.1 origin that echoes what reached it, and the `h2` crate as the client.

#[path = "../common/ci.rs"]
mod ci;
mod grpc;
mod grpc_real;
mod h2spec;
mod native;
mod transcode;
mod transcode_real;
mod upgrade;
mod upstream;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_proxy::{Gateway, ListenerKind, Listeners, ProxyConfig, Running, Snapshot};

/// An HTTP/1.1 origin. Each response body is `method target\n<headers, lower-cased, one per line>\n\n<body>`;
/// `/big` answers 1 MiB of `x`, `/chunked` answers a chunked body with a trailer.
pub struct Origin {
    pub addr: SocketAddr,
}

impl Origin {
    pub fn start() -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = l.local_addr().expect("origin addr");
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                std::thread::spawn(move || serve_origin(c));
            }
        });
        Origin { addr }
    }
}

fn serve_origin(mut c: TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let find = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let chunked = find("transfer-encoding").is_some_and(|v| v.contains("chunked"));
                let len: usize = find("content-length")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut desc = format!("{} {}\n", req.method.unwrap_or(""), req.path.unwrap_or(""));
                for h in req.headers.iter() {
                    desc.push_str(&format!(
                        "{}: {}\n",
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value)
                    ));
                }
                desc.push('\n');
                Ok(Some((
                    n,
                    chunked,
                    len,
                    desc,
                    req.path.unwrap_or("").to_owned(),
                )))
            }
            Ok(httparse::Status::Partial) => Ok(None),
            Err(_) => Err(()),
        };
        if let Ok(Some((n, chunked, len, desc, path))) = parsed {
            buf.drain(..n);
            let body = if chunked {
                match read_chunked(&mut c, &mut buf) {
                    Some(b) => b,
                    None => return,
                }
            } else {
                while buf.len() < len {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                }
                buf.drain(..len).collect()
            };
            let ok = if path == "/big" {
                let body = vec![b'x'; 1 << 20];
                c.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
                )
                .and_then(|_| c.write_all(&body))
            } else if path == "/chunked" {
                c.write_all(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
                )
            } else {
                let mut out = desc.into_bytes();
                out.extend_from_slice(&body);
                c.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nX-Origin: 1\r\nContent-Length: {}\r\n\r\n",
                        out.len()
                    )
                    .as_bytes(),
                )
                .and_then(|_| c.write_all(&out))
            };
            if ok.is_err() {
                return;
            }
            continue;
        }
        if parsed.is_err() {
            return;
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

/// Decodes a chunked body from `buf` + `c` (no trailers expected beyond the empty line).
fn read_chunked(c: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        if let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..pos]).ok()?.trim(), 16).ok()?;
            if size == 0 {
                while !buf.windows(4).any(|w| w == b"\r\n\r\n")
                    && !buf[pos..].starts_with(b"\r\n\r\n")
                {
                    let k = c.read(&mut chunk).ok()?;
                    if k == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&chunk[..k]);
                }
                let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
                buf.drain(..end);
                return Some(body);
            }
            if buf.len() >= pos + 2 + size + 2 {
                body.extend_from_slice(&buf[pos + 2..pos + 2 + size]);
                buf.drain(..pos + 2 + size + 2);
                continue;
            }
        }
        let k = c.read(&mut chunk).ok()?;
        if k == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..k]);
    }
}

pub struct Gw {
    pub gw: Gateway,
    pub addr: SocketAddr,
    running: Option<Running>,
}

impl Gw {
    pub fn start(res: Value, cfg: ProxyConfig) -> Gw {
        Self::start_kind(res, cfg, ListenerKind::Plain)
    }

    pub fn start_kind(res: Value, cfg: ProxyConfig, kind: ListenerKind) -> Gw {
        let res: Resources = serde_json::from_value(res).expect("resources");
        let snap = Snapshot::compile(&res, 1).expect("compiles");
        let gw = Gateway::new(cfg, snap);
        let listeners =
            Listeners::bind_kinds(&[("127.0.0.1:0".parse().unwrap(), kind)], 1).expect("bind");
        let addr = listeners.local_addrs[0];
        let running = gw.start(listeners).expect("start");
        Gw {
            gw,
            addr,
            running: Some(running),
        }
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

pub fn route_to(o: &Origin) -> Value {
    json!({"routes": [{"id": "r1", "uri": "/*", "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]})
}

type Client = h2::client::SendRequest<Bytes>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn connect(addr: SocketAddr) -> Client {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Sends a request (body in `pieces`, streamed without content-length) and returns status, headers, body.
async fn send(
    client: &mut Client,
    req: http::Request<()>,
    pieces: &[&[u8]],
) -> (u16, http::HeaderMap, Vec<u8>, Option<http::HeaderMap>) {
    let mut c = client.clone().ready().await.expect("ready");
    let (resp, mut tx) = c
        .send_request(req, pieces.is_empty())
        .expect("send_request");
    for (i, p) in pieces.iter().enumerate() {
        tx.send_data(Bytes::copy_from_slice(p), i + 1 == pieces.len())
            .expect("send_data");
    }
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("response in time")
        .expect("response");
    let (parts, mut body) = resp.into_parts();
    let mut out = Vec::new();
    while let Some(d) = body.data().await {
        let d = d.expect("data");
        body.flow_control()
            .release_capacity(d.len())
            .expect("release");
        out.extend_from_slice(&d);
    }
    let trailers = body.trailers().await.expect("trailers");
    (parts.status.as_u16(), parts.headers, out, trailers)
}

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).expect("request")
}

#[test]
fn h2c_prior_knowledge_get_reaches_http1_origin() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let req = http::Request::get(format!("http://example.test:{}/hello?x=1", addr.port()))
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("x-custom", "v")
            .body(())
            .unwrap();
        let (status, headers, body, _) = send(&mut c, req, &[]).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers.get("x-origin").unwrap(), "1");
        assert!(headers.get("connection").is_none());
        assert!(body.starts_with("GET /hello?x=1\n"), "{body}");
        assert!(
            body.contains(&format!("\nhost: example.test:{}\n", addr.port())),
            "{body}"
        );
        assert!(
            body.contains("\ncookie: a=1; b=2\n"),
            "cookie crumbs joined: {body}"
        );
        assert!(body.contains("\nx-custom: v\n"), "{body}");
        assert!(body.contains("\nx-forwarded-proto: http\n"), "{body}");
    });
}

#[test]
fn h2_request_body_streams_chunked_and_with_length() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let req = http::Request::post("http://t/echo").body(()).unwrap();
        let (status, _, body, _) = send(&mut c, req, &[b"hello ", b"h2 ", b"world"]).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("\ntransfer-encoding: chunked\n"), "{body}");
        assert!(body.ends_with("\n\nhello h2 world"), "{body}");

        let req = http::Request::put("http://t/len")
            .header("content-length", "4")
            .body(())
            .unwrap();
        let (status, _, body, _) = send(&mut c, req, &[b"ab", b"cd"]).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 200);
        assert!(
            body.contains("\ncontent-length: 4\n") && !body.contains("transfer-encoding"),
            "{body}"
        );
        assert!(body.ends_with("\n\nabcd"), "{body}");
    });
}

#[test]
fn h2_streams_multiplex_on_one_connection() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let mut tasks = Vec::new();
        for i in 0..32 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let (s, _, body, _) = send(&mut c, get(&format!("http://t/s/{i}")), &[]).await;
                (s, String::from_utf8(body).unwrap(), i)
            }));
        }
        for t in tasks {
            let (s, body, i) = t.await.unwrap();
            assert_eq!(s, 200);
            assert!(body.starts_with(&format!("GET /s/{i}\n")), "{body}");
        }
    });
}

#[test]
fn h2_large_response_respects_flow_control() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let (s, headers, body, _) = send(&mut c, get("http://t/big"), &[]).await;
        assert_eq!(s, 200);
        assert_eq!(headers.get("content-length").unwrap(), "1048576");
        assert_eq!(body.len(), 1 << 20);
        assert!(body.iter().all(|&b| b == b'x'));
        // HEAD: headers only.
        let (s, _, body, _) = send(
            &mut c,
            http::Request::head("http://t/big").body(()).unwrap(),
            &[],
        )
        .await;
        assert_eq!(s, 200);
        assert!(body.is_empty());
    });
}

#[test]
fn h2_chunked_response_and_hop_by_hop_fields_dropped() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let (s, headers, body, _) = send(&mut c, get("http://t/chunked"), &[]).await;
        assert_eq!(s, 200);
        assert_eq!(body, b"hello world");
        for f in ["transfer-encoding", "connection", "keep-alive"] {
            assert!(headers.get(f).is_none(), "{f} must not reach an h2 client");
        }
    });
}

#[test]
fn h2_no_route_is_404_and_stream_keeps_connection() {
    let o = Origin::start();
    let gw = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/only", "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let (s, _, _, _) = send(&mut c, get("http://t/nope"), &[]).await;
        assert_eq!(s, 404);
        let (s, _, body, _) = send(&mut c, get("http://t/only"), &[]).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    });
}

#[test]
fn http1_still_served_on_the_h2c_port() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // "P" as the first byte: a prefix of the preface until it is not.
    s.write_all(b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("\n\nok"), "{out}");
}

#[test]
fn h2c_disabled_answers_the_preface_as_http1() {
    let o = Origin::start();
    let cfg = ProxyConfig {
        enable_http2: false,
        ..ProxyConfig::default()
    };
    let gw = Gw::start(route_to(&o), cfg);
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    // The preface read as HTTP/1.1 is version "HTTP/2.0": refused as an unsupported version, never as h2.
    assert!(out.starts_with("HTTP/1.1 505"), "{out}");
}

/// Each h2 stream is one access log line, with HTTP/2.0 as its protocol (the bridge's HTTP/1.1 never shows).
#[test]
fn h2_streams_are_access_logged() {
    let o = Origin::start();
    let dir = std::env::temp_dir().join(format!("sluice-h2-alog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("access.log");
    let node: sluice_model::NodeConfig = serde_json::from_value(json!({"nginx_config": {"http": {
        "access_log": path.to_str().unwrap(),
        "access_log_format": "$server_protocol \"$request\" $status $upstream_status"
    }}}))
    .unwrap();
    let cfg = sluice_proxy::AccessLogConfig::from_node(&node, &dir)
        .unwrap()
        .unwrap();
    let log = sluice_proxy::AccessLog::open(cfg).unwrap();
    let gw = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/only", "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig {
            access_log: Some(log.handle()),
            ..ProxyConfig::default()
        },
    );
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        assert_eq!(send(&mut c, get("http://t/only"), &[]).await.0, 200);
        assert_eq!(send(&mut c, get("http://t/nope"), &[]).await.0, 404);
    });
    // Bounded wait: workers hand a partly filled buffer over once a second.
    let end = std::time::Instant::now() + Duration::from_secs(15);
    let text = loop {
        let t = std::fs::read_to_string(&path).unwrap_or_default();
        if t.lines().count() >= 2 || std::time::Instant::now() > end {
            break t;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        text,
        "HTTP/2.0 \"GET /only HTTP/2.0\" 200 200\nHTTP/2.0 \"GET /nope HTTP/2.0\" 404 -\n"
    );
}
