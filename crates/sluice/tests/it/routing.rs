//! Routing rules with APISIX semantics, observed end to end: each route's upstream rewrites the Host to the route's
//! name (`pass_host: rewrite`), so the origin's `X-Seen-Host` tells which route matched. Covers uri/uris exact,
//! prefix and params; host/hosts with wildcards; methods; remote_addrs; vars operators; priority; status 0;
//! service and upstream references; the 404 body.

use serde_json::{json, Value};

use crate::support::{t, Client, Gw, Origin};

const NOT_FOUND: &str = r#"{"error_msg":"404 Route Not Found"}"#;

fn up(o: &Origin, name: &str) -> Value {
    json!({"type": "roundrobin", "nodes": {o.addr.to_string(): 1},
           "pass_host": "rewrite", "upstream_host": name})
}

/// A route named `name` (its id too) with extra fields.
fn route(o: &Origin, name: &str, fields: Value) -> Value {
    let mut r = json!({"id": name, "upstream": up(o, name)});
    let m = r.as_object_mut().expect("object");
    for (k, v) in fields.as_object().expect("fields object") {
        m.insert(k.clone(), v.clone());
    }
    r
}

/// Which route served `req` (raw request bytes), or "404".
async fn which(c: &mut Client, req: String) -> String {
    c.send(req.as_bytes()).await;
    let r = c.read_response(false).await;
    match r.status {
        200 => r.header("x-seen-host").unwrap_or("?").to_owned(),
        404 => {
            assert_eq!(r.text().trim_end(), NOT_FOUND);
            assert_eq!(r.header("content-type"), Some("application/json"));
            "404".into()
        }
        s => format!("status {s}"),
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: test.local\r\n\r\n")
}

fn get_host(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uri_exact_prefix_params_and_uris() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(json!({"routes": [
            route(&o, "exact", json!({"uri": "/exact"})),
            route(&o, "prefix", json!({"uri": "/foo/*"})),
            route(&o, "deeper", json!({"uri": "/foo/bar/*"})),
            route(&o, "exact-in-prefix", json!({"uri": "/foo/exact"})),
            route(&o, "param", json!({"uri": "/user/:id"})),
            route(&o, "many", json!({"uris": ["/u1", "/u2"]})),
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let cases = [
            ("/exact", "exact"),
            ("/exact?q=1", "exact"),
            ("/exact/", "404"),
            ("/exactly", "404"),
            ("/foo/", "prefix"),
            ("/foo/x/y/z", "prefix"),
            ("/foo/bar/baz", "deeper"),
            ("/foo/exact", "exact-in-prefix"),
            ("/foo/exact2", "prefix"),
            ("/user/42", "param"),
            ("/user/abc?x=y", "param"),
            ("/user/42/more", "404"),
            ("/u1", "many"),
            ("/u2", "many"),
            ("/u3", "404"),
            ("/", "404"),
        ];
        for (path, want) in cases {
            assert_eq!(which(&mut c, get(path)).await, want, "path {path}");
        }
        // The origin sees the original target, query included.
        assert_eq!(o.last().target, "/u2");
        assert!(o.requests().iter().any(|r| r.target == "/exact?q=1"));
        assert!(o.requests().iter().any(|r| r.target == "/user/abc?x=y"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_with_wildcards() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(json!({"routes": [
            route(&o, "api", json!({"uri": "/h", "host": "api.example.com"})),
            route(&o, "wild", json!({"uri": "/h", "hosts": ["*.wild.com", "other.org"]})),
            route(&o, "any", json!({"uri": "/any"})),
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let cases = [
            ("api.example.com", "api"),
            ("API.Example.COM", "api"),
            ("api.example.com:9080", "api"),
            ("a.wild.com", "wild"),
            ("x.y.wild.com", "wild"),
            ("other.org", "wild"),
            ("wild.com", "404"),
            ("example.com", "404"),
        ];
        for (host, want) in cases {
            assert_eq!(
                which(&mut c, get_host("/h", host)).await,
                want,
                "host {host}"
            );
        }
        assert_eq!(which(&mut c, get_host("/any", "whatever.net")).await, "any");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_remote_addrs_priority_and_status() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(json!({"routes": [
            route(&o, "post", json!({"uri": "/m", "methods": ["POST", "PUT"]})),
            route(&o, "get", json!({"uri": "/m", "methods": ["GET"]})),
            route(&o, "local", json!({"uri": "/ip", "remote_addrs": ["127.0.0.0/8"]})),
            route(&o, "ten", json!({"uri": "/ip10", "remote_addr": "10.0.0.0/8"})),
            route(&o, "low", json!({"uri": "/p", "priority": 0})),
            route(&o, "high", json!({"uri": "/p", "priority": 10})),
            route(&o, "disabled", json!({"uri": "/off", "status": 0})),
            route(&o, "enabled", json!({"uri": "/on", "status": 1})),
        ]}));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(which(&mut c, get("/m")).await, "get");
        let post = "POST /m HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi".to_owned();
        assert_eq!(which(&mut c, post).await, "post");
        let del = "DELETE /m HTTP/1.1\r\nHost: t\r\n\r\n".to_owned();
        assert_eq!(which(&mut c, del).await, "404");
        assert_eq!(which(&mut c, get("/ip")).await, "local");
        assert_eq!(which(&mut c, get("/ip10")).await, "404");
        assert_eq!(which(&mut c, get("/p")).await, "high");
        assert_eq!(which(&mut c, get("/off")).await, "404");
        assert_eq!(which(&mut c, get("/on")).await, "enabled");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vars_expressions() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(json!({"routes": [
            route(&o, "eq", json!({"uri": "/v/eq", "vars": [["arg_k", "==", "v"]]})),
            route(&o, "ne", json!({"uri": "/v/ne", "vars": [["arg_k", "~=", "v"]]})),
            route(&o, "gt", json!({"uri": "/v/gt", "vars": [["arg_n", ">", 10]]})),
            route(&o, "lt", json!({"uri": "/v/lt", "vars": [["arg_n", "<", 10]]})),
            route(&o, "re", json!({"uri": "/v/re", "vars": [["http_x_tier", "~~", "^gold-[0-9]+$"]]})),
            route(&o, "rei", json!({"uri": "/v/rei", "vars": [["http_x_tier", "~*", "^GOLD"]]})),
            route(&o, "in", json!({"uri": "/v/in", "vars": [["cookie_region", "in", ["eu", "us"]]]})),
            route(&o, "has", json!({"uri": "/v/has", "vars": [["http_x_tags", "has", "b"]]})),
            route(&o, "not", json!({"uri": "/v/not", "vars": [["arg_k", "!", "==", "v"]]})),
            route(&o, "ip", json!({"uri": "/v/ip", "vars": [["remote_addr", "ipmatch", ["127.0.0.0/8"]]]})),
            route(&o, "ipno", json!({"uri": "/v/ipno", "vars": [["remote_addr", "ipmatch", "10.0.0.0/8"]]})),
            route(&o, "uri", json!({"uri": "/v/uri/*", "vars": [["uri", "~~", "/deep$"]]})),
            route(&o, "host", json!({"uri": "/v/host", "vars": [["host", "==", "h.test"]]})),
            route(&o, "and", json!({"uri": "/v/and", "vars": [["arg_a", "==", "1"], ["arg_b", "==", "2"]]})),
            route(&o, "or", json!({"uri": "/v/or", "vars": ["OR", ["arg_a", "==", "1"], ["arg_b", "==", "2"]]})),
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let hdr = |path: &str, h: &str| format!("GET {path} HTTP/1.1\r\nHost: test.local\r\n{h}\r\n\r\n");
        let cases: Vec<(String, &str)> = vec![
            (get("/v/eq?k=v"), "eq"),
            (get("/v/eq?k=w"), "404"),
            (get("/v/eq"), "404"),
            (get("/v/ne?k=w"), "ne"),
            (get("/v/ne?k=v"), "404"),
            (get("/v/gt?n=11"), "gt"),
            (get("/v/gt?n=9"), "404"),
            (get("/v/gt?n=abc"), "404"),
            (get("/v/lt?n=9.5"), "lt"),
            (get("/v/lt?n=10"), "404"),
            (hdr("/v/re", "X-Tier: gold-42"), "re"),
            (hdr("/v/re", "X-Tier: silver-42"), "404"),
            (hdr("/v/rei", "X-Tier: gold-1"), "rei"),
            (hdr("/v/in", "Cookie: a=1; region=eu"), "in"),
            (hdr("/v/in", "Cookie: region=asia"), "404"),
            (hdr("/v/has", "X-Tags: a\r\nX-Tags: b"), "has"),
            (hdr("/v/has", "X-Tags: a"), "404"),
            (get("/v/not?k=w"), "not"),
            (get("/v/not?k=v"), "404"),
            (get("/v/ip"), "ip"),
            (get("/v/ipno"), "404"),
            (get("/v/uri/x/deep"), "uri"),
            (get("/v/uri/x/shallow"), "404"),
            (get_host("/v/host", "h.test"), "host"),
            (get_host("/v/host", "g.test"), "404"),
            (get("/v/and?a=1&b=2"), "and"),
            (get("/v/and?a=1&b=3"), "404"),
            (get("/v/or?a=0&b=2"), "or"),
            (get("/v/or?a=0&b=3"), "404"),
        ];
        for (req, want) in cases {
            let line = req.lines().next().unwrap_or_default().to_owned();
            assert_eq!(which(&mut c, req).await, want, "{line}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_upstream_ids_merge_as_apisix() {
    t(async {
        let a = Origin::start("A").await;
        let b = Origin::start("B").await;
        let s = Origin::start("S").await;
        let gw = Gw::start(json!({
            "upstreams": [{"id": "ub", "nodes": {b.addr.to_string(): 1}, "type": "roundrobin"}],
            "services": [
                {"id": "svc", "upstream": {"nodes": {s.addr.to_string(): 1}, "type": "roundrobin"}},
                {"id": "svc-hosts", "hosts": ["svc.test"], "upstream_id": "ub"},
            ],
            "routes": [
                {"id": "1", "uri": "/svc", "service_id": "svc"},
                {"id": "2", "uri": "/own", "service_id": "svc",
                 "upstream": {"nodes": {a.addr.to_string(): 1}, "type": "roundrobin"}},
                {"id": "3", "uri": "/byid", "service_id": "svc", "upstream_id": "ub"},
                {"id": "4", "uri": "/hosts", "service_id": "svc-hosts"},
                {"id": "5", "uri": "/plain", "upstream_id": "ub"},
            ]
        }));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get("/svc").await.origin(), "S");
        assert_eq!(
            c.get("/own").await.origin(),
            "A",
            "route upstream beats service's"
        );
        assert_eq!(
            c.get("/byid").await.origin(),
            "B",
            "route upstream_id beats service's"
        );
        assert_eq!(c.get("/plain").await.origin(), "B");
        assert_eq!(c.get_host("/hosts", "svc.test").await.origin(), "B");
        assert_eq!(
            c.get_host("/hosts", "other.test").await.status,
            404,
            "service hosts apply"
        );
        assert_eq!(c.get("/nothing").await.text().trim_end(), NOT_FOUND);
    })
    .await
}
