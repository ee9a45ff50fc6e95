//! limit-count (local) and limit-conn through the proxy (APISIX docs/en/latest/plugins/limit-count.md,
//! t/plugin/limit-count.t, limit-conn.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::{request, route, Gw, Origin};

fn one(o: &Origin, plugins: serde_json::Value) -> serde_json::Value {
    json!({"routes": [route("r1", "/hello", o, plugins)]})
}

#[test]
fn limit_count_defaults_headers_and_503_page() {
    let o = Origin::start();
    let gw = Gw::start(one(
        &o,
        json!({"limit-count": {"count": 2, "time_window": 60}}),
    ));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((59..=60).contains(&reset), "{reset}");
    assert_eq!(
        gw.get("/hello", &[]).header("x-ratelimit-remaining"),
        Some("0")
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 503);
    assert!(
        r.body.contains("503 Service Temporarily Unavailable"),
        "{}",
        r.body
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(o.count(), 2);
}

#[test]
fn limit_count_rejected_code_msg_and_hidden_headers() {
    let o = Origin::start();
    let gw = Gw::start(one(
        &o,
        json!({"limit-count": {"count": 1, "time_window": 60, "rejected_code": 429,
                "rejected_msg": "Requests are too frequent, please try again later.",
                "show_limit_quota_header": false}}),
    ));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), None);
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(
        r.json(),
        json!({"error_msg": "Requests are too frequent, please try again later."})
    );
}

#[test]
fn limit_count_keys_var_combination_constant_and_groups() {
    let o = Origin::start();
    let gw = Gw::start(one(
        &o,
        json!({"limit-count": {"count": 1, "time_window": 60, "key": "http_x_user", "key_type": "var"}}),
    ));
    assert_eq!(gw.get("/hello", &[("X-User", "a")]).status, 200);
    assert_eq!(gw.get("/hello", &[("X-User", "b")]).status, 200);
    assert_eq!(gw.get("/hello", &[("X-User", "a")]).status, 503);
    drop(gw);

    let gw = Gw::start(one(
        &o,
        json!({"limit-count": {"count": 1, "time_window": 60,
                "key": "$http_x_a-$http_x_b", "key_type": "var_combination"}}),
    ));
    assert_eq!(gw.get("/hello", &[("X-A", "1"), ("X-B", "2")]).status, 200);
    assert_eq!(gw.get("/hello", &[("X-A", "1"), ("X-B", "3")]).status, 200);
    assert_eq!(gw.get("/hello", &[("X-A", "1"), ("X-B", "2")]).status, 503);
    drop(gw);

    // A group shares one window across routes; without it each route counts alone.
    let lc = json!({"limit-count": {"count": 2, "time_window": 60, "key": "k", "key_type": "constant", "group": "g"}});
    let gw = Gw::start(
        json!({"routes": [route("r1", "/a", &o, lc.clone()), route("r2", "/b", &o, lc)]}),
    );
    assert_eq!(gw.get("/a", &[]).status, 200);
    assert_eq!(gw.get("/b", &[]).status, 200);
    assert_eq!(gw.get("/a", &[]).status, 503);
    assert_eq!(gw.get("/b", &[]).status, 503);
    drop(gw);
    let lc =
        json!({"limit-count": {"count": 1, "time_window": 60, "key": "k", "key_type": "constant"}});
    let gw = Gw::start(
        json!({"routes": [route("r1", "/a", &o, lc.clone()), route("r2", "/b", &o, lc)]}),
    );
    assert_eq!(gw.get("/a", &[]).status, 200);
    assert_eq!(gw.get("/b", &[]).status, 200);
    assert_eq!(gw.get("/a", &[]).status, 503);
}

#[test]
fn limit_count_window_resets() {
    let o = Origin::start();
    let gw = Gw::start(one(
        &o,
        json!({"limit-count": {"count": 1, "time_window": 1}}),
    ));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 503);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(gw.get("/hello", &[]).status, 200);
}

#[test]
fn limit_count_survives_a_reload_with_the_same_conf() {
    let o = Origin::start();
    let cfg = one(&o, json!({"limit-count": {"count": 2, "time_window": 60}}));
    let gw = Gw::start(cfg.clone());
    assert_eq!(gw.get("/hello", &[]).status, 200);
    gw.reload(cfg, 2);
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 503);
    // A changed configuration starts afresh, as APISIX's conf_version in the key does.
    gw.reload(
        one(&o, json!({"limit-count": {"count": 3, "time_window": 60}})),
        3,
    );
    assert_eq!(gw.get("/hello", &[]).status, 200);
}

#[test]
fn limit_count_local_is_exact_across_worker_threads() {
    let o = Origin::start();
    let gw = Arc::new(
        Gw::start_with(
            one(&o, json!({"limit-count": {"count": 50, "time_window": 60, "key": "k", "key_type": "constant"}})),
            Arc::default(),
            4,
        )
        .unwrap(),
    );
    let ok = Arc::new(AtomicUsize::new(0));
    let limited = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (gw, ok, limited) = (gw.clone(), ok.clone(), limited.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    match request(gw.addr, "GET", "/hello", &[], "").status {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        503 => limited.fetch_add(1, Ordering::Relaxed),
                        s => panic!("unexpected {s}"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ok.load(Ordering::Relaxed), 50);
    assert_eq!(limited.load(Ordering::Relaxed), 30);
}

#[test]
fn limit_conn_rejects_beyond_conn_plus_burst() {
    let o = Origin::start();
    let gw = Arc::new(Gw::start(json!({"routes": [route("r1", "/slow*", &o,
        json!({"limit-conn": {"conn": 1, "burst": 0, "default_conn_delay": 0.1,
               "key": "remote_addr", "rejected_code": 429}}))]})));
    let g2 = gw.clone();
    let first = std::thread::spawn(move || g2.get("/slow/1", &[]).status);
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert_eq!(gw.get("/slow/2", &[]).status, 429);
    assert_eq!(first.join().unwrap(), 200);
    // The slot is released when the request's context drops, just after its response is written.
    let mut status = 0;
    for _ in 0..50 {
        status = gw.get("/slow/3", &[]).status;
        if status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(status, 200, "the slot is released when a request ends");
}

#[test]
fn limit_req_rejects_beyond_rate_plus_burst() {
    let o = Origin::start();
    let gw = Gw::start(one(
        &o,
        json!({"limit-req": {"rate": 1, "burst": 1, "key": "remote_addr", "rejected_code": 429,
                              "rejected_msg": "slow down", "nodelay": true}}),
    ));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 200, "within the burst");
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (429, json!({"error_msg": "slow down"}))
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(gw.get("/hello", &[]).status, 200, "the bucket drained");
}
