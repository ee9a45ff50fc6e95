//! Size limits (413/414/431), the header-read timeout (slowloris) and the connection cap.

use std::time::Instant;

use super::*;

#[test]
fn size_limits_answer_413_414_431_without_forwarding() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        max_body: 1024,
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let long_uri = format!("/{}", "a".repeat(9 * 1024));
    let out = exchange(
        gw.addr,
        format!("GET {long_uri} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&out), Some(414));
    let big = "b".repeat(40 * 1024);
    let out = exchange(
        gw.addr,
        format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&out), Some(431));
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let out = exchange(
        gw.addr,
        format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes(),
    );
    assert_eq!(status(&out), Some(431));
    let body = "c".repeat(2048);
    let out = exchange(
        gw.addr,
        format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(status(&out), Some(413));
    assert_eq!(origin.received(), 0, "nothing over a limit is forwarded");
    // At the limit it passes.
    let body = "c".repeat(1024);
    let out = exchange(
        gw.addr,
        format!(
            "POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 1024\r\n\r\n{body}"
        )
        .as_bytes(),
    );
    assert_eq!(status(&out), Some(200));
}

#[test]
fn slowloris_head_is_cut_by_the_header_timeout() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        header_timeout: Duration::from_millis(300),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    // Trickle a head, one byte every 100 ms, never finishing it.
    let mut closed = false;
    for b in b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter() {
        if c.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if start.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let elapsed = start.elapsed();
    assert!(
        closed || elapsed < Duration::from_secs(4),
        "connection was not closed"
    );
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    // Either a 408 or a silent close; never a forwarded request.
    assert!(
        out.is_empty() || status(&out) == Some(408),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(origin.received(), 0);
}

#[test]
fn idle_keepalive_connection_is_closed() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        keepalive_timeout: Duration::from_millis(300),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).unwrap();
    assert_eq!(status(&buf[..n]), Some(200));
    let t = Instant::now();
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed when idle");
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn connection_cap_refuses_extra_connections() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        max_connections: 2,
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(gw.addr).unwrap())
        .collect();
    let t = Instant::now();
    while gw.gw.connections() < 2 && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(gw.gw.connections(), 2);
    let out = exchange(gw.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(out.is_empty(), "over the cap: closed unanswered");
    assert_eq!(origin.received(), 0);
    // The held connections still work, and once one closes a new one is accepted.
    let mut first = &held[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    first
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = first.read_to_end(&mut out);
    assert_eq!(status(&out), Some(200));
    drop(held);
    let t = Instant::now();
    while gw.gw.connections() > 0 && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = exchange(
        gw.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&out), Some(200));
}
