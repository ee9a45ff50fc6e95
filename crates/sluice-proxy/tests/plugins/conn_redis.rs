//! limit-conn with policies `redis` and `redis-cluster` against real redis-server processes (helpers in
//! `redis.rs`): gateways with separate plugin state stand in for APISIX nodes sharing one Redis. The origin's
//! `/slow` paths answer after 400 ms, so a request holds its slot that long.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::redis::{
    cluster_and_origin, free_port, have_redis, on_cluster, on_redis, plugin_cfg, redis_and_origin,
    redis_cli,
};
use crate::{Gw, Origin};

fn nodes(o: &Origin, n: usize, conf: &Value) -> Vec<Gw> {
    let cfg = json!({"routes": [crate::route("r1", "/*", o, json!({"limit-conn": conf}))]});
    (0..n)
        .map(|_| Gw::start_with(cfg.clone(), Arc::default(), 1).unwrap())
        .collect()
}

/// Polls `gw` until `path` answers 200 (a slot is freed by a queued removal once the holder's request ended).
fn until_200(gw: &Gw, path: &str) {
    let t0 = Instant::now();
    loop {
        let s = gw.get(path, &[]).status;
        if s == 200 {
            return;
        }
        assert_eq!(s, 503);
        assert!(t0.elapsed() < Duration::from_secs(10), "slot never freed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One request in flight on node a holds the only slot: node b refuses until it ends, then admits.
fn one_slot_across_nodes(gws: &[Gw]) {
    let (a, b) = (&gws[0], &gws[1]);
    let addr = a.addr;
    let slow = std::thread::spawn(move || crate::request(addr, "GET", "/slow", &[], "").status);
    std::thread::sleep(Duration::from_millis(150));
    let r = b.get("/hello", &[]);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("503 Service Temporarily Unavailable"));
    assert_eq!(slow.join().unwrap(), 200);
    until_200(b, "/hello");
    until_200(a, "/hello");
}

#[test]
fn redis_policy_counts_requests_in_flight_across_nodes() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    let conf = on_redis(
        r.port,
        json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}),
    );
    let gws = nodes(&o, 2, &conf);
    one_slot_across_nodes(&gws);
    // Every slot was given back: the key's set is empty.
    let keys = redis_cli(r.port, &["KEYS", "limit_conn:*"]);
    let key = keys
        .lines()
        .next()
        .expect("the key exists while used")
        .to_owned();
    let t0 = Instant::now();
    while redis_cli(r.port, &["ZCARD", &key]).trim() != "0" {
        assert!(t0.elapsed() < Duration::from_secs(5), "slots left in {key}");
        std::thread::sleep(Duration::from_millis(10));
    }

    // 12 requests at once over 3 nodes, conn 2 + burst 1: never more than 3 in flight, so at most 3 pass (each
    // holds its slot 400 ms); the third waits `default_conn_delay`.
    let conf = on_redis(
        r.port,
        json!({"conn": 2, "burst": 1, "default_conn_delay": 0.05, "only_use_default_delay": true,
               "key": "x", "key_type": "var"}),
    );
    let gws = nodes(&o, 3, &conf);
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let ok = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(12));
    let threads: Vec<_> = (0..12)
        .map(|i| {
            let (addr, ok, start) = (addrs[i % 3], ok.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                match crate::request(addr, "GET", "/slow", &[], "").status {
                    200 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    503 => {}
                    s => panic!("status {s}"),
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let admitted = ok.load(Ordering::Relaxed);
    assert!(
        (1..=3).contains(&admitted),
        "{admitted} of 12 admitted with conn 2 + burst 1"
    );
}

#[test]
fn redis_cluster_policy_counts_requests_in_flight_across_nodes() {
    let Some((nodes_, o)) = cluster_and_origin() else {
        return;
    };
    let conf = on_cluster(
        &nodes_,
        json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}),
    );
    let mut conf = conf;
    // APISIX's limit-conn has no cluster name.
    conf.as_object_mut().unwrap().remove("redis_cluster_name");
    let gws = nodes(&o, 2, &conf);
    one_slot_across_nodes(&gws);
}

/// Redis unreachable: APISIX's bare 500, or the request passes uncounted with `allow_degradation`.
#[test]
fn redis_down_fails_closed_or_degrades() {
    if !have_redis() {
        return;
    }
    let o = Origin::start();
    let mut conf = on_redis(
        free_port(),
        json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr",
               "redis_timeout": 100}),
    );
    let gw = Gw::start(plugin_cfg(&o, "limit-conn", conf.clone()));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 500);
    assert!(r.body.contains("500 Internal Server Error"), "{}", r.body);
    drop(gw);
    conf["allow_degradation"] = json!(true);
    let gw = Gw::start(plugin_cfg(&o, "limit-conn", conf));
    for _ in 0..3 {
        assert_eq!(gw.get("/hello", &[]).status, 200);
    }
}
