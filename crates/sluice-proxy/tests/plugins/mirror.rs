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
