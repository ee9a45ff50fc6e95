//! Where a live apply's time goes at 100,000 routes (issue 4): the data plane's whole compile, the successor
//! compile that reuses the previous snapshot, and the radix router build on its own. Ignored by default: it is
//! a measurement, not a check. Run:
//! `cargo test --release -p sluice-bench --test compile_cost -- --ignored --nocapture`

use std::time::Instant;

use sluice_model::{Resources, Route};
use sluice_plugins::Shared;
use sluice_proxy::Snapshot;
use sluice_router::{RouteSpec, Router};

const N: usize = 100_000;

fn route(i: usize, uri: &str) -> Route {
    let v = serde_json::json!({
        "uri": uri,
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}},
    });
    let mut r: Route = serde_json::from_value(v).expect("route");
    r.id = sluice_model::Id(i.to_string());
    r
}

#[test]
#[ignore]
fn measure_compile_100k() {
    let mut res = Resources {
        routes: (1..=N)
            .map(|i| std::sync::Arc::new(route(i, &format!("/r/{i}"))))
            .collect(),
        ..Resources::default()
    };
    let shared = Shared::default();

    let t = Instant::now();
    let first = Snapshot::compile_with(&res, 1, &shared).expect("compile");
    println!("compile (whole, {N} routes): {:?}", t.elapsed());
    assert_eq!(first.route_count(), N);

    res.routes[499] = route(500, "/changed").into();
    let t = Instant::now();
    let next = Snapshot::compile_next(&res, 2, &shared, Some(&first)).expect("compile_next");
    println!("compile_next (1 route changed): {:?}", t.elapsed());
    assert_eq!(next.route_count(), N);

    let specs: Vec<RouteSpec<u32>> = (1..=N)
        .map(|i| RouteSpec::new(format!("/r/{i}"), i as u32))
        .collect();
    let t = Instant::now();
    let router = Router::build(specs).expect("router");
    println!("Router::build ({N} uris): {:?}", t.elapsed());
    drop(router);

    let t = Instant::now();
    let copy = res.clone();
    println!("Resources clone ({N} routes): {:?}", t.elapsed());
    assert_eq!(copy.routes.len(), N);
}
