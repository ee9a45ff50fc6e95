//! The L4 proxy (`stream_routes`) over real sockets on 127.0.0.1: an in-process gateway with `Stream`,
//! `StreamTls` and UDP listeners on port 0, real TCP/UDP echo origins and real rustls TLS servers (rcgen
//! certificates) as backends. Covers echo, a large transfer both ways with half-close, TLS passthrough by SNI to
//! two backends, TLS termination on a `tls: true` listener, `remote_addr` matching, UDP sessions, a dead node
//! skipped, live route changes, and hostile clients (garbage, truncated, huge and stalled ClientHellos, floods
//! bounded by limit-conn, ip-restriction).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_proxy::{Gateway, ListenerKind, Listeners, ProxyConfig, Running, Snapshot};

const IO: Duration = Duration::from_secs(10);

/// A TCP origin. `Echo`: echoes until EOF, then half-closes. `Name`: writes its name and closes.
#[derive(Clone, Copy)]
enum Mode {
    Echo,
    Name(&'static str),
}

struct Origin {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

fn origin(mode: Mode) -> Origin {
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
                match mode {
                    Mode::Name(n) => {
                        let _ = c.write_all(n.as_bytes());
                    }
                    Mode::Echo => {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            match c.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if c.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        let _ = c.shutdown(Shutdown::Write);
                        // Hold the socket until the peer is gone, so only the half-close was sent.
                        let _ = c.read(&mut buf);
                    }
                }
            });
        }
    });
    Origin { addr, accepted }
}

/// An address that refuses connections.
fn refused() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

fn udp_echo() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let mut out = b"echo:".to_vec();
            out.extend_from_slice(&buf[..n]);
            let _ = s.send_to(&out, from);
        }
    });
    addr
}

struct Pki {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca() -> Pki {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "stream test CA");
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Pki { cert, key }
}

fn leaf(ca: &Pki, name: &str) -> Pki {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca.cert, &ca.key)
        .unwrap();
    Pki { cert, key }
}

fn provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A real TLS server for `name`: after the handshake it writes `name` and closes.
fn tls_origin(ca: &Pki, name: &'static str) -> Origin {
    provider();
    let l = leaf(ca, name);
    let cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(l.cert.der().to_vec())],
            PrivateKeyDer::try_from(l.key.serialize_der()).unwrap(),
        )
        .unwrap();
    let cfg = Arc::new(cfg);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(IO));
                let Ok(mut conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut s = rustls::Stream::new(&mut conn, &mut c);
                let _ = s.write_all(name.as_bytes());
                let _ = s.flush();
                s.conn.send_close_notify();
                let _ = s.flush();
            });
        }
    });
    Origin { addr, accepted }
}

/// Connects through `addr` with TLS for `sni`, trusting only `ca`; returns what the server wrote.
/// A TLS client trusting `ca`'s certificate, for `sni`.
fn tls_client(ca: &Pki, sni: &str) -> rustls::ClientConnection {
    provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert.der().to_vec()))
        .unwrap();
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap()
}

fn tls_get(addr: SocketAddr, ca: &Pki, sni: &str) -> Result<String, String> {
    let mut conn = tls_client(ca, sni);
    let mut tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(IO)).unwrap();
    let mut s = rustls::Stream::new(&mut conn, &mut tcp);
    let mut out = String::new();
    match s.read_to_string(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if !out.is_empty() => Ok(format!("{out} ({e})")),
        Err(e) => Err(e.to_string()),
    }
}

struct Gw {
    gw: Gateway,
    tcp: SocketAddr,
    tls: SocketAddr,
    udp: SocketAddr,
    running: Option<Running>,
    rev: u64,
}

impl Gw {
    fn start(res: Value) -> Gw {
        Gw::start_with(res, ProxyConfig::default())
    }

    fn start_with(res: Value, cfg: ProxyConfig) -> Gw {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut l = Listeners::bind_kinds(
            &[(any, ListenerKind::Stream), (any, ListenerKind::StreamTls)],
            1,
        )
        .unwrap();
        l.bind_udp(&[any]).unwrap();
        let (tcp, tls, udp) = (l.local_addrs[0], l.local_addrs[1], l.udp_local_addrs[0]);
        let gw = Gateway::new(cfg, compile(&res, 1));
        let running = Some(gw.start(l).unwrap());
        Gw {
            gw,
            tcp,
            tls,
            udp,
            running,
            rev: 1,
        }
    }

