//! APISIX's control API health-check view through the real binary: `sluice start` (standalone apisix.yaml) with
//! `apisix.control` on an ephemeral loopback port, a route whose inline upstream has one live node (a `sluice
//! mock`) and one refused port under an active HTTP check. Asserts the checker marks the dead node `unhealthy`
//! and the live one `healthy` in `GET /v1/healthcheck/routes/1` and in the `/v1/healthcheck` list (APISIX's JSON
//! shape), that traffic then only reaches the live node, and APISIX's error bodies for unknown ids and types.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::process::{Mock, Sluice, TempDir};
use crate::support::{free_port, refused_addr, Client};

/// The gateway process (killed on drop) and the addresses a test talks to.
struct Node {
    _sluice: Sluice,
    gw: SocketAddr,
    control: SocketAddr,
}

async fn start(apisix_yaml: &str) -> Node {
    start_with(apisix_yaml, "").await
}

async fn start_with(apisix_yaml: &str, extra_config: &str) -> Node {
    let dir = TempDir::new("control");
    std::fs::write(dir.0.join("apisix.yaml"), apisix_yaml).expect("write apisix.yaml");
    let (port, control_port) = (free_port(), free_port());
    let cfg = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  ssl:\n    enable: false\n\
         \x20 enable_control: true\n  control:\n    ip: 127.0.0.1\n    port: {control_port}\n\
         nginx_config:\n  worker_processes: 1\n\
         deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n{extra_config}"
    );
    std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
    let gw: SocketAddr = ([127, 0, 0, 1], port).into();
    let control: SocketAddr = ([127, 0, 0, 1], control_port).into();
    Node {
        _sluice: Sluice::spawn_in(dir, gw, &[control]).await,
        gw,
        control,
    }
}

async fn get_json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let r = Client::connect(addr).await.get(path).await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    (
        r.status,
        serde_json::from_slice(&r.body).expect("JSON body"),
    )
}

fn status_of(info: &Value, port: u16) -> Option<String> {
    info["nodes"].as_array()?.iter().find_map(|n| {
        (n["port"] == port && n["ip"] == "127.0.0.1")
            .then(|| n["status"].as_str().unwrap_or("").to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_check_marks_the_dead_node_unhealthy_in_the_control_api() {
    let run = async {
        let mock = Mock::start(4).await;
        let dead = refused_addr();
        let yaml = format!(
            "routes:\n  - id: 1\n    uri: /hc\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{live}\": 1\n        \"{dead}\": 1\n\
             \x20     checks:\n        active:\n          type: http\n          http_path: /\n\
             \x20         healthy:\n            interval: 1\n            successes: 1\n\
             \x20         unhealthy:\n            interval: 1\n            http_failures: 1\n            tcp_failures: 1\n\
             upstreams:\n  - id: u1\n    nodes:\n      \"{live}\": 1\n    checks:\n      active:\n        type: tcp\n#END\n",
            live = mock.addr
        );
        let node = start(&yaml).await;

        let end = Instant::now() + Duration::from_secs(20);
        let info = loop {
            let (st, info) = get_json(node.control, "/v1/healthcheck/routes/1").await;
            assert_eq!(st, 200, "{info}");
            if status_of(&info, dead.port()).as_deref() == Some("unhealthy") {
                break info;
            }
            assert!(
                Instant::now() < end,
                "dead node never marked unhealthy: {info}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(info["name"], "/apisix/routes/1");
        assert_eq!(info["type"], "http");
        assert_eq!(
            status_of(&info, mock.addr.port()).as_deref(),
            Some("healthy"),
            "{info}"
        );
        // Counters count towards the next flip (sluice-upstream resets them when a node flips; APISIX keeps the
        // failures that tripped it), so only their presence is checked here.
        assert!(
            info["nodes"][0]["counter"]["tcp_failure"].is_u64(),
            "{info}"
        );

        // The list holds both resources with checks, in APISIX's order (routes, then upstreams).
        let (st, all) = get_json(node.control, "/v1/healthcheck").await;
        assert_eq!(st, 200);
        let names: Vec<&str> = all
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect();
        assert_eq!(names, ["/apisix/routes/1", "/apisix/upstreams/u1"]);
        assert_eq!(all[1]["type"], "tcp");

        // With the dead node out, every request reaches the live one.
        for _ in 0..10 {
            let r = Client::connect(node.gw).await.get("/hc").await;
            assert_eq!(r.status, 200);
            assert_eq!(r.body, b"xxxx");
        }

        // APISIX's errors.
        let (st, v) = get_json(node.control, "/v1/healthcheck/routes/404").await;
        assert_eq!(
            (st, v["error_msg"].as_str()),
            (404, Some("routes[404] not found"))
        );
        let (st, v) = get_json(node.control, "/v1/healthcheck/consumers/1").await;
        assert_eq!(
            (st, v["error_msg"].as_str()),
            (400, Some("invalid src type consumers"))
        );
    };
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("control API test timed out after 60 s");
}

/// server-info's control API (APISIX apisix/plugins/server-info.lua, t/plugin/server-info.t): `GET
/// /v1/server_info` reports this node while the plugin is enabled (Sluice: every plugin unless `plugins:` lists
/// some), with the id kept across restarts in the data directory; a `plugins:` list without it hides the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_info_reports_the_node_while_the_plugin_is_enabled() {
    let run = async {
        let yaml = "routes: []\n#END\n";
        let node = start(yaml).await;
        let (st, info) = get_json(node.control, "/v1/server_info").await;
        assert_eq!(st, 200, "{info}");
        let id = info["id"].as_str().expect("id");
        assert_eq!(id.len(), 36, "{info}");
        assert!(
            info["hostname"].as_str().is_some_and(|h| !h.is_empty()),
            "{info}"
        );
        assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(info["etcd_version"], "unknown");
        let boot = info["boot_time"].as_u64().expect("boot_time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(boot <= now && now - boot < 600, "{info}");
        assert!(
            info["up_time"]
                .as_u64()
                .is_some_and(|u| u <= now - boot + 1),
            "{info}"
        );
        drop(node);

        let node = start_with(yaml, "plugins:\n  - key-auth\n").await;
        let (st, _) = get_json(node.control, "/v1/server_info").await;
        assert_eq!(st, 404);
        let (st, _) = get_json(node.control, "/v1/healthcheck").await;
        assert_eq!(st, 200);
    };
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("test timed out");
}
