//! Size limits (413/414/431), the header deadline and body timeout (slowloris), and the connection cap: which
//! connections give way to a newcomer.

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

/// The keep-alive deadline moves with every request without re-arming the connection's timer: the timer fires at an
/// earlier wait's deadline and must then move on, not close a connection whose current wait is younger.
#[test]
fn keepalive_deadline_follows_each_request() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        keepalive_timeout: Duration::from_millis(400),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1024];
    let start = Instant::now();
    // Each request 250 ms after the previous answer: every wait outlives the one before it's deadline (400 ms
    // after that earlier answer) but never its own.
    for i in 0..4 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(250));
        }
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let n = c.read(&mut buf).unwrap();
        assert_eq!(status(&buf[..n]), Some(200), "request {i}");
    }
    assert!(start.elapsed() > Duration::from_millis(700));
    let t = Instant::now();
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed when idle");
    let idle = t.elapsed();
    assert!(
        idle >= Duration::from_millis(300) && idle < Duration::from_secs(3),
        "{idle:?}"
    );
}

/// A graceful shutdown closes a connection idle between requests at once (the keep-alive timeout is a minute).
#[test]
fn shutdown_closes_idle_keepalive_connections() {
    let origin = Origin::start("origin");
    let gw = Gw::to(&origin);
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 1024];
    for _ in 0..2 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let n = c.read(&mut buf).unwrap();
        assert_eq!(status(&buf[..n]), Some(200));
    }
    // The answer is written before the connection goes back to waiting: let it get there.
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    gw.gw.shutdown();
    assert_eq!(
        c.read(&mut buf).unwrap_or(usize::MAX),
        0,
        "closed at shutdown"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// Dribbles `bytes` one every `every` until the gateway closes or answers (or `give_up` passes). Returns when that
/// happened (from `start`) and what it answered.
fn dribble(
    c: &mut TcpStream,
    bytes: &[u8],
    every: Duration,
    start: Instant,
    give_up: Duration,
) -> Option<(Duration, Vec<u8>)> {
    c.set_read_timeout(Some(every)).unwrap();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    for b in bytes.iter().cycle() {
        if start.elapsed() > give_up {
            return None;
        }
        let _ = c.write_all(&[*b]);
        // Waits `every` for an answer or the close; a timeout means still open.
        match c.read(&mut chunk) {
            Ok(0) => return Some((start.elapsed(), out)),
            Ok(n) => {
                out.extend_from_slice(&chunk[..n]);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                while let Ok(n) = c.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(&chunk[..n]);
                }
                return Some((start.elapsed(), out));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some((start.elapsed(), out)),
        }
    }
    None
}

const SLOW_HEAD: &[u8] =
    b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[test]
fn slowloris_head_is_cut_at_the_deadline_not_later() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        header_timeout: Duration::from_secs(1),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    // One byte every 150 ms: an idle timer restarted on each read would never fire.
    let start = Instant::now();
    let mut c = TcpStream::connect(gw.addr).unwrap();
    let (at, out) = dribble(
        &mut c,
        SLOW_HEAD,
        Duration::from_millis(150),
        start,
        Duration::from_secs(8),
    )
    .expect("a dribbled head must be cut at the header deadline");
    assert!(
        at >= Duration::from_millis(900),
        "cut before the deadline: {at:?}"
    );
    assert!(at < Duration::from_millis(3500), "cut late: {at:?}");
    assert_eq!(
        status(&out),
        Some(408),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(origin.received(), 0);

    // On a keep-alive connection the deadline counts from the next head's first byte.
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).unwrap();
    assert_eq!(status(&buf[..n]), Some(200));
    let start = Instant::now();
    let (at, out) = dribble(
        &mut c,
        SLOW_HEAD,
        Duration::from_millis(150),
        start,
        Duration::from_secs(8),
    )
    .expect("the second head must be cut too");
    assert!(at < Duration::from_millis(3500), "cut late: {at:?}");
    assert_eq!(status(&out), Some(408));
}

#[test]
fn silent_connection_is_closed_at_the_header_deadline_without_an_answer() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        header_timeout: Duration::from_millis(500),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    let start = Instant::now();
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(out.is_empty(), "nothing was asked: no answer");
}

#[test]
fn request_body_timeout_is_between_reads_and_answers_408() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        body_timeout: Duration::from_millis(800),
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    // A body that keeps coming, slower in total than the timeout but never pausing that long, is served.
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 10\r\n\r\n")
        .unwrap();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        c.write_all(b"x").unwrap();
    }
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert_eq!(
        status(&out),
        Some(200),
        "{:?}",
        String::from_utf8_lossy(&out)
    );

    // A body that stalls gets 408 and the connection closes.
    let start = Instant::now();
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert_eq!(
        status(&out),
        Some(408),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// An origin that accepts and never answers: requests to it keep their connections busy.
fn black_hole() -> (SocketAddr, std::sync::mpsc::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        l.set_nonblocking(true).unwrap();
        // Bounded by the test dropping the sender.
        while let Err(std::sync::mpsc::TryRecvError::Empty) = rx.try_recv() {
            if let Ok((c, _)) = l.accept() {
                held.push(c);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    (addr, tx)
}

fn wait_connections(gw: &Gw, n: usize) {
    let t = Instant::now();
    while gw.gw.connections() != n && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(gw.gw.connections(), n);
}

#[test]
fn connection_cap_refuses_extra_connections_when_all_are_busy() {
    let (hole, _stop) = black_hole();
    let cfg = ProxyConfig {
        max_connections: 2,
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        json!({"routes": [{"id": "1", "uri": "/*", "upstream": {"nodes": {hole.to_string(): 1},
            "timeout": {"connect": 5, "send": 30, "read": 30}}}]}),
        cfg,
    );
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = TcpStream::connect(gw.addr).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            c
        })
        .collect();
    wait_connections(&gw, 2);
    // Both are waiting for the upstream: neither gives way.
    std::thread::sleep(Duration::from_millis(200));
    let out = exchange(gw.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(out.is_empty(), "over the cap: closed unanswered");
    drop(held);
}

#[test]
fn connections_at_the_cap_idle_or_dribbling_give_way_oldest_first() {
    let origin = Origin::start("origin");
    let cfg = ProxyConfig {
        max_connections: 20,
        ..ProxyConfig::default()
    };
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        cfg,
    );
    // The oldest ten dribble heads (one byte each so far), the next ten are idle keep-alive after a request.
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..10 {
        let mut c = TcpStream::connect(gw.addr).unwrap();
        c.write_all(b"G").unwrap();
        held.push(c);
        wait_connections(&gw, held.len());
    }
    for _ in 0..10 {
        let mut c = TcpStream::connect(gw.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).unwrap();
        assert_eq!(status(&buf[..n]), Some(200));
        held.push(c);
    }
    wait_connections(&gw, 20);
    // Newcomers are served, each in place of the oldest connection that is not busy; they stay open (idle
    // keep-alive), so each one takes a slot for good.
    let mut newcomers = Vec::new();
    for i in 0..12 {
        let mut c = TcpStream::connect(gw.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).unwrap_or(0);
        assert_eq!(status(&buf[..n]), Some(200), "newcomer {i} locked out");
        newcomers.push(c);
    }
    let closed = |c: &mut TcpStream| {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        !matches!(c.read(&mut b), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
    };
    // Twelve evictions: the ten dribblers, then the two oldest idle ones.
    for (i, c) in held.iter_mut().enumerate().take(12) {
        assert!(closed(c), "connection {i} should have been closed");
    }
    let mut c = held.pop().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert_eq!(status(&out), Some(200), "the newest idle one still works");
}