    fn publish(&mut self, res: Value) {
        self.rev += 1;
        let prev = self.gw.snapshot();
        let res: Resources = serde_json::from_value(res).unwrap();
        let snap =
            Snapshot::compile_next(&res, self.rev, &Default::default(), Some(&prev)).unwrap();
        self.gw.publish(snap);
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

fn compile(res: &Value, rev: u64) -> Snapshot {
    let r: Resources = serde_json::from_value(res.clone()).unwrap();
    Snapshot::compile(&r, rev).unwrap_or_else(|e| panic!("compile: {e}"))
}

fn up(addrs: &[SocketAddr]) -> Value {
    let nodes: serde_json::Map<String, Value> =
        addrs.iter().map(|a| (a.to_string(), json!(1))).collect();
    json!({"type": "roundrobin", "nodes": nodes})
}

/// Reads what a `Name` origin (or a closed connection: "") answers on a fresh connection from `from`.
fn name_via(addr: SocketAddr, from: Option<&str>) -> String {
    let s = match from {
        None => TcpStream::connect(addr).unwrap(),
        Some(ip) => {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())
                .unwrap();
            sock.connect(&addr.into()).unwrap();
            sock.into()
        }
    };
    read_all(s)
}

fn read_all(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(IO)).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the gateway closed `s` (EOF or reset) within `within`, without sending anything.
fn closed_unanswered(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
    }
}

#[test]
fn tcp_echo_and_a_large_transfer_both_ways_with_half_close() {
    let echo = origin(Mode::Echo);
    let gw = Gw::start(json!({"stream_routes": [{"id": 1, "upstream": up(&[echo.addr])}]}));
    // Small echo.
    let mut c = TcpStream::connect(gw.tcp).unwrap();
    c.set_read_timeout(Some(IO)).unwrap();
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    drop(c);
    // 32 MiB up while the echo streams back; the client's FIN reaches the origin, whose FIN comes back after
    // the last byte.
    const N: usize = 32 << 20;
    let c = TcpStream::connect(gw.tcp).unwrap();
    c.set_read_timeout(Some(IO)).unwrap();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
        for _ in 0..N / chunk.len() {
            w.write_all(&chunk).unwrap();
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut r = c;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let mut bad = None;
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (k, byte) in buf[..n].iter().enumerate() {
            let i = (got + k) % 65536;
            if *byte != (i as u32 * 7 % 251) as u8 && bad.is_none() {
                bad = Some(got + k);
            }
        }
        got += n;
    }
    writer.join().unwrap();
    assert_eq!(bad, None, "corrupted at byte {bad:?}");
    assert_eq!(
        got, N,
        "everything came back, then EOF (the half-close passed both ways)"
    );
}

