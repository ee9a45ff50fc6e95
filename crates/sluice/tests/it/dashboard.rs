//! The dashboard's server side through the real binary (issue 14): live traffic counters (`/stats` and the
//! `/stats/stream` event stream), the health view mirrored under the Admin API, the request tester (`POST /match`)
//! checked against what the proxy really serves, effective plugin chains, `whoami`, and attacks on each (bad
//! arguments and bodies, no key, a client opening many streams).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, Client, Origin};

const KEY: &str = "dash-admin-key-0123456789";
const VIEWER: &str = "dash-viewer-key-0123456789";

struct Node {
    sluice: Sluice,
    admin: SocketAddr,
    control: SocketAddr,
}

/// `sluice start`, traditional role (embedded store), two workers, an admin and a viewer key, the control API on.
async fn start() -> Node {
    let dir = TempDir::new("dash");
    let (port, admin_port, control_port) = (free_port(), free_port(), free_port());
    let cfg = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  ssl:\n    enable: false\n\
         \x20 enable_control: true\n  control:\n    ip: 127.0.0.1\n    port: {control_port}\n\
         nginx_config:\n  worker_processes: 2\n\
         deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n\
         \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
         \x20   admin_key:\n      - name: admin\n        key: {KEY}\n        role: admin\n\
         \x20     - name: viewer\n        key: {VIEWER}\n        role: viewer\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
         sluice:\n  data_dir: data\n"
    );
    std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
    let gw: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let control: SocketAddr = ([127, 0, 0, 1], control_port).into();
    Node {
        sluice: Sluice::spawn_in(dir, gw, &[admin, control]).await,
        admin,
        control,
    }
}

async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let extra = key
        .map(|k| format!("X-API-KEY: {k}\r\n"))
        .unwrap_or_default();
    let r = Client::connect(admin)
        .await
        .request(method, path, &extra, body.as_bytes())
        .await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::String(r.text()));
    (r.status, v)
}

async fn put(admin: SocketAddr, path: &str, body: Value) {
    let (st, v) = call(admin, "PUT", path, Some(KEY), &body.to_string()).await;
    assert!(st == 200 || st == 201, "PUT {path}: {st} {v}");
}

/// PUT with `?wait=applied`: the data plane serves it once this returns.
async fn put_applied(admin: SocketAddr, path: &str, body: Value) {
    put(admin, &format!("{path}?wait=applied"), body).await;
}

