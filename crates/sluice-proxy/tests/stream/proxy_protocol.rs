//! APISIX's `apisix.proxy_protocol` over real sockets: PROXY headers on stream and HTTP listeners (the client they
//! name drives `remote_addr` matching, ip-restriction and `X-Forwarded-For`), `enable_tcp_pp_to_upstream` as a
//! real upstream receives it, and what an attacker tries: a header on a listener not configured for it, malformed,
//! oversized and missing headers, a header split over several writes, v2 with TLVs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_proxy::{Gateway, ListenerKind, Listeners, ProxyConfig, Running};

use super::{closed_unanswered, compile, read_all, up, IO};

/// An origin that answers each connection with its first line (up to CRLF) and closes: with
/// `enable_tcp_pp_to_upstream`, the PROXY header the gateway sent.
fn first_line_origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(IO));
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while !line.ends_with(b"\r\n") && line.len() < 4096 {
                    match c.read(&mut b) {
                        Ok(1) => line.push(b[0]),
                        _ => break,
                    }
                }
                let _ = c.write_all(&line);
            });
        }
    });
    (addr, accepted)
}

/// An HTTP origin answering each request with its head as the body.
fn head_origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(IO));
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                    match c.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return,
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    head.len()
                );
                let _ = c.write_all(resp.as_bytes());
                let _ = c.write_all(&head);
            });
        }
    });
    (addr, accepted)
}

pub(crate) struct PpGw {
    gw: Gateway,
    /// Without, then with, the PROXY protocol.
    pub plain: SocketAddr,
    pub pp: SocketAddr,
    running: Option<Running>,
}

impl PpGw {
    fn start(kind: ListenerKind, res: Value, to_upstream: bool) -> PpGw {
        let cfg = ProxyConfig {
            proxy_protocol_to_upstream: to_upstream,
            header_timeout: Duration::from_secs(2),
            ..ProxyConfig::default()
        };
        PpGw::start_with(kind, res, cfg)
    }

    pub(crate) fn start_with(kind: ListenerKind, res: Value, cfg: ProxyConfig) -> PpGw {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let l = Listeners::bind_kinds(&[(any, kind), (any, kind.with_proxy_protocol(true))], 1)
            .unwrap();
        let (plain, pp) = (l.local_addrs[0], l.local_addrs[1]);
        let gw = Gateway::new(cfg, compile(&res, 1));
        let running = Some(gw.start(l).unwrap());
        PpGw {
            gw,
            plain,
            pp,
            running,
        }
    }
}

impl Drop for PpGw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

/// Sends `pieces` with a pause between them, then reads everything.
fn exchange(addr: SocketAddr, pieces: &[&[u8]]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(30));
        }
        s.write_all(p).unwrap();
    }
    read_all(s)
}

fn v2_header(src: [u8; 4], sport: u16, dport: u16, tlvs: &[u8]) -> Vec<u8> {
    let mut b = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    b.extend_from_slice(&[0x21, 0x11]);
    b.extend_from_slice(&(12 + tlvs.len() as u16).to_be_bytes());
    b.extend_from_slice(&src);
    b.extend_from_slice(&[127, 0, 0, 1]);
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&dport.to_be_bytes());
    b.extend_from_slice(tlvs);
    b
}

