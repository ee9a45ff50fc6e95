//! APISIX Admin API behaviour that needs whole gateways: two `sluice` processes on one real etcd. Concurrent PATCHes
//! of different fields of one route through both nodes (and through one) all succeed and all land; a consumer
//! credential written through one node authenticates on the other node's proxy, as credentials ADC syncs must.

use std::time::Duration;

use serde_json::{json, Value};

use crate::etcd_outage::{admin, start_node, Etcd, Node, ETCD, KEY};
use crate::support::process::Mock;
use crate::support::{t, Client};

/// Polls `GET path` on `node` until `ok` holds (at most ~10 s); the last body.
async fn until(node: &Node, path: &str, ok: impl Fn(u16, &Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        let (st, v) = admin(node, "GET", path, "").await;
        if ok(st, &v) {
            return v;
        }
        last = v;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}

/// `n` PATCHes per node, all at once, each adding its own label; every answer's status.
async fn race(nodes: &[&Node], n: usize, tag: &str) -> Vec<(u16, Value)> {
    let mut tasks = Vec::new();
    for i in 0..n {
        for (k, node) in nodes.iter().enumerate() {
            let addr = node.admin;
            let body = json!({"labels": {format!("{tag}{k}-{i}"): "x"}}).to_string();
            tasks.push(tokio::spawn(async move {
                let r = Client::connect(addr)
                    .await
                    .request(
                        "PATCH",
                        "/apisix/admin/routes/1",
                        &format!("X-API-KEY: {KEY}\r\n"),
                        body.as_bytes(),
                    )
                    .await;
                (
                    r.status,
                    serde_json::from_slice(&r.body).unwrap_or(Value::Null),
                )
            }));
        }
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("PATCH task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_etcd_patch_without_conflicts_and_share_credentials() {
    if !std::path::Path::new(ETCD).exists() {
        crate::support::skip_unless_ci(&format!(
            "{ETCD} not installed (apt-get install -y etcd-server)"
        ));
        return;
    }
    t(async {
        let mock = Mock::start(5).await;
        let mut etcd = Etcd::new();
        etcd.start().await;
        let a = start_node(etcd.client).await;
        let b = start_node(etcd.client).await;

        let route = json!({"uri": "/p", "upstream": {"nodes": {mock.addr.to_string(): 1}}});
        let (st, v) = admin(&a, "PUT", "/apisix/admin/routes/1", &route.to_string()).await;
        assert_eq!(st, 201, "{v}");
        until(&b, "/apisix/admin/routes/1", |st, _| st == 200).await;

        const N: usize = 8;
        let two = race(&[&a, &b], N, "two").await;
        let one = race(&[&a], N, "one").await;
        let bad: Vec<_> = two.iter().chain(&one).filter(|(s, _)| *s != 200).collect();
        assert!(bad.is_empty(), "PATCH answers other than 200: {bad:?}");
        let want = 3 * N;
        for node in [&a, &b] {
            let v = until(node, "/apisix/admin/routes/1", |_, v| {
                v["value"]["labels"]
                    .as_object()
                    .is_some_and(|l| l.len() == want)
            })
            .await;
            let got = v["value"]["labels"].as_object().map_or(0, |l| l.len());
            assert_eq!(got, want, "every PATCH's label on both nodes: {v}");
        }

        // A credential written through node a identifies its consumer on node b's proxy.
        let (st, v) = admin(
            &a,
            "PUT",
            "/apisix/admin/consumers",
            r#"{"username":"jack"}"#,
        )
        .await;
        assert_eq!(st, 201, "{v}");
        let (st, v) = admin(
            &a,
            "PUT",
            "/apisix/admin/consumers/jack/credentials/c1",
            r#"{"plugins":{"key-auth":{"key":"jack-cred-key"}}}"#,
        )
        .await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(v["value"]["id"], "c1");
        let guarded = json!({"uri": "/k", "plugins": {"key-auth": {}},
                             "upstream": {"nodes": {mock.addr.to_string(): 1}}});
        let (st, v) = admin(&a, "PUT", "/apisix/admin/routes/2", &guarded.to_string()).await;
        assert_eq!(st, 201, "{v}");
        let mut last = (0, String::new());
        for _ in 0..200 {
            let r = Client::connect(b.gw)
                .await
                .request("GET", "/k", "apikey: jack-cred-key\r\n", b"")
                .await;
            last = (r.status, r.raw_head.clone());
            if r.status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(last.0, 200, "credential key on node b: {}", last.1);
        let r = Client::connect(b.gw)
            .await
            .request("GET", "/k", "apikey: wrong\r\n", b"")
            .await;
        assert_eq!(r.status, 401);
        assert_eq!(r.header("www-authenticate"), Some("apikey realm=\"key\""));
    })
    .await
}
