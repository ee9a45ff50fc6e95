//! key-auth and the consumer merge (APISIX docs/en/latest/plugins/key-auth.md, t/plugin/key-auth.t,
//! `merge_consumer_route`), plus `_meta`.

use serde_json::json;

use crate::{consumer, route, Gw, Origin};

fn two_consumers(origin: &Origin, route_plugins: serde_json::Value) -> serde_json::Value {
    json!({
        "routes": [route("r1", "/hello", origin, route_plugins)],
        "consumers": [
            consumer("jack", json!({"key-auth": {"key": "auth-one"}})),
            consumer("rose", json!({"key-auth": {"key": "auth-two"},
                                    "limit-count": {"count": 1, "time_window": 60, "rejected_code": 429}})),
        ]
    })
}

#[test]
fn key_auth_errors_match_apisix() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(&o, json!({"key-auth": {}})));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json(), json!({"message": "Missing API key in request"}));
    assert!(r
        .header("content-type")
        .unwrap()
        .contains("application/json"));
    // APISIX 3.15+: every key-auth 401 carries the challenge, realm "key" unless configured.
    assert_eq!(r.header("www-authenticate"), Some("apikey realm=\"key\""));
    let r = gw.get("/hello", &[("apikey", "nope")]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json(), json!({"message": "Invalid API key in request"}));
    assert_eq!(r.header("www-authenticate"), Some("apikey realm=\"key\""));
    assert_eq!(o.count(), 0, "rejected requests never reach the origin");
    drop(gw);
    let gw = Gw::start(two_consumers(&o, json!({"key-auth": {"realm": "shop"}})));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.header("www-authenticate"), Some("apikey realm=\"shop\""));
    let r = gw.get("/hello", &[("apikey", "auth-one")]);
    assert_eq!((r.status, r.header("www-authenticate")), (200, None));
}

