//! Every verb on every resource, against both stores (issue 4's "Done when"): the embedded redb store and a real
//! etcd (`/usr/bin/etcd` on 127.0.0.1 ephemeral ports, temp data dir; that half is skipped with a message when
//! etcd is not installed, a failure under CI=true). One table of resources drives the same sequence on each backend: PUT creates (201),
//! PUT replaces (200), GET one (v3 envelope), list (`{total, list}`), PATCH merges, sub-path PATCH, POST (generated
//! id) or APISIX's 405, DELETE (200), GET after delete (404). Nothing here checks plugin semantics.

use std::sync::Arc;

use serde_json::{json, Value};
use sluice_admin::{AdminConfig, AdminState, PluginCatalog};
use sluice_store::kv::Store;

#[path = "common/support.rs"]
mod support;
use support::{http, Etcd};

struct NoPlugins;

impl PluginCatalog for NoPlugins {
    fn names(&self) -> Vec<String> {
        vec!["key-auth".into(), "limit-count".into()]
    }
    fn schema(&self, _: &str) -> Option<Value> {
        Some(json!({"type": "object"}))
    }
    fn check(&self, _: &str, _: &Value) -> Result<(), String> {
        Ok(())
    }
    fn is_auth(&self, name: &str) -> bool {
        name == "key-auth"
    }
}

