//! Admin API integration tests over a real socket on 127.0.0.1: the embedded store in a temp dir, a fake plugin
//! catalog, and a raw HTTP/1.1 client, so what is asserted is exactly what curl would see.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_admin::{AdminConfig, AdminKey, AdminState, Checker, PluginCatalog, Role};
use sluice_store::embedded::EmbeddedStore;
use sluice_store::kv::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "k-admin-0123456789";
const VIEWER: &str = "k-viewer-0123456789";

struct Catalog;

impl PluginCatalog for Catalog {
    fn names(&self) -> Vec<String> {
        vec!["key-auth".into(), "limit-count".into()]
    }
    fn schema(&self, name: &str) -> Option<Value> {
        (name == "limit-count").then(|| json!({"type": "object", "required": ["count"]}))
    }
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        if name == "limit-count" && conf.get("count").and_then(Value::as_u64).is_none() {
            return Err("property \"count\" is required".into());
        }
        Ok(())
    }
    fn is_auth(&self, name: &str) -> bool {
        name == "key-auth"
    }
}

struct Gw {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-admin-it-{}-{name}", std::process::id()));
    d
}

/// Wraps a store and lets a test take it "offline", as an etcd outage does.
struct Flaky {
    inner: EmbeddedStore,
    up: std::sync::atomic::AtomicBool,
}

impl Store for Flaky {
    fn backend(&self) -> &'static str {
        "flaky"
    }
    fn snapshot(&self) -> Arc<sluice_store::kv::Snapshot> {
        self.inner.snapshot()
    }
    fn commit(
        &self,
        ops: Vec<sluice_store::kv::Op>,
    ) -> sluice_store::kv::BoxFuture<'_, Result<u64, sluice_store::kv::StoreError>> {
        self.inner.commit(ops)
    }
    fn history(
        &self,
        after: u64,
        limit: usize,
    ) -> sluice_store::kv::BoxFuture<
        '_,
        Result<Vec<sluice_store::kv::Revision>, sluice_store::kv::StoreError>,
    > {
        self.inner.history(after, limit)
    }
    fn subscribe(&self) -> sluice_store::ConfigRx {
        self.inner.subscribe()
    }
    fn healthy(&self) -> bool {
        self.up.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tokio::test]
async fn store_outage_answers_503() {
    let dir = tmpdir("flaky");
    let _ = std::fs::remove_dir_all(&dir);
    let flaky = Arc::new(Flaky {
        inner: EmbeddedStore::open(&dir.join("db.redb")).unwrap(),
        up: std::sync::atomic::AtomicBool::new(true),
    });
    let (_applied_tx, applied_rx) = tokio::sync::watch::channel(0u64);
    let config = AdminConfig {
        keys: vec![AdminKey {
            name: "admin".into(),
            key: KEY.into(),
            role: Role::Admin,
        }],
        ..AdminConfig::default()
    };
    let state = AdminState::new(
        config,
        flaky.clone(),
        Arc::new(|_: &sluice_model::Resources| Ok(0)),
        Arc::new(Catalog),
        applied_rx,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gw = Gw {
        addr,
        task: tokio::spawn(sluice_admin::serve(listener, state)),
    };
    assert_eq!(
        call(&gw, "PUT", "/apisix/admin/routes/1", ISSUE_ROUTE)
            .await
            .status,
        201
    );
    flaky.up.store(false, std::sync::atomic::Ordering::Relaxed);
    let r = call(&gw, "PUT", "/apisix/admin/routes/2", ISSUE_ROUTE).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/routes/1", "").await.status,
        503
    );
    let r = call(&gw, "GET", "/apisix/admin/status", "").await;
    assert_eq!((r.status, r.body["healthy"].clone()), (200, json!(false)));
    flaky.up.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/routes/2", "").await.status,
        404,
        "the refused write left nothing"
    );
    std::fs::remove_dir_all(&dir).ok();
}

