//! file-logger and http-logger (APISIX docs/en/latest/plugins/{file,http}-logger.md): entries carry the
//! request, response status, route, consumer and latencies; delivery happens off the request path.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{consumer, route, Gw, Origin};

fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn file_logger_writes_json_lines() {
    let o = Origin::start();
    let path = std::env::temp_dir().join(format!("sluice-file-logger-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let gw = Gw::start(json!({
        "routes": [route("r1", "/hello", &o, json!({"key-auth": {}, "file-logger": {"path": path.to_str().unwrap()}}))],
        "consumers": [consumer("jack", json!({"key-auth": {"key": "k1"}}))]
    }));
    assert_eq!(gw.get("/hello?a=1", &[("apikey", "k1")]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 401);
    let mut lines: Vec<Value> = Vec::new();
    assert!(wait_until(|| {
        lines = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        lines.len() == 2
    }));
    // The log phase runs after each response is sent, so the two lines may land in either order.
    lines.sort_by_key(|l| l["response"]["status"].as_u64());
    assert_eq!(lines[0]["route_id"], "r1");
    assert_eq!(lines[0]["response"]["status"], 200);
    assert_eq!(lines[0]["request"]["method"], "GET");
    assert_eq!(lines[0]["request"]["uri"], "/hello?a=1");
    assert_eq!(lines[0]["request"]["querystring"]["a"], "1");
    assert_eq!(lines[0]["consumer"]["username"], "jack");
    assert_eq!(lines[0]["upstream"], o.addr.to_string());
    assert_eq!(lines[0]["client_ip"], "127.0.0.1");
    assert!(lines[0]["latency"].as_f64().unwrap() >= 0.0);
    assert_eq!(lines[1]["response"]["status"], 401);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn file_logger_custom_format() {
    let o = Origin::start();
    let path =
        std::env::temp_dir().join(format!("sluice-file-logger-fmt-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"file-logger": {
        "path": path.to_str().unwrap(), "log_format": {"host": "$host", "ua": "$http_user_agent"}}}))]}),
    );
    assert_eq!(gw.get("/hello", &[("User-Agent", "probe/1")]).status, 200);
    let mut line = Value::Null;
    assert!(wait_until(|| {
        line = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| serde_json::from_str(l).ok()))
            .unwrap_or(Value::Null);
        !line.is_null()
    }));
    assert_eq!(line["host"], "test.local");
    assert_eq!(line["ua"], "probe/1");
    assert_eq!(line["route_id"], "r1");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn http_logger_batches_to_the_endpoint() {
    let o = Origin::start();
    let sink = Origin::start();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"http-logger": {
        "uri": format!("http://{}/log", sink.addr), "batch_max_size": 2, "auth_header": "Bearer t",
        "inactive_timeout": 1}}))]}),
    );
    for _ in 0..3 {
        assert_eq!(gw.get("/hello", &[]).status, 200);
    }
    // Two entries fill a batch (a JSON array); the third leaves after inactive_timeout (a single object).
    assert!(
        wait_until(|| sink.count() == 2),
        "sink saw {}",
        sink.count()
    );
    let seen = sink.seen.lock().unwrap().clone();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].target, "/log");
    assert_eq!(seen[0].header("authorization"), Some("Bearer t"));
    let first: Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(first.as_array().map(Vec::len), Some(2), "{first}");
    assert_eq!(first[0]["route_id"], "r1");
    let second: Value = serde_json::from_str(&seen[1].body).unwrap();
    assert_eq!(second["response"]["status"], 200, "{second}");
}

