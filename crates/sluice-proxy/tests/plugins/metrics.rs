//! prometheus: APISIX's metric names and labels, rendered and served over HTTP
//! (APISIX docs/en/latest/plugins/prometheus.md, t/plugin/prometheus.t).

use std::sync::Arc;

use serde_json::json;

use crate::{consumer, request, route, Gw, Origin};

#[test]
fn metrics_count_status_latency_and_bandwidth_per_route_and_consumer() {
    let o = Origin::start();
    let gw = Gw::start(json!({
        "routes": [route("r1", "/hello", &o, json!({"prometheus": {}, "key-auth": {}}))],
        "consumers": [consumer("jack", json!({"key-auth": {"key": "k1"}}))]
    }));
    for _ in 0..3 {
        assert_eq!(gw.get("/hello", &[("apikey", "k1")]).status, 200);
    }
    assert_eq!(gw.get("/hello", &[]).status, 401);
    // The log phase runs after the response is written: wait (bounded) until it has.
    let text = settled(&gw, "apisix_http_requests_total 4");
    let node = o.addr.ip().to_string();
    assert!(text.contains(&format!(
        "apisix_http_status{{code=\"200\",route=\"r1\",matched_uri=\"/hello\",matched_host=\"\",service=\"\",consumer=\"jack\",node=\"{node}\"}} 3"
    )), "{text}");
    assert!(text.contains(
        "apisix_http_status{code=\"401\",route=\"r1\",matched_uri=\"/hello\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\"} 1"
    ), "{text}");
    assert!(text.contains(&format!(
        "apisix_http_latency_count{{type=\"request\",route=\"r1\",service=\"\",consumer=\"jack\",node=\"{node}\"}} 3"
    )), "{text}");
    assert!(text.contains(&format!(
        "apisix_http_latency_bucket{{type=\"upstream\",route=\"r1\",service=\"\",consumer=\"jack\",node=\"{node}\",le=\"+Inf\"}} 3"
    )), "{text}");
    assert!(text.contains("le=\"60000\""), "default buckets: {text}");
    let egress = text
        .lines()
        .find(|l| {
            l.starts_with("apisix_bandwidth{type=\"egress\",route=\"r1\"") && l.contains("jack")
        })
        .expect("egress line");
    let bytes: u64 = egress.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes > 3 * 6, "{egress}");
    assert!(text.contains("apisix_http_requests_total 4"), "{text}");
    assert!(text.contains("apisix_node_info{hostname="), "{text}");
    assert!(text.contains("# TYPE apisix_http_latency histogram"));
}

#[test]
fn metrics_are_served_at_the_apisix_path() {
    let o = Origin::start();
    let gw = Gw::start(json!({"routes": [route("r1", "/hello", &o, json!({"prometheus": {}}))]}));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    settled(&gw, "apisix_http_requests_total 1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    let shared = gw.shared.clone();
    let th = std::thread::spawn(move || {
        rt.block_on(async move {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                sluice_plugins::serve_metrics(l, shared),
            )
            .await;
        })
    });
    let r = request(addr, "GET", "/apisix/prometheus/metrics", &[], "");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        r.body
            .contains("apisix_http_status{code=\"200\",route=\"r1\""),
        "{}",
        r.body
    );
    assert_eq!(request(addr, "GET", "/other", &[], "").status, 404);
    th.join().unwrap();
}

#[test]
fn metrics_survive_reloads_and_global_rules_count_every_route() {
    let o = Origin::start();
    let cfg = json!({
        "routes": [route("r1", "/a", &o, json!({})), route("r2", "/b", &o, json!({}))],
        "global_rules": [{"id": "1", "plugins": {"prometheus": {}}}]
    });
    let gw = Gw::start_with(cfg.clone(), Arc::default(), 1).unwrap();
    gw.get("/a", &[]);
    gw.reload(cfg, 2);
    gw.get("/a", &[]);
    gw.get("/b", &[]);
    let text = settled(&gw, "apisix_http_requests_total 3");
    assert!(
        text.contains("code=\"200\",route=\"r1\"") && text.contains("} 2\n"),
        "{text}"
    );
    assert!(text.contains("code=\"200\",route=\"r2\""), "{text}");
}

/// The rendered metrics once they contain `want` (the log phase trails the response), or after 2 s.
pub fn settled(gw: &Gw, want: &str) -> String {
    for _ in 0..200 {
        let t = gw.shared.metrics().render();
        if t.contains(want) {
            return t;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    gw.shared.metrics().render()
}

/// prometheus has APISIX's `run_policy = "prefer_route"`: in a global rule and on the route, a request is counted
/// once (by the route's instance); routes without it are still counted by the global rule.
#[test]
fn metrics_global_rule_and_route_count_a_request_once() {
    let o = Origin::start();
    let gw = Gw::start(json!({
        "routes": [route("r1", "/a", &o, json!({"prometheus": {}})), route("r2", "/b", &o, json!({}))],
        "global_rules": [{"id": "1", "plugins": {"prometheus": {}}}]
    }));
    for _ in 0..3 {
        assert_eq!(gw.get("/a", &[]).status, 200);
    }
    assert_eq!(gw.get("/b", &[]).status, 200);
    let text = settled(&gw, "apisix_http_requests_total 4");
    let r1 = text
        .lines()
        .find(|l| l.starts_with("apisix_http_status{code=\"200\",route=\"r1\""))
        .expect("r1 line");
    assert!(r1.ends_with(" 3"), "{r1}");
    let r2 = text
        .lines()
        .find(|l| l.starts_with("apisix_http_status{code=\"200\",route=\"r2\""))
        .expect("r2 line");
    assert!(r2.ends_with(" 1"), "{r2}");
}
