//! proxy-rewrite, redirect, request-id, cors and fault-injection (APISIX docs/en/latest/plugins/<name>.md and
//! t/plugin/<name>.t).

use serde_json::json;

use crate::{request, route, Gw, Origin};

fn one(o: &Origin, uri: &str, plugins: serde_json::Value) -> Gw {
    Gw::start(json!({"routes": [route("r1", uri, o, plugins)]}))
}

#[test]
fn proxy_rewrite_uri_method_host_and_headers() {
    let o = Origin::start();
    let gw = one(
        &o,
        "/hello",
        json!({"proxy-rewrite": {"uri": "/test/home.html", "method": "POST", "host": "iresty.com",
            "headers": {"set": {"X-Api-Version": "v2", "X-Client": "$remote_addr"},
                        "add": {"X-Multi": "b"}, "remove": ["X-Drop"]}}}),
    );
    assert_eq!(
        gw.get(
            "/hello?a=1",
            &[("X-Drop", "x"), ("X-Multi", "a"), ("X-Api-Version", "v1")]
        )
        .status,
        200
    );
    let s = o.last();
    assert_eq!(s.target, "/test/home.html?a=1");
    assert_eq!(s.method, "POST");
    assert_eq!(s.header("host"), Some("iresty.com"));
    assert_eq!(s.header("x-api-version"), Some("v2"));
    assert_eq!(s.header("x-client"), Some("127.0.0.1"));
    assert_eq!(s.header("x-drop"), None);
    let multi: Vec<&str> = s
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-multi"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(multi, ["a", "b"]);
}

#[test]
fn proxy_rewrite_regex_uri_and_legacy_headers() {
    let o = Origin::start();
    let gw = one(
        &o,
        "/test/*",
        json!({"proxy-rewrite": {"regex_uri": ["^/test/(.*)/(.*)/(.*)", "/$1_$2_$3"], "headers": {"X-Legacy": "1"}}}),
    );
    assert_eq!(gw.get("/test/a/b/c", &[]).status, 200);
    assert_eq!(o.last().target, "/a_b_c");
    assert_eq!(o.last().header("x-legacy"), Some("1"));
    assert_eq!(gw.get("/test/nomatch", &[]).status, 200);
    assert_eq!(
        o.last().target,
        "/test/nomatch",
        "no match: the uri is kept"
    );
}

#[test]
fn redirect_uri_regex_and_http_to_https() {
    let o = Origin::start();
    let gw = one(
        &o,
        "/hello",
        json!({"redirect": {"uri": "/test/default.html?id=$arg_id", "ret_code": 301}}),
    );
    let r = gw.get("/hello?id=7", &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/test/default.html?id=7"));
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"redirect": {"uri": "/new", "append_query_string": true}}),
    );
    let r = gw.get("/hello?x=1", &[]);
    assert_eq!((r.status, r.header("location")), (302, Some("/new?x=1")));
    drop(gw);
    let gw = one(
        &o,
        "/hello*",
        json!({"redirect": {"regex_uri": ["^/hello/(.*)", "/world/$1"]}}),
    );
    assert_eq!(gw.get("/hello/x", &[]).header("location"), Some("/world/x"));
    assert_eq!(gw.get("/hellox", &[]).status, 200, "no match: proxied");
    drop(gw);
    let gw = one(&o, "/hello", json!({"redirect": {"http_to_https": true}}));
    let r = gw.get("/hello?a=b", &[("Host", "foo.com")]);
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("https://foo.com/hello?a=b"))
    );
    let r = request(gw.addr, "POST", "/hello", &[("Host", "foo.com")], "");
    assert_eq!(r.status, 308);
    assert_eq!(o.count(), 1);
}

#[test]
fn request_id_generated_kept_and_returned() {
    let o = Origin::start();
    let gw = one(&o, "/hello", json!({"request-id": {}}));
    let r = gw.get("/hello", &[]);
    let id = r
        .header("x-request-id")
        .expect("response carries the id")
        .to_owned();
    assert_eq!(id.len(), 36);
    assert_eq!(o.last().header("x-request-id"), Some(id.as_str()));
    let r = gw.get("/hello", &[("X-Request-Id", "given")]);
    assert_eq!(r.header("x-request-id"), Some("given"));
    assert_eq!(o.last().header("x-request-id"), Some("given"));
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"request-id": {"header_name": "X-Trace", "include_in_response": false, "algorithm": "range_id",
                               "range_id": {"char_set": "abcdef", "length": 8}}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(r.header("x-trace"), None);
    let t = o.last().header("x-trace").unwrap().to_owned();
    assert!(
        t.len() == 8 && t.chars().all(|c| "abcdef".contains(c)),
        "{t}"
    );
}

