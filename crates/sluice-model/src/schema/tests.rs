use serde_json::json;

use super::*;

#[test]
fn route_from_the_issue_is_valid() {
    let r = json!({"uri": "/hello", "plugins": {},
                   "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:80": 1}}});
    validate(&route(), &r).unwrap();
}

#[test]
fn route_errors_read_like_apisix() {
    let e = validate(&route(), &json!({"uri": 5, "plugins": {}})).unwrap_err();
    assert_eq!(
        e,
        "property \"uri\" validation failed: wrong type: expected string, got number"
    );
    let e = validate(&route(), &json!({"plugins": {}})).unwrap_err();
    assert!(
        e.contains("value should match only one schema, but matches none"),
        "{e}"
    );
    let e = validate(&route(), &json!({"uri": "/a", "plugins": {}, "bogus": 1})).unwrap_err();
    assert_eq!(e, "additional properties forbidden, found bogus");
    let e = validate(
        &route(),
        &json!({"uri": "/a", "host": "a.com", "hosts": ["b.com"], "plugins": {}}),
    );
    assert!(e.is_err());
    let e = validate(
        &route(),
        &json!({"uri": "/a", "methods": ["GETT"], "plugins": {}}),
    )
    .unwrap_err();
    assert!(
        e.contains("property \"methods\" validation failed: failed to validate item 1"),
        "{e}"
    );
    let e = validate(&route(), &json!({"uri": "/a"})).unwrap_err();
    assert!(e.starts_with("object matches none of the required"), "{e}");
}

#[test]
fn upstream_rules() {
    validate(
        &upstream(),
        &json!({"nodes": [{"host": "a", "port": 80, "weight": 1}]}),
    )
    .unwrap();
    let e = validate(&upstream(), &json!({"nodes": {"a:80": -1}})).unwrap_err();
    assert!(e.contains("nodes"), "{e}");
    assert!(validate(&upstream(), &json!({"type": "roundrobin"})).is_err());
    assert!(validate(&upstream(), &json!({"nodes": {}, "pass_host": "x"})).is_err());
    let e = validate(&upstream(), &json!({"nodes": {}, "retries": -1})).unwrap_err();
    assert_eq!(
        e,
        "property \"retries\" validation failed: expected -1 to be at least 0"
    );
}

#[test]
fn ids_remote_addrs_and_consumers() {
    assert!(validate(&id_schema(), &json!("a-b_c.1")).is_ok());
    assert!(validate(&id_schema(), &json!("a b")).is_err());
    assert!(validate(&id_schema(), &json!(0)).is_err());
    let r = json!({"uri": "/", "plugins": {}, "remote_addrs": ["10.0.0.0/8", "::1", "1.2.3.4"]});
    validate(&route(), &r).unwrap();
    let r = json!({"uri": "/", "plugins": {}, "remote_addr": "300.1.1.1"});
    assert!(validate(&route(), &r).is_err());
    assert!(validate(&consumer(), &json!({"username": "jack"})).is_ok());
    let e = validate(&consumer(), &json!({})).unwrap_err();
    assert_eq!(e, "property \"username\" is required");
    assert!(validate(&consumer(), &json!({"username": "ja ck"})).is_err());
    assert!(resource_schema("routes").is_some() && resource_schema("ssls").is_some());
    assert!(resource_schema("nope").is_none());
}

#[test]
fn upstream_tls_takes_inline_cert_and_key_or_an_ssl_id_not_both() {
    let pem = "-".repeat(128);
    let up = |tls: serde_json::Value| json!({"nodes": {"127.0.0.1:443": 1}, "scheme": "https", "tls": tls});
    validate(
        &upstream(),
        &up(json!({"client_cert": pem, "client_key": pem})),
    )
    .unwrap();
    validate(&upstream(), &up(json!({"client_cert_id": "1"}))).unwrap();
    validate(&upstream(), &up(json!({"verify": true}))).unwrap();
    for bad in [
        json!({"client_cert": pem}),
        json!({"client_key": pem}),
        json!({"client_cert_id": "1", "client_cert": pem, "client_key": pem}),
        json!({"client_cert_id": "1", "client_key": pem}),
    ] {
        assert!(validate(&upstream(), &up(bad.clone())).is_err(), "{bad}");
    }
}
