//! HTTP/2 upstreams beyond gRPC (Sluice's `scheme: "h2c"`), and the plugin phases on the h2-upstream path: an
//! in-process h2 origin (the `h2` crate's server) records every request (head, body, trailers); HTTP/1.1, HTTP/1.0
//! and h2 clients reach it through the gateway.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_proxy::ProxyConfig;

use super::{connect, rt, send, Gw};

/// One request as the origin saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: http::HeaderMap,
    body: Vec<u8>,
    trailers: Option<http::HeaderMap>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// `/len` answers `hello` with a Content-Length (and `x-up`, `x-drop`); any other path answers `echo:<body>`
/// without a length, ending with an `x-trailer: done` trailer.
fn h2_origin() -> (SocketAddr, Log) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let log: Log = Arc::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let log = log2.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let log = log.clone();
                        tokio::spawn(async move {
                            let (parts, mut body) = req.into_parts();
                            let mut got = Vec::new();
                            while let Some(Ok(d)) = body.data().await {
                                let _ = body.flow_control().release_capacity(d.len());
                                got.extend_from_slice(&d);
                            }
                            let trailers = body.trailers().await.ok().flatten();
                            let path = parts.uri.path().to_owned();
                            log.lock().unwrap().push(Seen {
                                method: parts.method.to_string(),
                                uri: parts.uri.to_string(),
                                headers: parts.headers,
                                body: got.clone(),
                                trailers,
                            });
                            if path == "/len" {
                                let resp = http::Response::builder()
                                    .header("content-length", "5")
                                    .header("x-up", "1")
                                    .header("x-drop", "1")
                                    .body(())
                                    .unwrap();
                                let mut tx = respond.send_response(resp, false).unwrap();
                                let _ = tx.send_data(Bytes::from_static(b"hello"), true);
                            } else {
                                let resp = http::Response::builder().body(()).unwrap();
                                let mut tx = respond.send_response(resp, false).unwrap();
                                let mut out = b"echo:".to_vec();
                                out.extend_from_slice(&got);
                                let _ = tx.send_data(Bytes::from(out), false);
                                let mut t = http::HeaderMap::new();
                                t.insert("x-trailer", "done".parse().unwrap());
                                let _ = tx.send_trailers(t);
                            }
                        });
                    }
                });
            }
        });
    });
    (addr, log)
}

fn route(scheme: &str, origin: SocketAddr, plugins: Value) -> Value {
    json!({"routes": [{"id": "h", "uri": "/*", "plugins": plugins, "upstream": {
        "scheme": scheme, "nodes": {origin.to_string(): 1}}}]})
}

/// Sends raw bytes, reads until the gateway closes; returns (head lower-cased, body as sent on the wire).
fn raw(addr: SocketAddr, req: &[u8]) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_ascii_lowercase(), body.to_owned())
}

fn header<'a>(s: &'a Seen, name: &str) -> Option<&'a str> {
    s.headers.get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn h2c_upstream_serves_http1_clients_with_the_forwarded_head_and_each_framing() {
    let (addr, log) = h2_origin();
    let plugins = json!({"proxy-rewrite": {"headers": {"set": {"x-edit": "yes"}}}});
    let gw = Gw::start(route("h2c", addr, plugins), ProxyConfig::default());

    // A length-delimited h2 response keeps its Content-Length.
    let (head, body) = raw(
        gw.addr,
        b"GET /len?q=1 HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n",
    );
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-length: 5"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, "hello");
    let seen = log.lock().unwrap()[0].clone();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.uri, "http://a.test/len?q=1", "Host becomes :authority");
    assert_eq!(
        header(&seen, "x-edit"),
        Some("yes"),
        "plugin request edits apply"
    );
    assert_eq!(
        header(&seen, "x-forwarded-for"),
        Some("10.0.0.1, 127.0.0.1")
    );
    assert_eq!(header(&seen, "x-real-ip"), Some("127.0.0.1"));
    assert_eq!(header(&seen, "x-forwarded-proto"), Some("http"));
    assert!(seen.headers.get("connection").is_none());

    // Chunked request body with a trailer out, chunked response with the upstream's trailer back.
    let (head, body) = raw(
        gw.addr,
        b"POST /echo HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-req-trailer: t\r\n\r\n",
    );
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(body, "8\r\necho:abc\r\n0\r\nx-trailer: done\r\n\r\n");
    let seen = log.lock().unwrap()[1].clone();
    assert_eq!(seen.body, b"abc");
    let t = seen.trailers.expect("request trailers reach the upstream");
    assert_eq!(t.get("x-req-trailer").unwrap(), "t");

    // An HTTP/1.0 client cannot take chunked: the body is close-delimited.
    let (head, body) = raw(
        gw.addr,
        b"POST /echo HTTP/1.0\r\nHost: a.test\r\nContent-Length: 2\r\n\r\nhi",
    );
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "echo:hi");
    assert_eq!(log.lock().unwrap()[2].body, b"hi");
}

