use serde_json::json;
use sluice_model::{NodeConfig, Resources};

use super::*;
use crate::Snapshot;

fn node(apisix: Value) -> NodeConfig {
    let mut v = json!({"apisix": apisix});
    v["apisix"]["node_listen"] = json!(9080);
    serde_json::from_value(v).unwrap()
}

#[test]
fn reads_stream_proxy_as_apisix() {
    let n = node(json!({"proxy_mode": "http&stream", "stream_proxy": {
        "tcp": [9100, "127.0.0.1:9101", {"addr": 9102, "tls": true}, {"addr": "[::1]:9103"}],
        "udp": [9200, "127.0.0.1:9201"]
    }}));
    let l = stream_listen(&n).unwrap();
    assert_eq!(
        l.tcp,
        vec![
            ("0.0.0.0:9100".parse().unwrap(), false),
            ("127.0.0.1:9101".parse().unwrap(), false),
            ("0.0.0.0:9102".parse().unwrap(), true),
            ("[::1]:9103".parse().unwrap(), false),
        ]
    );
    assert_eq!(l.udp.len(), 2);
    assert_eq!(n.apisix.proxy_modes(), (true, true));
    // proxy_mode http (APISIX's default): stream_proxy is not opened.
    let off = node(json!({"stream_proxy": {"tcp": [9100]}}));
    assert!(stream_listen(&off).unwrap().is_empty());
    // APISIX 2.x's `only`.
    let only = node(json!({"stream_proxy": {"only": true, "tcp": [9100]}}));
    assert_eq!(only.apisix.proxy_modes(), (false, true));
    assert_eq!(stream_listen(&only).unwrap().tcp.len(), 1);
    for bad in [
        json!({"tcp": [0]}),
        json!({"tcp": [70000]}),
        json!({"tcp": ["9100-9105"]}),
        json!({"tcp": ["nohost:x"]}),
        json!({"tcp": [{"addr": 9100, "proxy_protocol": true}]}),
        json!({"tcp": [{"addr": 9100, "tls": "yes"}]}),
        json!({"tcp": [9100, 9100]}),
        json!({"tcp": []}),
        json!({"udp": [true]}),
    ] {
        let n = node(json!({"proxy_mode": "stream", "stream_proxy": bad.clone()}));
        assert!(stream_listen(&n).is_err(), "{bad}");
    }
}

fn compile(routes: Value) -> Snapshot {
    let res: Resources = serde_json::from_value(json!({"stream_routes": routes})).unwrap();
    Snapshot::compile(&res, 1).unwrap()
}

fn hit(s: &Snapshot, sni: Option<&str>, remote: &str, local: &str) -> Option<String> {
    s.stream
        .find(sni, remote.parse().unwrap(), local.parse().unwrap())
        .map(|r| r.id.to_string())
}

