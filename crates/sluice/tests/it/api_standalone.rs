//! APISIX's API-driven standalone mode through the real binary (issue 18 item 3): `role: traditional` with
//! `config_provider: yaml` starts empty and takes its whole configuration through `/apisix/admin/configs`, with
//! APISIX's per-kind `*_conf_version` rules, `X-Digest`, YAML in and out, and `/configs/validate`. A refused
//! document changes nothing the gateway serves.

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::support::process::{Mock, Sluice, TempDir};
use crate::support::{free_port, Client};

const KEY: &str = "it-api-standalone-key-0123456789";

async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, Value, crate::support::client::Response) {
    let mut c = Client::connect(admin).await;
    let r = c
        .request(
            method,
            &format!("/apisix/admin{path}"),
            &format!("X-API-KEY: {KEY}\r\n{headers}"),
            body.as_bytes(),
        )
        .await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v, r)
}

async fn proxied(gw: SocketAddr, path: &str) -> u16 {
    Client::connect(gw).await.get(path).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_replace_the_whole_configuration_as_apisix() {
    let mock = Mock::start(5).await;
    let dir = TempDir::new("api-standalone");
    let (port, admin_port) = (free_port(), free_port());
    std::fs::write(
        dir.0.join("config.yaml"),
        format!(
            "apisix:\n  node_listen: [{{ip: 127.0.0.1, port: {port}}}]\n  enable_control: false\n  ssl: {{enable: false}}\n\
             deployment:\n  role: traditional\n  role_traditional:\n    config_provider: yaml\n\
             \x20 admin:\n    admin_listen: {{ip: 127.0.0.1, port: {admin_port}}}\n\
             \x20   admin_key:\n      - {{name: admin, key: {KEY}, role: admin}}\n\
             plugin_attr:\n  prometheus:\n    enable_export_server: false\nsluice:\n  data_dir: data\n"
        ),
    )
    .unwrap();
    let gw: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let _sluice = Sluice::spawn_in(dir, gw, &[admin]).await;

    // Empty at start: every version 0, nothing routed.
    let (st, v, _) = call(admin, "GET", "/configs", "", "").await;
    assert_eq!(st, 200);
    assert_eq!(v["routes_conf_version"], 0, "{v}");
    assert_eq!(proxied(gw, "/hello").await, 404);

    let doc = json!({
        "routes_conf_version": 1000, "upstreams_conf_version": 1000,
        "routes": [{"modifiedIndex": 1000, "id": "r1", "uri": "/hello", "upstream_id": "u1"}],
        "upstreams": [{"modifiedIndex": 1000, "id": "u1", "nodes": {mock.addr.to_string(): 1}, "type": "roundrobin"}],
        "consumers": [{"username": "jack"},
                      {"id": "jack/credentials/c1", "plugins": {"key-auth": {"key": "jack-key"}}}],
    });
    let (st, _, r) = call(
        admin,
        "PUT",
        "/configs",
        "X-Digest: d1\r\n",
        &doc.to_string(),
    )
    .await;
    assert_eq!(st, 202, "{}", r.text());
    assert_eq!(r.header("x-digest"), Some("d1"));
    assert!(r.header("x-last-modified").is_some());
    assert_eq!(proxied(gw, "/hello").await, 200);

    // The same digest is not applied again.
    let (st, _, _) = call(
        admin,
        "PUT",
        "/configs",
        "X-Digest: d1\r\n",
        "{\"routes\": []}",
    )
    .await;
    assert_eq!(st, 204);
    assert_eq!(proxied(gw, "/hello").await, 200);

    // Refused documents change nothing: a lower version, a bad item, a missing digest, no body, bad JSON, a
    // duplicate id, a version that is not a number.
    let refused: [(&str, &str, &str); 7] = [
        (
            "X-Digest: d2\r\n",
            r#"{"routes_conf_version": 999}"#,
            "routes_conf_version must be greater than or equal to (1000)",
        ),
        (
            "X-Digest: d3\r\n",
            r#"{"routes_conf_version": 1001, "routes": [{"id": "r2", "uri": 5}]}"#,
            "property \"uri\" validation failed",
        ),
        ("", "{}", "missing digest header"),
        (
            "X-Digest: d4\r\n",
            "",
            "invalid request body: empty request body",
        ),
        ("X-Digest: d5\r\n", "{\"routes\": [", "invalid request body"),
        (
            "X-Digest: d6\r\n",
            r#"{"routes_conf_version": 1001, "routes": [{"id": "a", "uri": "/a", "upstream_id": "u1"}, {"id": "a", "uri": "/b", "upstream_id": "u1"}]}"#,
            "found duplicate id a in routes",
        ),
        (
            "X-Digest: d7\r\n",
            r#"{"routes_conf_version": "1001"}"#,
            "routes_conf_version must be a number",
        ),
    ];
    for (headers, body, want) in refused {
        let (st, v, _) = call(admin, "PUT", "/configs", headers, body).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert!(
            v["error_msg"].as_str().is_some_and(|m| m.contains(want)),
            "{body}: {v}"
        );
        assert_eq!(
            proxied(gw, "/hello").await,
            200,
            "{body} changed what is served"
        );
    }
    let (_, v, r) = call(admin, "GET", "/configs", "", "").await;
    assert_eq!(r.header("x-digest"), Some("d1"), "{v}");
    assert_eq!(v["routes"][0]["modifiedIndex"], 1000, "{v}");

    // An equal version keeps the kind, a higher one replaces it, a kind sent without a version is replaced.
    let next = json!({
        "routes_conf_version": 1000,
        "upstreams_conf_version": 1001,
        "upstreams": [{"id": "u1", "nodes": {mock.addr.to_string(): 1}, "type": "roundrobin"}],
        "routes": [{"id": "ignored", "uri": "/ignored", "upstream_id": "u1"}],
    });
    let (st, _, _) = call(
        admin,
        "PUT",
        "/configs",
        "X-Digest: d8\r\n",
        &next.to_string(),
    )
    .await;
    assert_eq!(st, 202);
    assert_eq!(proxied(gw, "/hello").await, 200);
    assert_eq!(proxied(gw, "/ignored").await, 404);
    let (_, v, _) = call(admin, "GET", "/configs", "", "").await;
    assert_eq!(v["upstreams_conf_version"], 1001, "{v}");
    assert!(
        v.get("consumers").is_none(),
        "consumers were replaced by nothing: {v}"
    );

    // YAML both ways.
    let yaml = format!(
        "routes:\n  - id: y1\n    uri: /yaml\n    upstream:\n      nodes:\n        \"{}\": 1\n",
        mock.addr
    );
    let (st, _, r) = call(
        admin,
        "PUT",
        "/configs",
        "X-Digest: d9\r\nContent-Type: application/yaml\r\n",
        &yaml,
    )
    .await;
    assert_eq!(st, 202, "{}", r.text());
    assert_eq!(proxied(gw, "/yaml").await, 200);
    let (_, _, r) = call(admin, "GET", "/configs", "Accept: application/yaml\r\n", "").await;
    assert_eq!(r.header("content-type"), Some("application/yaml"));
    assert!(r.text().contains("uri: /yaml"), "{}", r.text());

    // Validate: every error, nothing applied.
    let (st, v, _) = call(
        admin,
        "POST",
        "/configs/validate",
        "",
        r#"{"routes": [{"id": "v", "uri": 5}, {"id": "v", "uri": "/v", "upstream_id": "u1"}]}"#,
    )
    .await;
    assert_eq!(st, 400);
    assert_eq!(v["error_msg"], "Configuration validation failed");
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(2), "{v}");
    let (st, v, _) = call(admin, "POST", "/configs/validate", "", r#"{"routes": []}"#).await;
    assert_eq!((st, v), (200, json!({})));

    // Resource URLs do not exist in this mode; HEAD gives the metadata.
    let (st, _, _) = call(admin, "GET", "/routes", "", "").await;
    assert_eq!(st, 404);
    let (st, _, r) = call(admin, "HEAD", "/configs", "", "").await;
    assert_eq!(st, 200);
    assert_eq!(r.header("x-digest"), Some("d9"));
}
