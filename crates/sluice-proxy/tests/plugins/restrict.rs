//! ip-restriction, ua-restriction, referer-restriction, consumer-restriction and basic-auth (APISIX
//! docs/en/latest/plugins/<name>.md and t/plugin/<name>.t).

use serde_json::json;

use crate::{consumer, request, route, Gw, Origin};

fn one(o: &Origin, plugins: serde_json::Value) -> Gw {
    Gw::start(json!({"routes": [route("r1", "/hello", o, plugins)]}))
}

#[test]
fn ip_restriction_whitelist_blacklist_and_message() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"ip-restriction": {"whitelist": ["127.0.0.0/24", "::1"]}}),
    );
    assert_eq!(gw.get("/hello", &[]).status, 200);
    drop(gw);
    let gw = one(&o, json!({"ip-restriction": {"whitelist": ["10.0.0.1"]}}));
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "Your IP address is not allowed"}))
    );
    drop(gw);
    let gw = one(
        &o,
        json!({"ip-restriction": {"blacklist": ["127.0.0.1"], "message": "Do you want to do something bad?", "response_code": 404}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (404, json!({"message": "Do you want to do something bad?"}))
    );
    assert!(Gw::try_start(json!({"routes": [route("r1", "/a", &o, json!({"ip-restriction": {"whitelist": ["300.1.1.1"]}}))]})).is_err());
    assert!(Gw::try_start(
        json!({"routes": [route("r1", "/a", &o, json!({"ip-restriction": {}}))]})
    )
    .is_err());
}

#[test]
fn ua_restriction_lists_and_missing_agent() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"ua-restriction": {"denylist": ["my-bot1", "(Baiduspider)/(\\d+)\\.(\\d+)"]}}),
    );
    assert_eq!(gw.get("/hello", &[("User-Agent", "curl/8")]).status, 200);
    let r = gw.get("/hello", &[("User-Agent", "Baiduspider/3.0")]);
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "Not allowed"}))
    );
    assert_eq!(
        gw.get("/hello", &[("User-Agent", "x my-bot1 y")]).status,
        403
    );
    assert_eq!(
        gw.get("/hello", &[]).status,
        403,
        "missing User-Agent is refused by default"
    );
    drop(gw);
    let gw = one(
        &o,
        json!({"ua-restriction": {"allowlist": ["my-bot1"], "denylist": ["bot"], "bypass_missing": true, "message": "no"}}),
    );
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(
        gw.get("/hello", &[("User-Agent", "my-bot1")]).status,
        200,
        "allowlist wins"
    );
    let r = gw.get("/hello", &[("User-Agent", "other-bot")]);
    assert_eq!((r.status, r.json()), (403, json!({"message": "no"})));
}

#[test]
fn referer_restriction_hosts_and_wildcards() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"referer-restriction": {"whitelist": ["xx.com", "*.xx.com"]}}),
    );
    assert_eq!(
        gw.get("/hello", &[("Referer", "http://xx.com/x")]).status,
        200
    );
    assert_eq!(
        gw.get("/hello", &[("Referer", "https://yy.xx.com:8080/x")])
            .status,
        200
    );
    let r = gw.get("/hello", &[("Referer", "http://yy.com/x")]);
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "Your referer host is not allowed"}))
    );
    assert_eq!(gw.get("/hello", &[]).status, 403);
    assert_eq!(gw.get("/hello", &[("Referer", "garbage")]).status, 403);
    drop(gw);
    let gw = one(
        &o,
        json!({"referer-restriction": {"blacklist": ["*.bad.com"], "bypass_missing": true}}),
    );
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(
        gw.get("/hello", &[("Referer", "http://a.bad.com")]).status,
        403
    );
    assert_eq!(
        gw.get("/hello", &[("Referer", "http://good.com")]).status,
        200
    );
}

fn with_consumers(o: &Origin, plugins: serde_json::Value) -> Gw {
    Gw::start(json!({
        "routes": [route("r1", "/hello", o, plugins)],
        "consumers": [
            consumer("jack1", json!({"basic-auth": {"username": "jack2019", "password": "123456"}})),
            consumer("jack2", json!({"basic-auth": {"username": "jack2020", "password": "123456"}}))
        ]
    }))
}

