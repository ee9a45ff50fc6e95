//! APISIX Admin API answers that clients depend on, byte for byte where APISIX's own tests pin them
//! (t/admin/credentials.t, t/admin/proto.t, apisix/admin/resource.lua, apisix/init.lua `cors_admin`): a gateway
//! on 127.0.0.1 with the embedded store and the real plugin registry, a raw HTTP/1.1 client, and for the
//! conflict-free PATCH test two Admin APIs (two nodes) on one real etcd.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_admin::{AdminConfig, AdminKey, AdminState, Role};
use sluice_model::Resources;
use sluice_plugins::registry;
use sluice_store::embedded::EmbeddedStore;
use sluice_store::kv::Store;

#[path = "common/support.rs"]
mod support;
use support::{raw, Answer, Etcd, Registry};

const KEY: &str = "k-admin-compat-0123456789";

struct Gw {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
    store: Arc<dyn Store>,
    _dir: Option<std::path::PathBuf>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(d) = &self._dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

async fn serve(store: Arc<dyn Store>, dir: Option<std::path::PathBuf>) -> Gw {
    let (_tx, applied) = tokio::sync::watch::channel(0u64);
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
        store.clone(),
        Arc::new(|_: &Resources| Ok(0)),
        Arc::new(Registry),
        applied,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    Gw {
        addr,
        task: tokio::spawn(sluice_admin::serve(listener, state)),
        store,
        _dir: dir,
    }
}

async fn embedded(name: &str) -> Gw {
    let dir =
        std::env::temp_dir().join(format!("sluice-admin-compat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&dir.join("db.redb")).unwrap());
    serve(store, Some(dir)).await
}

async fn call(gw: &Gw, method: &str, path: &str, body: &str) -> Answer {
    raw(
        gw.addr,
        method,
        path,
        &format!("X-API-KEY: {KEY}\r\n"),
        body,
    )
    .await
}

fn err(a: &Answer) -> (u16, String) {
    (
        a.status,
        a.body["error_msg"]
            .as_str()
            .or(a.body["message"].as_str())
            .unwrap_or(&a.raw_body)
            .to_owned(),
    )
}

#[tokio::test]
async fn credentials_answer_as_apisix() {
    let gw = embedded("creds").await;
    let cred = r#"{"plugins":{"key-auth":{"key":"the-key"}}}"#;
    // t/admin/credentials.t TEST 1: no consumer yet.
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/a",
        cred,
    )
    .await;
    assert_eq!(err(&a), (404, "consumer not found".into()));
    assert_eq!(
        call(
            &gw,
            "PUT",
            "/apisix/admin/consumers",
            r#"{"username":"jack"}"#
        )
        .await
        .status,
        201
    );
    // The answer carries the id (APISIX's check_conf sets conf.id).
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/a",
        cred,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.raw_body);
    assert_eq!(a.body["value"]["id"], json!("a"));
    assert_eq!(a.body["key"], json!("/apisix/consumers/jack/credentials/a"));
    let g = call(&gw, "GET", "/apisix/admin/consumers/jack/credentials/a", "").await;
    assert_eq!(g.body["value"]["id"], json!("a"));
    // Only auth plugins, and at most one.
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/b",
        r#"{"plugins":{"limit-count":{"count":1,"time_window":60}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "only supports auth type plugins in consumer credential".into()
        )
    );
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/b",
        r#"{"plugins":{"key-auth":{"key":"k2"},"basic-auth":{"username":"u","password":"p"}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "invalid configuration: property \"plugins\" validation failed: expect object to have at most 1 properties".into()
        )
    );
    // PATCH and POST are not offered (credentials.lua `unsupported_methods`).
    let a = call(
        &gw,
        "PATCH",
        "/apisix/admin/consumers/jack/credentials/a",
        cred,
    )
    .await;
    assert_eq!(
        err(&a),
        (405, "not supported `PATCH` method for credential".into())
    );
    // Deleting the consumer takes its credentials; listing them is then APISIX's 404 (TEST 13).
    assert_eq!(
        call(&gw, "DELETE", "/apisix/admin/consumers/jack", "")
            .await
            .status,
        200
    );
    let a = call(&gw, "GET", "/apisix/admin/consumers/jack/credentials", "").await;
    assert_eq!(a.status, 404);
    assert_eq!(a.raw_body, r#"{"message":"Key not found"}"#);
}

