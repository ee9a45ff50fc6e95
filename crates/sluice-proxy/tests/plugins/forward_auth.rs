//! forward-auth (APISIX apisix/plugins/forward-auth.lua, docs/en/latest/plugins/forward-auth.md,
//! t/plugin/forward-auth{,2,3}.t) through the real proxy, and with it the awaited-IO facility end to end: an
//! in-process auth service (plain or TLS) records every request and connection event and answers by the
//! `Authorization` value the client sent, the way the APISIX tests' serverless auth route does.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{request, route, Gw, Origin, Seen};

/// What the auth service reports as it happens.
#[derive(Debug, PartialEq)]
enum Ev {
    /// A request arrived (its Authorization value).
    Request(String),
    /// A connection it was holding open (the `hang` answer) was closed by the gateway.
    Closed,
}

struct Auth {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    conns: Arc<AtomicUsize>,
    events: Mutex<Receiver<Ev>>,
}

impl Auth {
    fn start() -> Auth {
        Self::start_with(None)
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Auth {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let conns = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = channel();
        let (s2, c2) = (seen.clone(), conns.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                c2.fetch_add(1, Ordering::SeqCst);
                let (seen, tx, tls) = (s2.clone(), tx.clone(), tls.clone());
                std::thread::spawn(move || {
                    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                    match tls {
                        None => serve(c, &seen, &tx),
                        Some(cfg) => {
                            let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            serve(rustls::StreamOwned::new(conn, c), &seen, &tx)
                        }
                    }
                });
            }
        });
        Auth {
            addr,
            seen,
            conns,
            events: Mutex::new(rx),
        }
    }

    fn uri(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("auth saw a request")
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn wait(&self, want: Ev) {
        let rx = self.events.lock().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(ev) if ev == want => return,
                Ok(_) => {}
                Err(_) => panic!("auth service never reported {want:?}"),
            }
        }
    }
}

fn ok(extra: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\n{extra}Content-Length: 0\r\n\r\n").into_bytes()
}