async fn serve(store: Arc<dyn Store>) -> std::net::SocketAddr {
    let (tx, applied) = tokio::sync::watch::channel(0u64);
    // The fake data plane applies whatever the store publishes.
    let mut rx = store.subscribe();
    tokio::spawn(async move {
        loop {
            let _ = tx.send(rx.borrow_and_update().revision);
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    let state = AdminState::new(
        AdminConfig {
            key_required: false,
            ..AdminConfig::default()
        },
        store,
        Arc::new(|_: &sluice_model::Resources| Ok(0)),
        Arc::new(NoPlugins),
        applied,
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(sluice_admin::serve(l, state));
    addr
}

/// One resource: its collection URL, an id, a valid body, a patch and the field the patch sets.
struct Res {
    url: &'static str,
    id: &'static str,
    body: Value,
    patch: Value,
    field: &'static str,
    post: bool,
    /// PATCH offered (APISIX answers 405 on consumers, credentials, protos and plugin_metadata).
    patch_ok: bool,
}

fn upstream() -> Value {
    json!({"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}})
}

fn table() -> Vec<Res> {
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----",
        "A".repeat(200)
    );
    let key = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----",
        "B".repeat(200)
    );
    vec![
        Res {
            url: "/apisix/admin/upstreams",
            id: "u1",
            body: upstream(),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: true,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/services",
            id: "s1",
            body: json!({"upstream": upstream()}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: true,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/routes",
            id: "r1",
            body: json!({"uri": "/v", "upstream": upstream()}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: true,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/plugin_configs",
            id: "pc1",
            body: json!({"plugins": {}}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: false,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/global_rules",
            id: "g1",
            body: json!({"plugins": {}}),
            patch: json!({"plugins": {"limit-count": {"count": 1, "time_window": 60}}}),
            field: "plugins",
            post: false,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/consumer_groups",
            id: "cg1",
            body: json!({"plugins": {}}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: false,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/consumers",
            id: "jack",
            body: json!({"username": "jack"}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: false,
            patch_ok: false,
        },
        Res {
            url: "/apisix/admin/consumers/jack/credentials",
            id: "c1",
            body: json!({"plugins": {"key-auth": {"key": "k1"}}}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: false,
            patch_ok: false,
        },
        Res {
            url: "/apisix/admin/ssls",
            id: "ssl1",
            body: json!({"cert": pem, "key": key, "snis": ["a.example"]}),
            patch: json!({"snis": ["b.example"]}),
            field: "snis",
            post: true,
            patch_ok: true,
        },
        Res {
            url: "/apisix/admin/protos",
            id: "p1",
            body: json!({"content": "syntax = \"proto3\";"}),
            patch: json!({"desc": "patched"}),
            field: "desc",
            post: true,
            patch_ok: false,
        },
        Res {
            url: "/apisix/admin/plugin_metadata",
            id: "limit-count",
            body: json!({"log_format": {"a": "$remote_addr"}}),
            patch: json!({"log_format": {"b": "$host"}}),
            field: "log_format",
            post: false,
            patch_ok: false,
        },
        Res {
            url: "/apisix/admin/secrets",
            id: "vault/1",
            body: json!({"uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "t"}),
            patch: json!({"token": "t2"}),
            field: "token",
            post: false,
            patch_ok: true,
        },
    ]
}

/// The whole sequence on one Admin API; `backend` names it in failures.
async fn every_verb(addr: std::net::SocketAddr, backend: &str) {
    let table = table();
    for r in &table {
        let one = format!("{}/{}", r.url, r.id);
        let at = |step: &str| format!("{backend} {one} {step}");
        let body = r.body.to_string();
        let (st, v) = http(addr, "PUT", &one, &body).await;
        assert_eq!(st, 201, "{}: {v}", at("PUT create"));
        let (st, v) = http(addr, "PUT", &one, &body).await;
        assert_eq!(st, 200, "{}: {v}", at("PUT replace"));

        let (st, v) = http(addr, "GET", &one, "").await;
        assert_eq!(st, 200, "{}: {v}", at("GET"));
        let key = one.replace("/apisix/admin/", "/apisix/");
        assert_eq!(v["key"], key.as_str(), "{}", at("GET key"));
        assert!(
            v["modifiedIndex"].as_u64() >= v["createdIndex"].as_u64(),
            "{}: {v}",
            at("GET")
        );
        // APISIX stamps every resource but plugin_metadata.
        let stamped = !r.url.ends_with("/plugin_metadata");
        assert_eq!(
            v["value"]["update_time"].is_i64(),
            stamped,
            "{}: {v}",
            at("GET times")
        );
        if r.url.ends_with("/ssls") {
            assert!(
                v["value"].get("key").is_none(),
                "{}: private key returned",
                at("GET")
            );
        }

        let (st, v) = http(addr, "GET", r.url, "").await;
        assert_eq!(st, 200, "{}: {v}", at("list"));
        assert!(v["total"].as_u64() >= Some(1), "{}: {v}", at("list"));
        assert!(
            v["list"]
                .as_array()
                .is_some_and(|l| l.iter().any(|e| e["key"] == key.as_str())),
            "{}: {v}",
            at("list")
        );

        if r.patch_ok {
            patch_applies(addr, r, &one, &at).await;
        } else {
            let (st, v) = http(addr, "PATCH", &one, &r.patch.to_string()).await;
            assert_eq!(st, 405, "{}: {v}", at("PATCH refused"));
            let (st, v) = http(addr, "PATCH", &format!("{one}/desc"), "\"x\"").await;
            assert_eq!(st, 405, "{}: {v}", at("PATCH sub-path refused"));
        }

        let (st, v) = http(addr, "POST", r.url, &body).await;
        if r.post {
            assert_eq!(st, 201, "{}: {v}", at("POST"));
            let gen = v["key"].as_str().expect("generated key").to_owned();
            let gen_admin = gen.replace("/apisix/", "/apisix/admin/");
            let (st, _) = http(addr, "DELETE", &gen_admin, "").await;
            assert_eq!(st, 200, "{}", at("DELETE generated"));
        } else {
            assert_eq!(st, 405, "{}: {v}", at("POST refused"));
        }
    }
    // Delete in reverse, so nothing is still referenced (credentials before their consumer, and so on).
    for r in table.iter().rev() {
        let one = format!("{}/{}", r.url, r.id);
        let (st, v) = http(addr, "DELETE", &one, "").await;
        assert_eq!(st, 200, "{backend} DELETE {one}: {v}");
        let (st, _) = http(addr, "GET", &one, "").await;
        assert_eq!(st, 404, "{backend} GET {one} after DELETE");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_on_every_resource_embedded() {
    let dir = std::env::temp_dir().join(format!("sluice-admin-verbs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = sluice_store::embedded::EmbeddedStore::open(&dir.join("db.redb")).expect("open");
    let addr = serve(Arc::new(store)).await;
    every_verb(addr, "embedded").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_on_every_resource_etcd() {
    let Some(etcd) = Etcd::start("verbs") else {
        return;
    };
    let store = etcd.store().await;
    let addr = serve(Arc::new(store)).await;
    every_verb(addr, "etcd").await;
}

/// PATCH merges into the stored value; the sub-path form replaces one field.
async fn patch_applies(
    addr: std::net::SocketAddr,
    r: &Res,
    one: &str,
    at: &dyn Fn(&str) -> String,
) {
    let (st, v) = http(addr, "PATCH", one, &r.patch.to_string()).await;
    assert_eq!(st, 200, "{}: {v}", at("PATCH"));

    let (_, v) = http(addr, "GET", one, "").await;
    let want = &r.patch[r.field];
    let got = &v["value"][r.field];
    if want.is_object() {
        // Merge-patch: the patch's members are in, the old ones stay.
        for (k, x) in want.as_object().into_iter().flatten() {
            assert_eq!(&got[k], x, "{}: {v}", at("PATCH merged"));
        }
    } else {
        assert_eq!(got, want, "{}: {v}", at("PATCH applied"));
    }
    // Sub-path form: `PATCH /{id}/{field}` replaces that field.
    let sub = format!("{one}/desc");
    let (st, v) = http(addr, "PATCH", &sub, "\"by sub-path\"").await;
    assert_eq!(st, 200, "{}: {v}", at("PATCH sub-path"));
    let (_, v) = http(addr, "GET", one, "").await;
    assert_eq!(
        v["value"]["desc"],
        "by sub-path",
        "{}: {v}",
        at("PATCH sub-path")
    );
}