#[tokio::test]
async fn duplicate_auth_keys_are_refused_with_apisix_texts() {
    let gw = embedded("dups").await;
    let put = |path: &'static str, body: &'static str| {
        let gw = &gw;
        async move { call(gw, "PUT", path, body).await }
    };
    assert_eq!(
        put("/apisix/admin/consumers", r#"{"username":"alex"}"#)
            .await
            .status,
        201
    );
    assert_eq!(
        put(
            "/apisix/admin/consumers/alex/credentials/cred-alex-a",
            r#"{"plugins":{"key-auth":{"key":"shared"}}}"#
        )
        .await
        .status,
        201
    );
    assert_eq!(
        put(
            "/apisix/admin/consumers",
            r#"{"username":"bob","plugins":{"key-auth":{"key":"bobkey"},"basic-auth":{"username":"bu","password":"p"}}}"#
        )
        .await
        .status,
        201
    );
    // t/admin/credentials.t: the exact texts, for a consumer and for a credential.
    let a = put(
        "/apisix/admin/consumers",
        r#"{"username":"carl","plugins":{"key-auth":{"key":"shared"}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "duplicate key of plugin key-auth found with credential: cred-alex-a of consumer: alex"
                .into()
        )
    );
    let a = put(
        "/apisix/admin/consumers/alex/credentials/cred-alex-b",
        r#"{"plugins":{"key-auth":{"key":"bobkey"}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "duplicate key of plugin key-auth found with consumer: bob".into()
        )
    );
    // basic-auth usernames are unique too.
    let a = put(
        "/apisix/admin/consumers",
        r#"{"username":"dan","plugins":{"basic-auth":{"username":"bu","password":"x"}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "duplicate username of plugin basic-auth found with consumer: bob".into()
        )
    );
    // A consumer does not conflict with itself or its own credentials; a credential not with itself.
    assert_eq!(
        put(
            "/apisix/admin/consumers",
            r#"{"username":"bob","plugins":{"key-auth":{"key":"bobkey"}}}"#
        )
        .await
        .status,
        200
    );
    assert_eq!(
        put(
            "/apisix/admin/consumers",
            r#"{"username":"alex","plugins":{"key-auth":{"key":"shared"}}}"#
        )
        .await
        .status,
        200
    );
    // The credential rewritten with its own key while its consumer holds the same one: APISIX's lookup keeps one
    // owner per key, so which wins depends on load order there; Sluice names the consumer.
    let a = put(
        "/apisix/admin/consumers/alex/credentials/cred-alex-a",
        r#"{"plugins":{"key-auth":{"key":"shared"}}}"#,
    )
    .await;
    assert_eq!(
        err(&a),
        (
            400,
            "duplicate key of plugin key-auth found with consumer: alex".into()
        )
    );
    assert_eq!(
        put(
            "/apisix/admin/consumers/alex/credentials/cred-alex-a",
            r#"{"plugins":{"key-auth":{"key":"own"}}}"#
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn cors_server_header_ttl_and_unsupported_patch() {
    let gw = embedded("cors").await;
    // Preflight: before authentication, APISIX's exact headers.
    let a = raw(
        gw.addr,
        "OPTIONS",
        "/apisix/admin/routes",
        "Origin: http://ui.test\r\nAccess-Control-Request-Method: PUT\r\n",
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.head);
    for (h, v) in [
        ("access-control-allow-origin", "*"),
        (
            "access-control-allow-methods",
            "POST, GET, PUT, OPTIONS, DELETE, PATCH",
        ),
        ("access-control-max-age", "3600"),
        ("access-control-allow-headers", "*"),
        ("access-control-allow-credentials", "true"),
        ("content-type", "text/plain"),
        ("content-length", "0"),
    ] {
        assert_eq!(a.header(h), Some(v), "{h}\n{}", a.head);
    }
    // Every other answer, 401 included.
    for extra in [format!("X-API-KEY: {KEY}\r\n"), String::new()] {
        let a = raw(gw.addr, "GET", "/apisix/admin/routes", &extra, "").await;
        for (h, v) in [
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            ("access-control-expose-headers", "*"),
            ("access-control-max-age", "3600"),
        ] {
            assert_eq!(a.header(h), Some(v), "{h}\n{}", a.head);
        }
        // The version ADC reads (`/APISIX\/(.*)/`), after Sluice's own product token.
        let server = a.header("server").unwrap_or_default().to_owned();
        assert_eq!(
            server,
            format!(
                "sluice/{} APISIX/{}",
                env!("CARGO_PKG_VERSION"),
                sluice_admin::APISIX_VERSION
            )
        );
        let adc = server.split_once("APISIX/").map(|(_, v)| v);
        assert_eq!(adc, Some(sluice_admin::APISIX_VERSION));
    }
    // `ttl` must be a number (apisix/admin/init.lua), checked before the resource is touched.
    let route = r#"{"uri":"/a","upstream":{"nodes":{"127.0.0.1:1":1}}}"#;
    let a = call(&gw, "PUT", "/apisix/admin/routes/1?ttl=abc", route).await;
    assert_eq!(
        err(&a),
        (400, "invalid argument ttl: should be a number".into())
    );
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/routes/1", "").await.status,
        404
    );
    assert_eq!(
        call(&gw, "PUT", "/apisix/admin/routes/1?ttl=60", route)
            .await
            .status,
        201
    );
    // PATCH is refused where APISIX refuses it.
    assert_eq!(
        call(
            &gw,
            "PUT",
            "/apisix/admin/consumers",
            r#"{"username":"jack"}"#
        )
        .await
        .status,
        201
    );
    for (path, kind) in [
        ("/apisix/admin/consumers/jack", "consumer"),
        (
            "/apisix/admin/plugin_metadata/http-logger",
            "plugin_metadata",
        ),
        ("/apisix/admin/protos/1", "proto"),
    ] {
        let a = call(&gw, "PATCH", path, r#"{"desc":"x"}"#).await;
        assert_eq!(
            err(&a),
            (405, format!("not supported `PATCH` method for {kind}")),
            "{path}"
        );
    }
    // plugin_metadata gets no timestamps (APISIX skips inject_conf_with_prev_conf for it).
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/plugin_metadata/http-logger",
        r#"{"log_format":{"host":"$host"}}"#,
    )
    .await;
    assert!(a.status < 300, "{}", a.raw_body);
    assert_eq!(
        a.body["value"],
        json!({"id": "http-logger", "log_format": {"host": "$host"}})
    );
    // Switched off, no CORS headers and OPTIONS is an ordinary (authenticated) request.
}

const HELLO: &str = r#"syntax = "proto3";
package helloworld;
service Greeter { rpc SayHello (HelloRequest) returns (HelloReply) {} }
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }"#;

