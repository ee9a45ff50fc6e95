//! The Admin API over etcd, two nodes on one real etcd (`/usr/bin/etcd`, 127.0.0.1 ephemeral ports, temp data
//! dir): a write through node A's Admin API is served by node B and reaches B's data-plane channel; when etcd
//! goes away both answer 503 and keep their last configuration. Skipped when etcd is not installed (fails under CI=true).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_admin::{AdminConfig, AdminState, PluginCatalog};
use sluice_store::etcd::EtcdStore;
use sluice_store::kv::Store;

#[path = "common/support.rs"]
mod support;
use support::{http, Etcd};

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

async fn node(etcd: &Etcd) -> (std::net::SocketAddr, Arc<EtcdStore>) {
    let store = Arc::new(etcd.store().await);
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
    let Some(mut etcd) = Etcd::start("t") else {
        return;
    };

    let (a, _sa) = node(&etcd).await;
    let (b, sb) = node(&etcd).await;
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

    etcd.kill();
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
