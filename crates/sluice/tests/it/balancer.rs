//! Each balancer's distribution as the origins see it: weighted roundrobin is exact (smooth WRR), chash keeps a key
//! on one node (hash_on vars, header, cookie), least_conn and ewma steer away from a slow node, and node priority
//! fails over to the lower group only when the higher one is down.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::gateway::one_route;
use crate::support::{refused_addr, t, Client, Gw, Mode, Origin};

fn weighted(kind: &str, nodes: &[(&Origin, u32)]) -> Value {
    let m: serde_json::Map<String, Value> = nodes
        .iter()
        .map(|(o, w)| (o.addr.to_string(), json!(w)))
        .collect();
    json!({"type": kind, "nodes": m})
}

/// Builds the request for key number `k`.
type ReqFn = fn(usize) -> String;

async fn tally(c: &mut Client, n: usize, req: impl Fn(usize) -> String) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for i in 0..n {
        c.send(req(i).as_bytes()).await;
        let r = c.read_response(false).await;
        assert_eq!(r.status, 200);
        *m.entry(r.origin()).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_weights_are_exact() {
    t(async {
        let a = Origin::start("A").await;
        let b = Origin::start("B").await;
        let c3 = Origin::start("C").await;
        let gw = Gw::start(one_route("/*", weighted("roundrobin", &[(&a, 1), (&b, 3)])));
        let mut c = Client::connect(gw.addr).await;
        let m = tally(&mut c, 400, |_| {
            "GET /rr HTTP/1.1\r\nHost: t\r\n\r\n".into()
        })
        .await;
        assert_eq!((m["A"], m["B"]), (100, 300), "{m:?}");
        // Smooth WRR interleaves: over 40 more requests never two A in a row, never four B.
        let mut seq = String::new();
        for _ in 0..40 {
            seq.push_str(&c.get("/rr").await.origin());
        }
        assert!(!seq.contains("AA") && !seq.contains("BBBB"), "{seq}");
        gw.publish(one_route(
            "/*",
            weighted("roundrobin", &[(&a, 2), (&b, 1), (&c3, 1)]),
        ));
        let mut c = Client::connect(gw.addr).await;
        let m = tally(&mut c, 400, |_| {
            "GET /rr HTTP/1.1\r\nHost: t\r\n\r\n".into()
        })
        .await;
        assert_eq!((m["A"], m["B"], m["C"]), (200, 100, 100), "{m:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chash_same_key_same_node() {
    t(async {
        let os = [
            Origin::start("A").await,
            Origin::start("B").await,
            Origin::start("C").await,
        ];
        let nodes: Vec<(&Origin, u32)> = os.iter().map(|o| (o, 1)).collect();
        let mut up_arg = weighted("chash", &nodes);
        up_arg["hash_on"] = json!("vars");
        up_arg["key"] = json!("arg_user");
        let mut up_hdr = weighted("chash", &nodes);
        up_hdr["hash_on"] = json!("header");
        up_hdr["key"] = json!("X-User");
        let mut up_cookie = weighted("chash", &nodes);
        up_cookie["hash_on"] = json!("cookie");
        up_cookie["key"] = json!("sid");
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/arg", "upstream": up_arg},
            {"id": 2, "uri": "/hdr", "upstream": up_hdr},
            {"id": 3, "uri": "/cookie", "upstream": up_cookie},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let reqs: [(&str, ReqFn); 3] = [
            ("arg", |k| {
                format!("GET /arg?user=u{k} HTTP/1.1\r\nHost: t\r\n\r\n")
            }),
            ("hdr", |k| {
                format!("GET /hdr HTTP/1.1\r\nHost: t\r\nX-User: u{k}\r\n\r\n")
            }),
            ("cookie", |k| {
                format!("GET /cookie HTTP/1.1\r\nHost: t\r\nCookie: a=b; sid=u{k}\r\n\r\n")
            }),
        ];
        for (what, req) in reqs {
            let mut used = HashMap::new();
            for k in 0..30 {
                let mut seen = Vec::new();
                for _ in 0..5 {
                    c.send(req(k).as_bytes()).await;
                    let r = c.read_response(false).await;
                    assert_eq!(r.status, 200);
                    seen.push(r.origin());
                }
                seen.dedup();
                assert_eq!(
                    seen.len(),
                    1,
                    "{what}: key u{k} moved between nodes: {seen:?}"
                );
                *used.entry(seen[0].clone()).or_insert(0) += 1;
            }
            assert!(
                used.len() >= 2,
                "{what}: 30 keys all hashed to one node: {used:?}"
            );
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn least_conn_avoids_the_slow_node() {
    t(async {
        let slow = Origin::with_mode("slow", Mode::Delay(Duration::from_millis(200))).await;
        let fast = Origin::start("fast").await;
        let gw = Gw::start(one_route(
            "/*",
            weighted("least_conn", &[(&slow, 1), (&fast, 1)]),
        ));
        let addr = gw.addr;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            tasks.push(tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                let end = Instant::now() + Duration::from_millis(800);
                let mut n = 0;
                while Instant::now() < end && n < 2000 {
                    assert_eq!(c.get("/lc").await.status, 200);
                    n += 1;
                }
            }));
        }
        for task in tasks {
            task.await.expect("client task");
        }
        let (s, f) = (slow.count(), fast.count());
        // Round robin would split the counts evenly; least_conn sends the slow node only what the fast one leaves.
        assert!(f > 3 * s.max(1), "slow {s}, fast {f}");
        assert!(
            s >= 1,
            "the slow node is still used when it has fewer connections"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ewma_prefers_the_fast_node() {
    t(async {
        let slow = Origin::with_mode("slow", Mode::Delay(Duration::from_millis(30))).await;
        let fast = Origin::start("fast").await;
        let gw = Gw::start(one_route("/*", weighted("ewma", &[(&slow, 1), (&fast, 1)])));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..60 {
            assert_eq!(c.get("/ewma").await.status, 200);
        }
        let (s, f) = (slow.count(), fast.count());
        assert!(s >= 1, "an unmeasured node is tried");
        assert!(f >= 3 * s, "slow {s}, fast {f}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_failover() {
    t(async {
        let hi = Origin::start("hi").await;
        let lo = Origin::start("lo").await;
        let dead = refused_addr();
        let list = |first: String| {
            json!({"type": "roundrobin", "nodes": [
                {"host": "127.0.0.1", "port": first.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()),
                 "weight": 1, "priority": 10},
                {"host": "127.0.0.1", "port": lo.addr.port(), "weight": 100, "priority": 0},
            ]})
        };
        // High priority node alive: it takes everything despite the low node's weight.
        let gw = Gw::start(one_route("/*", list(hi.addr.to_string())));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..20 {
            assert_eq!(c.get("/p").await.origin(), "hi");
        }
        assert_eq!(lo.count(), 0);
        // High priority node refuses connections: every request fails over to the lower priority.
        gw.publish(one_route("/*", list(dead.to_string())));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..20 {
            let r = c.get("/p").await;
            assert_eq!((r.status, r.origin().as_str()), (200, "lo"));
        }
        assert_eq!(lo.count(), 20);
    })
    .await
}

/// `retry_timeout` (APISIX: no further attempt once this long has passed since the first): a first node that
/// times out after 0.5 s is not followed by a retry under `retry_timeout: 0.2`, and is without it. The clock for
/// it is read only on upstreams that set it (the live counters' cost work), so both sides are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_timeout_stops_retries_after_it_passed() {
    t(async {
        let stalled = Origin::with_mode("S", Mode::Stall).await;
        let live = Origin::start("L").await;
        let upstream = |retry_timeout: Option<f64>| {
            let mut u = json!({"type": "roundrobin", "timeout": {"connect": 1, "send": 1, "read": 0.5},
                "nodes": [{"host": "127.0.0.1", "port": stalled.addr.port(), "weight": 1, "priority": 1},
                          {"host": "127.0.0.1", "port": live.addr.port(), "weight": 1, "priority": 0}]});
            if let Some(rt) = retry_timeout {
                u["retry_timeout"] = json!(rt);
            }
            u
        };
        let gw = Gw::start(one_route("/*", upstream(None)));
        let r = Client::connect(gw.addr).await.get("/x").await;
        assert_eq!((r.status, r.origin()), (200, "L".to_owned()), "retried on the live node");
        gw.publish(one_route("/*", upstream(Some(0.2))));
        let r = Client::connect(gw.addr).await.get("/x").await;
        assert_eq!(r.status, 504, "no retry once retry_timeout passed");
    })
    .await
}