#[test]
fn tls_passthrough_by_sni_to_two_backends_and_termination_on_a_tls_listener() {
    let pki = ca();
    let a = tls_origin(&pki, "a.test");
    let b = tls_origin(&pki, "b.test");
    let plain = origin(Mode::Name("plain"));
    let echo = origin(Mode::Echo);
    let term = leaf(&pki, "t.test");
    let gw = Gw::start(json!({
        "stream_routes": [
            {"id": "a", "sni": "a.test", "upstream": up(&[a.addr])},
            {"id": "b", "sni": "*.b.test", "upstream": up(&[b.addr])},
            {"id": "b2", "sni": "b.test", "upstream": up(&[b.addr])},
            {"id": "t", "sni": "t.test", "upstream": up(&[echo.addr])},
            {"id": "d", "upstream": up(&[plain.addr])}
        ],
        "ssls": [{"id": 1, "snis": ["t.test"], "cert": term.cert.pem(), "key": term.key.serialize_pem()}]
    }));
    // The client verifies the backend's own certificate: Sluice passed the handshake through untouched.
    assert_eq!(tls_get(gw.tcp, &pki, "a.test").unwrap(), "a.test");
    assert_eq!(tls_get(gw.tcp, &pki, "b.test").unwrap(), "b.test");
    assert_eq!(a.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1);
    // No SNI route for this name: the route without `sni` (a plain origin, so the TLS client fails).
    assert!(tls_get(gw.tcp, &pki, "c.test").is_err());
    assert_eq!(plain.accepted.load(Ordering::SeqCst), 1);
    // Not TLS at all: the default route.
    let mut c = TcpStream::connect(gw.tcp).unwrap();
    c.write_all(b"HELLO\r\n").unwrap();
    assert_eq!(read_all(c), "plain");

    // `tls: true` listener: Sluice terminates with the `ssls` certificate and routes by the handshake's SNI;
    // the echo origin gets cleartext.
    let mut conn = tls_client(&pki, "t.test");
    let mut tcp = TcpStream::connect(gw.tls).unwrap();
    tcp.set_read_timeout(Some(IO)).unwrap();
    let mut s = rustls::Stream::new(&mut conn, &mut tcp);
    s.write_all(b"over tls").unwrap();
    let mut b8 = [0u8; 8];
    s.read_exact(&mut b8).unwrap();
    assert_eq!(&b8, b"over tls");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn remote_addr_matching_and_live_route_changes() {
    let x = origin(Mode::Name("x"));
    let y = origin(Mode::Name("y"));
    let z = origin(Mode::Name("z"));
    let mut gw = Gw::start(json!({"stream_routes": [
        {"id": 1, "remote_addr": "127.0.0.2", "upstream": up(&[x.addr])},
        {"id": 2, "remote_addr": "127.0.0.0/30", "upstream": up(&[y.addr])}
    ]}));
    assert_eq!(name_via(gw.tcp, Some("127.0.0.2")), "x");
    assert_eq!(name_via(gw.tcp, Some("127.0.0.1")), "y");
    // No route for 127.0.0.9: closed without a byte, no origin contacted.
    let before = x.accepted.load(Ordering::SeqCst) + y.accepted.load(Ordering::SeqCst);
    assert_eq!(name_via(gw.tcp, Some("127.0.0.9")), "");
    assert_eq!(
        x.accepted.load(Ordering::SeqCst) + y.accepted.load(Ordering::SeqCst),
        before
    );
    // A new route set applies to the next connection.
    gw.publish(json!({"stream_routes": [{"id": 3, "server_port": gw.tcp.port(), "upstream": up(&[z.addr])}]}));
    assert_eq!(name_via(gw.tcp, Some("127.0.0.2")), "z");
    gw.publish(json!({"stream_routes": []}));
    assert_eq!(name_via(gw.tcp, None), "");
}

#[test]
fn a_dead_node_is_skipped_and_connect_failures_retry() {
    let live = origin(Mode::Name("live"));
    let dead = refused();
    let gw = Gw::start(json!({"stream_routes": [{"id": 1, "upstream": {
        "nodes": {dead.to_string(): 1, live.addr.to_string(): 1},
        "timeout": {"connect": 1, "send": 5, "read": 5}
    }}]}));
    for _ in 0..6 {
        assert_eq!(name_via(gw.tcp, None), "live");
    }
    // Only the dead node: closed.
    let gw2 = Gw::start(json!({"stream_routes": [{"id": 1, "upstream": up(&[dead])}]}));
    assert_eq!(name_via(gw2.tcp, None), "");
}

#[test]
fn idle_timeout_from_the_upstream_closes_quiet_connections() {
    let echo = origin(Mode::Echo);
    let gw = Gw::start(json!({"stream_routes": [{"id": 1, "upstream": {
        "nodes": {echo.addr.to_string(): 1}, "timeout": {"connect": 1, "send": 1, "read": 1}
    }}]}));
    let mut c = TcpStream::connect(gw.tcp).unwrap();
    // Traffic keeps it open past the timeout...
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(400));
        c.write_all(b"k").unwrap();
        let mut b = [0u8; 1];
        c.set_read_timeout(Some(IO)).unwrap();
        c.read_exact(&mut b).unwrap();
    }
    // ...silence closes it within the timeout (+1/8).
    let t = Instant::now();
    assert!(closed_unanswered(&mut c, Duration::from_secs(5)));
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(900) && e < Duration::from_millis(2500),
        "{e:?}"
    );
}