#[test]
fn stream_listener_takes_the_client_from_the_header_and_tells_the_upstream() {
    let (origin, accepted) = first_line_origin();
    let res = json!({"stream_routes": [
        // Only a client the header names as 203.0.113.0/24 matches; .66 is refused by ip-restriction.
        {"id": "lb", "remote_addr": "203.0.113.0/24", "upstream": up(&[origin]),
         "plugins": {"ip-restriction": {"blacklist": ["203.0.113.66"]}}},
        {"id": "local", "remote_addr": "127.0.0.1", "upstream": up(&[origin])},
    ]});
    let gw = PpGw::start(ListenerKind::Stream, res, true);
    let port = gw.pp.port();
    let want = |ip: &str, sport: u16| format!("PROXY TCP4 {ip} 127.0.0.1 {sport} {port}\r\n");

    let v1 = b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 9100\r\n";
    assert_eq!(exchange(gw.pp, &[v1]), want("203.0.113.7", 40000));
    // Split over three writes, one cut inside a port.
    assert_eq!(
        exchange(gw.pp, &[&v1[..9], &v1[9..37], &v1[37..]]),
        want("203.0.113.7", 40000)
    );
    // v2 with TLVs (ALPN, authority), and data right behind the header in the same write.
    let mut tlvs = vec![0x01, 0, 2];
    tlvs.extend_from_slice(b"h2");
    tlvs.extend_from_slice(&[0x02, 0, 11]);
    tlvs.extend_from_slice(b"example.com");
    let mut v2 = v2_header([203, 0, 113, 9], 41000, 9100, &tlvs);
    v2.extend_from_slice(b"data");
    assert_eq!(exchange(gw.pp, &[&v2]), want("203.0.113.9", 41000));
    // UNKNOWN: the connection's own address stands (and matches the other route).
    let got = exchange(gw.pp, &[b"PROXY UNKNOWN\r\n"]);
    assert!(
        got.starts_with("PROXY TCP4 127.0.0.1 127.0.0.1 ")
            && got.ends_with(&format!(" {port}\r\n")),
        "{got}"
    );
    // ip-restriction sees the header's client.
    let before = accepted.load(Ordering::SeqCst);
    assert_eq!(
        exchange(gw.pp, &[b"PROXY TCP4 203.0.113.66 127.0.0.1 1 2\r\n"]),
        ""
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "refused client reached the origin"
    );

    // Malformed, oversized, or no header at all: closed unanswered, nothing reaches the origin.
    let long = format!("PROXY TCP4 {}\r\n", "1".repeat(200));
    for bad in [
        &b"PROXY TCP4 203.0.113.7 not-an-ip 1 2\r\n"[..],
        b"PROXY TCP4 203.0.113.7 127.0.0.1 99999 2\r\n",
        long.as_bytes(),
        b"hello\r\n",
        &v2_header([203, 0, 113, 9], 1, 2, &[0x01, 0, 9, b'x']),
    ] {
        let mut s = TcpStream::connect(gw.pp).unwrap();
        s.write_all(bad).unwrap();
        assert!(
            closed_unanswered(&mut s, IO),
            "{:?} not closed",
            String::from_utf8_lossy(bad)
        );
    }
    // A client that sends half a header and stops is cut at the header timeout (2 s here).
    let mut s = TcpStream::connect(gw.pp).unwrap();
    s.write_all(b"PROXY TCP4 203.0.").unwrap();
    let t = std::time::Instant::now();
    assert!(closed_unanswered(&mut s, IO));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(accepted.load(Ordering::SeqCst), before);

    // On a listener without the PROXY protocol the header is data, not trusted: the client is the real peer
    // (route `local`), the gateway's own header comes first and the forged one follows as payload.
    let got = exchange(gw.plain, &[v1]);
    assert_eq!(
        got,
        format!(
            "PROXY TCP4 127.0.0.1 127.0.0.1 {} {}\r\n",
            got.split(' ').nth(4).unwrap_or("?"),
            gw.plain.port()
        )
    );
}

#[test]
fn http_listener_feeds_remote_addr_ip_restriction_and_x_forwarded_for() {
    let (origin, accepted) = head_origin();
    let res = json!({"routes": [{"id": 1, "uri": "/*", "upstream": up(&[origin]),
        "plugins": {"ip-restriction": {"blacklist": ["203.0.113.66"]}}}]});
    let gw = PpGw::start(ListenerKind::Plain, res, false);
    let req = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

    let got = exchange(
        gw.pp,
        &[b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 9181\r\n", req],
    );
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("x-forwarded-for: 203.0.113.7\r\n"),
        "{got}"
    );
    // v2, in the same write as the request.
    let mut v2 = v2_header([198, 51, 100, 1], 5000, 9181, &[]);
    v2.extend_from_slice(req);
    let got = exchange(gw.pp, &[&v2]);
    assert!(
        got.to_ascii_lowercase()
            .contains("x-forwarded-for: 198.51.100.1\r\n"),
        "{got}"
    );
    let before = accepted.load(Ordering::SeqCst);
    let got = exchange(gw.pp, &[b"PROXY TCP4 203.0.113.66 127.0.0.1 1 2\r\n", req]);
    assert!(got.starts_with("HTTP/1.1 403"), "{got}");
    assert!(
        got.ends_with(r#"{"message":"Your IP address is not allowed"}"#),
        "{got}"
    );
    // No header on a PROXY listener: closed unanswered.
    let mut s = TcpStream::connect(gw.pp).unwrap();
    s.write_all(req).unwrap();
    assert!(closed_unanswered(&mut s, IO));
    // A header on a listener not configured for it is a bad request line (nginx's 400), not a client address.
    let got = exchange(
        gw.plain,
        &[b"PROXY TCP4 203.0.113.7 127.0.0.1 1 2\r\n", req],
    );
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "the origin was reached"
    );
}

#[test]
fn tls_follows_the_header_on_a_tls_listener() {
    let pki = super::ca();
    let term = super::leaf(&pki, "t.test");
    let (origin, _) = first_line_origin();
    let res = json!({
        "stream_routes": [{"id": "t", "remote_addr": "203.0.113.0/24", "upstream": up(&[origin])}],
        "ssls": [{"id": 1, "snis": ["t.test"], "cert": term.cert.pem(), "key": term.key.serialize_pem()}]
    });
    let gw = PpGw::start(ListenerKind::StreamTls, res, true);
    let mut conn = super::tls_client(&pki, "t.test");
    let mut tcp = TcpStream::connect(gw.pp).unwrap();
    tcp.set_read_timeout(Some(IO)).unwrap();
    // The header, then the handshake: the client verifies the gateway's certificate for t.test.
    tcp.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 9100\r\n")
        .unwrap();
    let mut s = rustls::Stream::new(&mut conn, &mut tcp);
    s.write_all(b"x\r\n").unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!(
            "PROXY TCP4 203.0.113.7 127.0.0.1 40000 {}\r\n",
            gw.pp.port()
        )
    );
}
