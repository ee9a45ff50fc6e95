//! The `Connection: Content-Length` smuggling exploit over a TLS listener: a key-auth route must not be reachable
//! through a request hidden in another request's body, and a second client on the pooled upstream connection must
//! not get the answer to it.

use super::*;

/// An origin answering each request (head plus Content-Length body) with `200` and the request path as the body;
/// records the paths in arrival order.
fn echo_origin() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let p2 = paths.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let paths = p2.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let mut slots = [httparse::EMPTY_HEADER; 32];
                    let mut req = httparse::Request::new(&mut slots);
                    if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                        let path = req.path.unwrap_or("").to_string();
                        let len: usize = req
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= n + len {
                            buf.drain(..n + len);
                            paths.lock().unwrap().push(path.clone());
                            let r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
                                path.len()
                            );
                            if c.write_all(r.as_bytes()).is_err() {
                                return;
                            }
                            continue;
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
    (addr, paths)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect(c: &Client, addr: SocketAddr) -> Tls {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let name = ServerName::try_from("a.test".to_string()).unwrap();
    let conn = rustls::ClientConnection::new(c.cfg.clone(), name).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// One response: head plus Content-Length body, or what arrived before EOF / 5 s.
fn read_one(s: &mut Tls) -> String {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if out.len() >= end + 4 + len {
                break;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn connection_content_length_over_tls_cannot_bypass_key_auth() {
    let ca = Pki::ca("test ca");
    let leaf = ca.leaf(&["a.test"], ecdsa());
    let (origin, paths) = echo_origin();
    let up = json!({"nodes": {origin.to_string(): 1}, "retries": 0});
    let res: Resources = serde_json::from_value(json!({
        "routes": [
            {"id": "public", "uri": "/public", "upstream": up},
            {"id": "admin", "uri": "/admin/*", "upstream": up, "plugins": {"key-auth": {}}},
        ],
        "consumers": [{"username": "ops", "plugins": {"key-auth": {"key": "the-key"}}}],
        "ssls": [ssl("1", &["a.test"], &[&leaf])],
    }))
    .unwrap();
    let gw = Gateway::new(
        ProxyConfig::default(),
        Snapshot::compile(&res, 1).expect("compiles"),
    );
    let l =
        Listeners::bind_kinds(&[("127.0.0.1:0".parse().unwrap(), ListenerKind::Tls)], 1).unwrap();
    let addr = l.local_addrs[0];
    let running = gw.start(l).unwrap();

    let smuggled = "GET /admin/secret HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let exploit = format!(
        "POST /public HTTP/1.1\r\nHost: a.test\r\nConnection: Content-Length\r\nContent-Length: {}\r\n\r\n{smuggled}",
        smuggled.len()
    );
    let c = client();
    let mut attacker = connect(&c, addr);
    attacker.write_all(exploit.as_bytes()).unwrap();
    let first = read_one(&mut attacker);
    assert!(
        first.starts_with("HTTP/1.1 200") && first.ends_with("/public"),
        "{first}"
    );
    let mut victim = connect(&c, addr);
    victim
        .write_all(b"GET /public HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let second = read_one(&mut victim);
    assert!(!second.contains("secret"), "victim got: {second}");
    assert!(
        second.starts_with("HTTP/1.1 200") && second.ends_with("/public"),
        "{second}"
    );
    assert_eq!(*paths.lock().unwrap(), ["/public", "/public"]);
    drop((attacker, victim));
    gw.shutdown();
    running.join();
}