#[test]
fn h2_client_through_an_h2c_upstream_keeps_bodies_and_trailers() {
    let (addr, log) = h2_origin();
    let gw = Gw::start(route("h2c", addr, json!({})), ProxyConfig::default());
    let gw_addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(gw_addr).await;
        let req = http::Request::post("http://b.test/echo").body(()).unwrap();
        let (status, _, body, trailers) = send(&mut c, req, &[b"one ", b"two"]).await;
        assert_eq!(status, 200);
        assert_eq!(body, b"echo:one two");
        assert_eq!(
            trailers.expect("trailers").get("x-trailer").unwrap(),
            "done"
        );
        let (status, headers, body, _) = send(&mut c, super::get("http://b.test/len"), &[]).await;
        assert_eq!(status, 200);
        assert_eq!(headers.get("content-length").unwrap(), "5");
        assert_eq!(body, b"hello");
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].uri, "http://b.test/echo");
}

#[test]
fn grpc_route_applies_response_header_edits_and_runs_the_log_phase() {
    let (addr, _log) = h2_origin();
    let path = std::env::temp_dir().join(format!("sluice-h2up-log-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let plugins = json!({
        "response-rewrite": {"status_code": 203,
            "headers": {"set": {"x-set": "s", "x-up": "replaced"}, "add": ["x-add: a"], "remove": ["x-drop"]}},
        "file-logger": {"path": path.to_str().unwrap()},
    });
    let gw = Gw::start(route("grpc", addr, plugins), ProxyConfig::default());
    let (head, body) = raw(
        gw.addr,
        b"GET /len HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    );
    assert!(head.starts_with("http/1.1 203"), "{head}");
    assert!(head.contains("x-set: s"), "{head}");
    assert!(head.contains("x-add: a"), "{head}");
    assert!(
        head.contains("x-up: replaced") && !head.contains("x-up: 1"),
        "{head}"
    );
    assert!(!head.contains("x-drop"), "{head}");
    assert_eq!(body, "hello");
    let t = Instant::now();
    let line: Value = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(l) = text.lines().next() {
            break serde_json::from_str(l).unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no log line");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(line["route_id"], "h");
    assert_eq!(line["response"]["status"], 203, "the status the client got");
    assert_eq!(line["upstream"], addr.to_string());
    let _ = std::fs::remove_file(&path);
}

/// opentelemetry's and zipkin's context reaches an h2c upstream, from an HTTP/1.1 client and an h2 client. The
/// samplers are off / zero here (nothing is exported; tests/plugins/tracing.rs covers export): an unsampled
/// request still propagates its `traceparent` and `x-b3-sampled: 0`.
#[test]
fn h2c_upstream_gets_the_trace_context() {
    let (addr, log) = h2_origin();
    let plugins = json!({"opentelemetry": {"sampler": {"name": "parent_base"}}});
    let mut res = route("h2c", addr, plugins);
    // The sampled request's span goes to a closed port (export is not what this test checks).
    res["plugin_metadata"] =
        json!([{"id": "opentelemetry", "collector": {"address": "127.0.0.1:9"}}]);
    let gw = Gw::start(res, ProxyConfig::default());
    let client = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (head, _) = raw(
        gw.addr,
        format!(
            "GET /len HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\
             traceparent: 00-{client}-00f067aa0ba902b7-01\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let gw_addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(gw_addr).await;
        let (status, ..) = send(&mut c, super::get("http://b.test/len"), &[]).await;
        assert_eq!(status, 200);
    });
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2);
    let first = header(&log[0], "traceparent").expect("traceparent on h2c");
    assert!(first.starts_with(&format!("00-{client}-")), "{first}");
    assert!(!first.contains("00f067aa0ba902b7"), "{first}");
    assert!(first.ends_with("-01"), "the client's sampled flag: {first}");
    let second = header(&log[1], "traceparent").expect("traceparent on h2c from h2");
    assert_eq!(second.len(), 55, "{second}");
    assert!(second.ends_with("-00"), "{second}");
    assert_eq!(log[1].headers.get_all("traceparent").iter().count(), 1);
}
