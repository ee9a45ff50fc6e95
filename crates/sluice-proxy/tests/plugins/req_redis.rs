//! limit-req with policies `redis` and `redis-cluster` against real redis-server processes (helpers in
//! `redis.rs`): gateways with separate plugin state stand in for APISIX nodes sharing one Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::redis::{
    admitted_under_load, cluster_and_origin, down_fails_closed_or_degrades, have_redis, on_cluster,
    on_redis, plugin_cfg, redis_and_origin, redis_commands, three_pass_then_503, two_nodes,
};
use crate::{Gw, Origin};

fn two(o: &Origin, lr: Value) -> (Gw, Gw) {
    two_nodes(o, "limit-req", lr)
}

#[test]
fn redis_policy_shares_the_bucket_and_its_delay_across_nodes() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    let (a, b) = two(
        &o,
        on_redis(
            r.port,
            json!({"rate": 0.1, "burst": 2, "key": "remote_addr", "nodelay": true}),
        ),
    );
    // rate 0.1/s, burst 2, nodelay: three requests pass cluster-wide, whichever node they hit, back to back.
    three_pass_then_503(&a, &b, Duration::ZERO);
    drop((a, b));

    // Delays count the other node's requests: rate 0.5/s; a's request leaves excess 0, b's right after finds
    // excess ~1 and waits ~2 s (b's own bucket alone would let it through at once).
    let (a, b) = two(
        &o,
        on_redis(
            r.port,
            json!({"rate": 0.5, "burst": 10, "key": "remote_addr"}),
        ),
    );
    assert_eq!(a.get("/hello", &[]).status, 200);
    let t0 = Instant::now();
    assert_eq!(b.get("/hello", &[]).status, 200);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1000), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

#[test]
fn redis_cluster_policy_shares_the_bucket_across_nodes() {
    let Some((nodes, o)) = cluster_and_origin() else {
        return;
    };
    let (a, b) = two(
        &o,
        on_cluster(
            &nodes,
            json!({"rate": 0.1, "burst": 2, "key": "remote_addr", "nodelay": true}),
        ),
    );
    three_pass_then_503(&a, &b, Duration::ZERO);
}

#[test]
fn redis_down_fails_closed_or_degrades() {
    if have_redis() {
        down_fails_closed_or_degrades(
            "limit-req",
            json!({"rate": 1, "burst": 0, "key": "remote_addr"}),
            None,
        );
    }
}

#[test]
fn redis_configuration_errors() {
    let o = Origin::start();
    for (lr, want) in [
        (
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "policy": "redis"}),
            "redis_host",
        ),
        (
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "policy": "redis-cluster",
                   "redis_cluster_nodes": ["127.0.0.1:1"]}),
            "redis_cluster_nodes",
        ),
        (
            json!({"rate": 1, "burst": 0, "key": "remote_addr", "policy": "memcached"}),
            "policy",
        ),
    ] {
        let e = Gw::try_start(plugin_cfg(&o, "limit-req", lr))
            .err()
            .expect("refused");
        assert!(e.contains("limit-req") && e.contains(want), "{want}: {e}");
    }
}

/// A bucket that admits 100 (rate 0.001/s, burst 99, nodelay) under 8 clients over 2 and over 3 nodes: exactly
/// 100 pass (the batched syncs this replaced let up to 124 through), one Redis script per request (printed).
#[test]
fn redis_policy_is_exact_under_load() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    for n in [2, 3] {
        let lr = on_redis(
            r.port,
            // Another configuration (so another bucket) per round.
            json!({"rate": 0.001, "burst": 99, "key": "arg_k", "nodelay": true,
                   "rejected_msg": format!("round {n}")}),
        );
        let gws: Vec<Gw> = (0..n)
            .map(|_| {
                Gw::start_with(plugin_cfg(&o, "limit-req", lr.clone()), Arc::default(), 1).unwrap()
            })
            .collect();
        let refs: Vec<&Gw> = gws.iter().collect();
        let before = redis_commands(r.port).0;
        let admitted = admitted_under_load(&refs, "limit-req", 100);
        let trips = redis_commands(r.port).0 - before;
        eprintln!("limit-req redis, {n} nodes: {trips} scripts (EVAL) for 320 requests");
        assert_eq!(admitted, 100, "{n} nodes");
    }
}
