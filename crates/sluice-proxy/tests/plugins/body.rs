//! The response side through the real proxy: body_filter re-framing, response-rewrite (status, headers, body,
//! body_base64, filters, vars), gzip and echo (APISIX docs/en/latest/plugins/<name>.md, t/plugin/<name>.t). An
//! origin of its own serves length, chunked, close-delimited, encoded and streamed bodies; a client of its own
//! decodes chunked responses and keeps connections alive.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{consumer, Gw};

const PAGE_REPEAT: usize = 100;

fn page() -> String {
    format!("<html>{}</html>", "hello world ".repeat(PAGE_REPEAT))
}

/// An origin answering by path; keeps connections alive.
struct BodyOrigin {
    addr: SocketAddr,
}

impl BodyOrigin {
    fn start() -> BodyOrigin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = l.local_addr().expect("origin addr");
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                std::thread::spawn(move || serve(c));
            }
        });
        BodyOrigin { addr }
    }
}

fn serve(mut c: TcpStream) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut hs);
        let n = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => match c.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(k) => {
                    buf.extend_from_slice(&chunk[..k]);
                    continue;
                }
            },
            Err(_) => return,
        };
        let head = req.method == Some("HEAD");
        let path = req.path.unwrap_or("/").to_owned();
        buf.drain(..n);
        let fixed = |status: &str, ct: &str, extra: &str, body: &str| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ct}\r\n{extra}Content-Length: {}\r\n\r\n{}",
                body.len(),
                if head { "" } else { body }
            )
        };
        let p = page();
        let out = match path.as_str() {
            "/html" => fixed(
                "200 OK",
                "text/html; charset=utf-8",
                "ETag: \"v1\"\r\nLast-Modified: Sun, 22 Nov 2026 00:00:00 GMT\r\nAccept-Ranges: bytes\r\n",
                &p,
            ),
            "/hello" => fixed("200 OK", "text/plain", "X-Up: 1\r\n", "hello world\n"),
            "/small" => fixed("200 OK", "text/html", "", "tiny"),
            "/encoded" => fixed("200 OK", "text/html", "Content-Encoding: br\r\n", &p),
            "/missing" => fixed("404 Not Found", "text/html", "", &p),
            "/broken" => fixed("500 Internal Server Error", "text/html", "", &p),
            "/empty" => "HTTP/1.1 204 No Content\r\n\r\n".to_owned(),
            "/chunked" | "/stream" => {
                // Pieces arrive apart, so filters see several body_filter calls.
                let n = if path == "/stream" { 100 } else { 3 };
                let head_only = head;
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                if head_only {
                    continue;
                }
                for i in 0..n {
                    let piece = match i {
                        0 => "hello ".to_owned(),
                        1 => "world ".to_owned(),
                        _ => format!("piece{i} "),
                    };
                    let _ = c.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes());
                    let _ = c.flush();
                    std::thread::sleep(Duration::from_millis(30));
                }
                if c.write_all(b"0\r\n\r\n").is_err() {
                    return;
                }
                continue;
            }
            "/eof" => {
                let _ = c.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n{p}")
                        .as_bytes(),
                );
                return;
            }
            _ => fixed("200 OK", "text/plain", "", "origin"),
        };
        if c.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// A decoded response.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// How the body was framed: "length", "chunked" or "close".
    framing: &'static str,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn gunzip(&self) -> String {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&self.body[..])
            .read_to_string(&mut s)
            .expect("valid gzip body");
        s
    }
}

