//! public-api through the real proxy (APISIX docs/en/latest/plugins/public-api.md, t/plugin/public-api.t):
//! prometheus's metrics API answered on a route, behind the route's key-auth, at the route's own path or at a
//! custom one; other paths and methods answer 404 and the upstream is never contacted.

use serde_json::json;

use crate::{consumer, request, route, Gw, Origin};

#[test]
fn metrics_api_behind_key_auth_and_at_a_custom_uri() {
    let o = Origin::start();
    let g = Gw::start(json!({
        "routes": [
            route("metrics", "/apisix/prometheus/metrics", &o,
                  json!({"public-api": {}, "key-auth": {}})),
            route("custom", "/my-metrics", &o,
                  json!({"public-api": {"uri": "/apisix/prometheus/metrics"}})),
            route("other", "/other", &o, json!({"public-api": {}})),
            route("traffic", "/hello", &o, json!({"prometheus": {}})),
        ],
        "consumers": [consumer("jack", json!({"key-auth": {"key": "auth-one"}}))]
    }));
    assert_eq!(g.get("/hello", &[]).status, 200);
    let seen = o.count();

    // Without a key the route's key-auth answers first.
    let r = g.get("/apisix/prometheus/metrics", &[]);
    assert_eq!(r.status, 401, "{r:?}");
    let r = g.get("/apisix/prometheus/metrics", &[("apikey", "wrong")]);
    assert_eq!(r.status, 401);

    let r = g.get("/apisix/prometheus/metrics", &[("apikey", "auth-one")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4"));
    assert!(
        r.body.contains("# TYPE apisix_http_status counter"),
        "{}",
        r.body
    );
    assert!(r.body.contains("route=\"traffic\""), "{}", r.body);

    let r = g.get("/my-metrics", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body.contains("apisix_http_status"));

    // No API at /other, and the metrics API is GET only.
    assert_eq!(g.get("/other", &[]).status, 404);
    let r = request(g.addr, "POST", "/my-metrics", &[], "x");
    assert_eq!(r.status, 404);
    assert_eq!(o.count(), seen, "public-api routes reached the upstream");
}