/// The answer for one request, chosen by its Authorization value (POSTs without one echo their body length).
fn answer(req: &Seen) -> Vec<u8> {
    let auth = req.header("authorization").unwrap_or("");
    match auth {
        "111" | "pause" => ok(""),
        "222" => ok("X-User-ID: i-am-an-user\r\n"),
        "multi" => ok("X-User-ID: first\r\nX-User-ID: second\r\n"),
        "333" => b"HTTP/1.1 403 Forbidden\r\nLocation: http://example.com/auth\r\nX-Secret: internal\r\nContent-Length: 6\r\n\r\ndenied".to_vec(),
        "401" => {
            let body = r#"{"message":"who are you"}"#;
            format!("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"x\"\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
        }
        "302" => b"HTTP/1.1 302 Found\r\nLocation: https://login.example.com/\r\nContent-Length: 0\r\n\r\n".to_vec(),
        "chunked-deny" => b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nchu\r\n3\r\nnky\r\n0\r\n\r\n".to_vec(),
        "bare-lf" => b"HTTP/1.1 200 OK\r\nX-User-ID: a\nInjected: 1\r\nContent-Length: 0\r\n\r\n".to_vec(),
        "bare-cr" => b"HTTP/1.1 200 OK\r\nX-User-ID: a\rInjected: 1\r\nContent-Length: 0\r\n\r\n".to_vec(),
        "nul" => b"HTTP/1.1 200 OK\r\nX-User-ID: a\0b\r\nContent-Length: 0\r\n\r\n".to_vec(),
        "huge" => ok(&format!("X-User-ID: {}\r\n", "a".repeat(40_000))),
        "bigbody" => {
            let n = 2 * 1024 * 1024;
            let mut r = format!("HTTP/1.1 403 Forbidden\r\nContent-Length: {n}\r\n\r\n").into_bytes();
            r.resize(r.len() + n, b'x');
            r
        }
        "smuggle" => b"HTTP/1.1 200 OK\r\nX-User-ID: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
        "" if req.method == "POST" => ok(&format!("X-Body-Len: {}\r\n", req.body.len())),
        _ => b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 7\r\n\r\nno auth".to_vec(),
    }
}

fn serve(mut c: impl Read + Write, seen: &Mutex<Vec<Seen>>, tx: &Sender<Ev>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let n = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => Some(n),
            Ok(httparse::Status::Partial) => None,
            Err(_) => return,
        };
        if let Some(n) = n {
            let len: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                .unwrap_or(0);
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
            while buf.len() < n + len {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            rec.body = String::from_utf8_lossy(&buf[n..n + len]).into_owned();
            buf.drain(..n + len);
            let auth = rec.header("authorization").unwrap_or("").to_owned();
            seen.lock().unwrap().push(rec.clone());
            let _ = tx.send(Ev::Request(auth.clone()));
            match auth.as_str() {
                "hang" => {
                    // Hold the request until the gateway lets go of the connection.
                    loop {
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    let _ = tx.send(Ev::Closed);
                    return;
                }
                "slow" => std::thread::sleep(Duration::from_secs(3)),
                "pause" => std::thread::sleep(Duration::from_millis(300)),
                _ => {}
            }
            if c.write_all(&answer(&rec)).is_err() || c.flush().is_err() {
                return;
            }
            if rec
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"))
            {
                return;
            }
            continue;
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

fn gw(o: &Origin, conf: Value) -> Gw {
    Gw::start(json!({"routes": [route("r1", "/hello", o, json!({"forward-auth": conf}))]}))
}

fn get(gw: &Gw, auth: &str) -> crate::Resp {
    gw.get("/hello", &[("Authorization", auth)])
}

/// A port nothing listens on (bound, then released).
fn dead_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// t/plugin/forward-auth.t TESTs 3, 4, 7: request_headers reach the auth service, upstream_headers its answer
/// reach the origin.
#[test]
fn allowed_requests_carry_the_answer_s_upstream_headers() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "upstream_headers": ["X-User-ID"]}),
    );
    let r = get(&g, "222");
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    assert_eq!(o.last().header("x-user-id"), Some("i-am-an-user"));
    let seen = a.last();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("GET", "/auth")
    );
    assert_eq!(seen.header("authorization"), Some("222"));
    assert_eq!(seen.header("host"), Some(a.addr.to_string().as_str()));
    assert_eq!(seen.header("content-length"), None);

    let r = get(&g, "111");
    assert_eq!(r.status, 200);
    assert_eq!(o.last().header("x-user-id"), None);
    // Every value of a repeated answer header is passed on.
    assert_eq!(get(&g, "multi").status, 200);
    let vals: Vec<_> = o
        .last()
        .headers
        .into_iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-user-id"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(vals, ["first", "second"]);
    drop(g);

    // Without upstream_headers nothing of the answer reaches the origin; without request_headers the client's
    // Authorization does not reach the auth service.
    let g = gw(&o, json!({"uri": a.uri("/auth")}));
    assert_eq!(
        get(&g, "222").status,
        401,
        "the auth service saw no Authorization"
    );
    assert_eq!(a.last().header("authorization"), None);
    drop(g);
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"]}),
    );
    assert_eq!(get(&g, "222").status, 200);
    assert_eq!(o.last().header("x-user-id"), None);
}

/// TESTs 5, 8: a non-2xx answer goes to the client with its status and body and only the client_headers; the
/// origin is never contacted.
#[test]
fn denied_requests_get_the_auth_answer() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"],
               "client_headers": ["Location", "WWW-Authenticate", "Set-Cookie"]}),
    );
    let r = get(&g, "333");
    assert_eq!((r.status, r.body.as_str()), (403, "denied"));
    assert_eq!(r.header("location"), Some("http://example.com/auth"));
    assert_eq!(r.header("x-secret"), None, "only client_headers are copied");
    let r = get(&g, "401");
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "who are you"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"x\""));
    assert_eq!(r.header("content-type"), None, "not in client_headers");
    let cookies: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    let r = get(&g, "302");
    assert_eq!(
        (r.status, r.header("location")),
        (302, Some("https://login.example.com/"))
    );
    let r = get(&g, "chunked-deny");
    assert_eq!((r.status, r.body.as_str()), (403, "chunky"));
    assert_eq!(o.count(), 0, "denied requests never reach the origin");
    drop(g);

    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"]}),
    );
    let r = get(&g, "333");
    assert_eq!((r.status, r.header("location")), (403, None));
    assert_eq!(o.count(), 0);
}