async fn start_at(dir: PathBuf) -> Gw {
    // A restarted gateway may find the previous one's aborted tasks still releasing the file lock.
    let mut tries = 0;
    let store = loop {
        match EmbeddedStore::open(&dir.join("db.redb")) {
            Ok(s) => break s,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let store: Arc<dyn Store> = Arc::new(store);
    // A fake data plane: applies every revision it sees, refuses routes on /refused.
    let (applied_tx, applied_rx) = tokio::sync::watch::channel(0u64);
    let mut cfg_rx = store.subscribe();
    tokio::spawn(async move {
        loop {
            let rev = cfg_rx.borrow_and_update().revision;
            let _ = applied_tx.send(rev);
            if cfg_rx.changed().await.is_err() {
                return;
            }
        }
    });
    let checker: Checker = Arc::new(|r: &sluice_model::Resources| {
        if r.routes
            .iter()
            .any(|x| x.uri.as_deref() == Some("/refused"))
        {
            Err("data plane refuses /refused".into())
        } else {
            Ok(0)
        }
    });
    let config = AdminConfig {
        keys: vec![
            AdminKey {
                name: "admin".into(),
                key: KEY.into(),
                role: Role::Admin,
            },
            AdminKey {
                name: "viewer".into(),
                key: VIEWER.into(),
                role: Role::Viewer,
            },
        ],
        ..AdminConfig::default()
    };
    let state = AdminState::new(config, store, checker, Arc::new(Catalog), applied_rx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(sluice_admin::serve(listener, state));
    Gw { addr, task }
}

async fn start(name: &str) -> Gw {
    let dir = tmpdir(name);
    let _ = std::fs::remove_dir_all(&dir);
    start_at(dir).await
}

struct Resp {
    status: u16,
    head: String,
    body: Value,
    raw: String,
}

async fn call_raw(gw: &Gw, method: &str, path: &str, headers: &str, body: &str) -> Resp {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("admin answered");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, raw) = text.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    Resp {
        status,
        head: head.to_ascii_lowercase(),
        body: serde_json::from_str(raw).unwrap_or(Value::Null),
        raw: raw.to_owned(),
    }
}

async fn call(gw: &Gw, method: &str, path: &str, body: &str) -> Resp {
    call_raw(gw, method, path, &format!("X-API-KEY: {KEY}\r\n"), body).await
}

const ISSUE_ROUTE: &str = r#"
    {"uri": "/hello", "plugins": {}, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:80": 1}}}"#;

#[tokio::test]
async fn issue_put_verbatim_then_get_and_list() {
    let gw = start("issue").await;
    let r = call(&gw, "PUT", "/apisix/admin/routes/1", ISSUE_ROUTE).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert!(r.head.contains("x-api-version: v3"));
    assert!(r.head.contains("content-type: application/json"));
    assert_eq!(r.body["key"], "/apisix/routes/1");
    assert_eq!(r.body["value"]["id"], "1");
    assert_eq!(r.body["value"]["uri"], "/hello");
    let created = r.body["value"]["create_time"].as_i64().unwrap();
    assert!(r.body["value"]["update_time"].as_i64().unwrap() >= created);

    let r = call(&gw, "PUT", "/apisix/admin/routes/1", ISSUE_ROUTE).await;
    assert_eq!(r.status, 200, "replace answers 200");
    assert_eq!(r.body["value"]["create_time"].as_i64().unwrap(), created);

    let r = call(&gw, "GET", "/apisix/admin/routes/1", "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["value"]["upstream"]["nodes"]["127.0.0.1:80"], 1);
    assert_eq!(r.body["createdIndex"], 1);
    assert_eq!(r.body["modifiedIndex"], 2);

    let r = call(&gw, "GET", "/apisix/admin/routes", "").await;
    assert_eq!(r.body["total"], 1);
    assert_eq!(r.body["list"][0]["key"], "/apisix/routes/1");

    let r = call(&gw, "GET", "/apisix/admin/routes/nope", "").await;
    assert_eq!(
        (r.status, r.body.clone()),
        (404, json!({"message": "Key not found"}))
    );
    let r = call(&gw, "GET", "/apisix/admin/bogus", "").await;
    assert_eq!(r.body["error_msg"], "Unsupported resource type: bogus");
}

#[tokio::test]
async fn auth_roles_and_key_locations() {
    let gw = start("auth").await;
    let r = call_raw(&gw, "GET", "/apisix/admin/routes", "", "").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.body,
        json!({"error_msg": "failed to check token", "description": "missing apikey"})
    );
    let r = call_raw(
        &gw,
        "GET",
        "/apisix/admin/routes",
        "X-API-KEY: nope\r\n",
        "",
    )
    .await;
    assert_eq!(r.body["description"], "wrong apikey");
    let r = call_raw(
        &gw,
        "GET",
        &format!("/apisix/admin/routes?api_key={KEY}"),
        "",
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let r = call_raw(
        &gw,
        "GET",
        "/apisix/admin/routes",
        &format!("Cookie: a=b; x_api_key={VIEWER}\r\n"),
        "",
    )
    .await;
    assert_eq!(r.status, 200, "viewer reads");
    let viewer = format!("X-API-KEY: {VIEWER}\r\n");
    let r = call_raw(&gw, "PUT", "/apisix/admin/routes/1", &viewer, ISSUE_ROUTE).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["description"], "invalid method for role viewer");
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/routes/1", "").await.status,
        404,
        "viewer wrote nothing"
    );
}

#[tokio::test]
async fn validation_references_and_checker_change_nothing() {
    let gw = start("validate").await;
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1",
        r#"{"uri": 5, "plugins": {}}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error_msg"],
        "invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1",
        r#"{"uri": "/a", "upstream_id": "u9"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error_msg"],
        "failed to fetch upstream info by upstream id [u9], response code: 404"
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1",
        r#"{"uri": "/refused", "plugins": {}}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error_msg"].as_str()),
        (400, Some("data plane refuses /refused"))
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1",
        r#"{"uri": "/a", "plugins": {"nope": {}}}"#,
    )
    .await;
    assert_eq!(r.body["error_msg"], "unknown plugin [nope]");
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1",
        r#"{"uri": "/a", "plugins": {"limit-count": {}}}"#,
    )
    .await;
    assert!(r.body["error_msg"]
        .as_str()
        .unwrap()
        .starts_with("failed to check the configuration of plugin limit-count"));
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/2",
        r#"{"id": "3", "uri": "/a", "plugins": {}}"#,
    )
    .await;
    assert_eq!(r.body["error_msg"], "wrong route id");
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/2",
        r#"{"uri": "/a", "plugins": {}, "create_time": 1}"#,
    )
    .await;
    assert_eq!(
        r.body["error_msg"],
        "the property is forbidden:  create_time"
    );
    let r = call(&gw, "PUT", "/apisix/admin/routes/2", "{bad").await;
    assert!(r.body["error_msg"]
        .as_str()
        .unwrap()
        .starts_with("invalid request body"));
    let r = call(&gw, "POST", "/apisix/admin/routes/2", ISSUE_ROUTE).await;
    assert_eq!(r.body["error_msg"], "wrong route id, do not need it");
    let r = call(&gw, "GET", "/apisix/admin/routes", "").await;
    assert_eq!(r.body["total"], 0, "no failed write changed anything");
    let r = call(&gw, "GET", "/apisix/admin/status", "").await;
    assert_eq!(r.body["revision"], 0);
}

