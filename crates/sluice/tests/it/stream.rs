//! `stream_routes` through the real binary: `proxy_mode: stream` with `stream_proxy` TCP and UDP listeners on free
//! loopback ports, routes written through the Admin API (APISIX's schema, ids, errors and reference checks) and
//! applied live to TCP and UDP connections; and the Admin API refusing stream routes when stream mode is off.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, t, Client};

const KEY: &str = "it-stream-key-0123456789";

async fn call(admin: SocketAddr, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let r = Client::connect(admin)
        .await
        .request(method, path, &format!("X-API-KEY: {KEY}\r\n"), &body)
        .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

/// A TCP origin that writes `name`, then echoes until EOF.
async fn origin(name: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = c.write_all(name.as_bytes()).await;
                let mut b = [0u8; 4096];
                while let Ok(n) = c.read(&mut b).await {
                    if n == 0 || c.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// What the gateway's TCP port answers first on a fresh connection ("" when it closes unanswered).
async fn first_bytes(addr: SocketAddr) -> String {
    let Ok(mut c) = TcpStream::connect(addr).await else {
        return String::new();
    };
    let mut b = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(2), c.read(&mut b)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&b[..n]).into_owned(),
        _ => String::new(),
    }
}

/// Polls (bounded) until the TCP port answers `want`.
async fn until(addr: SocketAddr, want: &str) -> String {
    let mut last = String::new();
    for _ in 0..100 {
        last = first_bytes(addr).await;
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

fn free_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_routes_through_the_admin_api_applied_live_to_tcp_and_udp() {
    t(async {
        let dir = TempDir::new("stream");
        let (tcp_port, udp_port, admin_port) = (free_port(), free_udp_port(), free_port());
        let cfg = format!(
            "apisix:\n  proxy_mode: stream\n  enable_admin: true\n  enable_control: false\n  ssl:\n    enable: false\n\
             \x20 stream_proxy:\n    tcp:\n      - \"127.0.0.1:{tcp_port}\"\n    udp:\n      - \"127.0.0.1:{udp_port}\"\n\
             nginx_config:\n  worker_processes: 2\n\
             deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n\
             \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
             \x20   admin_key:\n      - name: admin\n        key: {KEY}\n        role: admin\n\
             plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
             sluice:\n  data_dir: data\n"
        );
        std::fs::write(dir.0.join("config.yaml"), cfg).unwrap();
        let tcp: SocketAddr = ([127, 0, 0, 1], tcp_port).into();
        let udp: SocketAddr = ([127, 0, 0, 1], udp_port).into();
        let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
        let _gw = Sluice::spawn_in(dir, tcp, &[admin]).await;
        // No route yet: closed unanswered.
        assert_eq!(first_bytes(tcp).await, "");

        let one = origin("one").await;
        let two = origin("two").await;
        let (st, v) = call(
            admin,
            "PUT",
            "/apisix/admin/stream_routes/1",
            json!({"server_port": tcp_port, "remote_addr": "127.0.0.1",
                   "upstream": {"type": "roundrobin", "nodes": {one.to_string(): 1}}}),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(v["key"], "/apisix/stream_routes/1");
        assert!(v["value"]["create_time"].is_i64());
        assert_eq!(until(tcp, "one").await, "one");
        // Bytes both ways after the origin's greeting.
        let mut c = TcpStream::connect(tcp).await.unwrap();
        let mut b = [0u8; 3];
        c.read_exact(&mut b).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut p = [0u8; 4];
        c.read_exact(&mut p).await.unwrap();
        assert_eq!(&p, b"ping");

        // APISIX's refusals.
        let bad = [
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"server_port": 0, "upstream": {"nodes": {one.to_string(): 1}}}),
                "invalid configuration: ",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"remote_addr": "not-an-ip", "upstream": {"nodes": {one.to_string(): 1}}}),
                "invalid configuration: ",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"uri": "/x", "upstream": {"nodes": {one.to_string(): 1}}}),
                "invalid configuration: ",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"upstream_id": "nope"}),
                "failed to fetch upstream info by upstream id [nope], response code: 404",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"service_id": "nope"}),
                "failed to fetch service info by service id [nope], response code: 404",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"plugins": {"key-auth": {}}, "upstream": {"nodes": {one.to_string(): 1}}}),
                "unknown plugin [key-auth]",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"plugins": {"limit-conn": {"conn": 1}}, "upstream": {"nodes": {one.to_string(): 1}}}),
                "failed to check the configuration of stream plugin [limit-conn]",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/2",
                json!({"protocol": {"name": "redis", "superior_id": "2"}, "upstream": {"nodes": {one.to_string(): 1}}}),
                "stream route can not set itself as superior_id",
            ),
            (
                "PUT",
                "/apisix/admin/stream_routes/3",
                json!({"id": "4", "upstream": {"nodes": {one.to_string(): 1}}}),
                "wrong stream route id",
            ),
        ];
        for (method, path, body, want) in bad {
            let (st, v) = call(admin, method, path, body.clone()).await;
            let msg = v["error_msg"].as_str().unwrap_or_default().to_owned();
            assert_eq!(st, 400, "{body}: {v}");
            assert!(msg.contains(want), "{body}: {msg:?} !~ {want:?}");
        }
        let (st, v) = call(admin, "PATCH", "/apisix/admin/stream_routes/1", json!({"server_port": 1})).await;
        assert_eq!((st, v["error_msg"].as_str()), (405, Some("not supported `PATCH` method for stream route")));
        assert_eq!(first_bytes(tcp).await, "one", "refused writes changed nothing");

        // A live change through a service: the route now takes the service's upstream.
        let (st, _) = call(
            admin,
            "PUT",
            "/apisix/admin/services/s1",
            json!({"upstream": {"nodes": {two.to_string(): 1}}}),
        )
        .await;
        assert_eq!(st, 201);
        let (st, v) = call(
            admin,
            "PUT",
            "/apisix/admin/stream_routes/1",
            json!({"server_port": tcp_port, "service_id": "s1"}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(until(tcp, "two").await, "two");
        let (st, v) = call(admin, "DELETE", "/apisix/admin/services/s1", Value::Null).await;
        assert_eq!(st, 400);
        assert_eq!(
            v["error_msg"],
            "can not delete this service directly, stream_route [1] is still using it now"
        );

        // UDP: a route on the UDP port, to a UDP echo.
        let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let mut b = [0u8; 2048];
            while let Ok((n, from)) = echo.recv_from(&mut b).await {
                let mut out = b"udp:".to_vec();
                out.extend_from_slice(&b[..n]);
                let _ = echo.send_to(&out, from).await;
            }
        });
        let (st, v) = call(
            admin,
            "POST",
            "/apisix/admin/stream_routes",
            json!({"server_port": udp_port, "upstream": {"nodes": {echo_addr.to_string(): 1}}}),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        let posted = v["value"]["id"].as_str().unwrap().to_owned();
        assert_eq!(posted.len(), 20);
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut got = String::new();
        for _ in 0..100 {
            client.send_to(b"hi", udp).await.unwrap();
            let mut b = [0u8; 64];
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_millis(50), client.recv_from(&mut b)).await
            {
                got = String::from_utf8_lossy(&b[..n]).into_owned();
                break;
            }
        }
        assert_eq!(got, "udp:hi");
        let (st, v) = call(admin, "GET", "/apisix/admin/stream_routes", Value::Null).await;
        assert_eq!((st, v["total"].as_u64()), (200, Some(2)));

        // Deleting the TCP route closes new connections.
        let (st, _) = call(admin, "DELETE", "/apisix/admin/stream_routes/1", Value::Null).await;
        assert_eq!(st, 200);
        assert_eq!(until(tcp, "").await, "");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_routes_are_refused_when_stream_mode_is_off() {
    t(async {
        let (_gw, admin) = Sluice::start_traditional(None, KEY, None).await;
        for method in ["GET", "PUT"] {
            let (st, v) = call(
                admin,
                method,
                "/apisix/admin/stream_routes/1",
                json!({"upstream": {"nodes": {"127.0.0.1:1": 1}}}),
            )
            .await;
            assert_eq!(st, 400);
            assert_eq!(
                v["error_msg"],
                "stream mode is disabled, can not add stream routes"
            );
        }
    })
    .await
}