/// TEST 6: the X-Forwarded-* fields are the gateway's view of the request, whatever the client sent.
#[test]
fn x_forwarded_fields_are_the_gateway_s() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"]}),
    );
    let r = g.get(
        "/hello?a=1",
        &[
            ("Host", "Shop.Example.com:8080"),
            ("Authorization", "111"),
            ("X-Forwarded-Host", "apisix.apache.org"),
            ("X-Forwarded-For", "6.6.6.6"),
            ("X-Forwarded-Uri", "/public"),
            ("X-Forwarded-Proto", "https"),
        ],
    );
    assert_eq!(r.status, 200);
    let s = a.last();
    assert_eq!(s.header("x-forwarded-proto"), Some("http"));
    assert_eq!(s.header("x-forwarded-method"), Some("GET"));
    assert_eq!(s.header("x-forwarded-host"), Some("shop.example.com"));
    assert_eq!(s.header("x-forwarded-uri"), Some("/hello?a=1"));
    assert_eq!(s.header("x-forwarded-for"), Some("127.0.0.1"));
    for n in [
        "x-forwarded-host",
        "x-forwarded-for",
        "x-forwarded-uri",
        "x-forwarded-proto",
    ] {
        let k = s
            .headers
            .iter()
            .filter(|(h, _)| h.eq_ignore_ascii_case(n))
            .count();
        assert_eq!(k, 1, "{n} is sent once");
    }
    // The auth service is asked about the path the router matched, not a traversal spelling of it.
    drop(g);
    let g = Gw::start(json!({"routes": [route("r1", "/admin/*", &o,
        json!({"forward-auth": {"uri": a.uri("/auth"), "request_headers": ["Authorization"]}}))]}));
    assert_eq!(
        g.get("/public/../admin/x", &[("Authorization", "111")])
            .status,
        200
    );
    assert_eq!(a.last().header("x-forwarded-uri"), Some("/admin/x"));
    // HEAD and other methods are reported as sent.
    let r = request(
        g.addr,
        "DELETE",
        "/admin/y",
        &[("Authorization", "111")],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(a.last().header("x-forwarded-method"), Some("DELETE"));
    assert_eq!(
        a.last().method,
        "GET",
        "the auth request's own method is request_method"
    );
}