/// A client connection reading responses one after the other.
struct Client {
    c: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let c = TcpStream::connect(addr).expect("connect gateway");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { c, buf: Vec::new() }
    }

    fn more(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match self.c.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(k) => {
                self.buf.extend_from_slice(&chunk[..k]);
                true
            }
        }
    }

    fn send(
        &mut self,
        method: &str,
        target: &str,
        version: &str,
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut req = format!("{method} {target} {version}\r\nHost: test.local\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.c.write_all(req.as_bytes()).unwrap();
        self.read(method == "HEAD")
    }

    fn read(&mut self, head_only: bool) -> Resp {
        let (status, headers, n) = loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut hs);
            if let Ok(httparse::Status::Complete(n)) = r.parse(&self.buf) {
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
                break (r.code.unwrap_or(0), headers, n);
            }
            assert!(self.more(), "connection closed before a response head");
        };
        self.buf.drain(..n);
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let mut resp = Resp {
            status,
            headers: headers.clone(),
            body: Vec::new(),
            framing: "length",
        };
        if head_only || status == 204 || status == 304 {
            return resp;
        }
        if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            resp.framing = "chunked";
            loop {
                let Some(line_end) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                    assert!(self.more(), "closed inside a chunked body");
                    continue;
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.buf[..line_end]).unwrap().trim(),
                    16,
                )
                .expect("chunk size");
                while self.buf.len() < line_end + 2 + size + 2 {
                    assert!(self.more(), "closed inside a chunk");
                }
                resp.body
                    .extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    return resp;
                }
            }
        }
        match get("content-length").and_then(|v| v.trim().parse::<usize>().ok()) {
            Some(len) => {
                while self.buf.len() < len {
                    assert!(self.more(), "closed inside a length body");
                }
                resp.body = self.buf.drain(..len).collect();
            }
            None => {
                resp.framing = "close";
                while self.more() {}
                resp.body = std::mem::take(&mut self.buf);
            }
        }
        resp
    }
}

fn get(gw: &Gw, target: &str, headers: &[(&str, &str)]) -> Resp {
    Client::connect(gw.addr).send("GET", target, "HTTP/1.1", headers)
}

fn one(o: &BodyOrigin, plugins: Value) -> Gw {
    Gw::start(json!({"routes": [{
        "id": "r1", "uri": "/*", "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}
    }]}))
}

const GZ: (&str, &str) = ("Accept-Encoding", "gzip, deflate");

#[test]
fn route_without_body_filters_keeps_length_framing() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"response-rewrite": {"headers": {"set": {"X-A": "1"}}}}),
    );
    let r = get(&gw, "/html", &[GZ]);
    assert_eq!(r.framing, "length");
    assert_eq!(
        r.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    assert_eq!(r.header("x-a"), Some("1"));
    assert_eq!(r.text(), page());
}

/// t/plugin/response-rewrite.t: `body`, `status_code` and `headers` together; the new body is re-framed.
#[test]
fn response_rewrite_body_status_and_headers() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"response-rewrite": {"body": "new body\n", "status_code": 403,
            "headers": {"add": ["X-Add: a"], "set": {"X-Up": "set", "X-Route": "$route_id"}, "remove": ["X-Gone"]}}}),
    );
    let r = get(&gw, "/hello", &[]);
    assert_eq!(r.status, 403);
    assert_eq!(r.text(), "new body\n");
    assert_eq!(r.framing, "chunked");
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.header("x-up"), Some("set"));
    assert_eq!(r.header("x-route"), Some("r1"));
    assert_eq!(r.header("x-add"), Some("a"));
    // Validators of the old body are gone.
    let r = get(&gw, "/html", &[]);
    assert_eq!((r.status, r.text().as_str()), (403, "new body\n"));
    assert_eq!(r.header("etag"), None);
    assert_eq!(r.header("last-modified"), None);
    // An HTTP/1.0 client gets the body delimited by close.
    let r = Client::connect(gw.addr).send("GET", "/html", "HTTP/1.0", &[]);
    assert_eq!((r.framing, r.text().as_str()), ("close", "new body\n"));
    // HEAD: the new status, no body.
    let r = Client::connect(gw.addr).send("HEAD", "/html", "HTTP/1.1", &[]);
    assert_eq!(r.status, 403);
}

#[test]
fn response_rewrite_body_base64_and_empty_body() {
    let o = BodyOrigin::start();
    // "SGVsbG8K" is "Hello\n" (APISIX's docs example).
    let gw = one(
        &o,
        json!({"response-rewrite": {"body": "SGVsbG8K", "body_base64": true}}),
    );
    assert_eq!(get(&gw, "/html", &[]).text(), "Hello\n");
    drop(gw);
    let gw = one(&o, json!({"response-rewrite": {"body": ""}}));
    let r = get(&gw, "/html", &[]);
    assert_eq!((r.status, r.body.len()), (200, 0));
}

