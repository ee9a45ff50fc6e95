//! Secrets through the Admin API, from an attacker's seat: a gateway on 127.0.0.1 with the real plugin registry's
//! secret declarations, resources of every kind holding secrets, then every GET endpoint read with the viewer key
//! (no plain secret, no private key, no ciphertext in any body), the admin key's view (APISIX's: plugin secrets
//! decrypted on GET, SSL keys never returned, write answers as stored), the embedded store's file bytes and etcd's
//! raw values (encrypted, and `openssl enc` reads them), keyring rotation, data an APISIX node wrote with
//! `openssl enc`, and the confirmation a rollback to an empty state needs.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_admin::{AdminConfig, AdminKey, AdminState, Role};
use sluice_model::Resources;
use sluice_plugins::registry;
use sluice_secrets::{DataEncryption, Keyring};
use sluice_store::embedded::EmbeddedStore;
use sluice_store::kv::Store;

#[path = "common/support.rs"]
mod support;
use support::{http, Etcd, Registry};

const ADMIN: &str = "k-admin-secrets-0123456789";
const VIEWER: &str = "k-viewer-secrets-0123456789";
const K1: &str = "0123456789abcdef";
const K2: &str = "fedcba9876543210fedcba9876543210";

fn de(keys: &[&str]) -> Arc<DataEncryption> {
    Arc::new(DataEncryption::new(
        Keyring::new(keys).unwrap(),
        true,
        registry::secret_fields,
    ))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `openssl enc -aes-{128,256}-cbc -K key -iv key[..16] -base64 -A [-d]`: APISIX's cipher, from the real CLI.
fn openssl(decrypt: bool, key: &str, input: &str) -> String {
    let cipher = if key.len() == 32 {
        "-aes-256-cbc"
    } else {
        "-aes-128-cbc"
    };
    let mut cmd = Command::new("openssl");
    cmd.args(["enc", cipher, "-K", &hex(key.as_bytes())]).args([
        "-iv",
        &hex(&key.as_bytes()[..16]),
        "-base64",
        "-A",
    ]);
    if decrypt {
        cmd.arg("-d");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl CLI");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl enc failed on {input:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A throwaway EC key and self-signed certificate from the openssl CLI.
fn cert_and_key(dir: &std::path::Path) -> (String, String) {
    let (k, c) = (dir.join("k.pem"), dir.join("c.pem"));
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=a.test",
        ])
        .args(["-days", "2", "-keyout"])
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .stderr(Stdio::null())
        .status()
        .expect("openssl req");
    assert!(ok.success());
    (
        std::fs::read_to_string(c).unwrap(),
        std::fs::read_to_string(k).unwrap(),
    )
}

struct Gw {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
    store: Arc<dyn Store>,
    /// What the data plane's dry run last received.
    checked: Arc<Mutex<Resources>>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(store: Arc<dyn Store>) -> Gw {
    let (_tx, applied) = tokio::sync::watch::channel(0u64);
    let checked = Arc::new(Mutex::new(Resources::default()));
    let seen = checked.clone();
    let config = AdminConfig {
        keys: vec![
            AdminKey {
                name: "admin".into(),
                key: ADMIN.into(),
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
    let state = AdminState::new(
        config,
        store.clone(),
        Arc::new(move |r: &Resources| {
            *seen.lock().unwrap() = r.clone();
            Ok(0)
        }),
        Arc::new(Registry),
        applied,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    Gw {
        addr,
        task: tokio::spawn(sluice_admin::serve(listener, state)),
        store,
        checked,
    }
}

async fn open_embedded(path: &std::path::Path, keys: &[&str]) -> Arc<dyn Store> {
    // A restarted gateway may find the previous one's aborted tasks still releasing the file lock.
    for _ in 0..200 {
        if let Ok(s) = EmbeddedStore::open_with(path, de(keys)) {
            return Arc::new(s);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("cannot reopen {}", path.display());
}

impl Gw {
    async fn call(&self, key: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let sep = if path.contains('?') { '&' } else { '?' };
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        http(
            self.addr,
            method,
            &format!("/apisix/admin{path}{sep}api_key={key}"),
            &body,
        )
        .await
    }
    async fn admin(&self, method: &str, path: &str, body: Value) -> Value {
        let (st, v) = self.call(ADMIN, method, path, &body).await;
        assert!((200..300).contains(&st), "{method} {path} -> {st} {v}");
        v
    }
    fn dataplane(&self) -> Resources {
        self.store.subscribe().borrow().resources.clone()
    }
}

fn key_of(r: &Resources, user: &str) -> Option<String> {
    r.consumers
        .iter()
        .find(|c| c.username == user)
        .and_then(|c| c.plugins.get("key-auth"))
        .and_then(|p| p["key"].as_str())
        .map(str::to_owned)
}

/// Every secret the fixture stores.
const SECRETS: &[&str] = &[
    "S-route-redis-pw",
    "S-route-auth-header",
    "S-svc-redis-pw",
    "S-jack-key",
    "S-jack-key-2",
    "S-jack-jwt-secret",
    "S-jack-basic-pw",
    "S-ann-hmac",
    "S-global-auth",
    "S-pc-redis-pw",
    "S-cg-redis-pw",
    "S-vault-token",
];

/// Resources of every kind, each holding secrets; then an update, a PATCH and a delete, so the history holds old
/// values with secrets too.
async fn fixture(gw: &Gw, cert: &str, key: &str) {
    let redis = |pw: &str| {
        json!({"count": 5, "time_window": 60, "policy": "redis", "redis_host": "127.0.0.1",
               "redis_password": pw})
    };
    let tls = json!({"client_cert": cert, "client_key": key});
    let nodes = json!({"127.0.0.1:1980": 1});
    gw.admin(
        "PUT",
        "/ssls/1",
        json!({"cert": cert, "key": key, "snis": ["a.test"]}),
    )
    .await;
    gw.admin(
        "PUT",
        "/upstreams/1",
        json!({"nodes": nodes, "scheme": "https", "tls": tls}),
    )
    .await;
    gw.admin("PUT", "/routes/1", json!({
        "uri": "/r", "upstream": {"nodes": nodes, "scheme": "https", "tls": tls},
        "plugins": {"limit-count": redis("S-route-redis-pw"),
                    "http-logger": {"uri": "http://127.0.0.1:1/log", "auth_header": "S-route-auth-header"}}
    }))
    .await;
    gw.admin(
        "PUT",
        "/services/1",
        json!({"plugins": {"limit-req": {
        "rate": 1, "burst": 1, "key": "remote_addr", "policy": "redis", "redis_host": "127.0.0.1",
        "redis_password": "S-svc-redis-pw"}}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/consumers/jack",
        json!({"username": "jack", "plugins": {
        "key-auth": {"key": "S-jack-key"},
        "jwt-auth": {"key": "jack-jwt", "secret": "S-jack-jwt-secret"}}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/consumers/jack/credentials/c1",
        json!({"plugins": {"basic-auth": {"username": "jack", "password": "S-jack-basic-pw"}}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/consumers/ann",
        json!({"username": "ann", "plugins": {
        "hmac-auth": {"key_id": "ann", "secret_key": "S-ann-hmac"}}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/global_rules/1",
        json!({"plugins": {
        "http-logger": {"uri": "http://127.0.0.1:1/", "auth_header": "S-global-auth"}}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/plugin_configs/1",
        json!({"plugins": {"limit-count": redis("S-pc-redis-pw")}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/consumer_groups/1",
        json!({"plugins": {"limit-count": redis("S-cg-redis-pw")}}),
    )
    .await;
    gw.admin(
        "PUT",
        "/secrets/vault/1",
        json!({"uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "S-vault-token"}),
    )
    .await;
    gw.admin(
        "PUT",
        "/plugin_metadata/http-logger",
        json!({"log_format": {"host": "$host"}}),
    )
    .await;
    // History with secrets on both sides: a key rotated, a PATCH that keeps the stored secrets, a delete.
    gw.admin(
        "PUT",
        "/consumers/jack",
        json!({"username": "jack", "plugins": {
        "key-auth": {"key": "S-jack-key-2"},
        "jwt-auth": {"key": "jack-jwt", "secret": "S-jack-jwt-secret"}}}),
    )
    .await;
    gw.admin(
        "PATCH",
        "/routes/1",
        json!({"plugins": {"limit-count": {"count": 7}}}),
    )
    .await;
    gw.admin("PATCH", "/ssls/1", json!({"snis": ["a.test", "b.test"]}))
        .await;
    gw.admin("DELETE", "/consumers/ann", Value::Null).await;
}

/// Every GET URL the Admin API serves for the fixture, history and diff included.
async fn every_get(gw: &Gw) -> Vec<String> {
    let mut urls: Vec<String> = [
        "/routes",
        "/routes/1",
        "/services",
        "/services/1",
        "/upstreams",
        "/upstreams/1",
        "/consumers",
        "/consumers/jack",
        "/consumers/jack/credentials",
        "/consumers/jack/credentials/c1",
        "/ssls",
        "/ssls/1",
        "/global_rules",
        "/global_rules/1",
        "/plugin_configs",
        "/plugin_configs/1",
        "/consumer_groups",
        "/consumer_groups/1",
        "/plugin_metadata/http-logger",
        "/protos",
        "/secrets",
        "/secrets/vault/1",
        "/status",
        "/plugins/list",
        "/plugins/key-auth",
        "/schema/ssl",
        "/history",
        "/history?after=0&limit=1000",
        "/history/diff",
        "/history/diff?from=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if gw.store.backend() != "embedded" {
        // etcd keeps no history of Sluice's (it compacts its own): those URLs answer 501 there.
        urls.retain(|u| !u.starts_with("/history"));
        return urls;
    }
    let rev = gw.store.snapshot().revision;
    for r in 1..=rev {
        urls.push(format!("/history/{r}"));
        urls.push(format!("/history/diff?from={}&to={r}", r - 1));
        urls.push(format!("/history/diff?from={r}"));
    }
    urls
}

/// The strings a viewer must never see: plain secrets, private key material, and their stored ciphertexts.
fn forbidden(key_pem: &str, ring: &Keyring) -> Vec<String> {
    let mut out: Vec<String> = SECRETS.iter().map(|s| s.to_string()).collect();
    out.extend(SECRETS.iter().filter_map(|s| ring.encrypt(s)));
    out.push("PRIVATE KEY".into());
    // The key's base64 body lines, and the whole stored (encrypted) key.
    out.extend(
        key_pem
            .lines()
            .filter(|l| !l.starts_with("---") && l.len() > 16)
            .map(str::to_owned),
    );
    out.extend(ring.encrypt(key_pem));
    out
}

async fn viewer_sees_no_secret(gw: &Gw, key_pem: &str, ring: &Keyring) {
    let bad = forbidden(key_pem, ring);
    let urls = every_get(gw).await;
    assert!(urls.len() > 25, "{} urls", urls.len());
    let history = gw.store.backend() == "embedded";
    for url in &urls {
        let (st, body) = gw.call(VIEWER, "GET", url, &Value::Null).await;
        assert_eq!(st, 200, "viewer GET {url}: {body}");
        let text = body.to_string();
        for s in &bad {
            assert!(
                !text.contains(s.as_str()),
                "viewer GET {url} shows {s:?}: {text}"
            );
        }
    }
    // Redacted, not dropped: the viewer sees that a secret is there.
    let (_, jack) = gw
        .call(VIEWER, "GET", "/consumers/jack", &Value::Null)
        .await;
    assert_eq!(
        jack["value"]["plugins"]["key-auth"]["key"],
        sluice_secrets::REDACTED
    );
    if history {
        let (_, h) = gw
            .call(VIEWER, "GET", "/history/diff?from=0", &Value::Null)
            .await;
        assert!(h.to_string().contains(sluice_secrets::REDACTED), "{h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_viewer_admin_disk_rotation_and_rollback() {
    let dir = std::env::temp_dir().join(format!("sluice-admin-secrets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = cert_and_key(&dir);
    let db = dir.join("db.redb");
    let ring = Keyring::new(&[K1]).unwrap();

    let gw = serve(open_embedded(&db, &[K1]).await).await;
    fixture(&gw, &cert, &key).await;
    viewer_sees_no_secret(&gw, &key, &ring).await;

    // The admin key sees what APISIX shows: plugin secrets decrypted on GET, SSL keys never, an upstream's client
    // key as stored (encrypted), and write answers as stored.
    let (_, jack) = gw.call(ADMIN, "GET", "/consumers/jack", &Value::Null).await;
    assert_eq!(jack["value"]["plugins"]["key-auth"]["key"], "S-jack-key-2");
    assert_eq!(
        jack["value"]["plugins"]["jwt-auth"]["secret"],
        "S-jack-jwt-secret"
    );
    let (_, ssl) = gw.call(ADMIN, "GET", "/ssls/1", &Value::Null).await;
    assert!(
        ssl["value"].get("key").is_none() && ssl["value"]["cert"] == cert,
        "{ssl}"
    );
    let (_, up) = gw.call(ADMIN, "GET", "/upstreams/1", &Value::Null).await;
    let stored_key = up["value"]["tls"]["client_key"].as_str().unwrap();
    assert_ne!(stored_key, key);
    assert_eq!(
        openssl(true, K1, stored_key),
        key,
        "openssl reads what Sluice wrote"
    );
    let put = gw
        .admin(
            "PUT",
            "/consumers/bob",
            json!({"username": "bob", "plugins": {"key-auth": {"key": "S-bob-key"}}}),
        )
        .await;
    let answered = put["value"]["plugins"]["key-auth"]["key"].as_str().unwrap();
    assert_eq!(
        answered,
        openssl(false, K1, "S-bob-key"),
        "APISIX answers a PUT with the stored value"
    );

    // The data plane (the store's view and the dry run) sees plain values; a PATCH did not encrypt twice.
    for r in [gw.dataplane(), gw.checked.lock().unwrap().clone()] {
        assert_eq!(key_of(&r, "jack").as_deref(), Some("S-jack-key-2"));
        assert_eq!(key_of(&r, "bob").as_deref(), Some("S-bob-key"));
    }
    let dp = gw.dataplane();
    let route = &dp.routes[0];
    assert_eq!(
        route.plugins["limit-count"]["redis_password"],
        "S-route-redis-pw"
    );
    assert_eq!(route.plugins["limit-count"]["count"], 7);
    assert_eq!(dp.ssls[0].key, key);
    assert_eq!(
        dp.credentials[0].plugins["basic-auth"]["password"],
        "S-jack-basic-pw"
    );

    // On disk (values and history alike): ciphertext only.
    let bytes = std::fs::read(&db).unwrap();
    let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    for s in SECRETS.iter().copied().chain(["S-bob-key", "PRIVATE KEY"]) {
        assert!(!has(s), "{s:?} in clear in {}", db.display());
    }
    assert!(
        has(&openssl(false, K1, "S-jack-key")),
        "the history keeps the old key, encrypted"
    );

    // Rotation: the new key first, the old one second. Old data still reads; new writes use the new key.
    drop(gw);
    let gw = serve(open_embedded(&db, &[K2, K1]).await).await;
    assert_eq!(
        key_of(&gw.dataplane(), "jack").as_deref(),
        Some("S-jack-key-2")
    );
    let put = gw
        .admin(
            "PUT",
            "/consumers/carl",
            json!({"username": "carl", "plugins": {"key-auth": {"key": "S-carl-key"}}}),
        )
        .await;
    let stored = put["value"]["plugins"]["key-auth"]["key"].as_str().unwrap();
    assert_eq!(openssl(true, K2, stored), "S-carl-key");
    viewer_sees_no_secret(&gw, &key, &ring).await;
    // Without the old key, what it encrypted no longer decrypts and is used as it is (APISIX's behaviour).
    drop(gw);
    let gw = serve(open_embedded(&db, &[K2]).await).await;
    let dp = gw.dataplane();
    assert_eq!(key_of(&dp, "carl").as_deref(), Some("S-carl-key"));
    assert_eq!(
        key_of(&dp, "jack"),
        Some(openssl(false, K1, "S-jack-key-2"))
    );

    // Rollback to a state without resources wipes everything: refused without the confirmation.
    let before = gw.store.snapshot();
    let (st, v) = gw
        .call(ADMIN, "POST", "/history/0/rollback", &Value::Null)
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error_msg"].as_str().unwrap().contains("?confirm=empty"),
        "{v}"
    );
    assert_eq!(
        gw.store.snapshot(),
        before,
        "a refused rollback changes nothing"
    );
    let (st, v) = gw
        .call(
            ADMIN,
            "POST",
            "/history/0/rollback?confirm=yes",
            &Value::Null,
        )
        .await;
    assert_eq!(st, 400, "{v}");
    // A rollback to a state that keeps resources needs no confirmation.
    let (st, v) = gw
        .call(ADMIN, "POST", "/history/3/rollback", &Value::Null)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(gw.store.snapshot().entries.len(), 3, "ssl, upstream, route");
    let (st, v) = gw
        .call(
            ADMIN,
            "POST",
            "/history/0/rollback?confirm=empty",
            &Value::Null,
        )
        .await;
    assert_eq!((st, v["changes"].clone()), (200, json!(3)), "{v}");
    assert!(gw.store.snapshot().entries.is_empty());
    assert_eq!(gw.dataplane(), Resources::default());
    // Nothing left to delete: an empty state rolls back to an empty state without ceremony.
    let (st, v) = gw
        .call(ADMIN, "POST", "/history/0/rollback", &Value::Null)
        .await;
    assert_eq!((st, v["changes"].clone()), (200, json!(0)), "{v}");
    drop(gw);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_holds_ciphertext_and_apisix_written_values_read_the_same() {
    let Some(etcd) = Etcd::start("secrets") else {
        return;
    };
    let dir =
        std::env::temp_dir().join(format!("sluice-admin-secrets-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = cert_and_key(&dir);
    let store = etcd.store().await;
    drop(store);
    let cfg = sluice_store::etcd::EtcdConfig {
        endpoints: vec![etcd.url.clone()],
        prefix: "/apisix".into(),
        timeout: Duration::from_secs(2),
        last_known_good: None,
        auth: None,
        tls: Default::default(),
    };
    let store = sluice_store::etcd::EtcdStore::connect_with(cfg, de(&[K1]))
        .await
        .expect("etcd store");
    let gw = serve(Arc::new(store)).await;
    fixture(&gw, &cert, &key).await;
    viewer_sees_no_secret(&gw, &key, &Keyring::new(&[K1]).unwrap()).await;

    // etcd itself holds ciphertext that openssl reads.
    let mut client = etcd_client::Client::connect([etcd.url.as_str()], None)
        .await
        .unwrap();
    let raw = |v: &[u8]| serde_json::from_slice::<Value>(v).unwrap();
    let jack = client.get("/apisix/consumers/jack", None).await.unwrap();
    let jack = raw(jack.kvs()[0].value());
    let stored = jack["plugins"]["key-auth"]["key"].as_str().unwrap();
    assert_eq!(openssl(true, K1, stored), "S-jack-key-2");
    let ssl = client.get("/apisix/ssls/1", None).await.unwrap();
    let ssl = raw(ssl.kvs()[0].value());
    assert_eq!(openssl(true, K1, ssl["key"].as_str().unwrap()), key);
    let all = client
        .get(
            "/apisix/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    for kv in all.kvs() {
        let text = String::from_utf8_lossy(kv.value());
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        for s in SECRETS {
            assert!(!text.contains(s), "{s} in clear in etcd: {text}");
        }
    }

    // A value an APISIX node wrote, encrypted with `openssl enc` as APISIX does: the data plane reads it plain,
    // the admin's GET shows it decrypted, the viewer's redacted.
    let apisix_written = json!({"username": "apx", "plugins": {"key-auth": {"key": openssl(false, K1, "S-apx-key")}}});
    client
        .put("/apisix/consumers/apx", apisix_written.to_string(), None)
        .await
        .unwrap();
    let mut ok = false;
    for _ in 0..200 {
        if key_of(&gw.dataplane(), "apx").as_deref() == Some("S-apx-key") {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        ok,
        "the watch delivered the APISIX-written consumer, decrypted"
    );
    let (_, v) = gw.call(ADMIN, "GET", "/consumers/apx", &Value::Null).await;
    assert_eq!(v["value"]["plugins"]["key-auth"]["key"], "S-apx-key");
    let (_, v) = gw.call(VIEWER, "GET", "/consumers/apx", &Value::Null).await;
    assert_eq!(
        v["value"]["plugins"]["key-auth"]["key"],
        sluice_secrets::REDACTED
    );
    assert!(!v.to_string().contains("S-apx-key"));
    drop(gw);
    std::fs::remove_dir_all(&dir).ok();
}
