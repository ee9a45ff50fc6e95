//! grpc-transcode through the real proxy against an in-process gRPC origin (the `h2` crate's server answering by
//! path, messages hand-encoded): what reaches the upstream, how answers, trailers and errors map back, and that a
//! request that cannot be transcoded never leaves the gateway. The same plugin against real grpc-go and Python
//! servers is in `grpc_real.rs`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use sluice_proxy::ProxyConfig;

use super::{connect, rt, Gw};

const PROTO: &str = r#"syntax = "proto3";
package helloworld;
service Greeter {
  rpc SayHello (HelloRequest) returns (HelloReply) {}
  rpc SayHelloStreamReply (HelloRequest) returns (stream HelloReply) {}
  rpc Fail (HelloRequest) returns (HelloReply) {}
  rpc Deny (HelloRequest) returns (HelloReply) {}
}
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }
"#;

/// What the origin received: path, content-type, te, grpc-timeout, body.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    content_type: Option<String>,
    te: Option<String>,
    timeout: Option<String>,
    body: Vec<u8>,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn string_field(s: &str) -> Vec<u8> {
    assert!(s.len() < 128);
    let mut m = vec![0x0a, s.len() as u8];
    m.extend_from_slice(s.as_bytes());
    m
}

fn frame(msg: &[u8]) -> Bytes {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    Bytes::from(f)
}

/// The `name` of a framed HelloRequest.
fn name_of(body: &[u8]) -> String {
    if body.len() < 7 {
        return String::new();
    }
    let n = body[6] as usize;
    String::from_utf8_lossy(&body[7..7 + n]).into_owned()
}

fn start_origin() -> (SocketAddr, Calls) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let calls: Calls = Arc::default();
    let c2 = calls.clone();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let calls = c2.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, respond))) = conn.accept().await {
                        tokio::spawn(answer(req, respond, calls.clone()));
                    }
                });
            }
        });
    });
    (addr, calls)
}

async fn answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    calls: Calls,
) {
    let header = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
    let mut call = Call {
        path: req.uri().path().to_owned(),
        content_type: header("content-type"),
        te: header("te"),
        timeout: header("grpc-timeout"),
        body: Vec::new(),
    };
    let mut body = req.into_body();
    while let Some(Ok(d)) = body.data().await {
        let _ = body.flow_control().release_capacity(d.len());
        call.body.extend_from_slice(&d);
    }
    let name = name_of(&call.body);
    let path = call.path.clone();
    calls.lock().unwrap().push(call);
    let ok = |trailers_only: Option<(&str, &str)>| {
        let mut b = http::Response::builder().header("content-type", "application/grpc");
        if let Some((code, msg)) = trailers_only {
            b = b.header("grpc-status", code).header("grpc-message", msg);
        }
        b.body(()).unwrap()
    };
    let trailers = |code: &str, msg: &str| {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.parse().unwrap());
        if !msg.is_empty() {
            t.insert("grpc-message", msg.parse().unwrap());
        }
        t
    };
    match path.as_str() {
        "/helloworld.Greeter/SayHello" => {
            let mut tx = respond.send_response(ok(None), false).unwrap();
            let _ = tx.send_data(frame(&string_field(&format!("Hello {name}"))), false);
            let _ = tx.send_trailers(trailers("0", ""));
        }
        "/helloworld.Greeter/SayHelloStreamReply" => {
            let mut tx = respond.send_response(ok(None), false).unwrap();
            for i in 0..3 {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let _ = tx.send_data(frame(&string_field(&format!("Hello {name} #{i}"))), false);
            }
            let _ = tx.send_trailers(trailers("0", ""));
        }
        "/helloworld.Greeter/Fail" => {
            let mut tx = respond.send_response(ok(None), false).unwrap();
            let _ = tx.send_trailers(trailers("5", "no%20such%20greeting"));
        }
        "/helloworld.Greeter/Deny" => {
            let _ = respond.send_response(ok(Some(("7", "denied"))), true);
        }
        _ => {
            let _ = respond.send_response(ok(Some(("12", "unimplemented"))), true);
        }
    }
}

fn config(origin: SocketAddr) -> serde_json::Value {
    let route = |id: &str, uri: &str, method: &str, extra: serde_json::Value| {
        let mut conf = json!({"proto_id": "1", "service": "helloworld.Greeter", "method": method});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"id": id, "uri": uri, "plugins": {"grpc-transcode": conf},
               "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {origin.to_string(): 1}}})
    };
    json!({
        "protos": [{"id": "1", "content": PROTO}],
        "routes": [
            route("hello", "/grpctest", "SayHello", json!({"deadline": 1500})),
            route("param", "/hello/:name", "SayHello", json!({})),
            route("stream", "/stream", "SayHelloStreamReply", json!({})),
            route("fail", "/fail", "Fail", json!({})),
            route("deny", "/deny", "Deny", json!({})),
        ]
    })
}

