//! h2 streams served by `Conn` directly (no in-memory HTTP/1.1 bridge): what that IO must carry beyond the basic
//! cases in main.rs. Request bodies read whole by a plugin, chunked responses larger than the client's window with
//! trailers, bodies through a body filter, many streams with bodies both ways on one connection, a client resetting
//! in the middle of its body, plugin answers, the body limit, `expect: 100-continue`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use sluice_proxy::ProxyConfig;

use crate::{connect, get, route_to, rt, send, Gw, Origin};

/// One chunk of [`ChunkOrigin`]'s body; it sends `CHUNKS` of them.
const CHUNK: usize = 8 * 1024;
const CHUNKS: usize = 128;

/// An HTTP/1.1 origin for what the echo origin cannot do. `/chunked-big` answers `CHUNKS` chunks of `CHUNK` bytes
/// (chunk i filled with b'a' + i % 26) and an `x-chunks` trailer; any other path reports its head, reads the body
/// until the client closes, and reports how many body bytes arrived and whether the body was whole.
struct ChunkOrigin {
    addr: SocketAddr,
    seen: mpsc::Receiver<Seen>,
}

#[derive(Debug, PartialEq)]
enum Seen {
    Head,
    /// Body bytes that arrived, and whether that was all of them.
    Ended(usize, bool),
}

impl ChunkOrigin {
    fn start() -> ChunkOrigin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = l.local_addr().expect("origin addr");
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let tx = tx.clone();
                std::thread::spawn(move || chunk_origin(c, tx));
            }
        });
        ChunkOrigin { addr, seen }
    }
}

fn chunk_origin(mut c: TcpStream, seen: mpsc::Sender<Seen>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(20)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let path = req.path.unwrap_or("").to_owned();
                let len: usize = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .unwrap_or(0);
                buf.drain(..n);
                if path == "/chunked-big" {
                    let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: x-chunks\r\n\r\n".to_vec();
                    for i in 0..CHUNKS {
                        out.extend_from_slice(format!("{CHUNK:x}\r\n").as_bytes());
                        out.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, CHUNK));
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(format!("0\r\nx-chunks: {CHUNKS}\r\n\r\n").as_bytes());
                    if c.write_all(&out).is_err() {
                        return;
                    }
                    continue;
                }
                let _ = seen.send(Seen::Head);
                let mut got = buf.len();
                while got < len {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => got += k,
                    }
                }
                let _ = seen.send(Seen::Ended(got, got >= len));
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                return;
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

fn expected_chunked_body() -> Vec<u8> {
    let mut b = Vec::with_capacity(CHUNK * CHUNKS);
    for i in 0..CHUNKS {
        b.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, CHUNK));
    }
    b
}

