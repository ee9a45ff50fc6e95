//! proxy-mirror through the proxy (APISIX docs/en/latest/plugins/proxy-mirror.md, t/plugin/proxy-mirror.t): a
//! second origin records the copies; `path` with both `path_concat_mode`s, bodies, `sample_ratio`, and a mirror
//! that is down or never answers, which must not delay or fail the main request.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{request, route, Gw, Origin, Seen};

fn gw(main: &Origin, plugins: Value) -> Gw {
    Gw::start(json!({"routes": [route("r1", "/*", main, plugins)]}))
}

/// Waits (bounded) until `o` has recorded `n` requests.
fn wait_for(o: &Origin, n: usize) -> Vec<Seen> {
    for _ in 0..300 {
        if o.count() >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    o.seen.lock().unwrap().clone()
}

#[test]
fn copies_method_target_headers_and_body() {
    let (main, mirror) = (Origin::start(), Origin::start());
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": format!("http://{}", mirror.addr)}}),
    );
    let r = g.get("/hello?a=1", &[("X-Trace", "t1")]);
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    let r = request(
        g.addr,
        "POST",
        "/post",
        &[("Content-Type", "text/plain")],
        "hello body",
    );
    assert_eq!(r.status, 200);
    assert_eq!(main.last().body, "hello body");
    let seen = wait_for(&mirror, 2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    let get = seen.iter().find(|s| s.method == "GET").expect("GET copy");
    assert_eq!(get.target, "/hello?a=1");
    assert_eq!(get.header("x-trace"), Some("t1"));
    assert_eq!(get.header("host"), Some("test.local"));
    let post = seen.iter().find(|s| s.method == "POST").expect("POST copy");
    assert_eq!(
        (post.target.as_str(), post.body.as_str()),
        ("/post", "hello body")
    );
    assert_eq!(post.header("content-length"), Some("10"));
}

#[test]
fn path_replace_and_prefix() {
    let (main, mirror) = (Origin::start(), Origin::start());
    let host = format!("http://{}", mirror.addr);
    let g = gw(&main, json!({"proxy-mirror": {"host": host, "path": "/a"}}));
    assert_eq!(g.get("/hello?x=1", &[]).status, 200);
    assert_eq!(wait_for(&mirror, 1)[0].target, "/a?x=1");
    // The main request keeps its own uri.
    assert_eq!(main.last().target, "/hello?x=1");
    drop(g);
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": host, "path": "/a", "path_concat_mode": "prefix"}}),
    );
    assert_eq!(g.get("/hello?x=1", &[]).status, 200);
    assert_eq!(wait_for(&mirror, 2)[1].target, "/a/hello?x=1");
}

#[test]
fn sample_ratio_mirrors_a_share() {
    let (main, mirror) = (Origin::start(), Origin::start());
    let host = format!("http://{}", mirror.addr);
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": host, "sample_ratio": 0.5}}),
    );
    for _ in 0..200 {
        assert_eq!(g.get("/hello", &[]).status, 200);
    }
    std::thread::sleep(Duration::from_millis(300));
    let n = mirror.count();
    // Binomial(200, 0.5): outside 50..150 has probability below 1e-12.
    assert!((50..=150).contains(&n), "{n}");
    drop(g);
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": host, "sample_ratio": 0.00001}}),
    );
    for _ in 0..20 {
        assert_eq!(g.get("/hello", &[]).status, 200);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(mirror.count(), n);
}

#[test]
fn a_dead_or_silent_mirror_neither_delays_nor_fails_requests() {
    let main = Origin::start();
    // Nothing listens on a port just released.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": format!("http://{dead}")}}),
    );
    for _ in 0..5 {
        assert_eq!(g.get("/hello", &[]).status, 200);
    }
    drop(g);
    // A mirror that accepts and never answers: copies pile up to the bound, then are skipped; the main requests
    // go on at full speed.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        silent.set_nonblocking(true).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok((c, _)) = silent.accept() {
                conns.push(c);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        conns.len()
    });
    let g = gw(
        &main,
        json!({"proxy-mirror": {"host": format!("http://{addr}")}}),
    );
    let t = Instant::now();
    for _ in 0..150 {
        let r = request(g.addr, "POST", "/hello", &[], "payload");
        assert_eq!(r.status, 200);
    }
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let accepted = held.join().unwrap();
    // At most 64 copies in flight per worker thread (2 here): the rest were skipped.
    assert!(accepted <= 128, "{accepted}");
    assert!(accepted > 0, "the mirror got copies");
}

#[test]
fn configuration_errors() {
    let main = Origin::start();
    for (conf, want) in [
        (json!({}), "host"),
        (json!({"host": "127.0.0.1:1986"}), "host"),
        (json!({"host": "http://127.0.0.1:1986/path"}), "host"),
        (
            json!({"host": "http://127.0.0.1:1986", "path": "a"}),
            "path",
        ),
        (
            json!({"host": "http://127.0.0.1:1986", "sample_ratio": 0}),
            "sample_ratio",
        ),
        (
            json!({"host": "http://127.0.0.1:1986", "path_concat_mode": "x"}),
            "path_concat_mode",
        ),
        (json!({"host": "https://127.0.0.1:1986"}), "only http://"),
    ] {
        let e = Gw::try_start(
            json!({"routes": [route("r1", "/*", &main, json!({"proxy-mirror": conf}))]}),
        )
        .err()
        .expect("refused");
        assert!(
            e.contains("proxy-mirror") && e.contains(want),
            "{want}: {e}"
        );
    }
}

/// An origin for chunked requests (the shared test origin reads Content-Length bodies only): answers `ok` once
/// the last chunk arrived and records the raw body.
fn chunked_origin() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.ends_with(b"\r\n0\r\n\r\n") {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    (addr, rx)
}

#[test]
fn chunked_bodies_are_mirrored_decoded() {
    use std::io::{Read, Write};
    let (main, raw) = chunked_origin();
    let mirror = Origin::start();
    let g = Gw::start(json!({"routes": [{
        "id": "r1", "uri": "/*",
        "plugins": {"proxy-mirror": {"host": format!("http://{}", mirror.addr)}},
        "upstream": {"type": "roundrobin", "nodes": {main.to_string(): 1}}
    }]}));
    let mut c = std::net::TcpStream::connect(g.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        b"POST /up HTTP/1.1\r\nHost: test.local\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .unwrap();
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    assert!(
        resp.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    // The upstream got the chunked body; the mirror got it decoded, with a Content-Length.
    let up = raw.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        up.contains("Transfer-Encoding: chunked") && up.contains("hello") && up.contains(" world"),
        "{up}"
    );
    let seen = wait_for(&mirror, 1);
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].body.as_str()),
        ("POST", "hello world")
    );
    assert_eq!(seen[0].header("content-length"), Some("11"));
    assert_eq!(seen[0].header("transfer-encoding"), None);
}
