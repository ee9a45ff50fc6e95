//! request-validation's `body_schema` through the real proxy (APISIX docs request-validation.md,
//! t/plugin/request-validation.t): JSON and urlencoded bodies validated before the upstream is contacted, the
//! schema's and the JSON decoder's errors as 400 bodies, `rejected_code` / `rejected_msg`, chunked bodies, and the
//! body still reaching the upstream intact after a pass.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use crate::{request, route, Gw, Origin};

fn start(o: &Origin, conf: serde_json::Value) -> Gw {
    Gw::start(json!({"routes": [route("r1", "/v", o, json!({"request-validation": conf}))]}))
}

fn body_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["required_payload"],
        "properties": {
            "required_payload": {"type": "string"},
            "boolean_payload": {"type": "boolean"},
            "number_payload": {"type": "number", "minimum": 2}
        }
    })
}

fn post(gw: &Gw, body: &str, ctype: &str) -> (u16, String) {
    let r = request(gw.addr, "POST", "/v", &[("Content-Type", ctype)], body);
    (r.status, r.body)
}

#[test]
fn json_bodies_are_validated_before_the_upstream() {
    let o = Origin::start();
    let gw = start(&o, json!({"body_schema": body_schema()}));
    let good = r#"{"required_payload": "x", "boolean_payload": true}"#;
    assert_eq!(post(&gw, good, "application/json").0, 200);
    assert_eq!(o.last().body, good, "the body reaches the upstream as sent");
    assert_eq!(o.count(), 1);

    let (status, body) = post(&gw, r#"{"boolean_payload": true}"#, "application/json");
    assert_eq!(
        (status, body.as_str()),
        (400, r#"property "required_payload" is required"#)
    );
    let (status, body) = post(
        &gw,
        r#"{"required_payload": "x", "number_payload": 1}"#,
        "text/plain",
    );
    assert_eq!(status, 400);
    assert!(
        body.starts_with(r#"property "number_payload" validation failed"#),
        "{body}"
    );
    // Malformed JSON: lua-cjson's message, and nothing reaches the upstream.
    let (status, body) = post(&gw, r#"{"required_payload": "x""#, "application/json");
    assert_eq!(
        (status, body.as_str()),
        (
            400,
            "Expected comma or object end but found T_END at character 25"
        )
    );
    let (status, body) = post(&gw, "{required_payload: 1}", "application/json");
    assert_eq!(
        (status, body.as_str()),
        (
            400,
            "Expected object key string but found invalid token at character 2"
        )
    );
    // No body at all is not JSON either.
    let r = request(gw.addr, "POST", "/v", &[], "");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Expected value but found T_END at character 1")
    );
    assert_eq!(o.count(), 1, "rejected requests never reach the upstream");
}

#[test]
fn urlencoded_bodies_rejected_code_and_msg_and_headers() {
    let o = Origin::start();
    let gw = start(
        &o,
        json!({"body_schema": {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 2}}},
               "header_schema": {"type": "object", "required": ["x-token"]}}),
    );
    let form = "application/x-www-form-urlencoded";
    let r = request(
        gw.addr,
        "POST",
        "/v",
        &[("Content-Type", form), ("X-Token", "t")],
        "name=jo%20e&x=1",
    );
    assert_eq!(r.status, 200);
    assert_eq!(o.last().body, "name=jo%20e&x=1");
    let r = request(
        gw.addr,
        "POST",
        "/v",
        &[("Content-Type", form), ("X-Token", "t")],
        "name=j",
    );
    assert_eq!(r.status, 400);
    assert!(
        r.body.starts_with(r#"property "name" validation failed"#),
        "{}",
        r.body
    );
    // The header schema is checked first.
    let r = request(gw.addr, "POST", "/v", &[("Content-Type", form)], "name=joe");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, r#"property "x-token" is required"#)
    );
    drop(gw);

    let gw = start(
        &o,
        json!({"body_schema": body_schema(), "rejected_code": 422, "rejected_msg": "bad body"}),
    );
    assert_eq!(
        post(&gw, "{}", "application/json"),
        (422, "bad body".to_owned())
    );
    assert_eq!(
        post(&gw, "not json", "application/json"),
        (422, "bad body".to_owned())
    );
}

/// A raw chunked POST; returns the status line.
fn chunked(gw: &Gw, chunks: &[&str]) -> String {
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = String::from(
        "POST /v HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for ch in chunks {
        req.push_str(&format!("{:x}\r\n{ch}\r\n", ch.len()));
    }
    req.push_str("0\r\n\r\n");
    c.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

#[test]
fn chunked_bodies_are_read_whole_and_validated() {
    let o = Origin::start();
    let gw = start(&o, json!({"body_schema": body_schema()}));
    // The document is split across chunks: validation sees it whole.
    let out = chunked(&gw, &[r#"{"boolean_"#, r#"payload": true}"#]);
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(
        out.ends_with(r#"property "required_payload" is required"#),
        "{out}"
    );
    let out = chunked(&gw, &[r#"{"required"#, r#"_payload": 1"#]);
    assert!(
        out.ends_with("Expected comma or object end but found T_END at character 23"),
        "{out}"
    );
    assert_eq!(o.count(), 0);
}

#[test]
fn schema_errors_in_the_plugin_config_are_refused() {
    let o = Origin::start();
    let e = Gw::try_start(json!({"routes": [route("r1", "/v", &o, json!({"request-validation": {"rejected_code": 400}}))]}))
        .err()
        .expect("refused");
    assert!(e.contains("request-validation"), "{e}");
}

#[test]
fn loggers_include_req_body_reads_the_body_for_the_log() {
    let o = Origin::start();
    let path = std::env::temp_dir().join(format!("sluice-req-body-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().unwrap();
    let gw = Gw::start(json!({"routes": [
        route("r1", "/with", &o, json!({"file-logger": {"path": p, "include_req_body": true}})),
        route("r2", "/without", &o, json!({"file-logger": {"path": p}}))
    ]}));
    let r = request(gw.addr, "POST", "/with", &[], r#"{"k": "v"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(o.last().body, r#"{"k": "v"}"#, "still forwarded");
    assert_eq!(
        request(gw.addr, "POST", "/without", &[], "secret").status,
        200
    );
    let mut lines: Vec<serde_json::Value> = Vec::new();
    let t0 = std::time::Instant::now();
    while lines.len() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        lines = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    }
    let with = lines
        .iter()
        .find(|l| l["route_id"] == "r1")
        .expect("r1 line");
    assert_eq!(with["request"]["body"], r#"{"k": "v"}"#, "{with}");
    let without = lines
        .iter()
        .find(|l| l["route_id"] == "r2")
        .expect("r2 line");
    assert!(without["request"].get("body").is_none(), "{without}");
    let _ = std::fs::remove_file(&path);
}
