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