/// TESTs 9, 10 and forward-auth2.t: with request_method POST the client's body goes to the auth service,
/// re-framed with a Content-Length (forward-auth.t TEST 21: a chunked body is not sent chunked); the origin still
/// gets the body.
#[test]
fn post_sends_the_client_body() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_method": "POST", "upstream_headers": ["X-Body-Len"]}),
    );
    let body = r#"{"authorization": "555"}"#;
    let r = request(
        g.addr,
        "POST",
        "/hello",
        &[("Content-Type", "application/json")],
        body,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let s = a.last();
    assert_eq!((s.method.as_str(), s.body.as_str()), ("POST", body));
    assert_eq!(
        s.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(s.header("content-type"), None, "not in request_headers");
    assert_eq!(o.last().body, body);
    assert_eq!(
        o.last().header("x-body-len"),
        Some(body.len().to_string().as_str())
    );

    // Chunked from the client: the auth service gets the decoded body with a length.
    let mut c = TcpStream::connect(g.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST /hello HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Encoding: identity\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let s = a.last();
    assert_eq!(s.body, "hello");
    assert_eq!(s.header("content-length"), Some("5"));
    assert_eq!(s.header("transfer-encoding"), None);
    assert_eq!(s.header("content-encoding"), Some("identity"));
    // (The origin gets it chunked, which the recording origin does not decode.)
    assert_eq!(o.last().header("transfer-encoding"), Some("chunked"));

    // A GET client with a POST config: an empty, length-framed body (forward-auth2.t TEST 3).
    assert_eq!(g.get("/hello", &[]).status, 200);
    assert_eq!(a.last().header("content-length"), Some("0"));
    drop(g);

    // A GET config never sends framing fields, whatever the client sent (forward-auth2.t TEST 5).
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization", "Content-Length", "Transfer-Encoding"]}),
    );
    let r = request(
        g.addr,
        "POST",
        "/hello",
        &[("Authorization", "111")],
        "payload",
    );
    assert_eq!(r.status, 200);
    let s = a.last();
    assert_eq!(
        (
            s.header("content-length"),
            s.header("transfer-encoding"),
            s.body.as_str()
        ),
        (None, None, "")
    );
    assert_eq!(o.last().body, "payload");
    drop(g);

    // TESTs 18, 19: max_req_body_size.
    let n = a.count();
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_method": "POST", "max_req_body_size": 10}),
    );
    let r = request(g.addr, "POST", "/hello", &[], r#"{"authorization":"555"}"#);
    assert_eq!(r.status, 413);
    assert_eq!(a.count(), n, "a too large body is not sent");
    assert_eq!(
        request(g.addr, "POST", "/hello", &[], "0123456789").status,
        200
    );
}

/// TESTs 14-16: extra_headers with fixed values and variables; a variable whose value would break the auth
/// request's head makes the call fail (status_on_error) instead of reaching the auth service.
#[test]
fn extra_headers_resolve_variables() {
    let (a, o) = (Auth::start(), Origin::start());
    let conf = json!({"uri": a.uri("/auth"), "request_headers": ["Authorization", "X-Fixed"],
        "extra_headers": {"X-Tenant": "$arg_tenant", "X-Fixed": "abcd", "X-Route": "route-$route_id",
                          "X-Forwarded-Host": "overridden", "X-Path": "$uri"}});
    let g =
        Gw::start(json!({"routes": [route("r1", "/hello*", &o, json!({"forward-auth": conf}))]}));
    let r = g.get(
        "/hello?tenant=123",
        &[("Authorization", "111"), ("X-Fixed", "from-client")],
    );
    assert_eq!(r.status, 200);
    let s = a.last();
    assert_eq!(s.header("x-tenant"), Some("123"));
    assert_eq!(
        s.header("x-fixed"),
        Some("abcd"),
        "extra_headers win over request_headers"
    );
    assert_eq!(s.header("x-route"), Some("route-r1"));
    assert_eq!(s.header("x-forwarded-host"), Some("overridden"));
    assert_eq!(s.header("x-path"), Some("/hello"));
    // A missing variable resolves to "".
    assert_eq!(g.get("/hello", &[("Authorization", "111")]).status, 200);
    assert_eq!(a.last().header("x-tenant"), Some(""));

    // `$uri` is decoded: %0d%0a becomes CR LF, which must not split the auth request.
    let n = a.count();
    let r = g.get("/hello%0d%0ax-user1:%20admin", &[("Authorization", "111")]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(a.count(), n, "nothing was sent to the auth service");
    assert_eq!(o.count(), 2);
}

/// TESTs 11-13: an unreachable auth service answers status_on_error (nginx's page for it) or, with
/// allow_degradation, lets the request through.
#[test]
fn auth_service_down() {
    let o = Origin::start();
    let uri = format!("http://{}/auth", dead_port());
    let g = gw(&o, json!({"uri": uri}));
    let r = get(&g, "111");
    assert_eq!(r.status, 403);
    assert!(
        r.body.contains("<title>403 Forbidden</title>"),
        "{}",
        r.body
    );
    drop(g);
    let g = gw(&o, json!({"uri": uri, "status_on_error": 503}));
    assert_eq!(get(&g, "111").status, 503);
    assert_eq!(o.count(), 0);
    drop(g);
    let g = gw(
        &o,
        json!({"uri": uri, "allow_degradation": true, "upstream_headers": ["X-User-ID"]}),
    );
    let r = g.get("/hello", &[("X-User-ID", "forged")]);
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    assert_eq!(o.count(), 1);
    // APISIX returns before touching upstream_headers when it degrades: the client's value passes.
    assert_eq!(o.last().header("x-user-id"), Some("forged"));
}

/// An auth service slower than `timeout` gets status_on_error after about the timeout (or degradation).
#[test]
fn slow_auth_service_times_out() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "timeout": 300}),
    );
    let t0 = Instant::now();
    let r = get(&g, "slow");
    let took = t0.elapsed();
    assert_eq!(r.status, 403);
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(
        took < Duration::from_millis(2500),
        "answered after the auth service, not the timeout: {took:?}"
    );
    assert_eq!(o.count(), 0);
    drop(g);
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "timeout": 300,
                          "allow_degradation": true}),
    );
    let t0 = Instant::now();
    let r = get(&g, "slow");
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    assert!(
        t0.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t0.elapsed()
    );
}

/// The awaited-IO facility's cancellation: a client that leaves while the auth call is in flight drops the call
/// (the auth service sees its connection closed) and nothing goes to the origin.
#[test]
fn client_leaving_cancels_the_auth_call() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "timeout": 20000}),
    );
    let mut c = TcpStream::connect(g.addr).unwrap();
    c.write_all(b"GET /hello HTTP/1.1\r\nHost: t\r\nAuthorization: hang\r\n\r\n")
        .unwrap();
    a.wait(Ev::Request("hang".into()));
    drop(c);
    // Well before the 20 s timeout: only the client's leaving can close it.
    let t0 = Instant::now();
    a.wait(Ev::Closed);
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(o.count(), 0);
    // The gateway goes on serving.
    assert_eq!(get(&g, "111").status, 200);
}