/// t/plugin/response-rewrite2.t: filters once/global, several in order, no match, empty replacement.
#[test]
fn response_rewrite_filters() {
    let o = BodyOrigin::start();
    let cases = [
        (
            json!([{"regex": "l", "replace": "t", "scope": "global"}]),
            "hetto wortd\n",
        ),
        (
            json!([{"regex": "hello", "replace": "HELLO"}, {"regex": "L", "replace": "T"}]),
            "HETLO world\n",
        ),
        (
            json!([{"regex": "test", "replace": "TEST"}]),
            "hello world\n",
        ),
        (json!([{"regex": "hello", "replace": ""}]), " world\n"),
        // PCRE's `$` would also match before the final newline; the regex crate's matches only at the end.
        (json!([{"regex": "\\w\\S+\n$", "replace": "*"}]), "hello *"),
        (
            json!([{"regex": "(\\w+) (\\w+)", "replace": "$2 $1"}]),
            "world hello\n",
        ),
        (
            json!([{"regex": "HELLO", "replace": "bye", "options": "i"}]),
            "bye world\n",
        ),
    ];
    for (filters, want) in cases {
        let gw = one(
            &o,
            json!({"response-rewrite": {"vars": [["status", "==", 200]], "filters": filters}}),
        );
        let r = get(&gw, "/hello", &[]);
        assert_eq!(r.text(), want, "{filters}");
        assert_eq!(r.framing, "chunked");
    }
}

/// A match spanning two upstream pieces: the body is held until its end, then substituted.
#[test]
fn response_rewrite_filters_see_the_whole_chunked_body() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"response-rewrite": {"filters": [{"regex": "o w", "replace": "0_W"}]}}),
    );
    let r = get(&gw, "/chunked", &[]);
    assert_eq!(r.text(), "hell0_World piece2 ");
}

/// `vars` on the status: a 404 page is rewritten, a 200 is not.
#[test]
fn response_rewrite_vars_select_responses() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"response-rewrite": {"vars": [["status", "==", 404]], "status_code": 200,
            "body": "{\"code\":\"ok\"}", "headers": {"Content-Type": "application/json"}}}),
    );
    let r = get(&gw, "/missing", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "{\"code\":\"ok\"}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = get(&gw, "/hello", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "hello world\n"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.framing, "length");
}

/// APISIX runs the filters on the plugins' own answers too: key-auth's 401 gets the new body and status.
#[test]
fn response_rewrite_applies_to_a_plugins_own_answer() {
    let o = BodyOrigin::start();
    let gw = Gw::start(json!({
        "routes": [{"id": "r1", "uri": "/*",
            "plugins": {"key-auth": {}, "response-rewrite": {"status_code": 200, "body": "rewritten\n"}},
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}],
        "consumers": [consumer("jack", json!({"key-auth": {"key": "k1"}}))]
    }));
    let r = get(&gw, "/hello", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "rewritten\n"));
    assert_eq!(r.header("content-length"), Some("10"));
}

/// A replaced body ends the response at once, even while the upstream is still streaming; the client's
/// connection stays usable for the next request.
#[test]
fn replaced_body_does_not_wait_for_a_streaming_upstream() {
    let o = BodyOrigin::start();
    let gw = one(&o, json!({"response-rewrite": {"body": "short\n"}}));
    let mut c = Client::connect(gw.addr);
    let t = Instant::now();
    let r = c.send("GET", "/stream", "HTTP/1.1", &[]);
    assert_eq!(r.text(), "short\n");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    let r = c.send("GET", "/hello", "HTTP/1.1", &[]);
    assert_eq!(r.text(), "short\n");
}