#[tokio::test]
async fn protos_compile_at_write_and_refuse_delete_while_used() {
    let gw = embedded("protos").await;
    let body = |content: &str| json!({ "content": content }).to_string();
    let a = call(&gw, "PUT", "/apisix/admin/protos/1", &body(HELLO)).await;
    assert_eq!(a.status, 201, "{}", a.raw_body);
    // Not a proto, not base64 of a descriptor set: the text compiler's error, behind APISIX's prefix.
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/protos/2",
        &body("syntax = \"proto3\"; message {"),
    )
    .await;
    let (status, msg) = err(&a);
    assert_eq!(status, 400, "{msg}");
    assert!(msg.starts_with("invalid content: "), "{msg}");
    assert!(msg.len() > "invalid content: ".len() + 5, "{msg}");
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/protos/2", "").await.status,
        404,
        "a refused write stores nothing"
    );
    // Imports resolve against another proto resource by its name.
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/protos/common",
        &json!({"name": "common/money.proto",
                "content": "syntax = \"proto3\"; package common; message Money { int64 units = 1; }"})
        .to_string(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.raw_body);
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/protos/3",
        &body("syntax = \"proto3\"; import \"common/money.proto\"; package shop; message Price { common.Money m = 1; }"),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.raw_body);
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/protos/4",
        &body("syntax = \"proto3\"; import \"nowhere.proto\"; message P { X x = 1; }"),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.raw_body);
    assert!(a.raw_body.contains("nowhere.proto"), "{}", a.raw_body);
    // In use by a route's grpc-transcode: APISIX's delete_checker text; `force=true` deletes anyway. The plugin
    // is not in this build's registry yet, so the route is stored the way another node (APISIX) would store it.
    let route = json!({"id": "7", "uri": "/grpc", "upstream": {"nodes": {"127.0.0.1:1": 1}},
        "plugins": {"grpc-transcode": {"proto_id": 1, "service": "helloworld.Greeter", "method": "SayHello"}}});
    gw.store
        .commit(vec![sluice_store::kv::Op::Put {
            key: "routes/7".into(),
            value: route,
            expect_mod: None,
        }])
        .await
        .unwrap();
    let a = call(&gw, "DELETE", "/apisix/admin/protos/1", "").await;
    assert_eq!(
        err(&a),
        (
            400,
            "can not delete this proto, route [7] is still using it now".into()
        )
    );
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/protos/1", "").await.status,
        200
    );
    assert_eq!(
        call(&gw, "DELETE", "/apisix/admin/protos/1?force=true", "")
            .await
            .status,
        200
    );
    assert_eq!(
        call(&gw, "GET", "/apisix/admin/protos/1", "").await.status,
        404
    );
}

