//! mocking through the real proxy (APISIX docs/en/latest/plugins/mocking.md, t/plugin/mocking.t): the answer is
//! the plugin's, and the origin behind the route must see nothing.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{route, Gw, Origin};

fn gw(o: &Origin, plugins: Value) -> Gw {
    Gw::start(json!({"routes": [route("1", "/hello", o, plugins)]}))
}

#[test]
fn example_status_headers_and_vars_without_the_upstream() {
    let o = Origin::start();
    let g = gw(
        &o,
        json!({"mocking": {
            "response_status": 201,
            "content_type": "text/plain",
            "response_example": "remote_addr:$remote_addr empty_var:$foo uri:$uri",
            "response_headers": {"X-Apisix": "is, cool", "X-Route-Id": "$route_id", "X-Num": 100}
        }}),
    );
    for _ in 0..3 {
        let r = g.get("/hello?a=1", &[]);
        assert_eq!(r.status, 201, "{r:?}");
        assert_eq!(r.body, "remote_addr:127.0.0.1 empty_var: uri:/hello");
        assert_eq!(r.header("content-type"), Some("text/plain"));
        assert_eq!(r.header("x-mock-by"), Some("APISIX/3.15.0"));
        assert_eq!(r.header("x-apisix"), Some("is, cool"));
        assert_eq!(r.header("x-route-id"), Some("1"));
        assert_eq!(r.header("x-num"), Some("100"));
    }
    // A POST with a body is answered too, and its body goes nowhere.
    let r = crate::request(g.addr, "POST", "/hello", &[], "secret=1");
    assert_eq!(r.status, 201);
    assert_eq!(o.count(), 0, "the upstream was contacted");
}

#[test]
fn defaults_and_no_mock_header() {
    let o = Origin::start();
    let g = gw(&o, json!({"mocking": {"response_example": "{\"a\":1}"}}));
    let r = g.get("/hello", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "{\"a\":1}"));
    assert_eq!(
        r.header("content-type"),
        Some("application/json;charset=utf8")
    );
    assert_eq!(r.header("content-length"), Some("7"));
    drop(g);
    let g = gw(
        &o,
        json!({"mocking": {"response_example": "x", "with_mock_header": false}}),
    );
    let r = g.get("/hello", &[]);
    assert_eq!(r.body, "x");
    assert!(r.header("x-mock-by").is_none(), "{r:?}");
    assert_eq!(o.count(), 0);
}

#[test]
fn schema_bodies_as_json_and_xml() {
    let o = Origin::start();
    let schema = json!({"type": "object", "properties": {
        "id": {"type": "string", "example": "abcd"},
        "ip": {"type": "number", "example": 192.168},
        "random_str_arr": {"type": "array", "items": {"type": "string"}},
        "nested": {"type": "object", "properties": {"flag": {"type": "boolean", "example": true},
                   "ints": {"type": "array", "items": {"type": "integer", "example": 155}}}}
    }});
    let g = gw(&o, json!({"mocking": {"response_schema": schema}}));
    let r = g.get("/hello", &[]);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["id"], "abcd");
    assert_eq!(v["ip"], 192.168);
    assert_eq!(v["nested"]["flag"], true);
    let strs = v["random_str_arr"].as_array().expect("array");
    assert!((1..=3).contains(&strs.len()), "{v}");
    assert!(strs.iter().all(|s| {
        s.as_str().is_some_and(|s| {
            (1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase())
        })
    }));
    let ints = v["nested"]["ints"].as_array().expect("array");
    assert!(!ints.is_empty() && ints.iter().all(|i| i == 155), "{v}");
    drop(g);

    let g = gw(
        &o,
        json!({"mocking": {"content_type": "application/xml", "response_schema":
            {"type": "object", "properties": {"id": {"type": "string", "example": "a&b"},
                                              "n": {"type": "integer", "example": 4}}}}}),
    );
    let r = g.get("/hello", &[]);
    assert_eq!(r.body, "<data><id>a&amp;b</id><n>4</n></data>");
    assert_eq!(r.header("content-type"), Some("application/xml"));
    assert_eq!(o.count(), 0);
}

#[test]
fn route_without_upstream() {
    let g = Gw::start(json!({"routes": [{"id": "1", "uri": "/hello",
        "plugins": {"mocking": {"response_example": "hello world", "content_type": "text/plain"}}}]}));
    let r = g.get("/hello", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello world"));
    drop(g);
    // As APISIX: such a route is accepted, and a request no plugin answers gets 503.
    let g = Gw::start(json!({"routes": [{"id": "1", "uri": "/hello",
        "plugins": {"mocking": {"response_example": "x",
                                "_meta": {"filter": [["arg_mock", "==", "1"]]}}}}]}));
    assert_eq!(g.get("/hello?mock=1", &[]).body, "x");
    assert_eq!(g.get("/hello", &[]).status, 503);
    // Without plugins it is still refused.
    let err = Gw::try_start(json!({"routes": [{"id": "1", "uri": "/hello"}]})).err();
    assert!(err.is_some_and(|e| e.contains("missing upstream configuration")));
}

#[test]
fn delay_is_waited_before_the_answer() {
    let o = Origin::start();
    let g = gw(
        &o,
        json!({"mocking": {"response_example": "late", "delay": 1}}),
    );
    let t = Instant::now();
    let r = g.get("/hello", &[]);
    let took = t.elapsed();
    assert_eq!(r.body, "late");
    assert!(took >= Duration::from_millis(995), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(o.count(), 0);
}

#[test]
fn bad_configurations_are_refused() {
    let o = Origin::start();
    for (conf, msg) in [
        (
            json!({"response_example": "x", "content_type": "image/png"}),
            "unsupported content type!",
        ),
        (json!({"content_type": "text/plain"}), "required"),
        (
            json!({"response_example": "x", "response_status": 99}),
            "at least 100",
        ),
    ] {
        let err =
            Gw::try_start(json!({"routes": [route("1", "/hello", &o, json!({"mocking": conf}))]}))
                .err()
                .expect("refused");
        assert!(err.contains(msg), "{err}");
    }
}