/// Keys are compared as the bytes sent: a valid key with obs-text or a NUL-free byte appended, a prefix, another
/// case or a key split across two header lines identifies nobody; only the exact key (header or query) passes.
#[test]
fn key_auth_matches_the_exact_key_bytes_only() {
    use std::io::{Read, Write};
    let o = Origin::start();
    let gw = Gw::start(two_consumers(&o, json!({"key-auth": {}})));
    let raw = |key_lines: &[u8]| {
        let mut c = std::net::TcpStream::connect(gw.addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut req = b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n".to_vec();
        req.extend_from_slice(key_lines);
        req.extend_from_slice(b"\r\n");
        c.write_all(&req).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    for bad in [
        &b"apikey: auth-one\xff\r\n"[..],
        b"apikey: auth-one\x80\x80\r\n",
        b"apikey: \xffauth-one\r\n",
        b"apikey: auth-on\r\n",
        b"apikey: AUTH-ONE\r\n",
        b"apikey: auth-one-\r\n",
        b"apikey: auth\r\napikey: -one\r\n",
    ] {
        let r = raw(bad);
        assert!(
            r.starts_with("HTTP/1.1 401 ") && r.contains("Invalid API key in request"),
            "{:?} -> {r}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(o.count(), 0, "rejected requests never reach the origin");
    assert!(raw(b"apikey: auth-one\r\n").starts_with("HTTP/1.1 200 "));
    assert_eq!(gw.get("/hello?apikey=auth-two", &[]).status, 200);
    assert_eq!(gw.get("/hello?apikey=auth-tw", &[]).status, 401);
}

/// APISIX 3.11+ credentials (`/consumers/{name}/credentials/{id}`) identify their consumer exactly as the
/// consumer's own auth objects do: key-auth, basic-auth, jwt-auth and hmac-auth each authenticate as jack, and
/// consumer-restriction sees jack's name. A credential whose consumer is gone identifies nobody.
#[test]
fn credentials_authenticate_as_their_consumer() {
    use sluice_plugins::hmac_auth::sign;
    use sluice_plugins::jwt_auth::sign_hs256;
    let o = Origin::start();
    let cred = |consumer: &str, id: &str, plugins: serde_json::Value| json!({"id": id, "consumer": consumer, "plugins": plugins});
    let gw = Gw::start(json!({
        "routes": [
            route("k", "/k", &o, json!({"key-auth": {}, "consumer-restriction": {"whitelist": ["jack"]}})),
            route("b", "/b", &o, json!({"basic-auth": {}})),
            route("j", "/j", &o, json!({"jwt-auth": {}})),
            route("h", "/h", &o, json!({"hmac-auth": {}})),
        ],
        "consumers": [
            consumer("jack", json!({})),
            consumer("rose", json!({"key-auth": {"key": "rose-key"}})),
        ],
        "credentials": [
            cred("jack", "c-key", json!({"key-auth": {"key": "jack-key"}})),
            cred("jack", "c-key2", json!({"key-auth": {"key": "jack-key-2"}})),
            cred("jack", "c-basic", json!({"basic-auth": {"username": "jb", "password": "pw"}})),
            cred("jack", "c-jwt", json!({"jwt-auth": {"key": "jack-jwt", "secret": "jack-secret"}})),
            cred("jack", "c-hmac", json!({"hmac-auth": {"key_id": "jack-hmac", "secret_key": "jack-hmac-secret"}})),
            cred("ghost", "c-ghost", json!({"key-auth": {"key": "ghost-key"}})),
        ]
    }));
    for key in ["jack-key", "jack-key-2"] {
        let r = gw.get("/k", &[("apikey", key)]);
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        assert_eq!(o.last().header("x-consumer-username"), Some("jack"));
    }
    // consumer-restriction judges the credential's consumer.
    let r = gw.get("/k", &[("apikey", "rose-key")]);
    assert_eq!(r.status, 403, "{}", r.body);
    let r = gw.get("/k", &[("apikey", "ghost-key")]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Invalid API key in request"}))
    );

    // "jb:pw"
    let r = gw.get("/b", &[("Authorization", "Basic amI6cHc=")]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(o.last().header("x-consumer-username"), Some("jack"));

    let token = sign_hs256(
        &json!({"key": "jack-jwt", "exp": now() + 600}),
        "jack-secret",
    );
    let r = gw.get("/j", &[("Authorization", &token)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(o.last().header("x-consumer-username"), Some("jack"));

    let date = http_date(now());
    let auth = sign(
        "jack-hmac",
        "jack-hmac-secret",
        "hmac-sha256",
        &[("@request-target", "GET /h")],
    );
    let r = gw.get("/h", &[("Date", &date), ("Authorization", &auth)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(o.last().header("x-consumer-username"), Some("jack"));
}

#[test]
fn key_auth_header_and_query_reach_origin_unless_hidden() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(&o, json!({"key-auth": {}})));
    let r = gw.get("/hello", &[("apikey", "auth-one")]);
    assert_eq!((r.status, r.body.as_str()), (200, "origin"));
    let seen = o.last();
    assert_eq!(seen.header("apikey"), Some("auth-one"));
    assert_eq!(seen.header("x-consumer-username"), Some("jack"));
    let r = gw.get("/hello?a=1&apikey=auth-one", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(o.last().target, "/hello?a=1&apikey=auth-one");
    drop(gw);

    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {"hide_credentials": true}}),
    ));
    assert_eq!(gw.get("/hello", &[("apikey", "auth-one")]).status, 200);
    assert_eq!(o.last().header("apikey"), None);
    assert_eq!(gw.get("/hello?a=1&apikey=auth-one&b=2", &[]).status, 200);
    assert_eq!(o.last().target, "/hello?a=1&b=2");
    assert_eq!(gw.get("/hello?apikey=auth-one", &[]).status, 200);
    assert_eq!(o.last().target, "/hello");
}

#[test]
fn key_auth_custom_header_and_query_names() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {"header": "Authorization", "query": "auth"}}),
    ));
    assert_eq!(
        gw.get("/hello", &[("Authorization", "auth-one")]).status,
        200
    );
    assert_eq!(gw.get("/hello?auth=auth-two", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[("apikey", "auth-one")]).status, 401);
}

#[test]
fn anonymous_consumer_is_used_without_a_valid_key() {
    let o = Origin::start();
    let mut cfg = two_consumers(&o, json!({"key-auth": {"anonymous_consumer": "anon"}}));
    cfg["consumers"].as_array_mut().unwrap().push(consumer(
        "anon",
        json!({"limit-count": {"count": 2, "time_window": 60, "rejected_code": 403}}),
    ));
    let gw = Gw::start(cfg);
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(o.last().header("x-consumer-username"), Some("anon"));
    assert_eq!(gw.get("/hello", &[("apikey", "bad")]).status, 200);
    assert_eq!(
        gw.get("/hello", &[]).status,
        403,
        "the anonymous consumer's own limit applies"
    );
    assert_eq!(gw.get("/hello", &[("apikey", "auth-one")]).status, 200);
    // A missing anonymous consumer fails the compile.
    assert!(Gw::try_start(two_consumers(
        &o,
        json!({"key-auth": {"anonymous_consumer": "ghost"}})
    ))
    .is_err());
}

