//! The dashboard's files at `/ui/` on the admin listener, over a real socket: the page (the built UI, or the
//! placeholder when `ui/dist` was absent at build time), its headers (CSP, cache, ETag, precompressed variants),
//! the `enable_admin_ui` switch, `allow_admin`, and path spellings an attacker would try to reach the Admin API or
//! another file through `/ui/`.

use std::sync::Arc;

use sluice_admin::{AdminConfig, AdminKey, AdminState, Role};
use sluice_model::Resources;
use sluice_store::embedded::EmbeddedStore;
use sluice_store::kv::Store;

#[path = "common/support.rs"]
mod support;
use support::{raw, Answer, Registry};

const KEY: &str = "k-admin-ui-0123456789";
/// Stored in a route's description: no answer through `/ui/` may ever carry it.
const MARKER: &str = "route-data-must-not-leak-7f3a";

struct Gw {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
    dir: std::path::PathBuf,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn gateway(name: &str, tweak: impl FnOnce(&mut AdminConfig)) -> Gw {
    let dir = std::env::temp_dir().join(format!("sluice-admin-ui-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&dir.join("db.redb")).unwrap());
    let (_tx, applied) = tokio::sync::watch::channel(0u64);
    let mut config = AdminConfig {
        keys: vec![AdminKey {
            name: "admin".into(),
            key: KEY.into(),
            role: Role::Admin,
        }],
        ..AdminConfig::default()
    };
    tweak(&mut config);
    let state = AdminState::new(
        config,
        store,
        Arc::new(|_: &Resources| Ok(0)),
        Arc::new(Registry),
        applied,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    Gw {
        addr,
        task: tokio::spawn(sluice_admin::serve(listener, state)),
        dir,
    }
}

async fn get(gw: &Gw, path: &str, extra: &str) -> Answer {
    raw(gw.addr, "GET", path, extra, "").await
}

/// The body bytes of a GET (the text client above is lossy for binary bodies).
async fn raw_bytes(addr: std::net::SocketAddr, path: &str, extra: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(15), s.read_to_end(&mut out))
        .await
        .expect("answered within 15 s")
        .unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    out.split_off(at)
}

fn assert_security_headers(a: &Answer, what: &str) {
    assert_eq!(
        a.header("content-security-policy"),
        Some(sluice_admin::UI_CSP),
        "{what}: {}",
        a.head
    );
    assert_eq!(
        a.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(a.header("x-frame-options"), Some("DENY"), "{what}");
}

#[tokio::test]
async fn index_placeholder_or_app_is_served_without_a_key_with_strict_headers() {
    let gw = gateway("index", |_| {}).await;
    let a = get(&gw, "/ui/", "").await;
    assert_eq!(a.status, 200, "{}", a.head);
    assert!(a.header("content-type").unwrap().starts_with("text/html"));
    assert_eq!(a.header("cache-control"), Some("no-cache"));
    assert_security_headers(&a, "index");
    let csp = a.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    if sluice_admin::UI_BUILT {
        assert!(a.raw_body.contains("<div id=\"root\">"), "{}", a.raw_body);
        assert!(a.raw_body.contains("/ui/assets/"), "{}", a.raw_body);
        // No inline script: every script tag loads a file (the CSP would block inline code anyway).
        for tag in a.raw_body.split("<script").skip(1) {
            let open = tag.split('>').next().unwrap();
            assert!(
                open.contains("src="),
                "inline script in index.html: <script{open}>"
            );
        }
    } else {
        assert!(a.raw_body.contains("make ui"), "{}", a.raw_body);
    }
    // The Admin API next to it still wants its key.
    assert_eq!(get(&gw, "/apisix/admin/routes", "").await.status, 401);

    // ETag revalidation.
    let etag = a.header("etag").expect("etag").to_owned();
    let b = get(&gw, "/ui/", &format!("If-None-Match: {etag}\r\n")).await;
    assert_eq!(b.status, 304, "{}", b.head);
    assert!(b.raw_body.is_empty());
    let c = get(&gw, "/ui/", "If-None-Match: \"other\"\r\n").await;
    assert_eq!(c.status, 200);

    // HEAD: the same headers, no body.
    let h = raw(gw.addr, "HEAD", "/ui/", "", "").await;
    assert_eq!(h.status, 200);
    assert!(h.raw_body.is_empty());
    assert_eq!(h.header("etag"), Some(etag.as_str()));
}

#[tokio::test]
async fn redirect_deep_links_missing_files_and_methods() {
    let gw = gateway("paths", |_| {}).await;
    let r = get(&gw, "/ui", "").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/ui/"));
    let r = get(&gw, "/ui?x=1", "").await;
    assert_eq!(r.status, 301, "a query does not change /ui's redirect");

    // A deep link into the app gets index.html (the app routes it).
    let index = get(&gw, "/ui/", "").await;
    for deep in [
        "/ui/routes",
        "/ui/routes/1",
        "/ui/routes/api.v2",
        "/ui/secrets/vault/1",
        "/ui/history/",
        "/ui/traffic?x=1",
    ] {
        let a = get(&gw, deep, "").await;
        assert_eq!(a.status, 200, "{deep}");
        assert_eq!(a.raw_body, index.raw_body, "{deep}");
        assert_security_headers(&a, deep);
    }
    // A missing file is a 404, never HTML in place of a script.
    for missing in [
        "/ui/assets/nope-123.js",
        "/ui/assets/nope",
        "/ui/x.css",
        "/ui/routes/1.json",
        "/ui/index.html.gz",
    ] {
        let a = get(&gw, missing, "").await;
        assert_eq!(a.status, 404, "{missing}");
        assert!(!a.raw_body.contains("<html"), "{missing}");
    }
    for m in ["POST", "PUT", "DELETE", "PATCH"] {
        let a = raw(gw.addr, m, "/ui/", &format!("X-API-KEY: {KEY}\r\n"), "{}").await;
        assert_eq!(a.status, 405, "{m}");
        assert_eq!(a.header("allow"), Some("GET, HEAD"));
    }
    // Paths that merely start with "ui" are not the dashboard.
    assert_eq!(get(&gw, "/uix/", "").await.status, 404);
    assert_eq!(get(&gw, "/ui.html", "").await.status, 404);
}

#[tokio::test]
async fn hashed_assets_are_immutable_and_served_precompressed() {
    let gw = gateway("assets", |_| {}).await;
    let index = get(&gw, "/ui/", "").await;
    if !sluice_admin::UI_BUILT {
        // The placeholder has no assets; `make test` builds the UI first, so this branch is the plain
        // `cargo test` without node.
        support::skip_unless_ci("ui/dist was not built (make ui): no assets to check");
        return;
    }
    let assets: Vec<&str> = index
        .raw_body
        .split('"')
        .filter(|s| s.starts_with("/ui/assets/"))
        .collect();
    assert!(
        assets.iter().any(|a| a.ends_with(".js")),
        "{}",
        index.raw_body
    );
    for path in assets {
        let plain = get(&gw, path, "").await;
        assert_eq!(plain.status, 200, "{path}");
        assert_eq!(
            plain.header("cache-control"),
            Some("public, max-age=31536000, immutable"),
            "{path}"
        );
        assert_eq!(plain.header("content-encoding"), None, "{path}");
        assert_security_headers(&plain, path);
        let ctype = plain.header("content-type").unwrap();
        if path.ends_with(".js") {
            assert!(ctype.contains("javascript"), "{path}: {ctype}");
        } else if path.ends_with(".css") {
            assert!(ctype.starts_with("text/css"), "{path}: {ctype}");
        }
        let plain_len: usize = plain.header("content-length").unwrap().parse().unwrap();
        // The gzip form decodes to exactly the plain file.
        let gz = raw_bytes(gw.addr, path, "Accept-Encoding: gzip\r\n").await;
        let plain_bytes = raw_bytes(gw.addr, path, "").await;
        let mut decoded = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut decoded)
            .expect("valid gzip");
        assert_eq!(decoded, plain_bytes, "{path}");
        for (accept, enc) in [("br, gzip", "br"), ("gzip", "gzip"), ("gzip;q=0, br", "br")] {
            let c = get(&gw, path, &format!("Accept-Encoding: {accept}\r\n")).await;
            assert_eq!(c.status, 200);
            assert_eq!(c.header("content-encoding"), Some(enc), "{path} {accept}");
            assert_eq!(c.header("vary"), Some("Accept-Encoding"));
            assert_ne!(
                c.header("etag"),
                plain.header("etag"),
                "each encoding has its own ETag"
            );
            let len: usize = c.header("content-length").unwrap().parse().unwrap();
            if plain_len > 2048 {
                assert!(len < plain_len, "{path} {enc}: {len} >= {plain_len}");
            }
        }
        let none = get(&gw, path, "Accept-Encoding: identity\r\n").await;
        assert_eq!(none.header("content-encoding"), None);
    }
}

#[tokio::test]
async fn switch_off_means_404_and_allow_admin_still_applies() {
    let off = gateway("off", |c| c.ui = false).await;
    for p in ["/ui/", "/ui", "/ui/index.html", "/ui/routes/1"] {
        let a = get(&off, p, "").await;
        assert_eq!(a.status, 404, "{p}");
        assert!(!a.raw_body.contains("<html"), "{p}");
    }
    // The Admin API itself is unaffected.
    let a = get(
        &off,
        "/apisix/admin/routes",
        &format!("X-API-KEY: {KEY}\r\n"),
    )
    .await;
    assert_eq!(a.status, 200);

    let fenced = gateway("fenced", |c| c.allow = vec!["10.0.0.0/8".parse().unwrap()]).await;
    assert_eq!(get(&fenced, "/ui/", "").await.status, 403);
}

#[tokio::test]
async fn traversal_spellings_never_reach_the_admin_api_or_leak_anything() {
    let gw = gateway("traversal", |_| {}).await;
    let key = format!("X-API-KEY: {KEY}\r\n");
    let put = raw(
        gw.addr,
        "PUT",
        "/apisix/admin/routes/1",
        &key,
        &format!(
            r#"{{"uri":"/x","desc":"{MARKER}","upstream":{{"type":"roundrobin","nodes":{{"127.0.0.1:1":1}}}}}}"#
        ),
    )
    .await;
    assert_eq!(put.status, 201, "{}", put.raw_body);
    let attacks = [
        "/ui/../apisix/admin/routes",
        "/ui/../apisix/admin/routes/1",
        "/ui/./../apisix/admin/routes",
        "/ui/assets/../../apisix/admin/routes",
        "/ui/%2e%2e/apisix/admin/routes",
        "/ui/%2E%2E/apisix/admin/routes",
        "/ui/.%2e/apisix/admin/routes",
        "/ui/..%2fapisix%2fadmin%2froutes",
        "/ui/%2e%2e%2fapisix%2fadmin%2froutes%2f1",
        "/ui/..%5capisix%5cadmin%5croutes",
        "/ui/..\\apisix\\admin\\routes",
        "/ui//apisix/admin/routes",
        "/ui/%252e%252e/apisix/admin/routes",
        "/ui/..;/apisix/admin/routes",
        "/ui/index.html/../../apisix/admin/routes",
        "/ui/%00../apisix/admin/routes",
        "/ui/../Cargo.toml",
        "/ui/../../../../etc/passwd",
        "/ui/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/ui/../build.rs",
        "/ui/../src/ui.rs",
    ];
    for path in attacks {
        for extra in ["", key.as_str()] {
            let a = get(&gw, path, extra).await;
            assert!(
                !a.raw_body.contains(MARKER),
                "{path}: leaked route data: {}",
                a.raw_body
            );
            assert!(!a.raw_body.contains("root:"), "{path}: {}", a.raw_body);
            assert!(!a.raw_body.contains("[package]"), "{path}");
            assert!(!a.raw_body.contains("fn main"), "{path}");
            assert!(
                a.status == 404 || a.status == 400,
                "{path} ({extra:?}): {} {}",
                a.status,
                a.raw_body
            );
            assert!(a.body.get("list").is_none() && a.body.get("value").is_none());
        }
    }
    // The other way round: an Admin API path that walks into /ui/ is still an Admin API path and needs the key.
    for path in ["/apisix/admin/../../ui/", "/apisix/admin/%2e%2e/%2e%2e/ui/"] {
        let a = get(&gw, path, "").await;
        assert_eq!(a.status, 401, "{path}: {}", a.raw_body);
    }
    // And the route is still there, readable with the key only.
    let a = get(&gw, "/apisix/admin/routes/1", &key).await;
    assert!(a.raw_body.contains(MARKER));
}
