//! tcp-logger, udp-logger and syslog (APISIX's t/plugin/{tcp,udp}-logger.t and syslog.t) against real TCP, TLS
//! and UDP listeners on 127.0.0.1:0 that record exactly what arrives.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_plugins::Shared;

use crate::{route, Gw, Origin};

/// A TCP listener recording each connection's bytes (one entry per connection, filled as bytes arrive) and,
/// with TLS, the SNI each client sent.
struct TcpSink {
    port: u16,
    conns: Arc<Mutex<Vec<String>>>,
    snis: Arc<Mutex<Vec<Option<String>>>>,
}

impl TcpSink {
    fn start(tls: bool) -> TcpSink {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<String>>> = Arc::default();
        let snis: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let cfg = tls.then(server_tls);
        let (c2, s2) = (conns.clone(), snis.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
                let idx = {
                    let mut c = c2.lock().unwrap();
                    c.push(String::new());
                    c.len() - 1
                };
                let (c3, s3, cfg) = (c2.clone(), s2.clone(), cfg.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    let push = |b: &[u8]| {
                        c3.lock().unwrap()[idx].push_str(&String::from_utf8_lossy(b));
                    };
                    if let Some(cfg) = cfg {
                        let conn = rustls::ServerConnection::new(cfg).unwrap();
                        let mut t = rustls::StreamOwned::new(conn, s);
                        loop {
                            match t.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if idx >= s3.lock().unwrap().len() {
                                        s3.lock()
                                            .unwrap()
                                            .push(t.conn.server_name().map(str::to_owned));
                                    }
                                    push(&buf[..n]);
                                }
                            }
                        }
                    } else {
                        loop {
                            match s.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => push(&buf[..n]),
                            }
                        }
                    }
                });
            }
        });
        TcpSink { port, conns, snis }
    }

    fn all(&self) -> Vec<String> {
        self.conns.lock().unwrap().clone()
    }
}

fn server_tls() -> Arc<rustls::ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec!["logs.example".into()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap(),
    )
}

/// A UDP socket recording each datagram.
fn udp_sink() -> (u16, Arc<Mutex<Vec<String>>>) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g2 = got.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = s.recv(&mut buf) {
            g2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    (port, got)
}

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn json_of(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s:?}"))
}

#[test]
fn tcp_logger_sends_one_connection_per_batch() {
    let o = Origin::start();
    let sink = TcpSink::start(false);
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"tcp-logger": {
        "host": "127.0.0.1", "port": sink.port, "batch_max_size": 2, "inactive_timeout": 1,
        "log_format": {"host": "$host", "uri": "$uri", "ua": "$http_user_agent"}}}))]}),
    );
    for _ in 0..3 {
        assert_eq!(gw.get("/hello", &[("User-Agent", "probe/2")]).status, 200);
    }
    // Two full batches' worth: one connection with an array of two, then (inactive_timeout) one with an array
    // of one; each connection is closed after its batch.
    let mut got = Vec::new();
    assert!(
        wait_for(|| {
            got = sink.all();
            got.len() == 2 && got.iter().all(|c| c.ends_with(']'))
        }),
        "{got:?}"
    );
    let a = json_of(&got[0]);
    assert_eq!(a.as_array().map(Vec::len), Some(2), "{a}");
    assert_eq!(
        a[0],
        json!({"host": "test.local", "uri": "/hello", "ua": "probe/2", "route_id": "r1"})
    );
    assert_eq!(json_of(&got[1]).as_array().map(Vec::len), Some(1));
}

#[test]
fn tcp_logger_tls_sends_the_server_name_and_a_single_object() {
    let o = Origin::start();
    let sink = TcpSink::start(true);
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"tcp-logger": {
        "host": "127.0.0.1", "port": sink.port, "tls": true, "tls_options": "logs.example",
        "batch_max_size": 1}}))]}),
    );
    assert_eq!(gw.get("/hello?q=tls", &[]).status, 200);
    let mut got = Vec::new();
    assert!(
        wait_for(|| {
            got = sink.all();
            got.len() == 1 && got[0].ends_with('}')
        }),
        "{got:?}"
    );
    let e = json_of(&got[0]);
    assert_eq!(e["request"]["uri"], "/hello?q=tls");
    assert_eq!(e["response"]["status"], 200);
    assert_eq!(
        sink.snis
            .lock()
            .unwrap()
            .first()
            .cloned()
            .flatten()
            .as_deref(),
        Some("logs.example")
    );
}

#[test]
fn udp_logger_sends_one_datagram_per_batch() {
    let o = Origin::start();
    let (port, got) = udp_sink();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"udp-logger": {
        "host": "127.0.0.1", "port": port, "batch_max_size": 1}}))]}),
    );
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/nope", &[]).status, 404);
    assert_eq!(gw.get("/hello?two", &[]).status, 200);
    assert!(wait_for(|| got.lock().unwrap().len() == 2));
    let mut uris: Vec<String> = got
        .lock()
        .unwrap()
        .iter()
        .map(|d| json_of(d)["request"]["uri"].as_str().unwrap().to_owned())
        .collect();
    uris.sort();
    assert_eq!(uris, ["/hello", "/hello?two"]);
}