/// `_meta.error_response` replaces the body of the plugin's answers: a deny, an error.
#[test]
fn meta_error_response_applies() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"],
                          "client_headers": ["Location"], "_meta": {"error_response": "nope"}}),
    );
    let r = get(&g, "333");
    assert_eq!((r.status, r.body.as_str()), (403, "nope"));
    assert_eq!(r.header("location"), Some("http://example.com/auth"));
    assert_eq!(get(&g, "111").body, "origin");
    drop(g);
    let g = gw(
        &o,
        json!({"uri": format!("http://{}/", dead_port()), "status_on_error": 502,
                          "_meta": {"error_response": "down"}}),
    );
    let r = get(&g, "111");
    assert_eq!((r.status, r.body.as_str()), (502, "down"));
}

/// Plugins after forward-auth run after its answer: a denied request never reaches limit-count (priority 1002,
/// access), an allowed one does; proxy-rewrite's header (rewrite phase, so earlier) is cleared like a client's.
#[test]
fn later_plugins_run_after_the_answer() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = Gw::start(json!({"routes": [route("r1", "/hello", &o, json!({
        "forward-auth": {"uri": a.uri("/auth"), "request_headers": ["Authorization"], "upstream_headers": ["X-User-ID"]},
        "limit-count": {"count": 1, "time_window": 60, "rejected_code": 429, "key": "remote_addr"},
        "proxy-rewrite": {"headers": {"set": {"X-User-ID": "from-rewrite", "X-Rewritten": "yes"}}}
    }))]}));
    assert_eq!(get(&g, "333").status, 403);
    assert_eq!(get(&g, "401").status, 401);
    let r = get(&g, "111");
    assert_eq!(r.status, 200, "the denials did not use the quota");
    let s = o.last();
    assert_eq!(s.header("x-rewritten"), Some("yes"));
    assert_eq!(s.header("x-user-id"), None);
    assert_eq!(get(&g, "222").status, 429);
    assert_eq!(a.count(), 4, "forward-auth runs before limit-count");
}

/// forward-auth3.t: a client-sent upstream header never reaches the origin unless the auth answer set it.
#[test]
fn clients_cannot_forge_upstream_headers() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "upstream_headers": ["X-User-ID"]}),
    );
    let mut c = TcpStream::connect(g.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /hello HTTP/1.1\r\nHost: t\r\nAuthorization: 111\r\nX-User-ID: admin\r\nx-user-id: admin2\r\nX-USER-ID: admin3\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        o.last()
            .headers
            .iter()
            .all(|(n, _)| !n.eq_ignore_ascii_case("x-user-id")),
        "{:?}",
        o.last()
    );
    let r = g.get(
        "/hello",
        &[("Authorization", "222"), ("X-User-ID", "admin")],
    );
    assert_eq!(r.status, 200);
    let vals: Vec<_> = o
        .last()
        .headers
        .into_iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-user-id"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(vals, ["i-am-an-user"]);
    assert_eq!(a.count(), 2);
}

/// A hostile or broken auth answer (bare LF / CR, NUL, a huge head, a huge body, CL with TE) is an error: it
/// answers status_on_error and nothing of it reaches the origin or breaks the upstream head.
#[test]
fn hostile_auth_answers_fail_closed() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"],
                          "upstream_headers": ["X-User-ID", "Injected"], "client_headers": ["X-User-ID"]}),
    );
    for key in ["bare-lf", "bare-cr", "nul", "huge", "bigbody", "smuggle"] {
        let r = get(&g, key);
        assert_eq!(r.status, 403, "{key}: {}", r.body);
        assert!(r.body.contains("403 Forbidden"), "{key}: {}", r.body);
        assert_eq!(r.header("x-user-id"), None, "{key}");
    }
    assert_eq!(o.count(), 0);
    // The gateway and its pooled auth connections are fine afterwards.
    assert_eq!(get(&g, "222").status, 200);
    assert_eq!(o.last().header("x-user-id"), Some("i-am-an-user"));
    assert_eq!(o.last().header("injected"), None);
}