#[test]
fn response_rewrite_schema_errors_refuse_the_config() {
    let o = BodyOrigin::start();
    let bad = [
        json!({"body": "a", "filters": [{"regex": "a", "replace": "b"}]}),
        json!({"body": "!", "body_base64": true}),
        json!({"filters": [{"regex": "a", "replace": "b", "options": "h"}]}),
        json!({"status_code": 600}),
    ];
    for conf in bad {
        let e = Gw::try_start(json!({"routes": [{"id": "r1", "uri": "/*",
            "plugins": {"response-rewrite": conf},
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}))
        .err()
        .expect("refused");
        assert!(
            e.contains("failed to check the configuration of plugin response-rewrite"),
            "{e}"
        );
    }
}

/// t/plugin/gzip.t: compressed when the type matches and the client accepts gzip; the body decompresses to the
/// origin's; Content-Length goes, Vary is added when asked.
#[test]
fn gzip_compresses_matching_responses() {
    let o = BodyOrigin::start();
    let gw = one(&o, json!({"gzip": {"vary": true}}));
    let r = get(&gw, "/html", &[GZ]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.header("accept-ranges"), None);
    assert_eq!(r.header("etag"), Some("W/\"v1\""));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert_eq!(r.framing, "chunked");
    assert!(r.body.len() < page().len() / 4, "{}", r.body.len());
    assert_eq!(r.gunzip(), page());
    // A chunked upstream body (no length) is compressed too.
    let r = get(&gw, "/chunked", &[GZ]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.gunzip(), "hello world piece2 ");
    // Keep-alive: two compressed responses on one connection.
    let mut c = Client::connect(gw.addr);
    for _ in 0..2 {
        assert_eq!(c.send("GET", "/html", "HTTP/1.1", &[GZ]).gunzip(), page());
    }
}

#[test]
fn gzip_leaves_other_responses_alone() {
    let o = BodyOrigin::start();
    let gw = one(&o, json!({"gzip": {"vary": true}}));
    let plain = |r: &Resp, why: &str| {
        assert_eq!(
            r.header("content-encoding").filter(|v| *v == "gzip"),
            None,
            "{why}"
        );
    };
    let r = get(&gw, "/html", &[]);
    plain(&r, "no Accept-Encoding");
    assert_eq!(r.text(), page());
    assert_eq!(
        r.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    assert_eq!(
        r.header("vary"),
        Some("Accept-Encoding"),
        "vary once the type matched"
    );
    plain(
        &get(&gw, "/html", &[("Accept-Encoding", "gzip;q=0, br")]),
        "q=0",
    );
    plain(
        &get(&gw, "/hello", &[GZ]),
        "text/plain is not in the default types",
    );
    plain(&get(&gw, "/small", &[GZ]), "below min_length");
    let r = get(&gw, "/encoded", &[GZ]);
    assert_eq!(r.header("content-encoding"), Some("br"), "already encoded");
    plain(&get(&gw, "/broken", &[GZ]), "status 500");
    let r = Client::connect(gw.addr).send("GET", "/html", "HTTP/1.0", &[GZ]);
    plain(&r, "HTTP/1.0 below http_version 1.1");
    let r = Client::connect(gw.addr).send("HEAD", "/html", "HTTP/1.1", &[GZ]);
    plain(&r, "HEAD");
    assert_eq!(
        get(&gw, "/missing", &[GZ]).gunzip(),
        page(),
        "404 pages are compressed"
    );
}

#[test]
fn gzip_types_star_min_length_level_and_http10() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"gzip": {"types": "*", "min_length": 5, "http_version": 1.0}}),
    );
    let r = get(&gw, "/hello", &[GZ]);
    assert_eq!(r.gunzip(), "hello world\n");
    assert_eq!(r.header("vary"), None);
    let r = get(&gw, "/small", &[GZ]);
    assert_eq!(r.header("content-encoding"), None, "4 bytes < min_length 5");
    let r = Client::connect(gw.addr).send("GET", "/html", "HTTP/1.0", &[GZ]);
    assert_eq!((r.framing, r.gunzip()), ("close", page()));
    drop(gw);
    let sizes: Vec<usize> = [1, 9]
        .iter()
        .map(|l| {
            let gw = one(&o, json!({"gzip": {"comp_level": l}}));
            let r = get(&gw, "/html", &[GZ]);
            assert_eq!(r.gunzip(), page());
            r.body.len()
        })
        .collect();
    assert!(sizes[1] <= sizes[0], "{sizes:?}");
    let e = Gw::try_start(
        json!({"routes": [{"id": "r1", "uri": "/*", "plugins": {"gzip": {"comp_level": 10}},
        "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
    )
    .err()
    .expect("refused");
    assert!(
        e.contains("failed to check the configuration of plugin gzip"),
        "{e}"
    );
}

/// gzip compresses what the body filters produced (nginx's gzip filter runs after APISIX's Lua filters).
#[test]
fn gzip_compresses_the_rewritten_body() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"gzip": {}, "response-rewrite": {"filters": [{"regex": "world", "replace": "there", "scope": "global"}]}}),
    );
    let r = get(&gw, "/html", &[GZ]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.gunzip(), page().replace("world", "there"));
}

