//! The Admin API over etcd, two nodes on one real etcd (`/usr/bin/etcd`, 127.0.0.1 ephemeral ports, temp data
//! dir): a write through node A's Admin API is served by node B and reaches B's data-plane channel; when etcd
//! goes away both answer 503 and keep their last configuration. Skipped when etcd is not installed.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_admin::{AdminConfig, AdminState, PluginCatalog};
use sluice_store::etcd::{EtcdConfig, EtcdStore};
use sluice_store::kv::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct NoPlugins;

impl PluginCatalog for NoPlugins {
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    fn schema(&self, _: &str) -> Option<Value> {
        None
    }
    fn check(&self, _: &str, _: &Value) -> Result<(), String> {
        Ok(())
    }
}

struct Etcd(Child, std::path::PathBuf);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn free_port() -> u16 {
    // etcd takes ports by number: bind-and-release on loopback (small race, acceptable in tests).
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    let text = tokio::time::timeout(Duration::from_secs(15), fut)
        .await
        .expect("answered");
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (
        head[9..12].parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

async fn node(url: &str) -> (std::net::SocketAddr, Arc<EtcdStore>) {
    let cfg = EtcdConfig {
        endpoints: vec![url.to_owned()],
        prefix: "/apisix".into(),
        timeout: Duration::from_secs(2),
    };
    let mut store = None;
    for _ in 0..100 {
        if let Ok(s) = EtcdStore::connect(cfg.clone()).await {
            store = Some(Arc::new(s));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = store.expect("etcd came up");
    let (_tx, applied) = tokio::sync::watch::channel(0u64);
    std::mem::forget(_tx);
    let state = AdminState::new(
        AdminConfig::default(),
        store.clone(),
        Arc::new(|_: &sluice_model::Resources| Ok(0)),
        Arc::new(NoPlugins),
        applied,
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(sluice_admin::serve(l, state));
    (addr, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_admin_nodes_share_one_etcd() {
    if !std::path::Path::new("/usr/bin/etcd").exists() {
        eprintln!("skipping: /usr/bin/etcd not installed (apt-get install -y etcd-server)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sluice-admin-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (cp, pp) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{cp}");
    let peer = format!("http://127.0.0.1:{pp}");
    let child = Command::new("/usr/bin/etcd")
        .args(["--name", "t", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("t={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut etcd = Etcd(child, dir);

    let (a, _sa) = node(&url).await;
    let (b, sb) = node(&url).await;
    let route = r#"{"uri": "/hello", "plugins": {}, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:80": 1}}}"#;
    let (st, body) = http(a, "PUT", "/apisix/admin/routes/1", route).await;
    assert_eq!(st, 201, "{body}");
    assert_eq!(body["key"], "/apisix/routes/1");
    let mut seen = false;
    for _ in 0..100 {
        let (st, body) = http(b, "GET", "/apisix/admin/routes/1", "").await;
        if st == 200 {
            assert_eq!(body["value"]["uri"], "/hello");
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "node B serves node A's write");
    assert_eq!(
        sb.subscribe().borrow().resources.routes.len(),
        1,
        "and B's data plane has it"
    );
    let (st, _) = http(
        b,
        "PUT",
        "/apisix/admin/routes/2",
        r#"{"uri": "/x", "service_id": "nope"}"#,
    )
    .await;
    assert_eq!(st, 400, "references are checked against the shared state");
    let (st, _) = http(a, "GET", "/apisix/admin/history", "").await;
    assert_eq!(st, 501, "history is an embedded-store feature");

    let _ = etcd.0.kill();
    let _ = etcd.0.wait();
    let mut unavailable = false;
    for _ in 0..100 {
        let (st, _) = http(b, "PUT", "/apisix/admin/routes/3", route).await;
        if st == 503 {
            unavailable = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unavailable, "writes answer 503 while etcd is away");
    assert_eq!(
        sb.subscribe().borrow().resources.routes.len(),
        1,
        "last configuration kept"
    );
}