/// Two nodes on one etcd PATCH different fields of one route at once: every PATCH succeeds and every field
/// lands (a lost compare-and-swap is redone on fresh state inside the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_through_two_nodes_never_conflict() {
    let Some(etcd) = Etcd::start("compat-patch") else {
        return;
    };
    let a = serve(Arc::new(etcd.store().await), None).await;
    let b = serve(Arc::new(etcd.store().await), None).await;
    let route = r#"{"uri":"/p","upstream":{"nodes":{"127.0.0.1:1":1}}}"#;
    assert_eq!(
        call(&a, "PUT", "/apisix/admin/routes/1", route)
            .await
            .status,
        201
    );
    // Both nodes see the route before the race starts.
    for _ in 0..100 {
        if call(&b, "GET", "/apisix/admin/routes/1", "").await.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    const N: usize = 12;
    let mut tasks = Vec::new();
    for i in 0..N {
        for (node, gw) in [("a", &a), ("b", &b)] {
            let addr = gw.addr;
            let body = json!({"labels": {format!("{node}{i}"): "1"}}).to_string();
            tasks.push(tokio::spawn(async move {
                raw(
                    addr,
                    "PATCH",
                    "/apisix/admin/routes/1",
                    &format!("X-API-KEY: {KEY}\r\n"),
                    &body,
                )
                .await
            }));
        }
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        statuses.push((r.status, r.raw_body));
    }
    let bad: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(bad.is_empty(), "non-200 PATCH answers: {bad:?}");
    let mut labels = Value::Null;
    for _ in 0..100 {
        labels =
            call(&a, "GET", "/apisix/admin/routes/1", "").await.body["value"]["labels"].clone();
        if labels.as_object().is_some_and(|l| l.len() == 2 * N) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = labels.as_object().map_or(0, |l| l.len());
    assert_eq!(got, 2 * N, "every PATCH's field applied: {labels}");
}

#[tokio::test]
async fn plugin_consumer_schema_on_request() {
    let gw = embedded("schema").await;
    for path in [
        "/apisix/admin/schema/plugins/key-auth?schema_type=consumer",
        "/apisix/admin/plugins/key-auth?schema_type=consumer",
    ] {
        let a = call(&gw, "GET", path, "").await;
        assert_eq!(a.status, 200, "{path}");
        assert_eq!(
            a.body,
            json!({"type": "object", "properties": {"key": {"type": "string"}},
                   "encrypt_fields": ["key"], "required": ["key"]}),
            "{path}"
        );
    }
    // Without it, the route-side schema (it has `header`).
    let a = call(&gw, "GET", "/apisix/admin/schema/plugins/key-auth", "").await;
    assert!(a.body["properties"]["header"].is_object(), "{}", a.raw_body);
    let a = call(
        &gw,
        "GET",
        "/apisix/admin/schema/plugins/hmac-auth?schema_type=consumer",
        "",
    )
    .await;
    assert_eq!(a.body["required"], json!(["key_id", "secret_key"]));
    // A plugin without a consumer schema: APISIX's 400; an unknown plugin stays 404.
    let a = call(
        &gw,
        "GET",
        "/apisix/admin/schema/plugins/limit-count?schema_type=consumer",
        "",
    )
    .await;
    assert_eq!(err(&a), (400, "not found schema".into()));
    let a = call(
        &gw,
        "GET",
        "/apisix/admin/schema/plugins/nope?schema_type=consumer",
        "",
    )
    .await;
    assert_eq!(a.status, 404);
}

/// t/admin/credentials.t TEST 3 with APISIX's default keyring: the PUT answer shows the password as stored
/// (encrypted, byte for byte APISIX's), a GET shows it decrypted.
#[tokio::test]
async fn credential_secrets_are_encrypted_in_put_answers_and_plain_in_get() {
    let dir = std::env::temp_dir().join(format!("sluice-admin-compat-{}-enc", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let de = sluice_secrets::DataEncryption::new(
        sluice_secrets::Keyring::new(&["qeddd145sfvddff3", "edd1c9f0985e76a2"]).unwrap(),
        true,
        registry::secret_fields,
    );
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open_with(&dir.join("db.redb"), Arc::new(de)).unwrap());
    let gw = serve(store, Some(dir)).await;
    assert_eq!(
        call(
            &gw,
            "PUT",
            "/apisix/admin/consumers",
            r#"{"username":"jack"}"#
        )
        .await
        .status,
        201
    );
    let a = call(
        &gw,
        "PUT",
        "/apisix/admin/consumers/jack/credentials/credential_a",
        r#"{"desc":"basic-auth for jack","plugins":{"basic-auth":{"username":"the-new-user","password":"the-password"}}}"#,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.raw_body);
    assert_eq!(
        a.body["value"]["plugins"],
        json!({"basic-auth": {"username": "the-new-user", "password": "WvF5kpaLvIzjuk4GNIMTJg=="}})
    );
    assert_eq!(a.body["value"]["id"], json!("credential_a"));
    let g = call(
        &gw,
        "GET",
        "/apisix/admin/consumers/jack/credentials/credential_a",
        "",
    )
    .await;
    assert_eq!(
        g.body["value"]["plugins"]["basic-auth"]["password"],
        json!("the-password")
    );
}
