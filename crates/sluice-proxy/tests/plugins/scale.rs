//! The benchmark configuration: 100 routes x 100 consumers with key-auth + limit-count + prometheus.

use serde_json::{json, Value};

use crate::{consumer, route, Gw, Origin};

#[test]
fn hundred_routes_hundred_consumers() {
    let o = Origin::start();
    let plugins = json!({
        "key-auth": {},
        "limit-count": {"count": 3, "time_window": 60, "key": "consumer_name", "rejected_code": 429},
        "prometheus": {}
    });
    let routes: Vec<Value> = (0..100)
        .map(|i| route(&format!("r{i}"), &format!("/r{i}/*"), &o, plugins.clone()))
        .collect();
    let consumers: Vec<Value> = (0..100)
        .map(|j| {
            consumer(
                &format!("c{j}"),
                json!({"key-auth": {"key": format!("key-{j}")}}),
            )
        })
        .collect();
    let gw = Gw::start(json!({"routes": routes, "consumers": consumers}));
    let t0 = std::time::Instant::now();
    let mut n = 0;
    for i in (0..100).step_by(7) {
        for j in (0..100).step_by(9) {
            let r = gw.get(&format!("/r{i}/x"), &[("apikey", &format!("key-{j}"))]);
            assert_eq!(r.status, 200, "route {i} consumer {j}");
            assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
            n += 1;
        }
    }
    assert_eq!(o.count(), n);
    assert_eq!(o.last().header("x-consumer-username"), Some("c99"));
    // Limits are per route and consumer.
    for _ in 0..2 {
        assert_eq!(gw.get("/r50/x", &[("apikey", "key-42")]).status, 200);
    }
    assert_eq!(gw.get("/r50/x", &[("apikey", "key-42")]).status, 200);
    assert_eq!(gw.get("/r50/x", &[("apikey", "key-42")]).status, 429);
    assert_eq!(gw.get("/r51/x", &[("apikey", "key-42")]).status, 200);
    assert_eq!(gw.get("/r50/x", &[("apikey", "key-43")]).status, 200);
    assert_eq!(gw.get("/r50/x", &[("apikey", "key-100")]).status, 401);
    let text = crate::metrics::settled(&gw, "code=\"429\",route=\"r50\"");
    assert!(text.contains("code=\"429\",route=\"r50\""), "{text}");
    assert!(text.contains("consumer=\"c42\""));
    eprintln!("{} requests in {:?}", n + 7, t0.elapsed());
}