#[test]
fn matches_in_apisix_order() {
    let up = json!({"nodes": {"127.0.0.1:1995": 1}, "type": "roundrobin"});
    let s = compile(json!([
        {"id": "a", "remote_addr": "10.0.0.0/8", "upstream": up},
        {"id": "b", "server_port": 9101, "upstream": up},
        {"id": "c", "server_addr": "127.0.0.2", "upstream": up},
        {"id": "d", "sni": "db.example.com", "remote_addr": "192.168.1.1", "upstream": up},
        {"id": "e", "sni": "DB.example.com", "upstream": up},
        {"id": "f", "sni": "*.example.com", "upstream": up},
        {"id": "g", "sni": "*.b.example.com", "upstream": up},
        {"id": "h", "upstream": up},
    ]));
    assert_eq!(
        hit(&s, None, "10.1.2.3", "127.0.0.1:9100").as_deref(),
        Some("a")
    );
    assert_eq!(
        hit(&s, None, "11.1.2.3", "127.0.0.1:9101").as_deref(),
        Some("b")
    );
    assert_eq!(
        hit(&s, None, "11.1.2.3", "127.0.0.2:9100").as_deref(),
        Some("c")
    );
    assert_eq!(
        hit(&s, None, "::ffff:11.1.2.3", "127.0.0.1:9100").as_deref(),
        Some("h")
    );
    // IPv4-mapped clients match IPv4 CIDRs.
    assert_eq!(
        hit(&s, None, "::ffff:10.1.2.3", "127.0.0.1:9100").as_deref(),
        Some("a")
    );
    // SNI routes first (exact, filtered by addresses, in order), then wildcards longest first, then the rest.
    assert_eq!(
        hit(&s, Some("db.example.com"), "192.168.1.1", "127.0.0.1:1").as_deref(),
        Some("d")
    );
    assert_eq!(
        hit(&s, Some("DB.EXAMPLE.COM"), "10.9.9.9", "127.0.0.1:1").as_deref(),
        Some("e")
    );
    assert_eq!(
        hit(&s, Some("x.b.example.com"), "10.9.9.9", "127.0.0.1:1").as_deref(),
        Some("g")
    );
    assert_eq!(
        hit(&s, Some("a.c.example.com"), "10.9.9.9", "127.0.0.1:1").as_deref(),
        Some("f")
    );
    assert_eq!(
        hit(&s, Some("example.com"), "10.9.9.9", "127.0.0.1:1").as_deref(),
        Some("a")
    );
    assert_eq!(
        hit(&s, Some("other.org"), "11.9.9.9", "127.0.0.1:1").as_deref(),
        Some("h")
    );
    assert!(s.stream.wants_sni("127.0.0.1:1".parse().unwrap()));
}

#[test]
fn no_match_and_no_sni_routes() {
    let up = json!({"nodes": {"127.0.0.1:1995": 1}});
    let s = compile(json!([{"id": 1, "server_port": 9000, "upstream": up}]));
    assert_eq!(hit(&s, None, "1.2.3.4", "127.0.0.1:9001"), None);
    assert!(!s.stream.wants_sni("127.0.0.1:9000".parse().unwrap()));
    let s = compile(json!([{"id": 1, "sni": "a.com", "server_port": 9000, "upstream": up}]));
    assert!(s.stream.wants_sni("127.0.0.1:9000".parse().unwrap()));
    assert!(!s.stream.wants_sni("127.0.0.1:9001".parse().unwrap()));
}

#[test]
fn compile_refusals_name_the_route() {
    let up = json!({"nodes": {"127.0.0.1:1995": 1}});
    let cases = [
        (
            json!({"id": 1}),
            "stream route 1: missing upstream configuration",
        ),
        (
            json!({"id": 2, "upstream": up, "protocol": {"name": "redis"}}),
            "xRPC protocol",
        ),
        (
            json!({"id": 3, "upstream": up, "plugins": {"key-auth": {}}}),
            "unknown plugin [key-auth]",
        ),
        (
            json!({"id": 4, "upstream": up, "plugins": {"limit-conn": {"conn": 1}}}),
            "failed to check the configuration of stream plugin [limit-conn]",
        ),
        (
            json!({"id": 5, "upstream": up, "plugins": {"ip-restriction": {"whitelist": ["x"]}}}),
            "stream plugin [ip-restriction]",
        ),
    ];
    for (r, want) in cases {
        let res: Resources = serde_json::from_value(json!({"stream_routes": [r]})).unwrap();
        let e = Snapshot::compile(&res, 1).err().unwrap_or_default();
        assert!(e.contains(want), "{e} !~ {want}");
    }
    // A route naming a missing upstream or service compiles (it closes its connections), as APISIX keeps it.
    let res: Resources = serde_json::from_value(json!({"stream_routes": [
        {"id": 1, "upstream_id": "gone"}, {"id": 2, "service_id": "gone"}
    ]}))
    .unwrap();
    let s = Snapshot::compile(&res, 1).unwrap();
    assert!(s.stream.routes.iter().all(|r| r.upstream.is_none()));
}
