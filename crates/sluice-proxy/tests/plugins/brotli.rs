//! brotli through the real proxy (APISIX docs/en/latest/plugins/brotli.md, t/plugin/brotli.t): negotiation from
//! Accept-Encoding with q-values, the response head (Content-Encoding, Vary, no Content-Length, a weakened ETag)
//! and the body checked with an independent decoder (the `brotli` crate's decompressor).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};

fn page() -> String {
    format!("<html>{}</html>", "hello brotli ".repeat(400))
}

/// `n` bytes of text that repeats only at long distances, so a too small window would lose matches or data.
fn sized(n: usize) -> String {
    let mut x: u32 = 2_463_534_242;
    let words: Vec<String> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            format!("w{:x} ", x % 50_000)
        })
        .collect();
    words.concat().repeat(n / 20_000 + 1)[..n].to_owned()
}

/// An origin answering `/n/<len>` (text/html of that length), `/html` (text/html with a strong ETag), `/json`, `/small`, `/encoded` (already gzip) and
/// `/stream` (a chunked page in several pieces).
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let Some(buf) = crate::head::read_head(&mut c) else {
                    return;
                };
                let head = String::from_utf8_lossy(&buf);
                let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                let p = page();
                let fixed = |ct: &str, extra: &str, body: &str| {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                if path == "/stream" {
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                    );
                    for piece in p.as_bytes().chunks(1000) {
                        let _ = write!(c, "{:x}\r\n", piece.len());
                        let _ = c.write_all(piece);
                        let _ = c.write_all(b"\r\n");
                        let _ = c.flush();
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let _ = c.write_all(b"0\r\n\r\n");
                    return;
                }
                if let Some(n) = path.strip_prefix("/n/") {
                    let body = sized(n.parse().unwrap_or(0));
                    let out = fixed("text/html", "", &body);
                    let _ = c.write_all(out.as_bytes());
                    return;
                }
                let out = match path.as_str() {
                    "/html" => fixed("text/html; charset=utf-8", "ETag: \"v1\"\r\n", &p),
                    "/weak" => fixed("text/html", "ETag: W/\"v1\"\r\n", &p),
                    "/bare" => fixed("text/html", "ETag: v1\r\n", &p),
                    "/json" => fixed("application/json", "", &p),
                    "/small" => fixed("text/html", "", "tiny"),
                    "/encoded" => fixed("text/html", "Content-Encoding: gzip\r\n", &p),
                    _ => fixed("text/html", "", &p),
                };
                let _ = c.write_all(out.as_bytes());
            });
        }
    });
    addr
}

struct Raw {
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
    fn status(&self) -> u16 {
        self.head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
    /// The body with chunked framing removed.
    fn payload(&self) -> Vec<u8> {
        if self.header("transfer-encoding") != Some("chunked") {
            return self.body.clone();
        }
        let (mut out, mut rest) = (Vec::new(), &self.body[..]);
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let n =
                usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap().trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[i + 2..i + 2 + n]);
            rest = &rest[i + 2 + n + 2..];
        }
        out
    }
    fn decoded(&self) -> String {
        let mut out = Vec::new();
        brotli::BrotliDecompress(&mut &self.payload()[..], &mut out).expect("valid brotli stream");
        String::from_utf8(out).unwrap()
    }
}

/// One request on its own connection, read to the close (binary-safe).
fn get(addr: SocketAddr, version: &str, path: &str, headers: &[(&str, &str)]) -> Raw {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} {version}\r\nHost: test.local\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    c.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    Raw {
        head: String::from_utf8_lossy(&buf[..end]).into_owned(),
        body: buf[end..].to_vec(),
    }
}

