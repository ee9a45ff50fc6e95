//! The Admin API through the real binary (issue 4's seed call): `PUT /apisix/admin/routes/1` exactly as the
//! benchmark reports send it, applied live to the data plane, kept across a restart of the embedded store; and the
//! first-start import of apisix.yaml into an empty store.

use std::time::Duration;

use crate::support::process::{Mock, Sluice};
use crate::support::{t, Client};

const KEY: &str = "it-admin-key-0123456789";

async fn get_until(addr: std::net::SocketAddr, path: &str, want: u16) -> u16 {
    let mut last = 0;
    for _ in 0..100 {
        let mut c = Client::connect(addr).await;
        last = c.get(path).await.status;
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_route_verbatim_applies_live_and_survives_restart() {
    t(async {
        let mock = Mock::start(5).await;
        let (mut gw, admin) = Sluice::start_traditional(None, KEY, None).await;
        assert_eq!(Client::connect(gw.addr).await.get("/hello").await.status, 404);

        // The benchmark reports' call, with the mock's address in place of 127.0.0.1:80.
        let body = format!(
            r#"{{"uri": "/hello", "plugins": {{}}, "upstream": {{"type": "roundrobin", "nodes": {{"{}": 1}}}}}}"#,
            mock.addr
        );
        let mut a = Client::connect(admin).await;
        let r = a
            .request("PUT", "/apisix/admin/routes/1", &format!("X-API-KEY: {KEY}\r\n"), body.as_bytes())
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["key"], "/apisix/routes/1");
        assert_eq!(v["value"]["uri"], "/hello");

        assert_eq!(get_until(gw.addr, "/hello", 200).await, 200);
        let r = Client::connect(gw.addr).await.get("/hello").await;
        assert_eq!(r.body, vec![b'x'; 5]);

        // A wrong key changes nothing.
        let mut a = Client::connect(admin).await;
        let r = a.request("DELETE", "/apisix/admin/routes/1", "X-API-KEY: wrong\r\n", b"").await;
        assert_eq!(r.status, 401);
        assert_eq!(Client::connect(gw.addr).await.get("/hello").await.status, 200);

        // Restart on the same data directory: the route is still there.
        gw.sigterm();
        assert!(gw.wait_exit(Duration::from_secs(10)).await.success());
        let dir = std::mem::replace(&mut gw.dir, crate::support::process::TempDir::new("moved"));
        drop(gw);
        let (gw, _admin) = Sluice::start_traditional(None, KEY, Some(dir)).await;
        assert_eq!(get_until(gw.addr, "/hello", 200).await, 200);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_store_is_seeded_from_apisix_yaml_once() {
    t(async {
        let mock = Mock::start(3).await;
        let yaml = format!(
            "routes:\n  - id: 1\n    uri: /seeded\n    upstream:\n      nodes:\n        \"{}\": 1\n#END\n",
            mock.addr
        );
        let (gw, admin) = Sluice::start_traditional(Some(&yaml), KEY, None).await;
        assert_eq!(get_until(gw.addr, "/seeded", 200).await, 200);
        let mut a = Client::connect(admin).await;
        let r = a.request("GET", "/apisix/admin/routes/1", &format!("X-API-KEY: {KEY}\r\n"), b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
        // Deleting through the Admin API wins over the file: the store is the source of truth now.
        let mut a = Client::connect(admin).await;
        let r = a.request("DELETE", "/apisix/admin/routes/1", &format!("X-API-KEY: {KEY}\r\n"), b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(get_until(gw.addr, "/seeded", 404).await, 404);
    })
    .await
}

/// An Admin API call with the test key: status and JSON body.
async fn call(
    admin: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let r = Client::connect(admin)
        .await
        .request(
            method,
            path,
            &format!("X-API-KEY: {KEY}\r\n"),
            body.as_bytes(),
        )
        .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null),
    )
}

/// `DELETE ?force=true` of an upstream, service or plugin config still in use deletes it (APISIX
/// `apisix/admin/resource.lua`, t/admin/*-force-delete.t) and the configuration still applies: the routes that
/// named it answer APISIX's status per request (apisix/init.lua: upstream 502 after the plugins ran, service 404,
/// plugin config 503, both before any plugin), other routes keep working, and a later PUT heals them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_delete_leaves_routes_answering_as_apisix_until_healed() {
    t(async {
        let mock = Mock::start(5).await;
        let (gw, admin) = Sluice::start_traditional(None, KEY, None).await;
        let up = format!(
            r#"{{"type": "roundrobin", "nodes": {{"{}": 1}}}}"#,
            mock.addr
        );
        let pc = r#"{"plugins": {"response-rewrite": {"headers": {"set": {"X-Pc": "1"}}}}}"#;
        for (path, body) in [
            ("/apisix/admin/upstreams/u1", up.clone()),
            (
                "/apisix/admin/services/s1",
                format!(r#"{{"upstream": {up}}}"#),
            ),
            ("/apisix/admin/plugin_configs/p1", pc.to_owned()),
            (
                "/apisix/admin/routes/ru",
                r#"{"uri": "/u", "upstream_id": "u1",
                "plugins": {"response-rewrite": {"headers": {"set": {"X-Ran": "1"}}}}}"#
                    .to_owned(),
            ),
            (
                "/apisix/admin/routes/rs",
                r#"{"uri": "/s", "service_id": "s1"}"#.to_owned(),
            ),
            (
                "/apisix/admin/routes/rp",
                format!(r#"{{"uri": "/p", "plugin_config_id": "p1", "upstream": {up}}}"#),
            ),
            (
                "/apisix/admin/routes/ok",
                format!(r#"{{"uri": "/ok", "upstream": {up}}}"#),
            ),
        ] {
            let (st, v) = call(admin, "PUT", path, &body).await;
            assert_eq!(st, 201, "{path}: {v}");
        }
        for p in ["/u", "/s", "/p", "/ok"] {
            assert_eq!(get_until(gw.addr, p, 200).await, 200, "{p}");
        }

        // Without force (or with another value): APISIX's 400 and texts.
        for (path, msg) in [
            (
                "/apisix/admin/upstreams/u1?force=anyvalue",
                "can not delete this upstream, route [ru] is still using it now",
            ),
            (
                "/apisix/admin/services/s1",
                "can not delete this service directly, route [rs] is still using it now",
            ),
            (
                "/apisix/admin/plugin_configs/p1",
                "can not delete this plugin config, route [rp] is still using it now",
            ),
        ] {
            let (st, v) = call(admin, "DELETE", path, "").await;
            assert_eq!(
                (st, v),
                (400, serde_json::json!({"error_msg": msg})),
                "{path}"
            );
        }
        // With force: deleted, APISIX's answer.
        for (res, id) in [
            ("upstreams", "u1"),
            ("services", "s1"),
            ("plugin_configs", "p1"),
        ] {
            let (st, v) = call(
                admin,
                "DELETE",
                &format!("/apisix/admin/{res}/{id}?force=true"),
                "",
            )
            .await;
            assert_eq!(
                (st, v),
                (
                    200,
                    serde_json::json!({"deleted": "1", "key": format!("/apisix/{res}/{id}")})
                ),
                "{res}"
            );
        }
        assert_eq!(get_until(gw.addr, "/u", 502).await, 502);
        let r = Client::connect(gw.addr).await.get("/u").await;
        assert!(r.text().contains("502 Bad Gateway"), "{}", r.text());
        assert_eq!(
            r.header("x-ran"),
            Some("1"),
            "the route's plugins ran before the 502"
        );
        assert_eq!(get_until(gw.addr, "/s", 404).await, 404);
        assert!(Client::connect(gw.addr)
            .await
            .get("/s")
            .await
            .text()
            .contains("404 Not Found"));
        assert_eq!(get_until(gw.addr, "/p", 503).await, 503);
        assert!(Client::connect(gw.addr)
            .await
            .get("/p")
            .await
            .text()
            .contains("503 Service"));
        assert_eq!(get_until(gw.addr, "/ok", 200).await, 200);
        // Another write still applies while the dangling routes exist.
        let (st, v) = call(
            admin,
            "PUT",
            "/apisix/admin/routes/new",
            &format!(r#"{{"uri": "/new", "upstream": {up}}}"#),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(get_until(gw.addr, "/new", 200).await, 200);

        // PUT the missing resources back: the routes heal.
        for (path, body) in [
            ("/apisix/admin/upstreams/u1", up.clone()),
            (
                "/apisix/admin/services/s1",
                format!(r#"{{"upstream": {up}}}"#),
            ),
            ("/apisix/admin/plugin_configs/p1", pc.to_owned()),
        ] {
            let (st, v) = call(admin, "PUT", path, &body).await;
            assert_eq!(st, 201, "{path}: {v}");
        }
        for p in ["/u", "/s", "/p"] {
            assert_eq!(get_until(gw.addr, p, 200).await, 200, "{p}");
        }
        assert_eq!(
            Client::connect(gw.addr)
                .await
                .get("/p")
                .await
                .header("x-pc"),
            Some("1")
        );
        drop(gw);
    })
    .await
}