#[test]
fn cors_preflight_and_headers() {
    let o = Origin::start();
    let gw = one(&o, "/hello", json!({"cors": {}}));
    let r = request(
        gw.addr,
        "OPTIONS",
        "/hello",
        &[("Origin", "http://a.com")],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-methods"), Some("*"));
    assert_eq!(r.header("access-control-allow-headers"), Some("*"));
    assert_eq!(r.header("access-control-max-age"), Some("5"));
    assert_eq!(o.count(), 0, "preflight answered by the gateway");
    let r = gw.get("/hello", &[("Origin", "http://a.com")]);
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, Some("*"))
    );
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"cors": {"allow_origins": "http://a.com,https://b.com", "allow_methods": "**",
                        "allow_headers": "**", "expose_headers": "X-Ex", "max_age": 60, "allow_credential": true}}),
    );
    let r = gw.get(
        "/hello",
        &[
            ("Origin", "https://b.com"),
            ("Access-Control-Request-Headers", "X-A"),
        ],
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://b.com")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE")
    );
    assert_eq!(r.header("access-control-allow-headers"), Some("X-A"));
    assert_eq!(r.header("access-control-expose-headers"), Some("X-Ex"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = gw.get("/hello", &[("Origin", "http://evil.com")]);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let e = Gw::try_start(
        json!({"routes": [route("r1", "/a", &o, json!({"cors": {"allow_credential": true}}))]}),
    )
    .err()
    .unwrap();
    assert!(
        e.contains("you can not set '*' for other option when 'allow_credential' is true"),
        "{e}"
    );
}

#[test]
fn fault_injection_abort_with_vars_and_percentage() {
    let o = Origin::start();
    let gw = one(
        &o,
        "/hello",
        json!({"fault-injection": {"abort": {"http_status": 403, "body": "Fault Injection! $arg_name",
            "headers": {"X-Fault": "yes"}, "vars": [[["arg_name", "==", "jack"]]]}}}),
    );
    let r = gw.get("/hello?name=jack", &[]);
    assert_eq!((r.status, r.body.as_str()), (403, "Fault Injection! jack"));
    assert_eq!(r.header("x-fault"), Some("yes"));
    assert_eq!(gw.get("/hello?name=rose", &[]).status, 200);
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"fault-injection": {"abort": {"http_status": 500, "percentage": 0}}}),
    );
    for _ in 0..5 {
        assert_eq!(gw.get("/hello", &[]).status, 200);
    }
    drop(gw);
    let e = Gw::try_start(json!({"routes": [route("r1", "/a", &o, json!({"fault-injection": {"delay": {"duration": -1}}}))]}))
        .err()
        .unwrap();
    assert!(e.contains("duration"), "{e}");
}

#[test]
fn response_rewrite_headers_and_vars() {
    let o = Origin::start();
    let gw = one(
        &o,
        "/hello",
        json!({"response-rewrite": {"headers": {"set": {"X-Server-Id": "3", "X-Client": "$remote_addr"},
            "add": ["X-Extra: a"], "remove": ["X-Origin"]}}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-server-id"), Some("3"));
    assert_eq!(r.header("x-client"), Some("127.0.0.1"));
    assert_eq!(r.header("x-extra"), Some("a"));
    assert_eq!(r.header("x-origin"), None);
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"response-rewrite": {"headers": {"X-Only-500": "1"}, "vars": [["status", "==", 500]]}}),
    );
    assert_eq!(gw.get("/hello", &[]).header("x-only-500"), None);
    drop(gw);
    let gw = one(
        &o,
        "/hello",
        json!({"response-rewrite": {"headers": {"X-Only-200": "1"}, "vars": [["status", "==", 200]]}}),
    );
    assert_eq!(gw.get("/hello", &[]).header("x-only-200"), Some("1"));
    // body and filters are mutually exclusive (their behaviour is tested in body.rs).
    let e = Gw::try_start(json!({"routes": [route("r1", "/a", &o,
        json!({"response-rewrite": {"body": "x", "filters": [{"regex": "a", "replace": "b"}]}}))]}))
    .err()
    .unwrap();
    assert!(e.contains("dependent schema"), "{e}");
}