/// loki-logger (APISIX t/plugin/loki-logger.t): one push per batch, streams grouped by resolved labels.
#[test]
fn loki_logger_pushes_streams_by_label() {
    let o = Origin::start();
    let loki = Origin::start();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello*", &o, json!({"loki-logger": {
        "endpoint_addrs": [format!("http://{}", loki.addr)], "tenant_id": "team-a",
        "headers": {"Authorization": "Bearer l"}, "log_labels": {"job": "apisix", "path": "$uri"},
        "batch_max_size": 3, "log_format": {"m": "$request_method"}}}))]}),
    );
    for p in ["/hello/a", "/hello/b", "/hello/a"] {
        assert_eq!(gw.get(p, &[]).status, 200);
    }
    assert!(
        wait_until(|| loki.count() == 1),
        "loki saw {}",
        loki.count()
    );
    let r = loki.last();
    assert_eq!(
        (r.method.as_str(), r.target.as_str()),
        ("POST", "/loki/api/v1/push")
    );
    assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("authorization"), Some("Bearer l"));
    let body: Value = serde_json::from_str(&r.body).unwrap();
    let streams = body["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2, "{body}");
    assert_eq!(
        streams[0]["stream"],
        json!({"job": "apisix", "path": "/hello/a"})
    );
    assert_eq!(
        streams[1]["stream"],
        json!({"job": "apisix", "path": "/hello/b"})
    );
    let values = streams[0]["values"].as_array().unwrap();
    assert_eq!(values.len(), 2);
    let ts = values[0][0].as_str().unwrap();
    assert!(
        ts.len() >= 19 && ts.ends_with("000000") && ts.bytes().all(|b| b.is_ascii_digit()),
        "{ts}"
    );
    let line: Value = serde_json::from_str(values[0][1].as_str().unwrap()).unwrap();
    assert_eq!(line, json!({"m": "GET", "route_id": "r1"}));
    // https endpoints are refused (no TLS client here yet), as are bad label values.
    for bad in [
        json!({"endpoint_addrs": ["https://127.0.0.1:1"]}),
        json!({"endpoint_addrs": []}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "log_labels": {"a": ""}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "timeout": 60001}),
    ] {
        let r =
            Gw::try_start(json!({"routes": [route("r", "/", &o, json!({"loki-logger": bad}))]}));
        assert!(r.is_err(), "accepted {bad}");
    }
}

/// clickhouse-logger (APISIX t/plugin/clickhouse-logger.t): one `INSERT ... FORMAT JSONEachRow` POST per batch
/// with ClickHouse's auth headers; a dead endpoint never slows the proxy.
#[test]
fn clickhouse_logger_inserts_batches() {
    let o = Origin::start();
    let ch = Origin::start();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello*", &o, json!({"clickhouse-logger": {
        "endpoint_addrs": [format!("http://{}/?query_id=q1", ch.addr)], "user": "default",
        "password": "s3cr\"et", "database": "logs", "logtable": "t1",
        "batch_max_size": 2, "inactive_timeout": 1, "log_format": {"m": "$request_method", "u": "$uri"}}}))]}),
    );
    for p in ["/hello/a", "/hello/b", "/hello/c"] {
        assert_eq!(gw.get(p, &[]).status, 200);
    }
    // Two entries fill a batch; the third leaves alone after inactive_timeout.
    assert!(
        wait_until(|| ch.count() == 2),
        "clickhouse saw {}",
        ch.count()
    );
    let seen = ch.seen.lock().unwrap().clone();
    let r = &seen[0];
    assert_eq!(
        (r.method.as_str(), r.target.as_str()),
        ("POST", "/?query_id=q1")
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-clickhouse-user"), Some("default"));
    assert_eq!(r.header("x-clickhouse-key"), Some("s3cr\"et"));
    assert_eq!(r.header("x-clickhouse-database"), Some("logs"));
    let rows = r
        .body
        .strip_prefix("INSERT INTO t1 FORMAT JSONEachRow ")
        .unwrap_or_else(|| panic!("{}", r.body));
    // JSONEachRow: objects separated by one space, each with the route id added to the custom format.
    let rows: Vec<Value> = serde_json::Deserializer::from_str(rows)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 2, "{}", r.body);
    let mut uris: Vec<&str> = rows.iter().map(|v| v["u"].as_str().unwrap()).collect();
    uris.sort_unstable();
    assert_eq!(uris, ["/hello/a", "/hello/b"]);
    assert_eq!(rows[0]["m"], "GET");
    assert_eq!(rows[0]["route_id"], "r1");
    assert!(r.body.contains("} {"), "{}", r.body);
    let last: Value = serde_json::from_str(
        seen[1]
            .body
            .strip_prefix("INSERT INTO t1 FORMAT JSONEachRow ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["u"], "/hello/c");

    // A sink that accepts connections but never answers: requests are not held up by it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"clickhouse-logger": {
        "endpoint_addr": format!("http://{}", dead.local_addr().unwrap()), "user": "u", "password": "p",
        "database": "d", "logtable": "t", "batch_max_size": 1, "timeout": 3}}))]}),
    );
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(gw.get("/hello", &[]).status, 200);
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
    }

    // Bad configurations get the schema's refusal.
    for bad in [
        json!({"endpoint_addrs": ["https://127.0.0.1:1"], "user": "u", "password": "p", "database": "d", "logtable": "t"}),
        json!({"endpoint_addrs": [], "user": "u", "password": "p", "database": "d", "logtable": "t"}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "user": "u", "password": "p", "database": "d"}),
        json!({"endpoint_addr": "http://127.0.0.1:1", "endpoint_addrs": ["http://127.0.0.1:1"],
               "user": "u", "password": "p", "database": "d", "logtable": "t"}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "user": "u", "password": "p", "database": "d",
               "logtable": "t", "timeout": 0}),
        // Header and request-line injection through the configuration.
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "user": "u\r\nX-Evil: 1", "password": "p",
               "database": "d", "logtable": "t"}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "user": "u", "password": "p\n", "database": "d",
               "logtable": "t"}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1/ HTTP/1.1\r\nX-Evil: 1\r\n\r\nGET /"], "user": "u",
               "password": "p", "database": "d", "logtable": "t"}),
    ] {
        let r = Gw::try_start(
            json!({"routes": [route("r", "/", &o, json!({"clickhouse-logger": bad}))]}),
        );
        assert!(r.is_err(), "accepted {bad}");
    }
}

