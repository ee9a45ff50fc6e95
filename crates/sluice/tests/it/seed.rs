//! The seed scenario through the real binary: route `uri: /hello` -> roundrobin upstream with one node returns the
//! mock's body through the gateway; then the same with 100 routes.

use std::fmt::Write;

use crate::support::process::{Mock, Sluice};
use crate::support::{t, Client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_route_returns_the_mock_body() {
    t(async {
        let mock = Mock::start(11).await;
        // The seed's apisix.yaml, with the mock's port in place of 1980.
        let yaml = format!(
            "routes:\n  -\n    uri: /hello\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n#END\n",
            mock.addr
        );
        let gw = Sluice::start(&yaml, 1).await;
        let mut c = Client::connect(gw.addr).await;
        let r = c.get("/hello").await;
        assert_eq!(r.status, 200, "{}", r.raw_head);
        assert_eq!(r.body, vec![b'x'; 11]);
        let r = c.get("/nope").await;
        assert_eq!(r.status, 404);
        assert_eq!(r.text().trim_end(), r#"{"error_msg":"404 Route Not Found"}"#);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_with_100_routes() {
    t(async {
        let mock = Mock::start(7).await;
        let mut yaml = String::from("routes:\n");
        for i in 0..100 {
            let _ = write!(
                yaml,
                "  - id: {i}\n    uri: /hello{i}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
                mock.addr
            );
        }
        yaml.push_str("#END\n");
        let gw = Sluice::start(&yaml, 2).await;
        let mut c = Client::connect(gw.addr).await;
        for i in (0..100).rev() {
            let r = c.get(&format!("/hello{i}")).await;
            assert_eq!(r.status, 200, "route {i}");
            assert_eq!(r.body, vec![b'x'; 7]);
        }
        assert_eq!(c.get("/hello100").await.status, 404);
    })
    .await
}