/// A 1 MiB JSON body that request-validation reads whole before the request phases, streamed in 16 KiB DATA
/// frames (more than the stream's window, so it only arrives as the proxy takes it): both without a length
/// (chunked towards the origin) and with one. A body failing the schema is refused without reaching the origin.
#[test]
fn h2_large_body_read_whole_by_a_plugin_reaches_the_origin_intact() {
    let o = Origin::start();
    let schema = json!({"type": "object", "required": ["payload"],
        "properties": {"payload": {"type": "string"}}});
    let gw = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/*",
            "plugins": {"request-validation": {"body_schema": schema}},
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let addr = gw.addr;
    let body = format!("{{\"payload\": \"{}\"}}", "p".repeat(1 << 20));
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let pieces: Vec<&[u8]> = body.as_bytes().chunks(16 * 1024).collect();
        for with_length in [false, true] {
            let mut req =
                http::Request::post("http://t/v").header("content-type", "application/json");
            if with_length {
                req = req.header("content-length", body.len().to_string());
            }
            let (s, _, echoed, _) = send(&mut c, req.body(()).unwrap(), &pieces).await;
            let echoed = String::from_utf8(echoed).unwrap();
            assert_eq!(s, 200, "with length: {with_length}");
            assert!(
                echoed.ends_with(&format!("\n\n{body}")),
                "the origin got the body whole (with length: {with_length}): {} bytes echoed",
                echoed.len()
            );
        }
        let req = http::Request::post("http://t/v")
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let (s, _, answer, _) = send(&mut c, req, &[b"{\"other\": ", b"1}"]).await;
        assert_eq!(
            (s, String::from_utf8(answer).unwrap().as_str()),
            (400, "property \"payload\" is required")
        );
    });
}

/// A chunked response of 1 MiB (16 times the client's default stream window) with a trailer: every byte in order,
/// the trailer as an h2 trailers frame; then the same through gzip (a body filter, so re-framed by `Conn`).
#[test]
fn h2_chunked_response_beyond_the_window_keeps_order_and_trailers() {
    let o = ChunkOrigin::start();
    let plain = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/*",
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let gzip = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/*", "plugins": {"gzip": {"types": "*"}},
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let (a, b) = (plain.addr, gzip.addr);
    rt().block_on(async move {
        let mut c = connect(a).await;
        let (s, headers, body, trailers) = send(&mut c, get("http://t/chunked-big"), &[]).await;
        assert_eq!(s, 200);
        assert!(headers.get("transfer-encoding").is_none());
        assert!(
            body == expected_chunked_body(),
            "{} bytes, out of order or cut",
            body.len()
        );
        let trailers = trailers.expect("trailers frame");
        assert_eq!(trailers.get("x-chunks").unwrap(), &CHUNKS.to_string());

        let mut c = connect(b).await;
        let req = http::Request::get("http://t/chunked-big")
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap();
        let (s, headers, body, _) = send(&mut c, req, &[]).await;
        assert_eq!(s, 200);
        assert_eq!(headers.get("content-encoding").unwrap(), "gzip");
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut plain)
            .expect("valid gzip");
        assert!(
            plain == expected_chunked_body(),
            "{} bytes after gunzip",
            plain.len()
        );
    });
}

/// 128 streams at once (the advertised maximum), each sending 64 KiB and getting it echoed back: the connection
/// window (1 MiB) is shared, so streams only progress as others' bytes are taken.
#[test]
fn h2_many_concurrent_streams_with_bodies_both_ways() {
    let o = Origin::start();
    let gw = Gw::start(route_to(&o), ProxyConfig::default());
    let addr = gw.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let mut tasks = Vec::new();
        for i in 0..128u32 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let fill = b'a' + (i % 26) as u8;
                let body = vec![fill; 64 * 1024];
                let pieces: Vec<&[u8]> = body.chunks(10_000).collect();
                let req = http::Request::post(format!("http://t/m/{i}"))
                    .body(())
                    .unwrap();
                let (s, _, echoed, _) = send(&mut c, req, &pieces).await;
                (i, s, echoed, body)
            }));
        }
        for t in tasks {
            let (i, s, echoed, body) = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("stream finished in time")
                .unwrap();
            assert_eq!(s, 200, "stream {i}");
            let head = format!("POST /m/{i}\n");
            assert!(echoed.starts_with(head.as_bytes()), "stream {i}");
            assert!(echoed.ends_with(&body), "stream {i}: its own body, whole");
        }
    });
}

/// A client that resets its stream in the middle of a request body: the upstream request is abandoned (the
/// origin sees its connection close before the body's end) and the client's connection keeps serving streams.
#[test]
fn h2_client_reset_mid_body_abandons_the_upstream_request() {
    let o = ChunkOrigin::start();
    let gw = Gw::start(
        json!({"routes": [{"id": "r1", "uri": "/*",
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let addr = gw.addr;
    let seen = o.seen;
    rt().block_on(async move {
        let c = connect(addr).await;
        let mut s = c.clone().ready().await.unwrap();
        let req = http::Request::post("http://t/upload")
            .header("content-length", (1u32 << 20).to_string())
            .body(())
            .unwrap();
        let (_resp, mut tx) = s.send_request(req, false).unwrap();
        tx.send_data(Bytes::from(vec![b'u'; 10_000]), false)
            .unwrap();
        // The upstream request is under way once the origin has its head.
        let wait = |seen: mpsc::Receiver<Seen>| {
            tokio::task::spawn_blocking(move || {
                let ev = seen
                    .recv_timeout(Duration::from_secs(15))
                    .expect("origin event");
                (ev, seen)
            })
        };
        let (ev, seen) = wait(seen).await.unwrap();
        assert_eq!(ev, Seen::Head);
        tx.send_reset(h2::Reason::CANCEL);
        let (ev, _) = wait(seen).await.unwrap();
        let Seen::Ended(got, whole) = ev else {
            panic!("{ev:?}")
        };
        assert!(!whole, "the origin saw its request cut ({got} bytes)");
        assert!(got < 1 << 20);
        let mut c = c;
        let (s, _, body, _) = send(&mut c, get("http://t/chunked-big"), &[]).await;
        assert_eq!(s, 200);
        assert_eq!(body.len(), CHUNK * CHUNKS);
    });
}

/// Plugin answers, the body limit and 100-continue on h2 streams: key-auth's 401 and a pass, 413 for a declared
/// length over `client_max_body_size` and for a streamed body that grows past it, an `expect: 100-continue`
/// request served whole.
#[test]
fn h2_plugin_answers_body_limit_and_expect_continue() {
    let o = Origin::start();
    let node = o.addr.to_string();
    let gw = Gw::start(
        json!({
            "consumers": [{"username": "jack", "plugins": {"key-auth": {"key": "k1"}}}],
            "routes": [
                {"id": "auth", "uri": "/auth", "plugins": {"key-auth": {}},
                 "upstream": {"type": "roundrobin", "nodes": {node.clone(): 1}}},
                {"id": "open", "uri": "/open/*",
                 "upstream": {"type": "roundrobin", "nodes": {node: 1}}}
            ]
        }),
        ProxyConfig {
            max_body: 1000,
            ..ProxyConfig::default()
        },
    );
    let addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(addr).await;
        let (s, headers, body, _) = send(&mut c, get("http://t/auth"), &[]).await;
        assert_eq!(s, 401, "{}", String::from_utf8_lossy(&body));
        assert!(headers.get("connection").is_none());
        assert!(String::from_utf8_lossy(&body).contains("Missing API key"));
        let req = http::Request::get("http://t/auth")
            .header("apikey", "k1")
            .body(())
            .unwrap();
        let (s, _, body, _) = send(&mut c, req, &[]).await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));

        let big = vec![b'b'; 5000];
        let req = http::Request::post("http://t/open/len")
            .header("content-length", "5000")
            .body(())
            .unwrap();
        let (s, _, _, _) = send(&mut c, req, &[&big]).await;
        assert_eq!(s, 413);
        let req = http::Request::post("http://t/open/stream")
            .body(())
            .unwrap();
        let (s, _, _, _) = send(&mut c, req, &[&big[..600], &big[600..]]).await;
        assert_eq!(s, 413);

        let req = http::Request::post("http://t/open/expect")
            .header("expect", "100-continue")
            .header("content-length", "5")
            .body(())
            .unwrap();
        let (s, _, body, _) = send(&mut c, req, &[b"hello"]).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(s, 200, "{body}");
        assert!(body.ends_with("\n\nhello"), "{body}");
        // The connection still serves streams after all of that.
        let (s, _, _, _) = send(&mut c, get("http://t/open/after"), &[]).await;
        assert_eq!(s, 200);
    });
}