/// t/plugin/echo.t: before_body and after_body around the upstream's body, `body` replacing it, headers set.
#[test]
fn echo_wraps_or_replaces_the_body() {
    let o = BodyOrigin::start();
    let gw = one(
        &o,
        json!({"echo": {"before_body": "before the body modification ", "after_body": " after"}}),
    );
    let r = get(&gw, "/hello", &[]);
    assert_eq!(r.text(), "before the body modification hello world\n after");
    assert_eq!(r.header("content-length"), None);
    // Across several upstream pieces: before once, after once.
    let r = get(&gw, "/chunked", &[]);
    assert_eq!(
        r.text(),
        "before the body modification hello world piece2  after"
    );
    drop(gw);
    let gw = one(
        &o,
        json!({"echo": {"before_body": "<", "body": "hello upstream", "after_body": ">",
            "headers": {"Location": "https://www.iresty.com", "X-Num": 1}}}),
    );
    let r = get(&gw, "/html", &[]);
    assert_eq!(r.text(), "<hello upstream>");
    assert_eq!(r.header("location"), Some("https://www.iresty.com"));
    assert_eq!(r.header("x-num"), Some("1"));
    let e = Gw::try_start(
        json!({"routes": [{"id": "r1", "uri": "/*", "plugins": {"echo": {"headers": {"a": "b"}}},
        "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}),
    )
    .err()
    .expect("refused");
    assert!(e.contains("object matches none of the required"), "{e}");
}

/// A close-delimited upstream body and an empty (204) one through the filters.
#[test]
fn body_filters_on_eof_and_empty_bodies() {
    let o = BodyOrigin::start();
    let gw = one(&o, json!({"echo": {"after_body": "!"}}));
    let r = get(&gw, "/eof", &[]);
    assert_eq!(r.text(), format!("{}!", page()));
    let r = get(&gw, "/empty", &[]);
    assert_eq!((r.status, r.body.len()), (204, 0));
}

/// h2 clients go through the same HTTP/1.1 connection code via the in-memory bridge: the re-framed body reaches
/// them too (curl with HTTP/2 prior knowledge; skipped when curl lacks HTTP/2, failed under CI=true).
#[test]
fn h2_client_gets_the_filtered_body() {
    let has_h2 = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"));
    if !has_h2 {
        crate::ci::skip_unless_ci("curl without HTTP/2");
        return;
    }
    let o = BodyOrigin::start();
    let res: sluice_model::Resources = serde_json::from_value(json!({"routes": [{
        "id": "r1", "uri": "/*", "plugins": {"echo": {"before_body": "h2:"}, "gzip": {"types": "*"}},
        "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}]}))
    .unwrap();
    let shared = std::sync::Arc::new(sluice_plugins::Shared::default());
    let snap = sluice_proxy::Snapshot::compile_with(&res, 1, &shared).unwrap();
    let cfg = sluice_proxy::ProxyConfig {
        enable_http2: true,
        ..Default::default()
    };
    let gw = sluice_proxy::Gateway::new(cfg, snap);
    let listeners = sluice_proxy::Listeners::bind(&["127.0.0.1:0".parse().unwrap()], 1).unwrap();
    let addr = listeners.local_addrs[0];
    let running = gw.start(listeners).unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "--compressed",
            "-m",
            "10",
            "-w",
            "\n%{http_version}",
        ])
        .arg(format!("http://{addr}/hello"))
        .output()
        .unwrap();
    gw.shutdown();
    running.join();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, "h2:hello world\n\n2", "{out:?}");
}

/// Log lines of a file-logger, polled until `n` are there (bounded).
fn log_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// APISIX's log entry: `response.headers` as sent, and `response.body` with `include_resp_body` (the body the
/// client got before gzip), filtered by `include_resp_body_expr`.
#[test]
fn loggers_see_response_headers_and_body() {
    let o = BodyOrigin::start();
    let path = std::env::temp_dir().join(format!("sluice-body-log-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let gw = one(
        &o,
        json!({"file-logger": {"path": path.to_str().unwrap(), "include_resp_body": true},
            "gzip": {"types": "*", "min_length": 1},
            "response-rewrite": {"headers": {"set": {"X-Rw": "1"}}}}),
    );
    let r = get(&gw, "/hello", &[GZ]);
    assert_eq!(r.gunzip(), "hello world\n");
    let lines = log_lines(&path, 1);
    assert_eq!(lines.len(), 1);
    let resp = &lines[0]["response"];
    assert_eq!(resp["status"], 200);
    assert_eq!(resp["body"], "hello world\n");
    assert_eq!(resp["headers"]["x-up"], "1");
    assert_eq!(resp["headers"]["x-rw"], "1");
    assert_eq!(resp["headers"]["content-encoding"], "gzip");
    assert_eq!(resp["headers"]["content-type"], "text/plain");
    drop(gw);
    let _ = std::fs::remove_file(&path);
    let gw = one(
        &o,
        json!({"file-logger": {"path": path.to_str().unwrap(), "include_resp_body": true,
            "include_resp_body_expr": [["status", "==", 404]]}}),
    );
    assert_eq!(get(&gw, "/hello", &[]).status, 200);
    assert_eq!(get(&gw, "/missing", &[]).status, 404);
    let mut lines = log_lines(&path, 2);
    assert_eq!(lines.len(), 2);
    lines.sort_by_key(|l| l["response"]["status"].as_u64());
    assert_eq!(
        lines[0]["response"]["body"],
        Value::Null,
        "200: expr does not match"
    );
    assert_eq!(lines[1]["response"]["body"], page().as_str());
    // Without include_resp_body the route keeps its zero-copy path and logs no body.
    drop(gw);
    let _ = std::fs::remove_file(&path);
    let gw = one(&o, json!({"file-logger": {"path": path.to_str().unwrap()}}));
    let r = get(&gw, "/hello", &[]);
    assert_eq!(r.framing, "length");
    let lines = log_lines(&path, 1);
    assert_eq!(lines[0]["response"]["body"], Value::Null);
    assert_eq!(lines[0]["response"]["headers"]["x-up"], "1");
    let _ = std::fs::remove_file(&path);
}

/// A consumer's own body filter joins the route's chain once key-auth identifies it (APISIX's
/// merge_consumer_route): the route alone has no body filter, the merged chain does.
#[test]
fn consumer_plugins_filter_the_body() {
    let o = BodyOrigin::start();
    let gw = Gw::start(json!({
        "routes": [{"id": "r1", "uri": "/*", "plugins": {"key-auth": {}},
            "upstream": {"type": "roundrobin", "nodes": {o.addr.to_string(): 1}}}],
        "consumers": [
            consumer("jack", json!({"key-auth": {"key": "k1"}, "echo": {"after_body": "for jack"}})),
            consumer("rose", json!({"key-auth": {"key": "k2"}}))
        ]
    }));
    let r = get(&gw, "/hello", &[("apikey", "k1")]);
    assert_eq!(r.text(), "hello world\nfor jack");
    assert_eq!(r.framing, "chunked");
    let r = get(&gw, "/hello", &[("apikey", "k2")]);
    assert_eq!(r.text(), "hello world\n");
    assert_eq!(r.framing, "length");
}