// base64("jack2019:123456"), base64("jack2020:123456"), base64("jack2019:wrong")
const JACK1: &str = "Basic amFjazIwMTk6MTIzNDU2";
const JACK2: &str = "Basic amFjazIwMjA6MTIzNDU2";
const WRONG: &str = "Basic amFjazIwMTk6d3Jvbmc=";

#[test]
fn basic_auth_errors_and_hidden_credentials() {
    let o = Origin::start();
    let gw = with_consumers(&o, json!({"basic-auth": {}}));
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Missing authorization in request"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Basic realm='.'"));
    let r = gw.get("/hello", &[("Authorization", "Bearer x")]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Invalid authorization in request"}))
    );
    let r = gw.get("/hello", &[("Authorization", WRONG)]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Invalid user authorization"}))
    );
    assert_eq!(gw.get("/hello", &[("Authorization", JACK1)]).status, 200);
    assert_eq!(o.last().header("authorization"), Some(JACK1));
    assert_eq!(o.last().header("x-consumer-username"), Some("jack1"));
    drop(gw);
    let gw = with_consumers(&o, json!({"basic-auth": {"hide_credentials": true}}));
    assert_eq!(gw.get("/hello", &[("Authorization", JACK2)]).status, 200);
    assert_eq!(o.last().header("authorization"), None);
}

#[test]
fn consumer_restriction_by_name_and_method() {
    let o = Origin::start();
    let gw = with_consumers(
        &o,
        json!({"basic-auth": {}, "consumer-restriction": {"whitelist": ["jack1"]}}),
    );
    assert_eq!(gw.get("/hello", &[("Authorization", JACK1)]).status, 200);
    let r = gw.get("/hello", &[("Authorization", JACK2)]);
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "The consumer_name is forbidden."}))
    );
    drop(gw);
    let gw = with_consumers(
        &o,
        json!({"basic-auth": {}, "consumer-restriction": {"blacklist": ["jack1"], "rejected_code": 401, "rejected_msg": "go away"}}),
    );
    let r = gw.get("/hello", &[("Authorization", JACK1)]);
    assert_eq!((r.status, r.json()), (401, json!({"message": "go away"})));
    assert_eq!(gw.get("/hello", &[("Authorization", JACK2)]).status, 200);
    drop(gw);
    let gw = with_consumers(
        &o,
        json!({"basic-auth": {}, "consumer-restriction": {"allowed_by_methods": [{"user": "jack1", "methods": ["POST"]}]}}),
    );
    assert_eq!(gw.get("/hello", &[("Authorization", JACK1)]).status, 403);
    assert_eq!(gw.get("/hello", &[("Authorization", JACK2)]).status, 200);
    drop(gw);
    // Without an auth plugin there is no consumer.
    let gw = one(
        &o,
        json!({"consumer-restriction": {"whitelist": ["jack1"]}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (
            401,
            json!({"message": "Missing authentication or identity verification."})
        )
    );
}

#[test]
fn consumer_restriction_by_service_and_consumer_group() {
    let o = Origin::start();
    let mut svc_route = route("r1", "/hello", &o, json!({}));
    svc_route["service_id"] = json!("s1");
    let mut other = route("r2", "/other", &o, json!({}));
    other["service_id"] = json!("s2");
    let by_service = json!({"basic-auth": {}, "consumer-restriction": {"type": "service_id", "whitelist": ["s1"]}});
    let mut jack1 = consumer(
        "jack1",
        json!({"basic-auth": {"username": "jack2019", "password": "123456"}}),
    );
    jack1["group_id"] = json!("gold");
    let gw = Gw::start(json!({
        "services": [{"id": "s1", "plugins": by_service}, {"id": "s2", "plugins": by_service}],
        "routes": [svc_route, other],
        "consumer_groups": [{"id": "gold", "plugins": {}}],
        "consumers": [
            jack1,
            consumer("jack2", json!({"basic-auth": {"username": "jack2020", "password": "123456"}}))
        ]
    }));
    assert_eq!(gw.get("/hello", &[("Authorization", JACK2)]).status, 200);
    let r = gw.get("/other", &[("Authorization", JACK2)]);
    assert_eq!(
        (r.status, r.json()),
        (403, json!({"message": "The service_id is forbidden."}))
    );
    drop(gw);
    // consumer_group_id: jack1 is in "gold", jack2 in no group (401 as for a missing consumer).
    let mut jack1 = consumer(
        "jack1",
        json!({"basic-auth": {"username": "jack2019", "password": "123456"}}),
    );
    jack1["group_id"] = json!("gold");
    let gw = Gw::start(json!({
        "routes": [route("r1", "/hello", &o, json!({"basic-auth": {}, "consumer-restriction": {"type": "consumer_group_id", "blacklist": ["gold"]}}))],
        "consumer_groups": [{"id": "gold", "plugins": {}}],
        "consumers": [
            jack1,
            consumer("jack2", json!({"basic-auth": {"username": "jack2020", "password": "123456"}}))
        ]
    }));
    let r = gw.get("/hello", &[("Authorization", JACK1)]);
    assert_eq!(
        (r.status, r.json()),
        (
            403,
            json!({"message": "The consumer_group_id is forbidden."})
        )
    );
    assert_eq!(gw.get("/hello", &[("Authorization", JACK2)]).status, 401);
}

#[test]
fn real_ip_feeds_ip_restriction_and_limit_keys() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"real-ip": {"source": "http_x_forwarded_for", "trusted_addresses": ["127.0.0.0/24"]},
               "ip-restriction": {"blacklist": ["10.0.0.1"]},
               "limit-count": {"count": 1, "time_window": 60}}),
    );
    let r = gw.get("/hello", &[("X-Forwarded-For", "10.0.0.1")]);
    assert_eq!(r.status, 403, "the forwarded address is the client");
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.0.0.2")]).status,
        200
    );
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.0.0.3")]).status,
        200,
        "limit keyed by real ip"
    );
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.0.0.3")]).status,
        503
    );
    drop(gw);
    // An untrusted peer's header is ignored.
    let gw = one(
        &o,
        json!({"real-ip": {"source": "http_x_forwarded_for", "trusted_addresses": ["192.168.0.0/16"]},
               "ip-restriction": {"blacklist": ["10.0.0.1"]}}),
    );
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.0.0.1")]).status,
        200
    );
    drop(gw);
    // recursive: the last untrusted address in the list.
    let gw = one(
        &o,
        json!({"real-ip": {"source": "http_x_forwarded_for", "trusted_addresses": ["127.0.0.1", "10.1.0.0/16"], "recursive": true},
               "ip-restriction": {"whitelist": ["10.9.9.9"]}}),
    );
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.9.9.9, 10.1.0.5")])
            .status,
        200
    );
    assert_eq!(
        gw.get("/hello", &[("X-Forwarded-For", "10.9.9.8, 10.1.0.5")])
            .status,
        403
    );
}