#[test]
fn consumer_plugins_merge_after_auth() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(&o, json!({"key-auth": {}})));
    let r = gw.get("/hello", &[("apikey", "auth-two")]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(gw.get("/hello", &[("apikey", "auth-two")]).status, 429);
    // jack has no limit of his own.
    for _ in 0..3 {
        let r = gw.get("/hello", &[("apikey", "auth-one")]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }
}

#[test]
fn consumer_plugin_replaces_the_routes_plugin_of_the_same_name() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {}, "limit-count": {"count": 5, "time_window": 60}}),
    ));
    assert_eq!(
        gw.get("/hello", &[("apikey", "auth-two")])
            .header("x-ratelimit-limit"),
        Some("1")
    );
    assert_eq!(
        gw.get("/hello", &[("apikey", "auth-one")])
            .header("x-ratelimit-limit"),
        Some("5")
    );
}

#[test]
fn key_auth_in_a_global_rule() {
    let o = Origin::start();
    let mut cfg = two_consumers(&o, json!({}));
    cfg["global_rules"] = json!([{"id": "g1", "plugins": {"key-auth": {}}}]);
    let gw = Gw::start(cfg);
    assert_eq!(gw.get("/hello", &[]).status, 401);
    assert_eq!(gw.get("/hello", &[("apikey", "auth-one")]).status, 200);
    assert_eq!(gw.get("/hello", &[("apikey", "auth-two")]).status, 200);
    assert_eq!(gw.get("/hello", &[("apikey", "auth-two")]).status, 429);
}

#[test]
fn meta_disable_error_response_and_filter() {
    let o = Origin::start();
    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {"_meta": {"disable": true}}}),
    ));
    assert_eq!(
        gw.get("/hello", &[]).status,
        200,
        "disabled plugin does not run"
    );
    drop(gw);
    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {"_meta": {"error_response": {"message": "go away"}}}}),
    ));
    let r = gw.get("/hello", &[]);
    assert_eq!((r.status, r.json()), (401, json!({"message": "go away"})));
    drop(gw);
    let gw = Gw::start(two_consumers(
        &o,
        json!({"key-auth": {"_meta": {"filter": [["arg_secure", "==", "1"]]}}}),
    ));
    assert_eq!(
        gw.get("/hello", &[]).status,
        200,
        "filter does not match: plugin skipped"
    );
    assert_eq!(gw.get("/hello?secure=1", &[]).status, 401);
}

#[test]
fn invalid_plugin_configs_fail_the_compile_with_apisix_text() {
    let o = Origin::start();
    let e = Gw::try_start(
        json!({"routes": [route("r1", "/a", &o, json!({"limit-count": {"count": 1}}))]}),
    )
    .err()
    .unwrap();
    assert!(
        e.contains("failed to check the configuration of plugin limit-count"),
        "{e}"
    );
    assert!(e.contains("time_window"), "{e}");
    let e = Gw::try_start(json!({"routes": [route("r1", "/a", &o, json!({"no-such": {}}))]}))
        .err()
        .unwrap();
    assert!(e.contains("unknown plugin [no-such]"), "{e}");
}

fn jwt_cfg(origin: &Origin, plugins: serde_json::Value) -> serde_json::Value {
    json!({
        "routes": [route("r1", "/hello", origin, plugins)],
        "consumers": [consumer("jack", json!({"jwt-auth": {"key": "user-key", "secret": "my-secret-key"}}))]
    })
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn jwt_auth_sources_errors_and_expiry() {
    use sluice_plugins::jwt_auth::sign_hs256;
    let o = Origin::start();
    let gw = Gw::start(jwt_cfg(&o, json!({"jwt-auth": {}})));
    let good = sign_hs256(
        &json!({"key": "user-key", "exp": now() + 600}),
        "my-secret-key",
    );
    let r = gw.get("/hello", &[]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Missing JWT token in request"}))
    );
    let r = gw.get("/hello", &[("Authorization", "not-a-jwt")]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "JWT token invalid"}))
    );
    let other = sign_hs256(
        &json!({"key": "nobody", "exp": now() + 600}),
        "my-secret-key",
    );
    let r = gw.get("/hello", &[("Authorization", &other)]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Invalid user key in JWT token"}))
    );
    let forged = sign_hs256(
        &json!({"key": "user-key", "exp": now() + 600}),
        "wrong-secret",
    );
    let r = gw.get("/hello", &[("Authorization", &forged)]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "failed to verify jwt"}))
    );
    let expired = sign_hs256(
        &json!({"key": "user-key", "exp": now() - 10}),
        "my-secret-key",
    );
    assert_eq!(gw.get("/hello", &[("Authorization", &expired)]).status, 401);

    assert_eq!(gw.get("/hello", &[("Authorization", &good)]).status, 200);
    assert_eq!(o.last().header("x-consumer-username"), Some("jack"));
    assert_eq!(o.last().header("authorization"), Some(good.as_str()));
    let bearer = format!("Bearer {good}");
    assert_eq!(gw.get("/hello", &[("Authorization", &bearer)]).status, 200);
    assert_eq!(gw.get(&format!("/hello?jwt={good}"), &[]).status, 200);
    assert_eq!(
        gw.get("/hello", &[("Cookie", &format!("a=b; jwt={good}"))])
            .status,
        200
    );
    drop(gw);
    let gw = Gw::start(jwt_cfg(&o, json!({"jwt-auth": {"hide_credentials": true}})));
    assert_eq!(gw.get("/hello", &[("Authorization", &bearer)]).status, 200);
    assert_eq!(o.last().header("authorization"), None);
}