#[tokio::test]
async fn references_block_delete_unless_forced() {
    let gw = start("refs").await;
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/upstreams/u1",
        r#"{"nodes": {"127.0.0.1:80": 1}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/services/s1",
        r#"{"upstream_id": "u1"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/r1",
        r#"{"uri": "/a", "service_id": "s1"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(&gw, "DELETE", "/apisix/admin/upstreams/u1", "").await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error_msg"],
        "can not delete this upstream, service [s1] is still using it now"
    );
    let r = call(&gw, "DELETE", "/apisix/admin/services/s1", "").await;
    assert_eq!(
        r.body["error_msg"],
        "can not delete this service directly, route [r1] is still using it now"
    );
    let r = call(&gw, "DELETE", "/apisix/admin/routes/r1", "").await;
    assert_eq!(
        (r.status, r.body.clone()),
        (200, json!({"deleted": "1", "key": "/apisix/routes/r1"}))
    );
    let r = call(&gw, "DELETE", "/apisix/admin/upstreams/u1?force=true", "").await;
    assert_eq!(r.status, 200);
    let r = call(&gw, "DELETE", "/apisix/admin/upstreams/u1", "").await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn post_patch_filters_and_pagination() {
    let gw = start("patch").await;
    let r = call(&gw, "POST", "/apisix/admin/routes", ISSUE_ROUTE).await;
    assert_eq!(r.status, 201);
    let id = r.body["value"]["id"].as_str().unwrap().to_owned();
    assert_eq!(r.body["key"], format!("/apisix/routes/{id}"));

    let path = format!("/apisix/admin/routes/{id}");
    let r = call(
        &gw,
        "PATCH",
        &path,
        r#"{"name": "n1", "labels": {"env": "prod"}, "plugins": null}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["value"]["name"], "n1");
    assert!(r.body["value"].get("plugins").is_none(), "null deletes");
    let r = call(
        &gw,
        "PATCH",
        &format!("{path}/upstream/nodes"),
        r#"{"127.0.0.2:81": 2}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(
        r.body["value"]["upstream"]["nodes"],
        json!({"127.0.0.2:81": 2})
    );
    assert_eq!(r.body["value"]["upstream"]["type"], "roundrobin");
    let r = call(&gw, "PATCH", &path, r#"{"uri": 1}"#).await;
    assert_eq!(r.status, 400, "patched result is validated");
    let r = call(
        &gw,
        "PATCH",
        "/apisix/admin/routes/none",
        r#"{"uri": "/x"}"#,
    )
    .await;
    assert_eq!(r.status, 404);

    for i in 0..14 {
        let body = format!(r#"{{"uri": "/p{i}", "name": "page-{i}", "plugins": {{}}}}"#);
        assert_eq!(
            call(&gw, "PUT", &format!("/apisix/admin/routes/p{i:02}"), &body)
                .await
                .status,
            201
        );
    }
    let r = call(&gw, "GET", "/apisix/admin/routes?name=^page-1", "").await;
    assert_eq!(r.body["total"], 5, "page-1, page-10..13");
    let r = call(&gw, "GET", "/apisix/admin/routes?label=env", "").await;
    assert_eq!(r.body["total"], 1);
    let r = call(&gw, "GET", "/apisix/admin/routes?uri=/p1", "").await;
    assert_eq!(r.body["total"], 5);
    let r = call(&gw, "GET", "/apisix/admin/routes?page=2&page_size=10", "").await;
    assert_eq!(r.body["total"], 15);
    assert_eq!(r.body["list"].as_array().unwrap().len(), 5);
    let r = call(&gw, "GET", "/apisix/admin/routes?page=1&page_size=5", "").await;
    assert_eq!(
        (r.status, r.raw.as_str()),
        (400, "page_size must be between 10 and 500")
    );
}

#[tokio::test]
async fn restart_restores_everything_and_history_rolls_back() {
    let dir = tmpdir("restart");
    let _ = std::fs::remove_dir_all(&dir);
    let gw = start_at(dir.clone()).await;
    assert_eq!(
        call(&gw, "PUT", "/apisix/admin/routes/1", ISSUE_ROUTE)
            .await
            .status,
        201
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers",
        r#"{"username": "jack", "plugins": {"key-auth": {}}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/c1",
        r#"{"plugins": {"key-auth": {}}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_eq!(r.body["key"], "/apisix/consumers/jack/credentials/c1");
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/nobody/credentials/c1",
        r#"{"plugins": {}}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error_msg"].as_str()),
        (404, Some("consumer not found"))
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/routes/1?wait=applied",
        &ISSUE_ROUTE.replace("/hello", "/v2"),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = call(&gw, "GET", "/apisix/admin/status", "").await;
    assert_eq!(
        (r.body["revision"].clone(), r.body["applied"].clone()),
        (json!(4), json!(4))
    );
    drop(gw);

    let gw = start_at(dir.clone()).await;
    let r = call(&gw, "GET", "/apisix/admin/routes/1", "").await;
    assert_eq!(
        r.body["value"]["uri"], "/v2",
        "restart restores the last write"
    );
    let r = call(&gw, "GET", "/apisix/admin/consumers", "").await;
    assert_eq!(
        r.body["total"], 1,
        "credentials are not listed as consumers"
    );
    let r = call(&gw, "GET", "/apisix/admin/consumers/jack/credentials", "").await;
    assert_eq!(r.body["total"], 1);

    let r = call(&gw, "GET", "/apisix/admin/history", "").await;
    assert_eq!(r.body["total"], 4);
    assert_eq!(
        r.body["list"][3]["changes"][0],
        json!({"key": "/apisix/routes/1", "action": "update"})
    );
    let r = call(&gw, "GET", "/apisix/admin/history/4", "").await;
    assert_eq!(r.body["changes"][0]["old"]["uri"], "/hello");
    assert_eq!(r.body["changes"][0]["new"]["uri"], "/v2");
    let r = call(&gw, "GET", "/apisix/admin/history/diff?from=1&to=4", "").await;
    assert_eq!(r.body["changes"].as_array().unwrap().len(), 3);

    let r = call(&gw, "POST", "/apisix/admin/history/1/rollback", "").await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.body["revision"], 5);
    let r = call(&gw, "GET", "/apisix/admin/routes/1", "").await;
    assert_eq!(r.body["value"]["uri"], "/hello");
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/consumers/jack", "")
            .await
            .status,
        404
    );
    let r = call(&gw, "POST", "/apisix/admin/history/99/rollback", "").await;
    assert_eq!(r.status, 404);
    drop(gw);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn plugins_and_schema_endpoints() {
    let gw = start("schema").await;
    let r = call(&gw, "GET", "/apisix/admin/plugins/list", "").await;
    assert_eq!(r.body, json!(["key-auth", "limit-count"]));
    let r = call(&gw, "GET", "/apisix/admin/plugins/limit-count", "").await;
    assert_eq!(r.body["required"], json!(["count"]));
    let r = call(&gw, "GET", "/apisix/admin/schema/plugins/nope", "").await;
    assert_eq!(r.status, 404);
    let r = call(&gw, "GET", "/apisix/admin/schema/route", "").await;
    assert_eq!(r.body["properties"]["uri"]["maxLength"], 4096);
    let r = call(
        &gw,
        "POST",
        "/apisix/admin/schema/validate/routes",
        ISSUE_ROUTE,
    )
    .await;
    assert_eq!((r.status, r.raw.as_str()), (200, ""));
    let r = call(
        &gw,
        "POST",
        "/apisix/admin/schema/validate/upstreams",
        r#"{"nodes": 1}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.body["error_msg"].as_str().unwrap().contains("nodes"));
}

#[tokio::test]
async fn remaining_resources() {
    let gw = start("remaining").await;
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumer_groups/g1",
        r#"{"plugins": {"limit-count": {"count": 1}}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers",
        r#"{"username": "jack", "group_id": "g1"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers",
        r#"{"username": "ann", "group_id": "g9"}"#,
    )
    .await;
    assert_eq!(
        r.body["error_msg"],
        "failed to fetch consumer group info by consumer group id [g9], response code: 404"
    );
    let r = call(&gw, "DELETE", "/apisix/admin/consumer_groups/g1", "").await;
    assert_eq!(
        r.body["error_msg"],
        "can not delete this consumer group, consumer [jack] is still using it now"
    );
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/secrets/vault/1",
        r#"{"uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "t"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_eq!(r.body["key"], "/apisix/secrets/vault/1");
    let r = call(&gw, "GET", "/apisix/admin/secrets", "").await;
    assert_eq!(r.body["total"], 1);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/protos/p1",
        r#"{"content": "syntax = \"proto3\";"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "PUT",
        "/apisix/admin/plugin_metadata/limit-count",
        r#"{"log_format": {}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let r = call(
        &gw,
        "POST",
        "/apisix/admin/global_rules",
        r#"{"plugins": {}}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error_msg"].as_str()),
        (405, Some("not supported `POST` method for global rule"))
    );
    let r = call(&gw, "PUT", "/apisix/admin/ssls/s1", r#"{"sni": "a.com"}"#).await;
    assert_eq!(r.status, 400);
}

/// Write cost with the embedded store (fsync per write) over a real socket, at 0 and at 5,000 existing routes.
/// Run: `cargo test -p sluice-admin --release --test it -- --ignored --nocapture measure_put`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_put() {
    let gw = start("measure").await;
    for (phase, n) in [("empty", 200), ("5k routes", 200)] {
        if phase == "5k routes" {
            for i in 0..5000 {
                let body = format!(r#"{{"uri": "/bulk/{i}", "plugins": {{}}}}"#);
                assert_eq!(
                    call(&gw, "PUT", &format!("/apisix/admin/routes/b{i}"), &body)
                        .await
                        .status,
                    201
                );
            }
        }
        let t = std::time::Instant::now();
        for i in 0..n {
            let r = call(
                &gw,
                "PUT",
                &format!("/apisix/admin/routes/m{i}"),
                ISSUE_ROUTE,
            )
            .await;
            assert!(r.status == 201 || r.status == 200);
        }
        let per = t.elapsed() / n;
        let t = std::time::Instant::now();
        for i in 0..n {
            assert_eq!(
                call(&gw, "GET", &format!("/apisix/admin/routes/m{i}"), "")
                    .await
                    .status,
                200
            );
        }
        let get = t.elapsed() / n;
        println!("{phase}: PUT {per:?}/write, GET {get:?}/read (sequential, new connection each)");
    }
}