#[test]
fn request_validation_header_schema() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"request-validation": {"header_schema": {"type": "object", "required": ["x-token"],
            "properties": {"x-token": {"type": "string", "minLength": 3}}}}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("x-token"), "{}", r.body);
    assert_eq!(gw.get("/hello", &[("X-Token", "ab")]).status, 400);
    assert_eq!(gw.get("/hello", &[("X-Token", "abc")]).status, 200);
    drop(gw);
    let gw = one(
        &o,
        json!({"request-validation": {"header_schema": {"type": "object", "required": ["x-token"]},
            "rejected_code": 403, "rejected_msg": "customize reject message"}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (403, "customize reject message")
    );
    // body_schema is covered by validation.rs.
}

/// APISIX t/plugin/uri-blocker.t: rules joined and searched in the URI with its query, 403 page or
/// `{"error_msg"}`, case_insensitive; and, as an attacker would try, encoded spellings of a blocked path.
#[test]
fn uri_blocker_rules_messages_and_encoded_spellings() {
    let o = Origin::start();
    let prefix = |plugins| Gw::start(json!({"routes": [route("r1", "/hello*", &o, plugins)]}));
    let gw =
        prefix(json!({"uri-blocker": {"block_rules": ["^/hello/admin", "root\\.exe", "\\.\\./"]}}));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    let seen = o.count();
    let r = gw.get("/hello/admin", &[]);
    assert_eq!(r.status, 403);
    assert!(r.body.contains("403 Forbidden"), "{}", r.body);
    assert_eq!(
        gw.get("/hello?x=root.exe", &[]).status,
        403,
        "the query counts"
    );
    assert_eq!(
        gw.get("/hello/ROOT.EXE", &[]).status,
        200,
        "case-sensitive by default"
    );
    for spelling in [
        "/hello/%61dmin",
        "/hello/./admin",
        "/hello//admin",
        "/hello/x/../admin",
    ] {
        assert_eq!(gw.get(spelling, &[]).status, 403, "{spelling}");
    }
    assert_eq!(
        gw.get("/hello/a/../b", &[]).status,
        403,
        "a raw-form rule still matches"
    );
    assert_eq!(
        o.count(),
        seen + 1,
        "only the one allowed request reached the upstream"
    );
    drop(gw);

    let gw = prefix(
        json!({"uri-blocker": {"block_rules": ["root.exe"], "case_insensitive": true,
                               "rejected_code": 410, "rejected_msg": "access is not allowed"}}),
    );
    let r = gw.get("/hello/ROOT.exe", &[]);
    assert_eq!(
        (r.status, r.json()),
        (410, json!({"error_msg": "access is not allowed"}))
    );
    drop(gw);

    for bad in [
        json!({}),
        json!({"block_rules": ["a", "a"]}),
        json!({"block_rules": [""]}),
        json!({"block_rules": ["(unclosed"]}),
        json!({"block_rules": ["a"], "rejected_code": 199}),
        json!({"block_rules": ["a"], "rejected_code": 600}),
    ] {
        let r = route("r1", "/hello", &o, json!({"uri-blocker": bad}));
        assert!(
            Gw::try_start(json!({"routes": [r]})).is_err(),
            "{bad} must be refused"
        );
    }
}

/// APISIX t/plugin/csrf.t: the cookie on every answer, GET passes, other methods need the same token in header and
/// cookie, APISIX's 401 texts; and, as an attacker would try, a token signed by another key or with its life
/// stretched.
#[test]
fn csrf_double_submit_tokens() {
    let o = Origin::start();
    let gw = one(
        &o,
        json!({"csrf": {"key": "userkey", "expires": 1000000000}}),
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 200);
    let set = r.header("set-cookie").expect("Set-Cookie").to_owned();
    let (pair, attrs) = set.split_once(';').expect("attributes");
    assert!(attrs.starts_with("path=/;Expires="), "{set}");
    assert!(attrs.ends_with(" GMT"), "{set}");
    let token = pair
        .strip_prefix("apisix-csrf-token=")
        .expect("name")
        .to_owned();
    let cookie = format!("apisix-csrf-token={token}");
    let post = |headers: &[(&str, &str)]| request(gw.addr, "POST", "/hello", headers, "x");

    let seen = o.count();
    let cases: [(&[(&str, &str)], &str); 3] = [
        (&[], "no csrf token in headers"),
        (&[("apisix-csrf-token", &token)], "no csrf cookie"),
        (
            &[("apisix-csrf-token", "other"), ("Cookie", &cookie)],
            "csrf token mismatch",
        ),
    ];
    for (headers, msg) in cases {
        let r = post(headers);
        assert_eq!((r.status, r.json()), (401, json!({"error_msg": msg})));
    }
    let forged = {
        let other = one(&o, json!({"csrf": {"key": "not-the-key"}}));
        let set = other
            .get("/hello", &[])
            .header("set-cookie")
            .unwrap()
            .to_owned();
        set.split(';')
            .next()
            .unwrap()
            .trim_start_matches("apisix-csrf-token=")
            .to_owned()
    };
    let forged_cookie = format!("apisix-csrf-token={forged}");
    let r = post(&[("apisix-csrf-token", &forged), ("Cookie", &forged_cookie)]);
    assert_eq!(
        (r.status, r.json()),
        (
            401,
            json!({"error_msg": "Failed to verify the csrf token signature"})
        )
    );
    assert_eq!(
        o.count(),
        seen + 1,
        "only the other gateway's GET reached the upstream"
    );

    let r = post(&[("Apisix-Csrf-Token", &token), ("Cookie", &cookie)]);
    assert_eq!(r.status, 200, "{}", r.body);
    drop(gw);

    // A token past its end is refused even though its signature holds.
    let gw = one(&o, json!({"csrf": {"key": "userkey", "expires": -1}}));
    let set = gw
        .get("/hello", &[])
        .header("set-cookie")
        .unwrap()
        .to_owned();
    let token = set
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("apisix-csrf-token=")
        .to_owned();
    let cookie = format!("apisix-csrf-token={token}");
    let r = request(
        gw.addr,
        "POST",
        "/hello",
        &[("apisix-csrf-token", &token), ("Cookie", &cookie)],
        "x",
    );
    assert_eq!(r.status, 401);
}

/// APISIX t/plugin/api-breaker.t: every `failures`-th unhealthy answer opens the breaker for 2^n seconds (the
/// upstream is not asked meanwhile), `successes` healthy answers close it and forget the count; counts are per
/// host + URI (the query is not part of the key).
#[test]
fn api_breaker_opens_after_failures_and_closes_after_successes() {
    let o = Origin::start();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/b/*", &o, json!({"api-breaker": {
            "break_response_code": 502,
            "break_response_body": "{\"message\":\"breaker open\"}",
            "break_response_headers": [{"key": "X-Breaker", "value": "open for $uri"}],
            "unhealthy": {"http_statuses": [500, 503], "failures": 2},
            "healthy": {"http_statuses": [200], "successes": 2}
        }}))]}),
    );
    assert_eq!(gw.get_logged("/b/x?code=500", &[]).status, 500);
    assert_eq!(
        gw.get_logged("/b/y?code=500", &[]).status,
        500,
        "another URI is counted apart"
    );
    assert_eq!(
        gw.get_logged("/b/x?code=503", &[]).status,
        503,
        "the 2nd failure opens the breaker"
    );
    let seen = o.count();
    let r = gw.get_logged("/b/x", &[]);
    assert_eq!(
        (r.status, r.body.as_str(), r.header("x-breaker")),
        (502, "{\"message\":\"breaker open\"}", Some("open for /b/x"))
    );
    assert_eq!(o.count(), seen, "an open breaker does not ask the upstream");
    assert_eq!(
        gw.get_logged("/b/y", &[]).status,
        200,
        "/b/y had one failure only"
    );
    // 2^1 seconds later requests go through again (APISIX's check is `opened + 2 >= now`, in whole seconds).
    let waited = std::time::Instant::now();
    while gw.get_logged("/b/x", &[]).status == 502 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "the breaker never let a request through"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // That request succeeded: one success of two. One more closes the breaker and forgets the count, so two new
    // failures open it for 2 s again, not for 4.
    assert_eq!(gw.get_logged("/b/x", &[]).status, 200);
    assert_eq!(gw.get_logged("/b/x?code=500", &[]).status, 500);
    assert_eq!(gw.get_logged("/b/x?code=500", &[]).status, 500);
    assert_eq!(
        gw.get_logged("/b/x", &[]).status,
        502,
        "open again after two more failures"
    );
    let reopened = std::time::Instant::now();
    while gw.get_logged("/b/x", &[]).status == 502 {
        assert!(
            reopened.elapsed() < std::time::Duration::from_secs(10),
            "stuck open"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        reopened.elapsed() < std::time::Duration::from_millis(3900),
        "2 s after a reset, not 4: {:?}",
        reopened.elapsed()
    );
    drop(gw);

    let gw = one(&o, json!({"api-breaker": {"break_response_code": 599}}));
    for _ in 0..3 {
        assert_eq!(gw.get_logged("/hello", &[]).status, 200);
    }
    let bad = [
        json!({}),
        json!({"break_response_code": 199}),
        json!({"break_response_code": 502, "max_breaker_sec": 2}),
        json!({"break_response_code": 502, "unhealthy": {"http_statuses": [404]}}),
        json!({"break_response_code": 502, "healthy": {"http_statuses": [500]}}),
        json!({"break_response_code": 502, "break_response_headers": [{"key": "x"}]}),
    ];
    for b in bad {
        let r = route("r1", "/hello", &o, json!({"api-breaker": b}));
        assert!(
            Gw::try_start(json!({"routes": [r]})).is_err(),
            "{b} must be refused"
        );
    }
}