/// One HTTP/1.1 request on a fresh connection: status, lower-cased headers, body (Content-Length or chunked), and
/// when the first body byte arrived.
pub(super) fn http1(addr: SocketAddr, req: &str) -> (u16, Vec<(String, String)>, Vec<u8>, Instant) {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut first_body = None;
    loop {
        let k = c.read(&mut chunk).unwrap_or(0);
        buf.extend_from_slice(&chunk[..k]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            if buf.len() > end + 4 && first_body.is_none() {
                first_body = Some(Instant::now());
            }
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let mut lines = head.split("\r\n");
            let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let rest = &buf[end + 4..];
            let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
            // 204 and 304 end at the head (and carry no Content-Length: RFC 9110 §8.6).
            if matches!(status, 204 | 304) {
                assert_eq!(h("content-length"), None, "{status} with a Content-Length");
                return (status, headers, Vec::new(), Instant::now());
            }
            if let Some(len) = h("content-length") {
                let len: usize = len.parse().unwrap();
                if rest.len() >= len {
                    let body = rest[..len].to_vec();
                    return (
                        status,
                        headers,
                        body,
                        first_body.unwrap_or_else(Instant::now),
                    );
                }
            } else if h("transfer-encoding").as_deref() == Some("chunked") {
                if let Some(body) = dechunk(rest) {
                    return (
                        status,
                        headers,
                        body,
                        first_body.unwrap_or_else(Instant::now),
                    );
                }
            }
        }
        assert!(
            k > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&buf)
        );
    }
}

/// The decoded body once the last chunk arrived.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let pos = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..pos]).ok()?, 16).ok()?;
        if size == 0 {
            return b[pos..].windows(4).any(|w| w == b"\r\n\r\n").then_some(out);
        }
        if b.len() < pos + 2 + size + 2 {
            return None;
        }
        out.extend_from_slice(&b[pos + 2..pos + 2 + size]);
        b = &b[pos + 2 + size + 2..];
    }
}

pub(super) fn header<'h>(hs: &'h [(String, String)], name: &str) -> Option<&'h str> {
    hs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