/// `<46>1 2026-01-02T03:04:05.678Z host apisix PID - - {json}\n`
fn check_rfc5424(line: &str, host: &str) -> Value {
    let pid = std::process::id().to_string();
    let parts: Vec<&str> = line.splitn(8, ' ').collect();
    assert_eq!(parts.len(), 8, "{line:?}");
    assert_eq!(parts[0], "<46>1");
    assert!(
        parts[1].len() == 24 && parts[1].ends_with('Z') && parts[1].as_bytes()[10] == b'T',
        "{line:?}"
    );
    assert_eq!(&parts[2..7], [host, "apisix", pid.as_str(), "-", "-"]);
    json_of(parts[7])
}

#[test]
fn syslog_tcp_keeps_its_connection_and_udp_sends_datagrams() {
    let o = Origin::start();
    let sink = TcpSink::start(false);
    let (uport, udp) = udp_sink();
    let gw = Gw::start(json!({"routes": [
        route("t", "/tcp", &o, json!({"syslog": {"host": "127.0.0.1", "port": sink.port,
            "batch_max_size": 1}})),
        route("u", "/udp", &o, json!({"syslog": {"host": "127.0.0.1", "port": uport,
            "sock_type": "udp", "batch_max_size": 1}})),
    ]}));
    for _ in 0..2 {
        assert_eq!(gw.get("/tcp", &[("Host", "logs.local")]).status, 200);
    }
    assert_eq!(gw.get("/udp", &[]).status, 200);
    let mut got = Vec::new();
    assert!(
        wait_for(|| {
            got = sink.all();
            got.len() == 1 && got[0].matches('\n').count() == 2
        }),
        "{got:?}"
    );
    // Both batches on the one connection, one line each.
    for line in got[0].lines() {
        let e = check_rfc5424(line, "logs.local");
        assert_eq!(e["route_id"], "t");
    }
    assert!(wait_for(|| udp.lock().unwrap().len() == 1));
    let d = udp.lock().unwrap()[0].clone();
    assert!(d.ends_with('\n'));
    assert_eq!(check_rfc5424(d.trim_end(), "test.local")["route_id"], "u");
}

#[test]
fn dead_sinks_never_slow_the_proxy_and_drop_after_retries() {
    let o = Origin::start();
    // A port nobody listens on (bound then closed), and a listener that accepts and never reads (blackhole).
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let shared = Arc::new(Shared::default());
    let gw = Gw::start_with(
        json!({"routes": [
            route("d", "/dead", &o, json!({"tcp-logger": {"host": "127.0.0.1", "port": dead,
                "batch_max_size": 1, "max_retry_count": 2, "retry_delay": 0}})),
            route("h", "/hole", &o, json!({"syslog": {"host": "127.0.0.1", "port": hole_port,
                "batch_max_size": 1, "timeout": 2000, "include_req_body": true}})),
        ]}),
        shared.clone(),
        2,
    )
    .unwrap();
    let t0 = Instant::now();
    let body = "x".repeat(512 * 1024);
    // 12 MiB of entries: more than the loopback socket buffers take (4 MiB send buffer at most here).
    for i in 0..24 {
        if i < 10 {
            assert_eq!(gw.get("/dead", &[]).status, 200);
        }
        assert_eq!(
            crate::request(gw.addr, "POST", "/hole", &[], &body).status,
            200
        );
    }
    let took = t0.elapsed();
    // A proxy waiting on the blackhole would wait out its 2 s write timeout once the buffers are full.
    assert!(took < Duration::from_secs(10), "34 requests took {took:?}");
    let tcp = shared.log_stats("tcp-logger");
    assert!(
        wait_for(|| tcp.failed.load(Ordering::Relaxed) == 10),
        "{tcp:?}"
    );
    assert_eq!(
        tcp.errors.load(Ordering::Relaxed),
        30,
        "1 try + 2 retries each"
    );
    assert_eq!(tcp.pending(), 0);
    // The blackhole's socket buffers fill, then a write times out (2 s) and its batch is dropped.
    let sys = shared.log_stats("syslog");
    assert!(
        wait_for(|| sys.failed.load(Ordering::Relaxed) >= 1),
        "{sys:?}"
    );
    drop(hole);
}

#[test]
fn socket_logger_schemas_as_apisix() {
    let o = Origin::start();
    for (name, bad) in [
        ("tcp-logger", json!({"host": "h"})),
        ("tcp-logger", json!({"port": 1})),
        ("tcp-logger", json!({"host": "h", "port": -1})),
        ("tcp-logger", json!({"host": "h", "port": 1, "timeout": 0})),
        (
            "tcp-logger",
            json!({"host": "h", "port": 1, "inactive_timeout": 0}),
        ),
        (
            "udp-logger",
            json!({"host": "h", "port": 1, "retry_delay": -1}),
        ),
        ("udp-logger", json!({"host": 1, "port": 1})),
        (
            "syslog",
            json!({"host": "h", "port": 1, "sock_type": "unix"}),
        ),
        ("syslog", json!({"host": "h", "port": 1, "pool_size": 4})),
        (
            "syslog",
            json!({"host": "h", "port": 1, "max_retry_count": -1}),
        ),
    ] {
        let r = Gw::try_start(json!({"routes": [route("r", "/", &o, json!({name: bad}))]}));
        assert!(r.is_err(), "{name} accepted {bad}");
    }
    for (name, prio, label) in [
        ("tcp-logger", 405, "tcp logger"),
        ("udp-logger", 400, "udp logger"),
        ("syslog", 401, "sys logger"),
    ] {
        let e = sluice_plugins::registry::find(name).unwrap();
        assert_eq!(e.priority, prio);
        assert_eq!((e.schema)()["properties"]["name"]["default"], label);
    }
}
