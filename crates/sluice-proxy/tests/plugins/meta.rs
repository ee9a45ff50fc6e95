//! plugin_metadata and route metadata through the real proxy: file-logger / http-logger take `log_format` from
//! their plugin_metadata when their own configuration has none (APISIX `log-util.get_log_entry`,
//! t/plugin/file-logger.t, http-logger-log-format.t), a reload with new metadata changes the format, log entries
//! carry the route's `service_id`, and prometheus labels `service`, `matched_uri`, `matched_host` (and names under
//! `prefer_name`) from the route's configuration.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{Gw, Origin};

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

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn upstream(o: &Origin) -> Value {
    json!({"type": "roundrobin", "nodes": {o.addr.to_string(): 1}})
}

#[test]
fn file_logger_takes_log_format_from_plugin_metadata_and_reloads_it() {
    let o = Origin::start();
    let path = std::env::temp_dir().join(format!("sluice-meta-fmt-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().unwrap();
    let cfg = |meta_format: Value| {
        json!({
            "services": [{"id": "s1", "name": "svc-one", "upstream": upstream(&o)}],
            "routes": [
                {"id": "r1", "uri": "/meta", "service_id": "s1", "plugins": {"file-logger": {"path": p}}},
                {"id": "r2", "uri": "/own", "upstream": upstream(&o),
                 "plugins": {"file-logger": {"path": p, "log_format": {"mine": "$uri"}}}}
            ],
            "plugin_metadata": [{"id": "file-logger", "log_format": meta_format}]
        })
    };
    let gw = Gw::start(cfg(json!({
        "host": "$host", "client_ip": "$remote_addr", "tag": "static", "missing": "$http_x_nope",
        "svc": "$service_name"
    })));
    assert_eq!(gw.get("/meta", &[]).status, 200);
    let mut got = Vec::new();
    assert!(wait_until(|| {
        got = lines(&path);
        got.len() == 1
    }));
    let e = &got[0];
    assert_eq!(e["host"], "test.local", "{e}");
    assert_eq!(e["client_ip"], "127.0.0.1");
    assert_eq!(e["tag"], "static", "a value without $ is a literal");
    assert!(
        e.get("missing").is_none(),
        "an unset variable leaves the key out: {e}"
    );
    assert_eq!(e["svc"], "svc-one");
    assert_eq!(e["route_id"], "r1");
    assert_eq!(e["service_id"], "s1");
    assert!(
        e.get("request").is_none(),
        "custom format, not the full entry"
    );

    // The route's own log_format wins over the metadata's.
    assert_eq!(gw.get("/own?x=1", &[]).status, 200);
    assert!(wait_until(|| {
        got = lines(&path);
        got.len() == 2
    }));
    let own = got.iter().find(|l| l["route_id"] == "r2").expect("r2 line");
    assert_eq!(own["mine"], "/own", "{own}");
    assert!(own.get("host").is_none());
    assert!(own.get("service_id").is_none(), "r2 has no service");

    // New metadata on reload: the next entry follows it.
    gw.reload(cfg(json!({"only": "$request_method"})), 2);
    assert_eq!(gw.get("/meta", &[]).status, 200);
    assert!(wait_until(|| {
        got = lines(&path);
        got.len() == 3
    }));
    let last = got
        .iter()
        .find(|l| l.get("only").is_some())
        .expect("reloaded format");
    assert_eq!(last["only"], "GET");
    assert!(last.get("host").is_none());
    drop(gw);

    // Without any log_format (or with an empty one) the full entry is logged, with the route's service_id.
    let _ = std::fs::remove_file(&path);
    let gw = Gw::start(cfg(json!({})));
    assert_eq!(gw.get("/meta", &[]).status, 200);
    assert!(wait_until(|| {
        got = lines(&path);
        got.len() == 1
    }));
    assert_eq!(got[0]["service_id"], "s1");
    assert_eq!(got[0]["request"]["method"], "GET");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn http_logger_uses_metadata_log_format() {
    let o = Origin::start();
    let sink = Origin::start();
    let gw = Gw::start(json!({
        "routes": [{"id": "r1", "uri": "/hello", "upstream": upstream(&o), "plugins": {"http-logger": {
            "uri": format!("http://{}/log", sink.addr), "batch_max_size": 1}}}],
        "plugin_metadata": [{"id": "http-logger", "log_format": {"m": "$request_method", "u": "$uri"}}]
    }));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert!(wait_until(|| sink.count() == 1));
    let body: Value = serde_json::from_str(&sink.last().body).unwrap();
    assert_eq!(
        body,
        json!({"m": "GET", "u": "/hello", "route_id": "r1"}),
        "{body}"
    );
}

fn settled(gw: &Gw, want: &str) -> String {
    let t0 = Instant::now();
    loop {
        let t = gw.shared.metrics().render();
        if t.contains(want) || t0.elapsed() > Duration::from_secs(5) {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn prometheus_labels_service_matched_uri_and_host_from_the_route() {
    let o = Origin::start();
    let res = |prefer_name: bool| {
        json!({
            "services": [{"id": "s1", "name": "svc-one", "upstream": upstream(&o)}],
            "routes": [
                {"id": "r1", "name": "route-one", "uri": "/api/*", "host": "*.example.com", "service_id": "s1",
                 "plugins": {"prometheus": {"prefer_name": prefer_name}}},
                {"id": "r2", "uris": ["/plain", "/other"], "upstream": upstream(&o),
                 "plugins": {"prometheus": {"prefer_name": prefer_name}}}
            ]
        })
    };
    let gw = Gw::start(res(false));
    let node = o.addr.ip().to_string();
    // Two request paths under one route fold into one series: the label is the route's pattern.
    for p in ["/api/a", "/api/b"] {
        assert_eq!(gw.get(p, &[("Host", "x.example.com")]).status, 200);
    }
    assert_eq!(gw.get("/other", &[]).status, 200);
    let want = format!(
        "apisix_http_status{{code=\"200\",route=\"r1\",matched_uri=\"/api/*\",matched_host=\"*.example.com\",service=\"s1\",consumer=\"\",node=\"{node}\"}} 2"
    );
    // The log phase trails each response: wait for all three before reading.
    let text = settled(&gw, "apisix_http_requests_total 3");
    assert!(text.contains(&want), "{text}");
    assert!(text.contains(&format!(
        "apisix_http_status{{code=\"200\",route=\"r2\",matched_uri=\"/plain\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\"}} 1"
    )), "{text}");
    assert!(text.contains(&format!(
        "apisix_http_latency_count{{type=\"request\",route=\"r1\",service=\"s1\",consumer=\"\",node=\"{node}\"}} 2"
    )), "{text}");
    drop(gw);

    let gw = Gw::start(res(true));
    assert_eq!(gw.get("/api/a", &[("Host", "x.example.com")]).status, 200);
    assert_eq!(gw.get("/plain", &[]).status, 200);
    let want = "route=\"route-one\",matched_uri=\"/api/*\",matched_host=\"*.example.com\",service=\"svc-one\"";
    let text = settled(&gw, "apisix_http_requests_total 2");
    assert!(text.contains(want), "{text}");
    // A route without a name keeps its id under prefer_name.
    assert!(
        text.contains("route=\"r2\",matched_uri=\"/plain\""),
        "{text}"
    );
}
