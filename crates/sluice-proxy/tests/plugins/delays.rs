//! Delays a request hook asks for and the proxy awaits: limit-req's leaky-bucket delay (`nodelay` off),
//! limit-conn's `default_conn_delay` (fixed with `only_use_default_delay`, else following latency) and
//! fault-injection's `delay` (APISIX docs/en/latest/plugins/{limit-req,limit-conn,fault-injection}.md,
//! t/plugin/fault-injection.t). Lower bounds follow from the algorithms and client-side clocks, so they cannot
//! flake; upper bounds are generous.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{route, Gw, Origin};

fn gw(o: &Origin, uri: &str, plugins: Value) -> Arc<Gw> {
    Arc::new(Gw::start(json!({"routes": [route("r1", uri, o, plugins)]})))
}

/// Sends `n` requests at once; returns (status, end instant) of each and the instant before the first was sent.
fn burst(gw: &Arc<Gw>, target: &'static str, n: usize) -> (Instant, Vec<(u16, Instant)>) {
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let g = gw.clone();
            std::thread::spawn(move || (g.get(target, &[]).status, Instant::now()))
        })
        .collect();
    (
        start,
        threads.into_iter().map(|t| t.join().unwrap()).collect(),
    )
}

#[test]
fn limit_req_delays_requests_within_the_burst() {
    let o = Origin::start();
    // rate 2/s: the k-th queued request leaves the bucket k * 500 ms after the first one was stamped.
    let g = gw(
        &o,
        "/hello",
        json!({"limit-req": {"rate": 2, "burst": 2, "key": "remote_addr"}}),
    );
    let (start, res) = burst(&g, "/hello", 3);
    assert!(res.iter().all(|(s, _)| *s == 200), "{res:?}");
    let last = res.iter().map(|(_, t)| *t).max().unwrap() - start;
    assert!(last >= Duration::from_millis(995), "{last:?}");
    assert!(last < Duration::from_secs(4), "{last:?}");
    drop(g);

    // nodelay: the same burst is admitted without waiting (the unit delay is 5 s here).
    let g = gw(
        &o,
        "/hello",
        json!({"limit-req": {"rate": 0.2, "burst": 2, "key": "remote_addr", "nodelay": true}}),
    );
    let (start, res) = burst(&g, "/hello", 3);
    assert!(res.iter().all(|(s, _)| *s == 200), "{res:?}");
    let last = res.iter().map(|(_, t)| *t).max().unwrap() - start;
    assert!(last < Duration::from_secs(4), "nodelay waited {last:?}");
}

#[test]
fn limit_req_rejects_without_delay_beyond_the_burst() {
    let o = Origin::start();
    // rate 0.4/s, burst 1: the second request waits 2.5 s, the third is over the burst.
    let g = gw(
        &o,
        "/hello",
        json!({"limit-req": {"rate": 0.4, "burst": 1, "key": "remote_addr", "rejected_code": 429}}),
    );
    let t0 = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    let g2 = g.clone();
    let queued = std::thread::spawn(move || {
        let t = Instant::now();
        (g2.get("/hello", &[]).status, t.elapsed())
    });
    // The queued request is stamped at once; wait until it surely has been.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 429);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a rejection is not delayed"
    );
    let (status, took) = queued.join().unwrap();
    assert_eq!(status, 200);
    // It leaves the bucket 2.5 s after the first request was stamped, which was after t0.
    assert!(t0.elapsed() >= Duration::from_millis(2495), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert_eq!(o.count(), 2);
}

#[test]
fn limit_conn_delays_requests_beyond_conn_by_default_conn_delay() {
    let o = Origin::start();
    let g = gw(
        &o,
        "/*",
        json!({"limit-conn": {"conn": 1, "burst": 1, "default_conn_delay": 0.3,
               "only_use_default_delay": true, "key": "remote_addr", "key_type": "var"}}),
    );
    // Alone in flight: no delay.
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    let alone = t.elapsed();
    // /slow holds its slot for 400 ms at the origin; a second request meanwhile is the 2nd in flight (> conn):
    // it waits 0.3 * floor(1 / 1) s.
    let g2 = g.clone();
    let slow = std::thread::spawn(move || g2.get("/slow", &[]).status);
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    let delayed = t.elapsed();
    assert_eq!(slow.join().unwrap(), 200);
    assert!(delayed >= Duration::from_millis(300), "{delayed:?}");
    assert!(delayed < Duration::from_millis(2300), "{delayed:?}");
    assert!(
        alone < Duration::from_millis(300) || alone < delayed,
        "{alone:?}"
    );
}

#[test]
fn limit_conn_delay_follows_latency_unless_only_use_default_delay() {
    let o = Origin::start();
    // A default of 20 s: halved by every finished request (averaged with its few-ms latency), as
    // lua-resty-limit-conn's `leaving` does, so after 10 requests it is ~20 ms.
    let g = gw(
        &o,
        "/*",
        json!({"limit-conn": {"conn": 1, "burst": 1, "default_conn_delay": 20,
               "key": "remote_addr"}}),
    );
    for _ in 0..10 {
        assert_eq!(g.get("/hello", &[]).status, 200);
        // The slot is released in the log phase, just after the response is written: give it time, or the next
        // request (a new connection) may still count as excess and wait the unadapted 20 s.
        std::thread::sleep(Duration::from_millis(50));
    }
    let g2 = g.clone();
    let slow = std::thread::spawn(move || g2.get("/slow", &[]).status);
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    let delayed = t.elapsed();
    assert_eq!(slow.join().unwrap(), 200);
    // 20 s / 2^10 ≈ 19.5 ms is a floor of the adapted unit delay; far below the 20 s default.
    assert!(delayed >= Duration::from_millis(19), "{delayed:?}");
    assert!(delayed < Duration::from_secs(5), "{delayed:?}");
}