#[test]
fn udp_sessions_per_client() {
    let echo = udp_echo();
    let gw = Gw::start(json!({"stream_routes": [{"id": 1, "upstream": up(&[echo])}]}));
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in [&a, &b] {
        s.set_read_timeout(Some(IO)).unwrap();
    }
    let mut buf = [0u8; 2048];
    for i in 0..3 {
        a.send_to(format!("a{i}").as_bytes(), gw.udp).unwrap();
        b.send_to(format!("b{i}").as_bytes(), gw.udp).unwrap();
        let (n, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!(from, gw.udp, "answers come from the listener's address");
        assert_eq!(&buf[..n], format!("echo:a{i}").as_bytes());
        let (n, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], format!("echo:b{i}").as_bytes());
    }
    // A large datagram passes whole.
    let big = vec![b'x'; 60_000];
    a.send_to(&big, gw.udp).unwrap();
    let (n, _) = a.recv_from(&mut vec![0u8; 65536][..]).unwrap();
    assert_eq!(n, 60_005);
}

#[test]
fn hostile_client_hellos() {
    let pki = ca();
    let a = tls_origin(&pki, "a.test");
    let plain = origin(Mode::Name("plain"));
    let cfg = ProxyConfig {
        header_timeout: Duration::from_secs(1),
        ..ProxyConfig::default()
    };
    // With a route without `sni`, and without.
    let with_default = Gw::start_with(
        json!({"stream_routes": [
            {"id": "a", "sni": "a.test", "upstream": up(&[a.addr])},
            {"id": "d", "upstream": up(&[plain.addr])}
        ]}),
        cfg.clone(),
    );
    let sni_only = Gw::start_with(
        json!({"stream_routes": [{"id": "a", "sni": "a.test", "upstream": up(&[a.addr])}]}),
        cfg,
    );
    let send = |addr: SocketAddr, bytes: &[u8], half_close: bool| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        if half_close {
            s.shutdown(Shutdown::Write).unwrap();
        }
        read_all(s)
    };
    // Garbage that starts like a handshake record: not a hello, so no SNI: the default route, or closed.
    let garbage = b"\x16\x03\x01\x00\x05hello world";
    assert_eq!(send(with_default.tcp, garbage, false), "plain");
    assert_eq!(send(sni_only.tcp, garbage, false), "");
    // A truncated hello and the client's FIN: closed, no backend contacted.
    let hello = client_hello("a.test");
    let before = a.accepted.load(Ordering::SeqCst) + plain.accepted.load(Ordering::SeqCst);
    assert_eq!(send(with_default.tcp, &hello[..hello.len() / 2], true), "");
    // A hello claiming 16 MiB: closed at once.
    assert_eq!(
        send(
            with_default.tcp,
            b"\x16\x03\x01\x40\x00\x01\xff\xff\xff",
            false
        ),
        ""
    );
    assert_eq!(
        a.accepted.load(Ordering::SeqCst) + plain.accepted.load(Ordering::SeqCst),
        before
    );
    // A client that sends part of a hello and stalls is cut at the deadline (1 s here), while others are served.
    let mut slow = TcpStream::connect(with_default.tcp).unwrap();
    slow.write_all(&hello[..20]).unwrap();
    let t = Instant::now();
    assert_eq!(tls_get(with_default.tcp, &pki, "a.test").unwrap(), "a.test");
    assert!(closed_unanswered(&mut slow, Duration::from_secs(5)));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // A client that sends nothing is routed without SNI at the deadline (server-first protocols).
    let t = Instant::now();
    assert_eq!(name_via(with_default.tcp, None), "plain");
    assert!(t.elapsed() >= Duration::from_millis(900));
    // A hello dribbled in many records is refused before it costs much.
    let mut s = TcpStream::connect(with_default.tcp).unwrap();
    let _ = s.set_nodelay(true);
    s.write_all(b"\x16\x03\x01\x00\x04\x01\x00\x3f\x00")
        .unwrap();
    let mut refused_early = false;
    for _ in 0..4000 {
        if s.write_all(b"\x16\x03\x01\x00\x04AAAA").is_err() {
            refused_early = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    assert!(refused_early || closed_unanswered(&mut s, Duration::from_secs(5)));
}

/// A real ClientHello from rustls for `name`.
fn client_hello(name: &str) -> Vec<u8> {
    provider();
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut c = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from(name.to_string()).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    c.write_tls(&mut out).unwrap();
    out
}

#[test]
fn limit_conn_bounds_a_flood_and_ip_restriction_refuses() {
    let echo = origin(Mode::Echo);
    let gw = Gw::start(json!({"stream_routes": [
        {"id": 2, "plugins": {"limit-conn": {"conn": 2, "burst": 1, "default_conn_delay": 0.2, "key": "remote_addr"}},
         "upstream": up(&[echo.addr])}
    ]}));
    let open = |addr| {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(IO)).unwrap();
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).map(|_| c)
    };
    let t = Instant::now();
    let held: Vec<TcpStream> = (0..3)
        .map(|_| open(gw.tcp).expect("within conn + burst"))
        .collect();
    // The third (burst) waited default_conn_delay * floor((3 - 1) / 2) = 0.2 s.
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // A flood past conn + burst: every one closed unanswered, the origin never sees them.
    let before = echo.accepted.load(Ordering::SeqCst);
    let flood: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(gw.tcp).unwrap())
        .collect();
    for mut c in flood {
        assert!(closed_unanswered(&mut c, Duration::from_secs(5)));
    }
    assert_eq!(echo.accepted.load(Ordering::SeqCst), before);
    // A held connection ends: its slot is free again.
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    assert!(open(gw.tcp).is_ok());

    let gw = Gw::start(json!({"stream_routes": [
        {"id": 1, "plugins": {"ip-restriction": {"blacklist": ["127.0.0.0/24"]}}, "upstream": up(&[echo.addr])}
    ]}));
    let before = echo.accepted.load(Ordering::SeqCst);
    assert_eq!(name_via(gw.tcp, Some("127.0.0.1")), "");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), before);
}
mod access_log;
mod proxy_protocol;

