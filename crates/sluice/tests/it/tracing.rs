//! `plugin_attr` in config.yaml reaches the plugins through the real binary: opentelemetry exports to the
//! collector address set there (before this was wired, every compile saw no plugin_attr and the span went to the
//! default 127.0.0.1:4318).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use crate::support::client::get_once;
use crate::support::free_port;
use crate::support::origin::Origin;
use crate::support::process::{Sluice, TempDir};

/// A collector that records the first request line and headers of each POST and answers 200.
fn collector() -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let head = String::from_utf8_lossy(&buf);
            let head = head.split("\r\n\r\n").next().unwrap_or("").to_owned();
            if tx.send(head).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn plugin_attr_from_config_yaml_reaches_opentelemetry() {
    let origin = Origin::start("o").await;
    let (collector, got) = collector();
    let dir = TempDir::new("otel");
    std::fs::write(
        dir.0.join("apisix.yaml"),
        format!(
            "routes:\n  - id: 1\n    uri: /t\n    plugins:\n      opentelemetry:\n        sampler:\n          name: always_on\n\
             \x20   upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n#END\n",
            origin.addr
        ),
    )
    .unwrap();
    let port = free_port();
    std::fs::write(
        dir.0.join("config.yaml"),
        format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n  ssl:\n    enable: false\n\
             nginx_config:\n  worker_processes: 1\n\
             deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
             plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
             \x20 opentelemetry:\n    collector:\n      address: {collector}\n      request_headers:\n        x-collector-key: k1\n\
             \x20   batch_span_processor:\n      inactive_timeout: 0.05\n"
        ),
    )
    .unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let gw = Sluice::spawn_in(dir, addr, &[]).await;
    let r = get_once(gw.addr, "/t").await;
    assert_eq!(r.status, 200);
    let head = tokio::task::spawn_blocking(move || got.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the span reached the collector named in config.yaml");
    assert!(head.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("content-type: application/x-protobuf"),
        "{head}"
    );
    assert!(lower.contains("x-collector-key: k1"), "{head}");
}