#[test]
fn fault_injection_delay_then_abort_and_vars() {
    let o = Origin::start();
    let g = gw(
        &o,
        "/hello",
        json!({"fault-injection": {"delay": {"duration": 0.3}}}),
    );
    let t = Instant::now();
    let r = g.get("/hello", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(2300), "{took:?}");
    drop(g);

    // Delay and abort: the abort is answered after the delay (t/plugin/fault-injection.t).
    let g = gw(
        &o,
        "/hello",
        json!({"fault-injection": {"delay": {"duration": 0.3},
                                   "abort": {"http_status": 403, "body": "Fault Injection!\n"}}}),
    );
    let t = Instant::now();
    let r = g.get("/hello", &[]);
    assert_eq!((r.status, r.body.as_str()), (403, "Fault Injection!\n"));
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    drop(g);

    // `vars` and `percentage` choose which requests wait: only ?name=jack, and never at 0 %.
    let g = gw(
        &o,
        "/hello",
        json!({"fault-injection": {"delay": {"duration": 3,
                                             "vars": [[["arg_name", "==", "jack"]]]},
                                   "abort": {"http_status": 403, "percentage": 0}}}),
    );
    let t = Instant::now();
    assert_eq!(g.get("/hello?name=rose", &[]).status, 200);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let t = Instant::now();
    assert_eq!(g.get("/hello?name=jack", &[]).status, 200);
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    drop(g);

    let g = gw(
        &o,
        "/hello",
        json!({"fault-injection": {"delay": {"duration": 3, "percentage": 0}}}),
    );
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn fault_injection_delay_schema_errors() {
    let o = Origin::start();
    for (conf, want) in [
        (json!({"delay": {"duration": -1}}), "duration"),
        (json!({"delay": {"percentage": 50}}), "duration"),
        (
            json!({"delay": {"duration": 1, "percentage": 101}}),
            "percentage",
        ),
    ] {
        let e = Gw::try_start(
            json!({"routes": [route("r1", "/a", &o, json!({"fault-injection": conf}))]}),
        )
        .err()
        .expect("refused");
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn limit_conn_defaults_and_error_shapes() {
    let o = Origin::start();
    // Default rejected_code 503 with nginx's page; rejected_msg as {"error_msg": ...}.
    for (extra, status, body) in [
        (json!({}), 503, "503 Service Temporarily Unavailable"),
        (
            json!({"rejected_code": 429, "rejected_msg": "too many"}),
            429,
            "{\"error_msg\":\"too many\"}",
        ),
    ] {
        let mut conf = json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1,
                              "key": "$remote_addr $http_x_user", "key_type": "var_combination"});
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let g = gw(&o, "/*", json!({"limit-conn": conf}));
        let g2 = g.clone();
        let slow = std::thread::spawn(move || g2.get("/slow", &[("X-User", "a")]).status);
        std::thread::sleep(Duration::from_millis(150));
        let r = g.get("/hello", &[("X-User", "a")]);
        assert_eq!(r.status, status);
        assert!(r.body.contains(body), "{}", r.body);
        // Another key has its own slot.
        assert_eq!(g.get("/hello", &[("X-User", "b")]).status, 200);
        assert_eq!(slow.join().unwrap(), 200);
    }
    for (conf, want) in [
        (
            json!({"conn": 1, "burst": 0, "key": "remote_addr"}),
            "default_conn_delay",
        ),
        (
            json!({"conn": 0, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}),
            "conn",
        ),
        (
            json!({"conn": 1, "burst": 0, "default_conn_delay": 0, "key": "remote_addr"}),
            "default_conn_delay",
        ),
        (
            json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr",
                   "policy": "redis"}),
            "redis_host",
        ),
    ] {
        let e =
            Gw::try_start(json!({"routes": [route("r1", "/a", &o, json!({"limit-conn": conf}))]}))
                .err()
                .expect("refused");
        assert!(e.contains("limit-conn") && e.contains(want), "{want}: {e}");
    }
}

#[test]
fn later_plugins_run_after_the_wait() {
    let o = Origin::start();
    // fault-injection (11000) delays only ?name=jack, by 3 s, before limit-req (1001, rate 0.5/s) stamps it, as
    // APISIX's ngx.sleep inside the rewrite hook. Jack's request comes first but reaches the bucket last, so the
    // plain request sent 100 ms later finds the bucket empty and passes at once (had jack been stamped before
    // his wait, it would wait ~1.9 s), and jack finds it drained after his wait.
    let g = gw(
        &o,
        "/hello",
        json!({"fault-injection": {"delay": {"duration": 3, "vars": [[["arg_name", "==", "jack"]]]}},
               "limit-req": {"rate": 0.5, "burst": 5, "key": "remote_addr"}}),
    );
    let g2 = g.clone();
    let jack = std::thread::spawn(move || {
        let t = Instant::now();
        (g2.get("/hello?name=jack", &[]).status, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(g.get("/hello", &[]).status, 200);
    let plain = t.elapsed();
    assert!(plain < Duration::from_millis(1500), "{plain:?}");
    let (status, took) = jack.join().unwrap();
    assert_eq!(status, 200);
    assert!(took >= Duration::from_secs(3), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