/// Waits (bounded) until route `id`'s counters satisfy `pred`, returning them.
fn stats_until(
    gw: &Gw,
    id: &str,
    pred: impl Fn(&sluice_proxy::StreamRouteStats) -> bool,
) -> sluice_proxy::StreamRouteStats {
    let end = Instant::now() + IO;
    loop {
        let s = gw.gw.stream_stats();
        let r = s.iter().find(|s| s.route == id).cloned();
        if let Some(r) = r.filter(|r| pred(r)) {
            return r;
        }
        assert!(Instant::now() < end, "route {id}: counters still {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn live_counters_per_stream_route_survive_a_reload() {
    let echo = origin(Mode::Echo);
    let mut gw = Gw::start(json!({"stream_routes": [
        {"id": "e", "upstream": up(&[echo.addr])}
    ]}));
    // One connection held open: active 1, and the bytes count while it is open.
    let mut held = TcpStream::connect(gw.tcp).unwrap();
    held.set_read_timeout(Some(IO)).unwrap();
    held.write_all(b"0123456789").unwrap();
    let mut b = [0u8; 10];
    held.read_exact(&mut b).unwrap();
    let s = stats_until(&gw, "e", |s| s.bytes_out == 10);
    assert_eq!((s.active, s.total, s.bytes_in, s.bytes_out), (1, 1, 10, 10));
    // A reload keeps the route's counters (and the open connection's, which ends on the same ones).
    gw.publish(json!({"stream_routes": [
        {"id": "e", "upstream": up(&[echo.addr])},
        {"id": "other", "server_port": 1, "upstream": up(&[echo.addr])}
    ]}));
    // A second connection, closed; then the held one.
    let mut c = TcpStream::connect(gw.tcp).unwrap();
    c.set_read_timeout(Some(IO)).unwrap();
    c.write_all(b"abc").unwrap();
    let mut b = [0u8; 3];
    c.read_exact(&mut b).unwrap();
    drop(c);
    drop(held);
    let s = stats_until(&gw, "e", |s| s.active == 0 && s.total == 2);
    assert_eq!((s.bytes_in, s.bytes_out), (13, 13));
    let o = stats_until(&gw, "other", |_| true);
    assert_eq!((o.active, o.total, o.bytes_in), (0, 0, 0));
    // The exposition APISIX's prometheus plugin names.
    let mut text = String::new();
    sluice_proxy::render_stream_prometheus(&gw.gw.stream_stats(), &mut text);
    for line in [
        "apisix_stream_connection_total{route=\"e\"} 2",
        "apisix_stream_active_connections{route=\"e\"} 0",
        "apisix_stream_bandwidth{route=\"e\",type=\"ingress\"} 13",
        "apisix_stream_bandwidth{route=\"e\",type=\"egress\"} 13",
        "apisix_stream_connection_total{route=\"other\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
}
