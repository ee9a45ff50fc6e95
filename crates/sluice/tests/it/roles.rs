//! APISIX's deployment roles on one real etcd (issue 18 item 1): a `control_plane` serves the Admin API and no
//! proxy port, `data_plane` nodes with `config_provider: etcd` proxy and serve no Admin API; a write through the
//! control plane with `?nodes=all` returns once every data plane serves it, and only data planes are listed as
//! nodes.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use crate::etcd_outage::{admin, route, Etcd, Node, ETCD, KEY};
use crate::support::process::{Mock, Sluice, TempDir};
use crate::support::{free_port, Client};

/// `sluice start` in `role` on `etcd`, waiting until `wait_for` (its proxy port, or its Admin API) accepts.
async fn start_role(etcd: SocketAddr, role: &str) -> Node {
    let dir = TempDir::new(&format!("role-{role}"));
    let (port, admin_port) = (free_port(), free_port());
    let cfg = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n\
         deployment:\n  role: {role}\n  role_{role}:\n    config_provider: etcd\n\
         \x20 etcd:\n    host:\n      - http://{etcd}\n    prefix: /apisix\n    timeout: 2\n\
         \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
         \x20   admin_key:\n      - name: admin\n        key: {KEY}\n        role: admin\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
         sluice:\n  data_dir: data\n  node_ttl: 5\n"
    );
    std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
    let gw: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let wait_for = if role == "control_plane" { admin } else { gw };
    let mut sluice = Sluice::spawn_in(dir, wait_for, &[]).await;
    sluice.addr = gw;
    Node { sluice, gw, admin }
}

async fn refuses(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_writes_data_planes_serve() {
    if !std::path::Path::new(ETCD).exists() {
        crate::support::skip_unless_ci(&format!(
            "{ETCD} not installed (apt-get install -y etcd-server)"
        ));
        return;
    }
    let overall = tokio::time::timeout(Duration::from_secs(120), async {
        let mock = Mock::start(5).await;
        let mut etcd = Etcd::new();
        etcd.start().await;
        let cp = start_role(etcd.client, "control_plane").await;
        let dp1 = start_role(etcd.client, "data_plane").await;
        let dp2 = start_role(etcd.client, "data_plane").await;

        // Each role opens only its own ports.
        assert!(refuses(cp.gw).await, "a control plane proxies nothing");
        for dp in [&dp1, &dp2] {
            assert!(refuses(dp.admin).await, "a data plane has no Admin API");
        }

        // The registry lists the two data planes (they register at start), not the control plane.
        let listed = || async {
            let (st, v) = admin(&cp, "GET", "/apisix/admin/nodes", "").await;
            assert_eq!(st, 200, "{v}");
            v["total"].as_u64()
        };
        crate::etcd_outage::eventually(
            Duration::from_secs(15),
            "both data planes listed",
            || async { listed().await == Some(2) },
        )
        .await;

        // A write through the control plane, answered once both data planes applied it: both serve it at once.
        let body = route("/roles", mock.addr).to_string();
        let (st, v) = admin(&cp, "PUT", "/apisix/admin/routes/1?nodes=all", &body).await;
        assert_eq!(st, 201, "{v}");
        for dp in [&dp1, &dp2] {
            let r = Client::connect(dp.gw).await.get("/roles").await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let (st, v): (u16, Value) = admin(&cp, "GET", "/apisix/admin/routes/1", "").await;
        assert_eq!(st, 200, "{v}");

        // A second node on dp1's data directory would take its identity: refused, naming the directory.
        let data = dp1.sluice.dir.0.join("data");
        let dir = TempDir::new("role-shared-data");
        let text = std::fs::read_to_string(dp1.sluice.dir.0.join("config.yaml"))
            .unwrap()
            .replace(
                &format!("port: {}", dp1.gw.port()),
                &format!("port: {}", free_port()),
            )
            .replace("data_dir: data", &format!("data_dir: {}", data.display()));
        std::fs::write(dir.0.join("config.yaml"), text).unwrap();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
                .arg("start")
                .arg("-c")
                .arg(dir.0.join("config.yaml"))
                .output()
                .expect("run sluice")
        })
        .await
        .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("uses the data directory"), "{err}");
        drop(etcd);
    });
    overall.await.expect("bounded");
}
