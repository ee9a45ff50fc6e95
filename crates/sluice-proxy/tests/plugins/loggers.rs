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