fn http_date(secs: u64) -> String {
    // IMF-fixdate from unix seconds (civil-from-days).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!(
        "{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[test]
fn hmac_auth_signature_clock_skew_and_signed_headers() {
    use sluice_plugins::hmac_auth::sign;
    let o = Origin::start();
    let cfg = |plugins: serde_json::Value| {
        json!({
            "routes": [route("r1", "/hello", &o, plugins)],
            "consumers": [consumer("john", json!({"hmac-auth": {"key_id": "john-key", "secret_key": "john-secret-key"}}))]
        })
    };
    let gw = Gw::start(cfg(json!({"hmac-auth": {"signed_headers": ["date"]}})));
    let date = http_date(now());
    let auth = sign(
        "john-key",
        "john-secret-key",
        "hmac-sha256",
        &[("@request-target", "GET /hello?a=1"), ("date", &date)],
    );
    let r = gw.get("/hello?a=1", &[("Date", &date), ("Authorization", &auth)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(o.last().header("x-consumer-username"), Some("john"));
    let denied = json!({"message": "client request can't be validated"});
    // The signature covers the request target: another query fails.
    let r = gw.get("/hello?a=2", &[("Date", &date), ("Authorization", &auth)]);
    assert_eq!((r.status, r.json()), (401, denied.clone()));
    let r = gw.get("/hello", &[]);
    assert_eq!((r.status, r.json()), (401, denied.clone()));
    // date must be signed (signed_headers).
    let unsigned = sign(
        "john-key",
        "john-secret-key",
        "hmac-sha256",
        &[("@request-target", "GET /hello")],
    );
    assert_eq!(
        gw.get("/hello", &[("Date", &date), ("Authorization", &unsigned)])
            .status,
        401
    );
    // Clock skew (300 s default).
    let old = http_date(now() - 1000);
    let stale = sign(
        "john-key",
        "john-secret-key",
        "hmac-sha256",
        &[("date", &old)],
    );
    assert_eq!(
        gw.get("/hello", &[("Date", &old), ("Authorization", &stale)])
            .status,
        401
    );
    let wrong = sign("john-key", "bad-secret", "hmac-sha256", &[("date", &date)]);
    assert_eq!(
        gw.get("/hello", &[("Date", &date), ("Authorization", &wrong)])
            .status,
        401
    );
    drop(gw);
    let gw = Gw::start(cfg(
        json!({"hmac-auth": {"allowed_algorithms": ["hmac-sha512"], "hide_credentials": true}}),
    ));
    let a256 = sign(
        "john-key",
        "john-secret-key",
        "hmac-sha256",
        &[("date", &date)],
    );
    assert_eq!(
        gw.get("/hello", &[("Date", &date), ("Authorization", &a256)])
            .status,
        401
    );
    let a512 = sign(
        "john-key",
        "john-secret-key",
        "hmac-sha512",
        &[("date", &date)],
    );
    assert_eq!(
        gw.get("/hello", &[("Date", &date), ("Authorization", &a512)])
            .status,
        200
    );
    assert_eq!(o.last().header("authorization"), None);
}

#[test]
fn identical_consumer_limits_count_per_consumer() {
    let o = Origin::start();
    let lc = json!({"count": 1, "time_window": 60, "rejected_code": 429});
    let gw = Gw::start(json!({
        "routes": [route("r1", "/hello", &o, json!({"key-auth": {}}))],
        "consumers": [
            consumer("a", json!({"key-auth": {"key": "ka"}, "limit-count": lc.clone()})),
            consumer("b", json!({"key-auth": {"key": "kb"}, "limit-count": lc})),
        ]
    }));
    assert_eq!(gw.get("/hello", &[("apikey", "ka")]).status, 200);
    assert_eq!(
        gw.get("/hello", &[("apikey", "kb")]).status,
        200,
        "b has its own window"
    );
    assert_eq!(gw.get("/hello", &[("apikey", "ka")]).status, 429);
    assert_eq!(gw.get("/hello", &[("apikey", "kb")]).status, 429);
}
