//! Bulk load through the Admin API in the traditional role (issue 16): `PUT /apisix/admin/configs` with the body of
//! APISIX's API-driven standalone mode replaces the stored configuration in one request, on the embedded store (one
//! transaction, one data-plane snapshot) and on a real etcd (transactions within etcd's limits). Each item is
//! checked as a single PUT checks it; one bad item, a dangling reference or an oversized body changes nothing.
//! Single PUTs racing a bulk load are serialised with it. Real gateway binary, real etcd, ephemeral ports.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::etcd_outage::{start_node, Etcd, ETCD, KEY as ETCD_KEY};
use crate::support::process::{Mock, Sluice};
use crate::support::Client;

const KEY: &str = "it-bulk-load-key-0123456789abcdef";

async fn call(admin: SocketAddr, key: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut c = Client::connect(admin).await;
    let r = c
        .request(
            method,
            &format!("/apisix/admin{path}"),
            &format!("X-API-KEY: {key}\r\nContent-Type: application/json\r\n"),
            body.as_bytes(),
        )
        .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or_else(|_| Value::String(r.text())),
    )
}

async fn status(gw: SocketAddr, path: &str) -> u16 {
    Client::connect(gw).await.get(path).await.status
}

fn route(i: usize, up: SocketAddr) -> Value {
    json!({"id": i.to_string(), "uri": format!("/r/{i}"),
           "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}})
}

fn routes(ids: impl Iterator<Item = usize>, up: SocketAddr) -> Vec<Value> {
    ids.map(|i| route(i, up)).collect()
}

/// A bulk request: a whole configuration can take longer than the client's usual 10 s on a loaded debug build.
async fn load(admin: SocketAddr, key: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
        let head = format!(
            "{method} /apisix/admin{path} HTTP/1.1\r\nHost: t\r\nX-API-KEY: {key}\r\n\
             Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(120), io)
        .await
        .expect("bulk request answered within 120 s");
    let text = String::from_utf8_lossy(&raw);
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The stored configuration, without what changes on every read.
async fn configs(admin: SocketAddr, key: &str) -> Value {
    let (st, v) = call(admin, key, "GET", "/configs", "").await;
    assert_eq!(st, 200, "{v}");
    v
}

fn ids(doc: &Value, kind: &str) -> Vec<String> {
    let mut v: Vec<String> = doc[kind]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_load_replaces_the_configuration_and_get_returns_it() {
    let mock = Mock::start(5).await;
    let (sluice, admin) = Sluice::start_traditional(None, KEY, None).await;
    let gw = sluice.addr;

    // Load: an upstream, routes using it by id and routes with inline upstreams.
    let mut rs = routes(1..=300, mock.addr);
    for r in rs.iter_mut().take(10) {
        let o = r.as_object_mut().unwrap();
        o.remove("upstream");
        o.insert("upstream_id".into(), json!("u1"));
    }
    let doc = json!({
        "upstreams": [{"id": "u1", "type": "roundrobin", "nodes": {mock.addr.to_string(): 1}}],
        "routes": rs,
    });
    let (st, v) = call(admin, KEY, "PUT", "/configs", &doc.to_string()).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(
        (&v["created"], &v["updated"], &v["deleted"]),
        (&json!(301), &json!(0), &json!(0)),
        "{v}"
    );
    let loaded_rev = v["revision"].as_u64().unwrap();
    // Answered once served: no polling needed.
    for p in ["/r/1", "/r/10", "/r/11", "/r/300"] {
        assert_eq!(status(gw, p).await, 200, "{p}");
    }
    assert_eq!(status(gw, "/r/301").await, 404);

    // GET returns what was loaded, in the standalone shape, stamped as single PUTs are.
    let got = configs(admin, KEY).await;
    assert_eq!(got["routes"].as_array().unwrap().len(), 300);
    assert_eq!(ids(&got, "upstreams"), ["u1"]);
    assert_eq!(got["routes_conf_version"], json!(loaded_rev));
    let r5 = got["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "5")
        .unwrap();
    assert_eq!(r5["upstream_id"], "u1");
    assert_eq!(r5["modifiedIndex"], json!(loaded_rev));
    assert!(r5.get("create_time").is_none(), "{r5}");
    let (st, one) = call(admin, KEY, "GET", "/routes/5", "").await;
    assert_eq!(st, 200);
    assert!(one["value"]["create_time"].is_i64(), "{one}");

    // GET's document goes back in unchanged: nothing is written.
    let (st, v) = call(admin, KEY, "PUT", "/configs", &got.to_string()).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["unchanged"], json!(301), "{v}");
    assert_eq!(v["revision"], json!(loaded_rev), "{v}");

    // Replace: 101..=400, inline upstreams only; u1 and routes 1..=100 go, 101..=300 stay as they were.
    let doc = json!({"routes": routes(101..=400, mock.addr)});
    let (st, v) = call(admin, KEY, "PUT", "/configs", &doc.to_string()).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(
        (&v["created"], &v["deleted"], &v["unchanged"]),
        (&json!(100), &json!(101), &json!(200)),
        "{v}"
    );
    for (p, want) in [
        ("/r/1", 404),
        ("/r/100", 404),
        ("/r/101", 200),
        ("/r/400", 200),
    ] {
        assert_eq!(status(gw, p).await, want, "{p}");
    }
    let (st, _) = call(admin, KEY, "GET", "/upstreams/u1", "").await;
    assert_eq!(st, 404);
    let got = configs(admin, KEY).await;
    assert_eq!(got["routes"].as_array().unwrap().len(), 300);
    assert!(got.get("upstreams").is_none(), "{}", got["upstreams"]);
    // An unchanged route kept its revision and its create_time.
    let (_, r200) = call(admin, KEY, "GET", "/routes/200", "").await;
    assert_eq!(r200["modifiedIndex"], json!(loaded_rev), "{r200}");

    // YAML both ways, and the empty configuration.
    let mut c = Client::connect(admin).await;
    let r = c
        .request(
            "GET",
            "/apisix/admin/configs",
            &format!("X-API-KEY: {KEY}\r\nAccept: application/yaml\r\n"),
            b"",
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("uri: /r/400"), "{}", r.text());
    let yaml = format!(
        "routes:\n  - id: y1\n    uri: /yaml\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
        mock.addr
    );
    let mut c = Client::connect(admin).await;
    let r = c
        .request(
            "PUT",
            "/apisix/admin/configs",
            &format!("X-API-KEY: {KEY}\r\nContent-Type: application/yaml\r\n"),
            yaml.as_bytes(),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(status(gw, "/yaml").await, 200);
    assert_eq!(status(gw, "/r/400").await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_resource_anywhere_refuses_the_whole_load() {
    let mock = Mock::start(5).await;
    let (sluice, admin) = Sluice::start_traditional(None, KEY, None).await;
    let gw = sluice.addr;
    let doc = json!({"routes": routes(1..=20, mock.addr),
                     "consumers": [{"username": "jack", "plugins": {"key-auth": {"key": "k-jack"}}}]});
    let (st, v) = call(admin, KEY, "PUT", "/configs", &doc.to_string()).await;
    assert_eq!(st, 202, "{v}");
    let before = configs(admin, KEY).await;

    let up = mock.addr;
    let bad_route = |i: usize, f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut rs = routes(100..=299, up);
        f(rs[i].as_object_mut().unwrap());
        json!({"routes": rs})
    };
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            bad_route(150, &|r| {
                r.insert("uri".into(), json!(5));
            }),
            400,
            "invalid routes at index 150, err: invalid configuration: property \"uri\" validation failed",
        ),
        (
            bad_route(7, &|r| {
                r.insert("plugins".into(), json!({"no-such-plugin": {}}));
            }),
            400,
            "invalid routes at index 7, err: unknown plugin [no-such-plugin]",
        ),
        (
            bad_route(199, &|r| {
                r.remove("upstream");
                r.insert("upstream_id".into(), json!("nope"));
            }),
            400,
            "invalid routes at index 199, err: failed to fetch upstream info by upstream id [nope], response code: 404",
        ),
        (
            bad_route(3, &|r| {
                r.insert("create_time".into(), json!(1));
            }),
            400,
            "invalid routes at index 3, err: the property is forbidden:  create_time",
        ),
        (
            bad_route(4, &|r| {
                r.remove("id");
            }),
            400,
            "invalid routes at index 4, err: missing route id",
        ),
        // An id that would land under another key (path traversal in the key space).
        (
            bad_route(5, &|r| {
                r.insert("id".into(), json!("../consumers/jack"));
            }),
            400,
            "invalid routes at index 5, err: invalid route id: ../consumers/jack",
        ),
        (
            bad_route(6, &|r| {
                r.insert("id".into(), json!("100"));
            }),
            400,
            "found duplicate id 100 in routes",
        ),
        (
            bad_route(8, &|r| {
                r.insert("upstream".into(), json!({"type": "chash", "nodes": {"127.0.0.1:1": 1}}));
            }),
            400,
            "invalid routes at index 8, err: ",
        ),
        // Consumers: a key taken by another consumer, a credential of nobody.
        (
            json!({"consumers": [
                {"username": "jack", "plugins": {"key-auth": {"key": "k-jack"}}},
                {"username": "rose", "plugins": {"key-auth": {"key": "k-jack"}}}]}),
            400,
            "invalid consumers at index 1, err: duplicate key of plugin key-auth found with consumer: jack",
        ),
        (
            json!({"consumers": [{"id": "ghost/credentials/c1", "plugins": {"key-auth": {"key": "k-g"}}}]}),
            400,
            "invalid consumers at index 0, err: consumer not found",
        ),
        (
            json!({"routes": "all of them"}),
            400,
            "invalid routes: must be an array",
        ),
        (
            json!({"routes_conf_version": "7", "routes": []}),
            400,
            "routes_conf_version must be a number",
        ),
    ];
    for (doc, want_status, want_msg) in cases {
        let (st, v) = call(admin, KEY, "PUT", "/configs", &doc.to_string()).await;
        assert_eq!(st, want_status, "{v}");
        let msg = v["error_msg"].as_str().unwrap_or_default();
        assert!(msg.starts_with(want_msg), "want {want_msg:?}, got {v}");
    }
    let (st, v) = call(admin, KEY, "PUT", "/configs", "{\"routes\": [").await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error_msg"]
            .as_str()
            .unwrap()
            .starts_with("invalid request body"),
        "{v}"
    );
    // The error names the resource.
    let (_, v) = call(
        admin,
        KEY,
        "PUT",
        "/configs",
        &bad_route(150, &|r| {
            r.insert("uri".into(), json!(5));
        })
        .to_string(),
    )
    .await;
    assert_eq!(
        (&v["resource_type"], &v["resource_id"], &v["index"]),
        (&json!("routes"), &json!("250"), &json!(150))
    );

    // Large loads are checked on several threads: the first bad item in body order is still the one named,
    // whichever chunk it falls in.
    let big = |bad: &[usize]| {
        let mut rs = routes(1000..=6999, up);
        for &i in bad {
            rs[i]
                .as_object_mut()
                .unwrap()
                .insert("uri".into(), json!(i));
        }
        json!({"routes": rs}).to_string()
    };
    for (bad, first) in [
        (&[5900, 900][..], 900),
        (&[5999][..], 5999),
        (&[0, 5999][..], 0),
    ] {
        let (st, v) = load(admin, KEY, "PUT", "/configs", &big(bad)).await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["index"], json!(first), "{v}");
    }

    // Nothing changed: same document, same revision, the old routes served, none of the new ones.
    assert_eq!(configs(admin, KEY).await, before);
    assert_eq!(status(gw, "/r/20").await, 200);
    assert_eq!(status(gw, "/r/100").await, 404);

    // Without the key, nothing is loaded.
    let (st, _) = call(admin, "wrong-key", "PUT", "/configs", "{}").await;
    assert_eq!(st, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_before_it_is_read() {
    let (_sluice, admin) = Sluice::start_traditional(None, KEY, None).await;
    let before = configs(admin, KEY).await;
    let max = 64u64 << 20;
    let mut c = Client::connect(admin).await;
    c.send(
        format!(
            "PUT /apisix/admin/configs HTTP/1.1\r\nHost: t\r\nX-API-KEY: {KEY}\r\nContent-Length: {}\r\n\r\n",
            max + 1
        )
        .as_bytes(),
    )
    .await;
    let raw = String::from_utf8_lossy(&c.read_to_eof_or(b"allowed\"}").await).into_owned();
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(
        raw.contains(&format!(
            "invalid request body: request size {} is greater than the maximum size {max} allowed",
            max + 1
        )),
        "{raw}"
    );
    // A body just under it is read (and refused for what it is, not its size).
    let mut big = String::from("{\"routes\": [], \"pad\": \"");
    big.push_str(&"x".repeat(3 << 20));
    big.push_str("\"}");
    let (st, v) = call(admin, KEY, "PUT", "/configs", &big).await;
    assert_eq!(st, 202, "{v}");
    let after = configs(admin, KEY).await;
    assert!(after.get("routes").is_none(), "{after}");
    assert_eq!(before.get("routes"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_puts_racing_a_bulk_load_are_serialised_with_it() {
    let mock = Mock::start(5).await;
    let (sluice, admin) = Sluice::start_traditional(None, KEY, None).await;
    let gw = sluice.addr;
    let n = 1500;

    // A probe on the data plane: once the last route of the load is served, the first must be too (one snapshot).
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut torn, mut seen_last) = (0u32, 0u32);
            while !stop.load(Ordering::Relaxed) {
                if status(gw, &format!("/r/{n}")).await == 200 {
                    seen_last += 1;
                    if status(gw, "/r/1").await != 200 {
                        torn += 1;
                    }
                }
            }
            (torn, seen_last)
        })
    };
    // Single PUTs of routes the bulk body does not name, and of one it does (5), while the load runs.
    let singles = {
        let up = mock.addr;
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..40 {
                let (id, uri) = if i % 4 == 0 {
                    ("5".to_owned(), format!("/single/5/{i}"))
                } else {
                    (format!("s{i}"), format!("/single/{i}"))
                };
                let body = json!({"uri": uri, "upstream": {"type": "roundrobin", "nodes": {up.to_string(): 1}}});
                let (st, v) = load(
                    admin,
                    KEY,
                    "PUT",
                    &format!("/routes/{id}"),
                    &body.to_string(),
                )
                .await;
                assert!(st == 200 || st == 201, "{st} {v}");
                out.push((id, uri));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let doc = json!({"routes": routes(1..=n, mock.addr)});
    let (st, v) = load(admin, KEY, "PUT", "/configs", &doc.to_string()).await;
    assert_eq!(st, 202, "{v}");
    let bulk_rev = v["revision"].as_u64().unwrap();
    let singles = singles.await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (torn, seen_last) = probe.await.unwrap();
    assert!(seen_last > 0, "the probe never saw the load");
    assert_eq!(
        torn, 0,
        "a snapshot served the last route of the load without the first"
    );

    // Every single PUT is either before the load (its route replaced: gone, or 5 as the load wrote it) or after
    // it (its own revision above the load's, served as written). Nothing in between, nothing lost after.
    let mut after = 0;
    let mut last_for_5 = None;
    for (id, uri) in &singles {
        let (st, v) = call(admin, KEY, "GET", &format!("/routes/{id}"), "").await;
        if id == "5" {
            last_for_5 = Some(uri.clone());
            continue;
        }
        if st == 200 {
            assert!(v["modifiedIndex"].as_u64().unwrap() > bulk_rev, "{id}: {v}");
            assert_eq!(v["value"]["uri"], json!(uri));
            assert_eq!(status(gw, uri).await, 200, "{uri}");
            after += 1;
        } else {
            assert_eq!(st, 404);
            assert_eq!(status(gw, uri).await, 404, "{uri}");
        }
    }
    let (_, v5) = call(admin, KEY, "GET", "/routes/5", "").await;
    let m5 = v5["modifiedIndex"].as_u64().unwrap();
    if m5 == bulk_rev {
        assert_eq!(v5["value"]["uri"], "/r/5");
    } else {
        assert!(m5 > bulk_rev);
        assert_eq!(v5["value"]["uri"], json!(last_for_5.unwrap()));
    }
    let served5 = v5["value"]["uri"].as_str().unwrap().to_owned();
    assert_eq!(status(gw, &served5).await, 200);
    // Whatever interleaving happened, the store and the data plane agree on the whole configuration.
    let got = configs(admin, KEY).await;
    let total = got["routes"].as_array().unwrap().len();
    assert_eq!(total, n + after, "{after} single PUTs after the load");
    assert_eq!(status(gw, &format!("/r/{}", n - 1)).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_load_on_etcd_writes_in_batches_and_refuses_as_one() {
    if !std::path::Path::new(ETCD).exists() {
        crate::support::skip_unless_ci(&format!(
            "{ETCD} not installed (apt-get install -y etcd-server)"
        ));
        return;
    }
    let overall = tokio::time::timeout(Duration::from_secs(120), async {
        let mock = Mock::start(5).await;
        let mut etcd = Etcd::new();
        etcd.start().await;
        let node = start_node(etcd.client).await;
        let admin = node.admin;
        let key = ETCD_KEY;

        // 1,000 routes and an upstream: more than one etcd transaction (128 ops each).
        let mut rs = routes(1..=1000, mock.addr);
        rs[0].as_object_mut().unwrap().remove("upstream");
        rs[0]["upstream_id"] = json!("u1");
        let doc = json!({"upstreams": [{"id": "u1", "type": "roundrobin", "nodes": {mock.addr.to_string(): 1}}], "routes": rs});
        let (st, v) = load(admin, key, "PUT", "/configs", &doc.to_string()).await;
        assert_eq!(st, 202, "{v}");
        assert_eq!(v["created"], json!(1001), "{v}");
        for p in ["/r/1", "/r/500", "/r/1000"] {
            assert_eq!(status(node.gw, p).await, 200, "{p}");
        }
        let got = configs(admin, key).await;
        assert_eq!(got["routes"].as_array().unwrap().len(), 1000);
        assert_eq!(ids(&got, "upstreams"), ["u1"]);
        // Several etcd revisions: the routes were written after the upstream they use.
        let rev_of = |id: &str| {
            got["routes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["id"] == id)
                .unwrap()["modifiedIndex"]
                .as_u64()
                .unwrap()
        };
        assert!(rev_of("1000") > rev_of("1"), "one transaction for 1,000 routes?");

        // An invalid item at the end: nothing written to etcd.
        let mut rs = routes(2001..=2600, mock.addr);
        rs[599]["plugins"] = json!({"limit-count": {"count": -1, "time_window": 1}});
        let (st, v) = load(admin, key, "PUT", "/configs", &json!({"routes": rs}).to_string()).await;
        assert_eq!(st, 400, "{v}");
        assert!(
            v["error_msg"].as_str().unwrap().starts_with("invalid routes at index 599, err: failed to check the configuration of plugin limit-count"),
            "{v}"
        );
        assert_eq!(configs(admin, key).await, got);
        assert_eq!(status(node.gw, "/r/2001").await, 404);

        // Replace: 700 go, 300 stay, 200 new.
        let doc = json!({"routes": routes(701..=1200, mock.addr)});
        let (st, v) = load(admin, key, "PUT", "/configs", &doc.to_string()).await;
        assert_eq!(st, 202, "{v}");
        assert_eq!(
            (&v["created"], &v["deleted"], &v["unchanged"]),
            (&json!(200), &json!(701), &json!(300)),
            "{v}"
        );
        for (p, want) in [("/r/1", 404), ("/r/700", 404), ("/r/701", 200), ("/r/1200", 200)] {
            assert_eq!(status(node.gw, p).await, want, "{p}");
        }
        // What etcd holds is what GET says, as another node would see it.
        let other = start_node(etcd.client).await;
        let (st, v) = call(other.admin, key, "GET", "/configs", "").await;
        assert_eq!(st, 200);
        assert_eq!(ids(&v, "routes").len(), 500);
        assert_eq!(status(other.gw, "/r/1200").await, 200);
    })
    .await;
    assert!(overall.is_ok(), "etcd bulk test did not finish in 120 s");
}