pub(super) fn json_body(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

#[test]
fn unary_call_from_query_and_from_json_body() {
    let (origin, calls) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    let (status, hs, body, _) = http1(
        gw.addr,
        "GET /grpctest?name=world HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_body(&body), json!({"message": "Hello world"}));
    assert_eq!(header(&hs, "content-type"), Some("application/json"));
    assert!(header(&hs, "grpc-status").is_none() && header(&hs, "trailer").is_none());
    // The gRPC origin sent no Date; a proxy adds one.
    assert!(
        header(&hs, "date").is_some_and(|d| d.ends_with(" GMT")),
        "{hs:?}"
    );
    let c = calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!(c.path, "/helloworld.Greeter/SayHello");
    assert_eq!(c.content_type.as_deref(), Some("application/grpc"));
    assert_eq!(c.te.as_deref(), Some("trailers"));
    assert_eq!(c.timeout.as_deref(), Some("1500m"));
    assert_eq!(c.body, frame(&string_field("world")).to_vec());

    let json = r#"{"name":"json"}"#;
    let (status, _, body, _) = http1(
        gw.addr,
        &format!(
            "POST /grpctest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
            json.len()
        ),
    );
    assert_eq!(
        (status, json_body(&body)),
        (200, json!({"message": "Hello json"}))
    );
    // A chunked JSON body is read whole and replaced the same way.
    let (status, _, body, _) = http1(
        gw.addr,
        "POST /grpctest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n6\r\n{\"name\r\n9\r\n\":\"chunk\"\r\n1\r\n}\r\n0\r\n\r\n",
    );
    assert_eq!(
        (status, json_body(&body)),
        (200, json!({"message": "Hello chunk"}))
    );
    assert_eq!(
        calls.lock().unwrap().last().unwrap().body,
        frame(&string_field("chunk")).to_vec()
    );
}

#[test]
fn untranscodable_request_is_400_and_never_reaches_the_upstream() {
    let (origin, calls) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    for bad in [
        r#"{"name": "#,
        r#"["not", "an", "object"]"#,
        r#"{"name": 12}"#,
    ] {
        let (status, _, body, _) = http1(
            gw.addr,
            &format!(
                "POST /grpctest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{bad}",
                bad.len()
            ),
        );
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
        assert!(json_body(&body)["message"].is_string());
    }
    assert!(
        calls.lock().unwrap().is_empty(),
        "{:?}",
        calls.lock().unwrap()
    );
}

#[test]
fn grpc_status_in_trailers_and_in_a_trailers_only_answer_map_to_http() {
    let (origin, _) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    // NOT_FOUND in the trailers after the head: APISIX would already have sent 200; Sluice held the head.
    let (status, _, _, _) = http1(
        gw.addr,
        "GET /fail?name=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 404);
    // PERMISSION_DENIED in a trailers-only answer.
    let (status, hs, _, _) = http1(
        gw.addr,
        "GET /deny?name=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 403);
    assert_eq!(header(&hs, "grpc-status"), Some("7"));
}

#[test]
fn server_stream_is_a_json_array_sent_as_it_arrives() {
    let (origin, _) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    let t0 = Instant::now();
    let (status, hs, body, first) = http1(
        gw.addr,
        "GET /stream?name=s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let done = t0.elapsed();
    assert_eq!(status, 200);
    assert_eq!(header(&hs, "transfer-encoding"), Some("chunked"));
    assert_eq!(
        json_body(&body),
        json!([{"message": "Hello s #0"}, {"message": "Hello s #1"}, {"message": "Hello s #2"}])
    );
    // The origin spaces the messages 300 ms apart: the first reached the client well before the last was sent.
    assert!(
        first.duration_since(t0) + Duration::from_millis(300) < done,
        "first body byte after {:?}, whole body after {done:?}",
        first.duration_since(t0)
    );
}

#[test]
fn h2_client_gets_the_transcoded_answer_too() {
    let (origin, _) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    rt().block_on(async {
        let mut client = connect(gw.addr).await;
        let req = http::Request::post(format!("http://{}/grpctest", gw.addr))
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let (status, headers, body, _) =
            super::send(&mut client, req, &[br#"{"name":"h2"}"#]).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers.get("content-type").unwrap(), "application/json");
        assert_eq!(json_body(&body), json!({"message": "Hello h2"}));
    });
}

#[test]
fn route_parameters_fill_fields_of_the_same_name() {
    let (origin, calls) = start_origin();
    let gw = Gw::start(config(origin), ProxyConfig::default());
    // The capture wins over the query, as a path parameter should; it is percent-decoded (nginx's `$uri`).
    let (status, _, body, _) = http1(
        gw.addr,
        "GET /hello/from%20path?name=query HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        (status, json_body(&body)),
        (200, json!({"message": "Hello from path"}))
    );
    assert_eq!(
        calls.lock().unwrap().last().unwrap().body,
        frame(&string_field("from path")).to_vec()
    );
}

/// A held head works on HTTP/1.1 upstreams too: an upstream speaking gRPC framing over HTTP/1.1 (content-length
/// body, `grpc-status` in the head) gets its status decided after the body, and the answer a length.
#[test]
fn held_head_on_an_http1_upstream() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&got).into_owned();
                if text.contains("/Fail ") {
                    // The status in a chunked body's trailers.
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\ngrpc-status: 5\r\ngrpc-message: gone\r\n\r\n",
                    );
                    return;
                }
                let code = if text.contains("/Deny ") { "7" } else { "0" };
                let body = frame(&string_field("over h1"));
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\ngrpc-status: {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(head.as_bytes());
                let _ = c.write_all(&body);
            });
        }
    });
    let route = |id: &str, uri: &str, method: &str| {
        json!({"id": id, "uri": uri, "plugins": {"grpc-transcode":
                  {"proto_id": "1", "service": "helloworld.Greeter", "method": method}},
               "upstream": {"type": "roundrobin", "nodes": {origin.to_string(): 1}}})
    };
    let gw = Gw::start(
        json!({"protos": [{"id": "1", "content": PROTO}],
               "routes": [route("ok", "/ok", "SayHello"), route("deny", "/deny", "Deny"),
                          route("fail", "/fail", "Fail")]}),
        ProxyConfig::default(),
    );
    let (status, hs, body, _) = http1(
        gw.addr,
        "GET /ok?name=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        (status, json_body(&body)),
        (200, json!({"message": "over h1"}))
    );
    assert_eq!(
        header(&hs, "content-length"),
        Some(body.len().to_string().as_str())
    );
    assert!(header(&hs, "transfer-encoding").is_none(), "{hs:?}");
    let (status, _, _, _) = http1(
        gw.addr,
        "GET /deny?name=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 403);
    // Trailers of an HTTP/1.1 chunked body reach the filters too.
    let (status, _, _, _) = http1(
        gw.addr,
        "GET /fail?name=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 404);
}
