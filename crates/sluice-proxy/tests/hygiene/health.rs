//! Active (http, tcp) and passive health checks: a node that goes down is ejected, and returns when it heals.

use std::sync::atomic::AtomicU16;
use std::time::Instant;

use super::*;

/// An origin whose `/health` answers `status` (changeable) and whose other paths answer `200 name`.
struct Flappy {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    probes: Arc<AtomicUsize>,
}

fn flappy(name: &'static str) -> Flappy {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let status = Arc::new(AtomicU16::new(200));
    let probes = Arc::new(AtomicUsize::new(0));
    let (s2, p2) = (status.clone(), probes.clone());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let (s, p) = (s2.clone(), p2.clone());
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let (code, body) = if head.starts_with("GET /health ") {
                            p.fetch_add(1, Ordering::SeqCst);
                            (s.load(Ordering::SeqCst), "health")
                        } else {
                            (200, name)
                        };
                        let r = format!(
                            "HTTP/1.1 {code} X\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if c.write_all(r.as_bytes()).is_err() {
                            return;
                        }
                    }
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    Flappy {
        addr,
        status,
        probes,
    }
}

/// Runs the gateway's checkers on a thread of their own (the binary uses its control runtime); they stop at
/// shutdown.
fn run_checkers(gw: &Gateway) {
    let fut = gw.run_health_checks();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(fut);
    });
}

fn healthy(gw: &Gateway, addr: SocketAddr) -> Option<bool> {
    gw.node_health()
        .iter()
        .flat_map(|u| &u.nodes)
        .find(|n| n.addr == addr.to_string())
        .map(|n| n.status.healthy)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn bodies(addr: SocketAddr, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let out = exchange(
                addr,
                b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            );
            let text = String::from_utf8_lossy(&out).into_owned();
            text.rsplit("\r\n\r\n")
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn active_http_check_ejects_a_failing_node_and_restores_it() {
    let a = flappy("A");
    let b = flappy("B");
    let checks = json!({"active": {
        "type": "http", "http_path": "/health", "timeout": 0.5,
        "healthy": {"interval": 0.05, "successes": 2},
        "unhealthy": {"interval": 0.05, "http_failures": 2},
    }});
    let gw = Gw::start(
        route_to(
            json!({a.addr.to_string(): 1, b.addr.to_string(): 1}),
            json!({"checks": checks}),
        ),
        ProxyConfig::default(),
    );
    run_checkers(&gw.gw);
    wait_for("probes", || a.probes.load(Ordering::SeqCst) >= 2);
    assert_eq!(healthy(&gw.gw, a.addr), Some(true));
    let h = gw.gw.node_health();
    assert_eq!(h.len(), 1);
    assert!(h[0].active);
    assert_eq!(h[0].key, "r:1");

    a.status.store(500, Ordering::SeqCst);
    wait_for("A unhealthy", || healthy(&gw.gw, a.addr) == Some(false));
    assert_eq!(healthy(&gw.gw, b.addr), Some(true));
    assert!(
        bodies(gw.addr, 6).iter().all(|b| b == "B"),
        "traffic avoids the ejected node"
    );

    a.status.store(200, Ordering::SeqCst);
    wait_for("A healthy again", || healthy(&gw.gw, a.addr) == Some(true));
    let seen = bodies(gw.addr, 6);
    assert!(
        seen.iter().any(|b| b == "A"),
        "the healed node takes traffic again: {seen:?}"
    );
}

#[test]
fn active_tcp_check_follows_a_node_that_goes_down_and_comes_back() {
    let b = flappy("B");
    // A node on a port that stops listening, then listens again.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a_addr = l.local_addr().unwrap();
    drop(l);
    let checks = json!({"active": {
        "type": "tcp", "timeout": 0.5,
        "healthy": {"interval": 0.05, "successes": 1},
        "unhealthy": {"interval": 0.05, "tcp_failures": 1},
    }});
    let gw = Gw::start(
        route_to(
            json!({a_addr.to_string(): 1, b.addr.to_string(): 1}),
            json!({"checks": checks}),
        ),
        ProxyConfig::default(),
    );
    run_checkers(&gw.gw);
    wait_for("down node ejected", || {
        healthy(&gw.gw, a_addr) == Some(false)
    });
    assert!(bodies(gw.addr, 4).iter().all(|b| b == "B"));
    let _back = TcpListener::bind(a_addr).expect("rebind the node's port");
    wait_for("node back", || healthy(&gw.gw, a_addr) == Some(true));
}

#[test]
fn every_node_unhealthy_still_serves_like_apisix() {
    // APISIX: when the checker reports no healthy node, the balancer uses all nodes rather than failing.
    let a = flappy("A");
    let b = flappy("B");
    a.status.store(503, Ordering::SeqCst);
    b.status.store(503, Ordering::SeqCst);
    let checks = json!({"active": {
        "http_path": "/health",
        "healthy": {"interval": 0.05, "successes": 1},
        "unhealthy": {"interval": 0.05, "http_failures": 1},
    }});
    let gw = Gw::start(
        route_to(
            json!({a.addr.to_string(): 1, b.addr.to_string(): 1}),
            json!({"checks": checks}),
        ),
        ProxyConfig::default(),
    );
    run_checkers(&gw.gw);
    wait_for("both unhealthy", || {
        healthy(&gw.gw, a.addr) == Some(false) && healthy(&gw.gw, b.addr) == Some(false)
    });
    let seen = bodies(gw.addr, 4);
    assert!(seen.iter().all(|s| s == "A" || s == "B"), "{seen:?}");
}

#[test]
fn passive_check_ejects_on_real_traffic() {
    let a = flappy("A");
    let b = flappy("B");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    // Active probing is configured (APISIX requires it) but too slow to interfere within the test.
    let checks = json!({
        "active": {"type": "tcp", "healthy": {"interval": 60}, "unhealthy": {"interval": 60}},
        "passive": {"unhealthy": {"tcp_failures": 1}},
    });
    let gw = Gw::start(
        route_to(
            json!({dead.to_string(): 1, a.addr.to_string(): 1, b.addr.to_string(): 1}),
            json!({"checks": checks}),
        ),
        ProxyConfig::default(),
    );
    // Requests retry onto live nodes; the failed connect marks the dead node down at once.
    let seen = bodies(gw.addr, 6);
    assert!(seen.iter().all(|s| s == "A" || s == "B"), "{seen:?}");
    assert_eq!(healthy(&gw.gw, dead), Some(false));
    assert_eq!(healthy(&gw.gw, a.addr), Some(true));
}

#[test]
fn invalid_checks_do_not_compile() {
    for checks in [
        json!({"passive": {}}),
        json!({"active": {"type": "udp"}}),
        json!({"active": {"healthy": {"successes": 1000}}}),
    ] {
        let res = route_to(json!({"127.0.0.1:1": 1}), json!({"checks": checks}));
        assert!(Snapshot::compile(&resources(res), 1).is_err(), "{checks}");
    }
}