/// elasticsearch-logger (APISIX t/plugin/elasticsearch-logger.t): one `POST /_bulk` per batch of
/// batch_max_size entries, NDJSON action + document lines, Basic auth from `auth`, `headers` on top; a sink
/// that accepts and never answers does not slow the proxy.
#[test]
fn elasticsearch_logger_bulk_posts_batches() {
    let o = Origin::start();
    let es = Origin::start();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello*", &o, json!({"elasticsearch-logger": {
        "endpoint_addrs": [format!("http://{}", es.addr)], "field": {"index": "svc-$uri"},
        "auth": {"username": "elastic", "password": "p@ss:w"}, "headers": {"X-Tenant": "t1"},
        "batch_max_size": 2, "log_format": {"m": "$request_method", "q": "$arg_a"}}}))]}),
    );
    for p in ["/hello/a?a=1", "/hello/b?a=%22%0A", "/hello/c"] {
        assert_eq!(gw.get(p, &[]).status, 200);
    }
    // Two entries fill a batch; the third waits for inactive_timeout (5 s by default), past this wait.
    assert!(wait_until(|| es.count() == 1), "es saw {}", es.count());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(es.count(), 1);
    let r = es.last();
    assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "/_bulk"));
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(
        r.header("accept"),
        Some("application/vnd.elasticsearch+json")
    );
    // base64("elastic:p@ss:w")
    assert_eq!(
        r.header("authorization"),
        Some("Basic ZWxhc3RpYzpwQHNzOnc=")
    );
    assert_eq!(r.header("x-tenant"), Some("t1"));
    // A quote and a newline in a request value stay inside their JSON string: four lines, no more.
    let lines: Vec<&str> = r.body.split_terminator('\n').collect();
    assert!(r.body.ends_with('\n'), "{:?}", r.body);
    assert_eq!(lines.len(), 4, "{:?}", r.body);
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(
        parse(lines[0]),
        json!({"index": {"_index": "svc-/hello/a"}})
    );
    assert_eq!(
        parse(lines[1]),
        json!({"m": "GET", "q": "1", "route_id": "r1"})
    );
    assert_eq!(
        parse(lines[2]),
        json!({"index": {"_index": "svc-/hello/b"}})
    );
    assert_eq!(parse(lines[3])["q"], "%22%0A");

    // A sink that accepts connections and never answers: requests keep their pace.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gw2 = Gw::start(
        json!({"routes": [route("r1", "/hello", &o, json!({"elasticsearch-logger": {
        "endpoint_addr": format!("http://{}", hole.local_addr().unwrap()), "field": {"index": "i"},
        "timeout": 3, "batch_max_size": 1}}))]}),
    );
    let t0 = Instant::now();
    for _ in 0..5 {
        assert_eq!(gw2.get("/hello", &[]).status, 200);
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());

    for bad in [
        json!({"endpoint_addrs": ["https://127.0.0.1:1"], "field": {"index": "i"}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1/"], "field": {"index": "i"}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"]}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "field": {}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "field": {"index": "i"}, "auth": {"username": "u"}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "field": {"index": "i"}, "headers": {"a:b": "c"}}),
        json!({"endpoint_addrs": ["http://127.0.0.1:1"], "field": {"index": "i"}, "timeout": 0}),
    ] {
        let r = Gw::try_start(
            json!({"routes": [route("r", "/", &o, json!({"elasticsearch-logger": bad}))]}),
        );
        assert!(r.is_err(), "accepted {bad}");
    }
}