/// keepalive (the default) reuses the auth connection per worker thread; `keepalive: false` closes it each time.
#[test]
fn keepalive_reuses_auth_connections() {
    let o = Origin::start();
    let start = |conf: Value| {
        let res = json!({"routes": [route("r1", "/hello", &o, json!({"forward-auth": conf}))]});
        Gw::start_with(res, Arc::new(sluice_plugins::Shared::default()), 1).unwrap()
    };
    let a = Auth::start();
    let g = start(json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"]}));
    for _ in 0..3 {
        assert_eq!(get(&g, "111").status, 200);
    }
    assert_eq!(a.conns.load(Ordering::SeqCst), 1, "one pooled connection");
    assert_eq!(a.last().header("connection"), None);
    drop(g);
    let a = Auth::start();
    let g = start(
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"], "keepalive": false}),
    );
    for _ in 0..3 {
        assert_eq!(get(&g, "111").status, 200);
    }
    assert_eq!(a.conns.load(Ordering::SeqCst), 3);
    assert_eq!(a.last().header("connection"), Some("close"));
}

fn tls_server() -> Arc<rustls::ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![ck.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(ck.key_pair.serialize_der()).unwrap(),
        )
        .unwrap();
    Arc::new(cfg)
}

/// https auth services: a self-signed certificate passes only with `ssl_verify: false`.
#[test]
fn https_auth_service() {
    let (a, o) = (Auth::start_with(Some(tls_server())), Origin::start());
    let uri = format!("https://localhost:{}/auth", a.addr.port());
    let g = gw(
        &o,
        json!({"uri": uri, "ssl_verify": false, "request_headers": ["Authorization"],
                          "upstream_headers": ["X-User-ID"]}),
    );
    let r = get(&g, "222");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(o.last().header("x-user-id"), Some("i-am-an-user"));
    assert_eq!(get(&g, "333").status, 403);
    assert_eq!(
        a.last().header("host"),
        Some(format!("localhost:{}", a.addr.port()).as_str())
    );
    drop(g);
    let n = a.count();
    let g = gw(
        &o,
        json!({"uri": uri, "request_headers": ["Authorization"], "status_on_error": 502}),
    );
    assert_eq!(
        get(&g, "222").status,
        502,
        "an untrusted certificate fails the call"
    );
    assert_eq!(a.count(), n);
}

/// The configuration is checked when it is compiled, with APISIX's schema errors.
#[test]
fn bad_configurations_are_refused() {
    let o = Origin::start();
    let try_conf = |conf: Value| {
        Gw::try_start(json!({"routes": [route("r1", "/hello", &o, json!({"forward-auth": conf}))]}))
            .err()
    };
    let e = try_conf(json!({"request_headers": ["a"]})).unwrap();
    assert!(e.contains("property \"uri\" is required"), "{e}");
    let e = try_conf(json!({"uri": "ftp://x/"})).unwrap();
    assert!(e.contains("invalid uri"), "{e}");
    let e = try_conf(json!({"uri": "http://x/", "request_headers": ["A\r\nB: c"]})).unwrap();
    assert!(e.contains("invalid header name"), "{e}");
}

/// Body bytes the proxy reads while it watches the client during the auth call are kept: a large body sent
/// during the call reaches the origin whole, and the connection serves the next request.
#[test]
fn client_body_read_during_the_call_reaches_the_origin() {
    let (a, o) = (Auth::start(), Origin::start());
    let g = gw(
        &o,
        json!({"uri": a.uri("/auth"), "request_headers": ["Authorization"]}),
    );
    let body: String = (0..300_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let r = request(
        g.addr,
        "POST",
        "/hello",
        &[("Authorization", "pause")],
        &body,
    );
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    assert!(
        o.last().body == body,
        "the origin got {} bytes",
        o.last().body.len()
    );
    assert_eq!(a.last().body, "", "a GET auth request carries no body");

    // Keep-alive: a second request on the same connection after an awaited call.
    let mut c = TcpStream::connect(g.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST /hello HTTP/1.1\r\nHost: t\r\nAuthorization: pause\r\nContent-Length: 5\r\n\r\nfirstGET /hello HTTP/1.1\r\nHost: t\r\nAuthorization: 111\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    let seen = o.seen.lock().unwrap();
    let n = seen.len();
    assert_eq!(
        (seen[n - 2].body.as_str(), seen[n - 1].method.as_str()),
        ("first", "GET")
    );
}