/// Sums `field` of the object at JSON pointer `at` of each sample of a `/stats` series.
fn sum(series: &Value, at: &str, field: &str) -> u64 {
    series["series"]
        .as_array()
        .expect("series")
        .iter()
        .map(|s| s.pointer(at).and_then(|v| v[field].as_u64()).unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_exactly_per_route_service_and_node() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    let up = json!({"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}});
    put(a, "/apisix/admin/services/s1", json!({"upstream": up})).await;
    put_applied(
        a,
        "/apisix/admin/routes/ok",
        json!({"uri": "/ok", "service_id": "s1"}),
    )
    .await;
    put_applied(
        a,
        "/apisix/admin/routes/err",
        json!({"uri": "/status/503", "upstream": up}),
    )
    .await;

    // No traffic yet: the counters start empty (the puts above are Admin API traffic, not proxied).
    let (st, before) = call(a, "GET", "/apisix/admin/stats", Some(KEY), "").await;
    assert_eq!(st, 200, "{before}");
    assert_eq!(before["interval"], 1);
    assert!(before["now"].as_u64().unwrap_or(0) > 1_700_000_000);
    assert_eq!(sum(&before, "/total", "req"), 0, "{before}");

    // 7 + 5 + 3 requests, over keep-alive and fresh connections (both workers may serve them).
    let gw = node.sluice.addr;
    let mut c = Client::connect(gw).await;
    for i in 0..7 {
        let r = if i % 2 == 0 {
            c.get("/ok").await
        } else {
            Client::connect(gw).await.get("/ok").await
        };
        assert_eq!(r.status, 200);
    }
    for _ in 0..5 {
        assert_eq!(c.get("/status/503").await.status, 503);
    }
    for _ in 0..3 {
        assert_eq!(
            Client::connect(gw).await.get("/nothing-here").await.status,
            404
        );
    }

    // The seconds close once a second: wait (bounded) until all 15 are in, then check every count exactly.
    let end = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let (st, v) = call(
            a,
            "GET",
            "/apisix/admin/stats?seconds=900",
            Some(VIEWER),
            "",
        )
        .await;
        assert_eq!(st, 200);
        if sum(&v, "/total", "req") >= 15 || Instant::now() > end {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let total = |f| sum(&stats, "/total", f);
    assert_eq!(total("req"), 15, "{stats}");
    assert_eq!((total("s2xx"), total("s4xx"), total("s5xx")), (7, 3, 5));
    assert_eq!((total("s1xx"), total("s3xx")), (0, 0));
    assert!(
        total("bytes_in") > 15 * 20 && total("bytes_out") > 15 * 50,
        "{stats}"
    );
    assert_eq!(sum(&stats, "/routes/ok", "req"), 7);
    assert_eq!(sum(&stats, "/routes/ok", "s2xx"), 7);
    assert_eq!(sum(&stats, "/routes/err", "req"), 5);
    assert_eq!(sum(&stats, "/routes/err", "s5xx"), 5);
    assert_eq!(sum(&stats, "/services/s1", "req"), 7);
    let n = origin.addr.to_string();
    assert_eq!(sum(&stats, &format!("/nodes/{n}"), "req"), 12);
    // Only keys with traffic in a second appear in it; latencies are there and in milliseconds.
    let series = stats["series"].as_array().expect("series");
    for s in series {
        for (_, v) in s["routes"].as_object().expect("routes") {
            assert!(v["req"].as_u64().unwrap_or(0) > 0, "{s}");
            assert!(v["lat_p50"].as_f64().unwrap_or(0.0) > 0.0, "{s}");
            assert!(v["up_p99"].as_f64().unwrap_or(0.0) >= v["up_p50"].as_f64().unwrap_or(0.0));
            assert!(v["lat_p50"].as_f64().unwrap_or(0.0) < 5000.0, "{s}");
        }
    }
    let ts: Vec<u64> = series
        .iter()
        .map(|s| s["t"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        ts.windows(2).all(|w| w[1] == w[0] + 1),
        "one sample per second, oldest first: {ts:?}"
    );
    // Nothing is counted twice: a few seconds later the sums are the same.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, again) = call(a, "GET", "/apisix/admin/stats", Some(KEY), "").await;
    assert_eq!(sum(&again, "/total", "req"), 15, "{again}");
    // `seconds` bounds the series.
    let (_, one) = call(a, "GET", "/apisix/admin/stats?seconds=1", Some(KEY), "").await;
    assert_eq!(one["series"].as_array().map(Vec::len), Some(1));

    // The counters survive a configuration change (keyed by ids): a write recompiles, the series stays.
    put_applied(
        a,
        "/apisix/admin/routes/other",
        json!({"uri": "/other", "upstream": up}),
    )
    .await;
    let (_, after) = call(a, "GET", "/apisix/admin/stats", Some(KEY), "").await;
    assert_eq!(sum(&after, "/routes/ok", "req"), 7);
    assert_eq!(c.get("/ok").await.status, 200);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = call(a, "GET", "/apisix/admin/stats", Some(KEY), "").await;
        if sum(&v, "/routes/ok", "req") == 8 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the request after the change was not counted: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads `data:` events off an open stream (bounded).
async fn events(c: &mut Client, buf: &mut String, want: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while out.len() < want {
        assert!(Instant::now() < end, "no events: {buf:?}");
        while let Some(i) = buf.find("data: ") {
            let Some(len) = buf[i..].find("\n\n") else {
                break;
            };
            let json = buf[i + 6..i + len].to_owned();
            buf.drain(..i + len + 2);
            out.push(serde_json::from_str(&json).expect("event JSON"));
        }
        if out.len() >= want {
            break;
        }
        let got = c.read_some().await;
        assert!(!got.is_empty(), "stream ended");
        buf.push_str(&String::from_utf8_lossy(&got));
    }
    out
}

async fn open_stream(admin: SocketAddr, query_key: &str) -> (Client, u16) {
    let mut c = Client::connect(admin).await;
    c.send(
        format!("GET /apisix/admin/stats/stream?api_key={query_key} HTTP/1.1\r\nHost: a\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let (status, _, headers) = c.read_head().await;
    if status == 200 {
        let ct = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.clone());
        assert_eq!(ct.as_deref(), Some("text/event-stream"));
    }
    (c, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_sends_a_second_at_a_time_and_streams_are_bounded() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    let up = json!({"nodes": {origin.addr.to_string(): 1}});
    put_applied(
        a,
        "/apisix/admin/routes/1",
        json!({"uri": "/s", "upstream": up}),
    )
    .await;

    // No key, a wrong key: 401 before anything streams.
    let (_, st) = open_stream(a, "").await;
    assert_eq!(st, 401);
    let (_, st) = open_stream(a, "wrong").await;
    assert_eq!(st, 401);

    // 100 clients at once: 32 streams, the rest refused with 503; none of it leaks once they leave.
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..100 {
        let (c, st) = open_stream(a, KEY).await;
        match st {
            200 => open.push(c),
            503 => refused += 1,
            other => panic!("stream answered {other}"),
        }
    }
    assert_eq!((open.len(), refused), (32, 68));
    drop(open);
    // Each stream ends when its client is gone (noticed at the next event): all 32 slots come back.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut again = Vec::new();
        for _ in 0..32 {
            let (c, st) = open_stream(a, KEY).await;
            if st == 200 {
                again.push(c);
            }
        }
        if again.len() == 32 {
            break;
        }
        assert!(
            Instant::now() < end,
            "stream slots leaked: only {} free",
            again.len()
        );
        drop(again);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The viewer key in `?api_key=`, as APISIX's check_token takes it (retried while the slots above drain).
    let end = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        let (c, st) = open_stream(a, VIEWER).await;
        if st == 200 {
            break c;
        }
        assert!(Instant::now() < end, "no stream slot came back");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let mut buf = String::new();
    let first = events(&mut c, &mut buf, 1).await;
    let mut g = Client::connect(node.sluice.addr).await;
    for _ in 0..4 {
        assert_eq!(g.get("/s").await.status, 200);
    }
    // One event a second, consecutive seconds, and the four requests show up in them.
    let mut seen = first;
    let end = Instant::now() + Duration::from_secs(20);
    while seen
        .iter()
        .map(|e| e["routes"]["1"]["req"].as_u64().unwrap_or(0))
        .sum::<u64>()
        < 4
    {
        assert!(Instant::now() < end, "the counts never moved: {seen:?}");
        seen.extend(events(&mut c, &mut buf, 1).await);
    }
    let ts: Vec<u64> = seen.iter().map(|e| e["t"].as_u64().unwrap_or(0)).collect();
    assert!(ts.windows(2).all(|w| w[1] == w[0] + 1), "{ts:?}");
    assert_eq!(
        seen.iter()
            .map(|e| e["total"]["req"].as_u64().unwrap_or(0))
            .sum::<u64>(),
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_roles_whoami_and_healthcheck() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    put_applied(
        a,
        "/apisix/admin/upstreams/hc",
        json!({"nodes": {origin.addr.to_string(): 1},
               "checks": {"active": {"type": "tcp", "healthy": {"interval": 1, "successes": 1}}}}),
    )
    .await;

    for path in [
        "/apisix/admin/stats",
        "/apisix/admin/whoami",
        "/apisix/admin/healthcheck",
        "/apisix/admin/routes/1/effective",
    ] {
        let (st, v) = call(a, "GET", path, None, "").await;
        assert_eq!(st, 401, "{path}: {v}");
        assert_eq!(v["error_msg"], "failed to check token");
        let (st, _) = call(a, "GET", path, Some("wrong"), "").await;
        assert_eq!(st, 401, "{path}");
    }
    let (st, _) = call(a, "POST", "/apisix/admin/match", None, r#"{"uri": "/"}"#).await;
    assert_eq!(st, 401);

    assert_eq!(
        call(a, "GET", "/apisix/admin/whoami", Some(KEY), "")
            .await
            .1,
        json!({"role": "admin"})
    );
    assert_eq!(
        call(a, "GET", "/apisix/admin/whoami", Some(VIEWER), "")
            .await
            .1,
        json!({"role": "viewer"})
    );
    // The viewer may ask the request tester (a read), and still may not write.
    let (st, v) = call(
        a,
        "POST",
        "/apisix/admin/match",
        Some(VIEWER),
        r#"{"uri": "/none"}"#,
    )
    .await;
    assert_eq!((st, v), (404, json!({"error_msg": "no route matched"})));
    let (st, v) = call(
        a,
        "PUT",
        "/apisix/admin/routes/x",
        Some(VIEWER),
        r#"{"uri": "/x"}"#,
    )
    .await;
    assert_eq!(
        (st, v["description"].as_str()),
        (401, Some("invalid method for role viewer"))
    );

    // Exactly what the control API answers (probe counters move once a second: compare a consistent pair).
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, mine) = call(a, "GET", "/apisix/admin/healthcheck", Some(VIEWER), "").await;
        assert_eq!(st, 200);
        let r = Client::connect(node.control)
            .await
            .get("/v1/healthcheck")
            .await;
        let theirs: Value = serde_json::from_slice(&r.body).expect("control JSON");
        if mine == theirs && !mine.as_array().is_none_or(Vec::is_empty) {
            assert_eq!(mine[0]["name"], "/apisix/upstreams/hc");
            break;
        }
        assert!(Instant::now() < end, "{mine} != {theirs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn match_picks_the_route_the_proxy_serves() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    let up = json!({"nodes": {origin.addr.to_string(): 1}});
    let tag = |id: &str| json!({"response-rewrite": {"headers": {"set": {"X-Route": id}}}});
    let routes = [
        (
            "m1",
            json!({"uri": "/m/*", "hosts": ["a.example"], "methods": ["GET"], "upstream": up, "plugins": tag("m1")}),
        ),
        (
            "m2",
            json!({"uri": "/m/*", "hosts": ["a.example"], "methods": ["GET"], "priority": 10,
                      "vars": [["arg_v", "==", "2"]], "upstream": up, "plugins": tag("m2")}),
        ),
        (
            "m3",
            json!({"uri": "/m/*", "methods": ["POST"], "upstream": up, "plugins": tag("m3")}),
        ),
        (
            "m4",
            json!({"uri": "/m/exact", "hosts": ["*.example"], "upstream": up, "plugins": tag("m4")}),
        ),
        (
            "m5",
            json!({"uri": "/m/*", "remote_addrs": ["10.0.0.0/8"], "priority": 20, "upstream": up,
                      "plugins": tag("m5")}),
        ),
    ];
    for (id, r) in routes {
        put_applied(a, &format!("/apisix/admin/routes/{id}"), r).await;
    }
    // (method, host, uri, headers) -> the route the tester names must be the route that answers for real.
    let cases: [(&str, &str, &str, Option<&str>); 8] = [
        ("GET", "a.example", "/m/x", Some("m1")),
        ("GET", "a.example", "/m/x?v=2", Some("m2")),
        ("GET", "A.Example:9080", "/m/x?v=2", Some("m2")),
        ("GET", "a.example", "/m/y/../x?v=2", Some("m2")),
        ("POST", "a.example", "/m/x", Some("m3")),
        ("GET", "b.example", "/m/exact", Some("m4")),
        ("GET", "b.example", "/m/x", None),
        ("DELETE", "a.example", "/m/x", None),
    ];
    for (method, host, uri, want) in cases {
        let q = json!({"method": method, "host": host, "uri": uri});
        let (st, v) = call(a, "POST", "/apisix/admin/match", Some(KEY), &q.to_string()).await;
        let mut c = Client::connect(node.sluice.addr).await;
        c.send(
            format!("{method} {uri} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let served = c.read_response(false).await;
        match want {
            Some(id) => {
                assert_eq!((st, v["route_id"].as_str()), (200, Some(id)), "{q}: {v}");
                assert_eq!(
                    served.header("x-route"),
                    Some(id),
                    "{q}: the proxy served another route"
                );
                assert_eq!(
                    v["route"]["uri"],
                    if id == "m4" { "/m/exact" } else { "/m/*" }
                );
                assert_eq!(v["upstream"]["nodes"], up["nodes"], "{v}");
                assert_eq!(v["node"], origin.addr.to_string());
                assert_eq!(
                    v["plugins"],
                    json!([{"name": "response-rewrite", "priority": 899,
                    "source": "route", "source_id": id}])
                );
            }
            None => {
                assert_eq!(
                    (st, v),
                    (404, json!({"error_msg": "no route matched"})),
                    "{q}"
                );
                assert_eq!(served.status, 404, "{q}");
            }
        }
    }
    // The client address counts like the proxy's `remote_addr` (no real request can come from 10.x here). Host
    // routes are tried first, as APISIX's radixtree_host_uri does: with a.example, m1 wins over m5's priority.
    let q = json!({"uri": "/m/x", "remote_addr": "10.1.2.3"});
    let (_, v) = call(a, "POST", "/apisix/admin/match", Some(KEY), &q.to_string()).await;
    assert_eq!(v["route_id"], "m5", "{v}");
    let q = json!({"host": "a.example", "uri": "/m/x", "remote_addr": "10.1.2.3"});
    let (_, v) = call(a, "POST", "/apisix/admin/match", Some(KEY), &q.to_string()).await;
    assert_eq!(v["route_id"], "m1", "{v}");
    let (st, _) = call(
        a,
        "POST",
        "/apisix/admin/match",
        Some(KEY),
        r#"{"uri": "/m/x"}"#,
    )
    .await;
    assert_eq!(st, 404, "m5 needs a 10.x client");
    // A header-only request host (no "host" field) routes as the Host header.
    let q = json!({"uri": "/m/x", "headers": {"Host": "a.example"}});
    let (_, v) = call(a, "POST", "/apisix/admin/match", Some(KEY), &q.to_string()).await;
    assert_eq!(v["route_id"], "m1", "{v}");

    // Hostile bodies: 400 with a reason, and the tester keeps working.
    let bad: [&str; 10] = [
        "{",
        "[1, 2]",
        r#"{"method": "GET"}"#,
        r#"{"uri": 7}"#,
        r#"{"uri": "no-slash"}"#,
        r#"{"uri": "/a b"}"#,
        r#"{"uri": "/../../etc/passwd"}"#,
        r#"{"uri": "/", "headers": {"X-A": "1\r\nHost: evil"}}"#,
        r#"{"uri": "/", "method": "GET /x HTTP/1.1\r\n"}"#,
        r#"{"uri": "/", "remote_addr": "not-an-ip"}"#,
    ];
    for b in bad {
        let (st, v) = call(a, "POST", "/apisix/admin/match", Some(KEY), b).await;
        assert_eq!(st, 400, "{b}: {v}");
        assert!(
            v["error_msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{b}: {v}"
        );
    }
    let many: serde_json::Map<String, Value> =
        (0..500).map(|i| (format!("X-H{i}"), json!("v"))).collect();
    let (st, _) = call(
        a,
        "POST",
        "/apisix/admin/match",
        Some(KEY),
        &json!({"uri": "/m/x", "headers": many}).to_string(),
    )
    .await;
    assert_eq!(st, 400, "more headers than the proxy accepts");
    let huge = format!(r#"{{"uri": "/{}"}}"#, "a".repeat(1600 * 1024));
    let (st, _) = call(a, "POST", "/apisix/admin/match", Some(KEY), &huge).await;
    assert_eq!(st, 400, "a body over the Admin API's limit");
    let (st, v) = call(
        a,
        "POST",
        "/apisix/admin/match",
        Some(KEY),
        r#"{"host": "a.example", "uri": "/m/x"}"#,
    )
    .await;
    assert_eq!((st, v["route_id"].as_str()), (200, Some("m1")));

    // `seconds` must be 1..=900.
    for q in ["-1", "abc", "1e9", "0", "901", "99999999999999999999"] {
        let (st, v) = call(
            a,
            "GET",
            &format!("/apisix/admin/stats?seconds={q}"),
            Some(KEY),
            "",
        )
        .await;
        assert_eq!(st, 400, "seconds={q}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effective_chain_in_run_order_with_sources() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    let up = json!({"nodes": {origin.addr.to_string(): 1}});
    let limit = |n: u32| json!({"count": n, "time_window": 60, "key": "remote_addr"});
    put(
        a,
        "/apisix/admin/global_rules/g1",
        json!({"plugins": {"request-id": {}}}),
    )
    .await;
    put(
        a,
        "/apisix/admin/services/s1",
        json!({"upstream": up,
        "plugins": {"limit-count": limit(1000), "cors": {}}}),
    )
    .await;
    put(
        a,
        "/apisix/admin/plugin_configs/pc1",
        json!({"plugins": {"ip-restriction": {"whitelist": ["127.0.0.0/8"]}}}),
    )
    .await;
    put(
        a,
        "/apisix/admin/consumer_groups/grp",
        json!({"plugins": {"limit-count": limit(500)}}),
    )
    .await;
    put(a, "/apisix/admin/consumers", json!({"username": "jack", "group_id": "grp",
        "plugins": {"key-auth": {"key": "jack-key"}, "proxy-rewrite": {"headers": {"set": {"X-Who": "jack"}}}}})).await;
    put_applied(
        a,
        "/apisix/admin/routes/e1",
        json!({"uri": "/e", "service_id": "s1", "plugin_config_id": "pc1",
        "plugins": {"key-auth": {}, "cors": {"allow_origins": "*"},
                    "response-rewrite": {"body": "x", "_meta": {"disable": true}},
                    "echo": {"body": "e", "_meta": {"priority": 5000}}}}),
    )
    .await;

    let p = |name: &str, priority: i32, source: &str, id: &str| json!({"name": name, "priority": priority, "source": source, "source_id": id});
    let (st, v) = call(
        a,
        "GET",
        "/apisix/admin/routes/e1/effective",
        Some(VIEWER),
        "",
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["plugins"],
        json!([
            p("request-id", 12015, "global_rule", "g1"),
            p("echo", 5000, "route", "e1"),
            p("cors", 4000, "route", "e1"),
            p("ip-restriction", 3000, "plugin_config", "pc1"),
            p("key-auth", 2500, "route", "e1"),
            p("limit-count", 1002, "service", "s1"),
        ]),
        "{v}"
    );
    // With the consumer: its plugins join in priority order, its group's limit-count replaces the service's.
    let with_jack = json!([
        p("request-id", 12015, "global_rule", "g1"),
        p("echo", 5000, "route", "e1"),
        p("cors", 4000, "route", "e1"),
        p("ip-restriction", 3000, "plugin_config", "pc1"),
        p("key-auth", 2500, "route", "e1"),
        p("proxy-rewrite", 1008, "consumer", "jack"),
        p("limit-count", 1002, "consumer_group", "grp"),
    ]);
    let (st, v) = call(
        a,
        "GET",
        "/apisix/admin/routes/e1/effective?consumer=jack",
        Some(KEY),
        "",
    )
    .await;
    assert_eq!((st, &v["plugins"]), (200, &with_jack), "{v}");
    // The tester gives the same chain for a request to that route.
    let (st, v) = call(
        a,
        "POST",
        "/apisix/admin/match",
        Some(KEY),
        r#"{"uri": "/e", "consumer": "jack", "headers": {"apikey": "jack-key"}}"#,
    )
    .await;
    assert_eq!((st, &v["plugins"]), (200, &with_jack), "{v}");

    // And the data plane runs the consumer's plugins on that route: its proxy-rewrite reached the origin.
    let r = Client::connect(node.sluice.addr)
        .await
        .request("GET", "/e", "apikey: jack-key\r\n", b"")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(origin.last().header("x-who"), Some("jack"));

    let (st, v) = call(
        a,
        "GET",
        "/apisix/admin/routes/nope/effective",
        Some(KEY),
        "",
    )
    .await;
    assert_eq!((st, v), (404, json!({"message": "Key not found"})));
    let (st, v) = call(
        a,
        "GET",
        "/apisix/admin/routes/e1/effective?consumer=nobody",
        Some(KEY),
        "",
    )
    .await;
    assert_eq!((st, v), (404, json!({"error_msg": "consumer not found"})));
}

/// `curl -si` against the proxy: (status, headers lower-cased, body).
async fn curl(args: Vec<String>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-s", "-i", "--max-time", "20"])
            .args(&args)
            .output()
            .expect("run curl")
    })
    .await
    .expect("curl task");
    assert!(out.status.success(), "curl {:?}", out);
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("curl head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, raw[split + 4..].to_vec())
}

fn answer_header<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_answers_what_curl_gets_and_refuses_injection() {
    let origin = Origin::start("o").await;
    let node = start().await;
    let a = node.admin;
    let gw = node.sluice.addr;
    let up = json!({"nodes": {origin.addr.to_string(): 1}});
    put_applied(
        a,
        "/apisix/admin/routes/s1",
        json!({"uri": "/*", "hosts": ["a.example"], "upstream": up,
               "plugins": {"response-rewrite": {"headers": {"set": {"X-Route": "s1"}}}}}),
    )
    .await;
    let send = "/apisix/admin/match/send";

    // A POST with a body and a header: the tester's answer is what curl gets from the proxy.
    let q = json!({"method": "POST", "host": "a.example", "uri": "/echo?x=1",
                   "headers": {"X-Test": "t1"}, "body": "hello from the tester"});
    let (st, v) = call(a, "POST", send, Some(KEY), &q.to_string()).await;
    assert_eq!(st, 200, "{v}");
    let sent = origin.last();
    assert_eq!(
        (sent.method.as_str(), sent.target.as_str()),
        ("POST", "/echo?x=1")
    );
    assert_eq!(sent.header("x-test"), Some("t1"));
    assert_eq!(sent.header("host"), Some("a.example"));
    assert_eq!(sent.body, b"hello from the tester");
    let (cst, ch, cbody) = curl(vec![
        "-X".into(),
        "POST".into(),
        "-H".into(),
        "Host: a.example".into(),
        "-H".into(),
        "X-Test: t1".into(),
        "--data-binary".into(),
        "hello from the tester".into(),
        format!("http://{gw}/echo?x=1"),
    ])
    .await;
    assert_eq!(v["status"], cst, "{v}");
    assert_eq!(v["body"], String::from_utf8_lossy(&cbody).as_ref(), "{v}");
    for name in ["x-route", "x-origin", "x-seen-target", "content-length"] {
        let theirs = ch.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert!(theirs.is_some(), "curl got no {name}: {ch:?}");
        assert_eq!(answer_header(&v, name), theirs, "{name}: {v}");
    }
    assert_eq!(v["truncated"], false);
    assert!(v["elapsed_ms"].as_f64().is_some_and(|t| t >= 0.0), "{v}");

    // No route for that host: the proxy's own 404, as curl sees it.
    let q = json!({"host": "b.example", "uri": "/x"});
    let (st, v) = call(a, "POST", send, Some(KEY), &q.to_string()).await;
    let (cst, _, cbody) = curl(vec![
        "-H".into(),
        "Host: b.example".into(),
        format!("http://{gw}/x"),
    ])
    .await;
    assert_eq!((st, v["status"].as_u64()), (200, Some(u64::from(cst))));
    assert_eq!(cst, 404);
    assert_eq!(v["body"], String::from_utf8_lossy(&cbody).as_ref());

    // A body over 64 KiB is cut there, and said so.
    let q =
        json!({"method": "POST", "host": "a.example", "uri": "/echo", "body": "z".repeat(100_000)});
    let (st, v) = call(a, "POST", send, Some(KEY), &q.to_string()).await;
    assert_eq!((st, v["status"].as_u64()), (200, Some(200)));
    assert_eq!(v["body"].as_str().map(str::len), Some(64 * 1024));
    assert_eq!(v["truncated"], true);
    assert_eq!(answer_header(&v, "content-length"), Some("100000"));

    // Nothing below may reach the proxy: the origin (which every request on a.example reaches, and which records
    // any smuggled header line) sees no new request.
    let seen = origin.count();
    let bad: Vec<String> = vec![
        json!({"host": "a.example", "uri": "/", "headers": {"X-A": "1\r\nX-Smuggled: yes"}}),
        json!({"host": "a.example", "uri": "/", "headers": {"X-A": "1\nX-Smuggled: yes"}}),
        json!({"host": "a.example", "uri": "/", "headers": {"X-A\r\nX-Smuggled": "yes"}}),
        json!({"host": "a.example", "uri": "/", "headers": {"X-A": "1\u{0}"}}),
        json!({"host": "a.example\r\nX-Smuggled: yes", "uri": "/"}),
        json!({"host": "a.example", "uri": "/ HTTP/1.1\r\nX-Smuggled: yes\r\n\r\nGET /"}),
        json!({"host": "a.example", "uri": "/a b"}),
        json!({"host": "a.example", "uri": "/", "method": "GET / HTTP/1.1\r\n"}),
        json!({"host": "a.example", "uri": "/", "method": "CONNECT"}),
        json!({"host": "a.example", "uri": "/", "headers": {"Transfer-Encoding": "chunked"},
               "body": "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a.example\r\n\r\n"}),
        json!({"host": "a.example", "uri": "/", "headers": {"Content-Length": "0"},
               "body": "GET /smuggled HTTP/1.1\r\nHost: a.example\r\n\r\n"}),
        json!({"host": "a.example", "uri": "/", "headers": {"Connection": "keep-alive"}}),
        json!({"host": "a.example", "uri": "/", "headers": {"Upgrade": "websocket"}}),
        json!({"host": "a.example", "uri": "/", "remote_addr": "10.0.0.1"}),
        json!({"host": "a.example", "uri": "/", "consumer": "jack"}),
        json!({"host": "a.example", "uri": "/", "body": 5}),
        json!({"host": "a.example", "uri": "http://elsewhere.example/"}),
    ]
    .into_iter()
    .map(|v| v.to_string())
    .collect();
    for b in &bad {
        let (st, v) = call(a, "POST", send, Some(KEY), b).await;
        assert_eq!(st, 400, "{b}: {v}");
        assert!(
            v["error_msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{b}: {v}"
        );
    }
    // Over the Admin API's body limit (1.5 MiB).
    let huge = json!({"method": "POST", "host": "a.example", "uri": "/echo", "body": "z".repeat(1600 * 1024)});
    let (st, _) = call(a, "POST", send, Some(KEY), &huge.to_string()).await;
    assert_eq!(st, 400, "a body over the Admin API's limit");
    // A viewer may match but not send (a sent request may have side effects); no key at all neither.
    let ok = json!({"host": "a.example", "uri": "/viewer"}).to_string();
    let (st, v) = call(a, "POST", send, Some(VIEWER), &ok).await;
    assert_eq!(
        (st, v["description"].as_str()),
        (401, Some("invalid method for role viewer")),
        "{v}"
    );
    let (st, _) = call(a, "POST", send, None, &ok).await;
    assert_eq!(st, 401);
    assert_eq!(
        origin.count(),
        seen,
        "a refused send reached the proxy: {:?}",
        origin.requests().last()
    );
    assert!(origin
        .requests()
        .iter()
        .all(|r| !r.has_header("x-smuggled") && !r.target.contains("smuggled")));

    // The same request from an admin key goes through (the refusals above were about the request, not the route).
    let (st, v) = call(a, "POST", send, Some(KEY), &ok).await;
    assert_eq!((st, v["status"].as_u64()), (200, Some(200)), "{v}");
    assert_eq!(answer_header(&v, "x-route"), Some("s1"));
    assert_eq!(origin.last().target, "/viewer");
}