fn gw(up: SocketAddr, plugins: Value) -> crate::Gw {
    crate::Gw::start(
        json!({"routes": [{"id": "1", "uri": "/*", "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}}]}),
    )
}

const BR: (&str, &str) = ("Accept-Encoding", "br");

#[test]
fn compresses_when_accepted_with_apisix_head() {
    let up = origin();
    let g = gw(up, json!({"brotli": {"vary": true}}));
    let r = get(g.addr, "HTTP/1.1", "/html", &[BR]);
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("content-encoding"), Some("br"), "{}", r.head);
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    assert!(r.header("content-length").is_none(), "{}", r.head);
    assert_eq!(r.header("etag"), Some("W/\"v1\""));
    assert!(
        r.payload().len() < page().len() / 4,
        "not compressed: {}",
        r.payload().len()
    );
    assert_eq!(r.decoded(), page());
    // A streamed answer is compressed piece by piece and still decodes whole.
    let r = get(g.addr, "HTTP/1.1", "/stream", &[BR]);
    assert_eq!(r.header("content-encoding"), Some("br"));
    assert_eq!(r.decoded(), page());
    // A weak ETag stays, an unquoted one is dropped.
    assert_eq!(
        get(g.addr, "HTTP/1.1", "/weak", &[BR]).header("etag"),
        Some("W/\"v1\"")
    );
    assert!(get(g.addr, "HTTP/1.1", "/bare", &[BR])
        .header("etag")
        .is_none());
}

#[test]
fn window_sized_to_the_answer_decodes_at_every_size() {
    let up = origin();
    let g = gw(up, json!({"brotli": {"min_length": 1}}));
    for n in [1, 1023, 1024, 1025, 65_535, 65_536, 65_537, 300_000] {
        let r = get(g.addr, "HTTP/1.1", &format!("/n/{n}"), &[BR]);
        assert_eq!(r.header("content-encoding"), Some("br"), "{n}: {}", r.head);
        assert_eq!(r.decoded(), sized(n), "{n}");
    }
}

#[test]
fn negotiation_follows_accept_encoding_q_values() {
    let up = origin();
    let g = gw(up, json!({"brotli": {}}));
    for (ae, want) in [
        (Some("br"), true),
        (Some("gzip, br;q=0.5"), true),
        (Some("*"), true),
        (Some("gzip;q=1, *;q=0.1"), true),
        (Some("br;q=0"), false),
        (Some("br;q=0.0"), false),
        (Some("gzip, deflate"), false),
        (Some("identity"), false),
        (None, false),
    ] {
        let h: Vec<(&str, &str)> = ae.map(|v| ("Accept-Encoding", v)).into_iter().collect();
        let r = get(g.addr, "HTTP/1.1", "/html", &h);
        assert_eq!(
            r.header("content-encoding") == Some("br"),
            want,
            "{ae:?}: {}",
            r.head
        );
        if !want {
            assert_eq!(r.body, page().as_bytes(), "{ae:?}");
            assert!(r.header("vary").is_none());
        }
    }
}

#[test]
fn types_length_encoding_and_version_are_respected() {
    let up = origin();
    let g = gw(up, json!({"brotli": {}}));
    // Default types: text/html only; below min_length 20; already encoded; HTTP/1.0 under http_version 1.1.
    for (version, path) in [
        ("HTTP/1.1", "/json"),
        ("HTTP/1.1", "/small"),
        ("HTTP/1.1", "/encoded"),
        ("HTTP/1.0", "/html"),
    ] {
        let r = get(g.addr, version, path, &[BR]);
        assert_ne!(
            r.header("content-encoding"),
            Some("br"),
            "{path} {version}: {}",
            r.head
        );
    }
    drop(g);
    let g = gw(
        up,
        json!({"brotli": {"types": "*", "min_length": 1, "http_version": 1.0, "comp_level": 11, "mode": 1, "lgwin": 0, "lgblock": 16}}),
    );
    for (version, path) in [
        ("HTTP/1.1", "/json"),
        ("HTTP/1.1", "/small"),
        ("HTTP/1.0", "/html"),
    ] {
        let r = get(g.addr, version, path, &[BR]);
        assert_eq!(
            r.header("content-encoding"),
            Some("br"),
            "{path} {version}: {}",
            r.head
        );
        let want = if path == "/small" {
            "tiny".to_owned()
        } else {
            page()
        };
        assert_eq!(r.decoded(), want);
    }
    // Upstream encodings are never re-encoded.
    assert_eq!(
        get(g.addr, "HTTP/1.1", "/encoded", &[BR]).header("content-encoding"),
        Some("gzip")
    );
}

#[test]
fn brotli_wins_over_gzip_on_the_same_route() {
    let up = origin();
    let g = gw(up, json!({"brotli": {}, "gzip": {}}));
    let r = get(
        g.addr,
        "HTTP/1.1",
        "/html",
        &[("Accept-Encoding", "gzip, br")],
    );
    assert_eq!(r.header("content-encoding"), Some("br"), "{}", r.head);
    assert_eq!(r.decoded(), page());
    let r = get(g.addr, "HTTP/1.1", "/html", &[("Accept-Encoding", "gzip")]);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
}

#[test]
fn bad_configurations_are_refused() {
    let up = origin();
    for conf in [
        json!({"comp_level": 12}),
        json!({"lgwin": 25}),
        json!({"mode": 3}),
        json!({"types": []}),
    ] {
        let err = crate::Gw::try_start(
            json!({"routes": [{"id": "1", "uri": "/*", "plugins": {"brotli": conf},
            "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}}]}),
        )
        .err();
        assert!(err.is_some_and(|e| e.contains("brotli")), "{conf}");
    }
}
