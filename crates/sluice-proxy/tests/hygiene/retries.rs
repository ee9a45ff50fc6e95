//! Balancing under retries through the proxy: a node that never answers in time must not become the first pick of
//! every request because the retries away from it moved the balancer on.

use super::smuggling::{echo_path, Recorder};
use super::*;

/// A node that reads requests and never answers (it closes after a while); counts the request heads it got.
fn silent_node() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let h2 = heads.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let h = h2.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        h.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (addr, heads)
}

#[test]
fn roundrobin_retries_do_not_send_every_request_to_the_slow_node_first() {
    let (slow, slow_heads) = silent_node();
    let fast = Recorder::start(echo_path);
    let gw = Gw::start(
        route_to(
            json!({slow.to_string(): 1, fast.addr.to_string(): 1}),
            json!({"type": "roundrobin", "retries": 1, "timeout": {"connect": 5, "send": 5, "read": 2}}),
        ),
        ProxyConfig::default(),
    );
    const N: usize = 8;
    for i in 0..N {
        let req = format!("GET /r{i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let out = exchange(gw.addr, req.as_bytes());
        assert_eq!(
            status(&out),
            Some(200),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
    }
    // Sequential requests and no health checks: the slow node heard only the requests that started on it (a retry
    // never goes back to it). Equal weights put it first on every other request: N/2, +1 for the random phase.
    let slow_first = slow_heads.load(Ordering::SeqCst);
    assert!(
        slow_first <= N / 2 + 1,
        "{slow_first} of {N} requests waited for the slow node first"
    );
    assert_eq!(fast.paths().len(), N);
}
