//! The node registry (issue 18 item 2): two `sluice start` processes on one real etcd each keep a leased
//! `/apisix/data_plane/server_info/{id}` key (APISIX's shape plus `applied_revision`); `GET /apisix/admin/nodes`
//! lists both with their applied revisions, a write moves both, registry reports do not make configuration
//! revisions, and a node killed with SIGKILL leaves the list once its lease (`sluice.node_ttl`) expires. With the
//! embedded store the one local node is listed. A node that starts while etcd is down serves its last known good
//! copy and catches up when etcd returns.

use std::time::Duration;

use serde_json::Value;

use crate::etcd_outage::{admin, eventually, route, start_node, start_node_with, Etcd, Node, ETCD};
use crate::support::process::{Mock, Sluice};
use crate::support::Client;

fn node_id(n: &Node) -> String {
    std::fs::read_to_string(n.sluice.dir.0.join("data/sluice.uid"))
        .expect("sluice.uid in the data dir")
        .trim()
        .to_owned()
}

async fn nodes(n: &Node) -> Value {
    let (st, v) = admin(n, "GET", "/apisix/admin/nodes", "").await;
    assert_eq!(st, 200, "{v}");
    v
}

/// The listed nodes' `id -> applied_revision`.
fn applied(v: &Value) -> Vec<(String, u64)> {
    v["list"]
        .as_array()
        .expect("list")
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap_or("").to_owned(),
                n["applied_revision"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_etcd_are_listed_with_applied_revisions_and_a_killed_one_expires() {
    if !std::path::Path::new(ETCD).exists() {
        crate::support::skip_unless_ci(&format!(
            "{ETCD} not installed (apt-get install -y etcd-server)"
        ));
        return;
    }
    let overall = tokio::time::timeout(Duration::from_secs(120), async {
        let mut etcd = Etcd::new();
        etcd.start().await;
        let a = start_node_with(etcd.client, "  node_ttl: 2\n").await;
        let b = start_node_with(etcd.client, "  node_ttl: 2\n").await;
        let (ida, idb) = (node_id(&a), node_id(&b));
        assert_ne!(ida, idb);

        // Both nodes, seen from either one, each at the revision its own status reports as applied (a node
        // that started later loaded a later etcd revision: the other's registry report moved it).
        let (_, sa) = admin(&a, "GET", "/apisix/admin/status", "").await;
        let (_, sb) = admin(&b, "GET", "/apisix/admin/status", "").await;
        let rev0 = sa["applied"].as_u64().expect("applied");
        let mut want = vec![
            (ida.clone(), rev0),
            (idb.clone(), sb["applied"].as_u64().expect("applied")),
        ];
        want.sort();
        for n in [&a, &b] {
            eventually(Duration::from_secs(15), "both nodes listed", || async {
                applied(&nodes(n).await) == want
            })
            .await;
        }
        let v = nodes(&a).await;
        assert_eq!(v["total"], 2, "{v}");
        for n in v["list"].as_array().unwrap() {
            assert_eq!(n["alive"], true, "{n}");
            assert_eq!(n["version"], env!("CARGO_PKG_VERSION"), "{n}");
            assert!(n["hostname"].as_str().is_some_and(|h| !h.is_empty()), "{n}");
            assert!(
                n["boot_time"].as_u64().is_some_and(|t| t > 1_600_000_000),
                "{n}"
            );
            assert!(n["last_report_time"].as_u64().is_some(), "{n}");
            assert!(
                n["etcd_version"]
                    .as_str()
                    .is_some_and(|e| e.starts_with('3')),
                "{n}"
            );
        }

        // A write through node a: both nodes report its revision.
        let body = r#"{"uri": "/nodes-test", "upstream": {"nodes": {"127.0.0.1:1": 1}}}"#;
        let (st, v) = admin(&a, "PUT", "/apisix/admin/routes/1?wait=applied", body).await;
        assert_eq!(st, 201, "{v}");
        let (_, st) = admin(&a, "GET", "/apisix/admin/status", "").await;
        let rev1 = st["revision"].as_u64().expect("revision");
        assert!(rev1 > rev0, "{rev1} after {rev0}");
        let mut want = vec![(ida.clone(), rev1), (idb.clone(), rev1)];
        want.sort();
        eventually(
            Duration::from_secs(15),
            "both nodes at the write's revision",
            || async { applied(&nodes(&b).await) == want },
        )
        .await;

        // The registry's own writes are not configuration: after reports settle, no new revision was applied.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        for n in [&a, &b] {
            let (_, st) = admin(n, "GET", "/apisix/admin/status", "").await;
            assert_eq!(
                (st["revision"].as_u64(), st["applied"].as_u64()),
                (Some(rev1), Some(rev1)),
                "{st}"
            );
        }

        // `nodes=all`: the write returns once both nodes report it, so the registry shows it at once.
        let body2 = r#"{"uri": "/nodes-test-2", "upstream": {"nodes": {"127.0.0.1:1": 1}}}"#;
        let (st, v) = admin(
            &a,
            "PUT",
            "/apisix/admin/routes/2?wait=applied&nodes=all",
            body2,
        )
        .await;
        assert_eq!(st, 201, "{v}");
        let (_, st) = admin(&a, "GET", "/apisix/admin/status", "").await;
        let rev2 = st["revision"].as_u64().expect("revision");
        assert!(rev2 > rev1);
        let mut want = vec![(ida.clone(), rev2), (idb.clone(), rev2)];
        want.sort();
        assert_eq!(
            applied(&nodes(&a).await),
            want,
            "every node applied it when the write returned"
        );
        // More nodes than there are: the write is kept, the answer says how many applied it.
        // (Answered after the 10 s wait: longer than the test client's own bound, so by hand.)
        let raw = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(b.admin).await.unwrap();
            let req = format!(
                "DELETE /apisix/admin/routes/2?nodes=3 HTTP/1.1\r\nHost: x\r\nX-API-KEY: {}\r\n\
                 Connection: close\r\n\r\n",
                crate::etcd_outage::KEY
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8_lossy(&out).into_owned()
        };
        let answer = tokio::time::timeout(Duration::from_secs(30), raw)
            .await
            .expect("answered");
        assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
        assert!(answer.contains("2 of 2 live nodes"), "{answer}");
        // A bad value is refused before anything is written.
        for bad in ["0", "-1", "some", "1e3", ""] {
            let (st, v) = admin(
                &a,
                "PUT",
                &format!("/apisix/admin/routes/9?nodes={bad}"),
                body2,
            )
            .await;
            assert_eq!(st, 400, "nodes={bad}: {v}");
        }
        let (st, _) = admin(&a, "GET", "/apisix/admin/routes/9", "").await;
        assert_eq!(st, 404, "a refused write changed nothing");
        let (_, st) = admin(&a, "GET", "/apisix/admin/status", "").await;
        let rev1 = st["revision"].as_u64().expect("revision");
        let mut want = vec![(ida.clone(), rev1), (idb.clone(), rev1)];
        want.sort();
        eventually(
            Duration::from_secs(15),
            "both nodes at the delete",
            || async { applied(&nodes(&a).await) == want },
        )
        .await;

        // SIGKILL b: no goodbye, its key leaves with the lease (TTL 2 s), a stays.
        b.sluice.signal("KILL");
        eventually(
            Duration::from_secs(20),
            "killed node gone from the list",
            || async { applied(&nodes(&a).await) == vec![(ida.clone(), rev1)] },
        )
        .await;
        // a keeps renewing past its own TTL.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(applied(&nodes(&a).await), vec![(ida.clone(), rev1)]);
        drop(b);

        // etcd away for longer than the TTL (a's lease is lost), then back: a registers again, and stays
        // listed after its old lease has expired (the key moved to the new lease).
        etcd.kill();
        tokio::time::sleep(Duration::from_secs(3)).await;
        etcd.start().await;
        eventually(
            Duration::from_secs(20),
            "node a registered again",
            || async {
                let (st, v) = admin(&a, "GET", "/apisix/admin/nodes", "").await;
                st == 200
                    && applied(&v)
                        .iter()
                        .map(|(id, _)| id.clone())
                        .collect::<Vec<_>>()
                        == vec![ida.clone()]
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let ids: Vec<String> = applied(&nodes(&a).await)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, vec![ida.clone()]);
        drop(etcd);
    })
    .await;
    overall.expect("node registry test timed out after 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_lists_the_local_node() {
    const K: &str = "it-nodes-embedded-key-0123456789";
    let (gw, admin_addr) = Sluice::start_traditional(None, K, None).await;
    let id = std::fs::read_to_string(gw.dir.0.join("data/sluice.uid")).expect("sluice.uid");
    let get = |path: &'static str| async move {
        let r = Client::connect(admin_addr)
            .await
            .request("GET", path, &format!("X-API-KEY: {K}\r\n"), b"")
            .await;
        (
            r.status,
            serde_json::from_slice::<Value>(&r.body).unwrap_or(Value::Null),
        )
    };
    let (st, v) = get("/apisix/admin/nodes").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["total"], 1, "{v}");
    let n = &v["list"][0];
    assert_eq!(n["id"], id.trim(), "{v}");
    assert_eq!(n["alive"], true, "{v}");
    let (_, status) = get("/apisix/admin/status").await;
    assert_eq!(n["applied_revision"], status["applied"], "{v} {status}");
    // No key: refused as every read.
    let r = Client::connect(admin_addr)
        .await
        .get("/apisix/admin/nodes")
        .await;
    assert_eq!(r.status, 401);
}

async fn status_of(n: &Node, path: &str) -> u16 {
    match Client::try_connect(n.gw).await {
        Ok(mut c) => c.get(path).await.status,
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starts_from_its_last_known_good_copy_while_etcd_is_down() {
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
        let mut node = start_node(etcd.client).await;
        let body = route("/lkg", mock.addr).to_string();
        let (st, v) = admin(&node, "PUT", "/apisix/admin/routes/1?wait=applied", &body).await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(status_of(&node, "/lkg").await, 200);
        let copy = node.sluice.dir.0.join("data/etcd-last-known-good.json");
        eventually(Duration::from_secs(10), "the copy holds the route", || {
            let copy = copy.clone();
            async move { std::fs::read_to_string(&copy).is_ok_and(|t| t.contains("/lkg")) }
        })
        .await;

        // etcd gone, node restarted: it starts (it used to exit 1), serves the copy, refuses writes.
        etcd.kill();
        node.sluice.restart(&[node.admin]).await;
        assert_eq!(status_of(&node, "/lkg").await, 200);
        let (st, v) = admin(&node, "PUT", "/apisix/admin/routes/3", &body).await;
        assert_eq!(st, 503, "{v}");

        // etcd back with a change made meanwhile: caught up.
        etcd.start().await;
        etcd.put("/apisix/routes/2", &route("/later", mock.addr))
            .await;
        let n = &node;
        eventually(
            Duration::from_secs(30),
            "the node catches up",
            move || async move { status_of(n, "/later").await == 200 },
        )
        .await;
        assert_eq!(status_of(&node, "/lkg").await, 200);
    });
    overall.await.expect("bounded");
}
