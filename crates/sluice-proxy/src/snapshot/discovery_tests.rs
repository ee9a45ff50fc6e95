//! Upstreams with a `discovery_type`: compiled with the nodes a `Discovery` gives, kept across compiles while
//! those do not change, 503 without any.

use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use sluice_model::{Discovery, Node, Resources};
use sluice_plugins::Shared;

use crate::snapshot::Snapshot;

/// Nodes by service name, for `discovery_type: "zk"` only.
#[derive(Default)]
struct Fake(Mutex<Vec<(String, Vec<Node>)>>);

impl Fake {
    fn set(&self, service: &str, ports: &[u16]) {
        let nodes = ports
            .iter()
            .map(|p| Node {
                host: "127.0.0.1".into(),
                port: Some(*p),
                weight: 1,
                priority: 0,
                metadata: None,
            })
            .collect();
        let mut m = self.0.lock().unwrap();
        m.retain(|(s, _)| s != service);
        m.push((service.to_owned(), nodes));
    }
}

impl Discovery for Fake {
    fn nodes(
        &self,
        kind: &str,
        service: &str,
        _args: Option<&Map<String, Value>>,
    ) -> Option<Vec<Node>> {
        (kind == "zk").then(|| {
            let m = self.0.lock().unwrap();
            m.iter()
                .find(|(s, _)| s == service)
                .map(|(_, n)| n.clone())
                .unwrap_or_default()
        })
    }
}

fn res() -> Resources {
    serde_json::from_value(json!({
        "routes": [
            {"id": "inline", "uri": "/i", "upstream": {"type": "roundrobin", "discovery_type": "zk", "service_name": "a"}},
            {"id": "shared", "uri": "/s", "upstream_id": "u"},
            {"id": "static", "uri": "/t", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}},
            {"id": "other", "uri": "/o", "upstream": {"type": "roundrobin", "discovery_type": "eureka", "service_name": "a"}}
        ],
        "upstreams": [{"id": "u", "type": "roundrobin", "discovery_type": "zk", "service_name": "b"}]
    }))
    .expect("resources")
}

fn up<'a>(s: &'a Snapshot, id: &str) -> &'a Arc<crate::snapshot::UpstreamRt> {
    &s.routes().find(|r| &*r.id == id).expect("route").upstream
}

fn ports(s: &Snapshot, id: &str) -> Vec<u16> {
    up(s, id).nodes.iter().map(|n| n.addr.port()).collect()
}

#[test]
fn discovered_nodes_compile_in_and_changes_swap_only_what_changed() {
    let shared = Shared::default();
    let d = Fake::default();
    let r = res();
    // Nothing discovered yet: both 503 with APISIX's reason; an unknown type is "uninitialized".
    let s0 = Snapshot::compile_discovered(&r, 1, &shared, None, Some(&d)).expect("compile");
    let missing = |s: &Snapshot, id: &str| up(s, id).missing.clone();
    assert_eq!(missing(&s0, "inline").map(|m| m.0), Some(503));
    assert!(missing(&s0, "shared")
        .is_some_and(|m| m.0 == 503 && m.1.starts_with("no valid upstream node")));
    assert!(missing(&s0, "other")
        .is_some_and(|m| m.0 == 503 && &*m.1 == "discovery eureka is uninitialized"));
    // Without any discovery configured, the same configuration still compiles (503 per request).
    let plain = Snapshot::compile(&r, 1).expect("compile");
    assert!(missing(&plain, "inline").is_some_and(|m| &*m.1 == "discovery zk is uninitialized"));

    d.set("a", &[2001, 2002]);
    d.set("b", &[3001]);
    let s1 = Snapshot::compile_discovered(&r, 1, &shared, Some(&s0), Some(&d)).expect("compile");
    assert_eq!(ports(&s1, "inline"), [2001, 2002]);
    assert_eq!(ports(&s1, "shared"), [3001]);
    assert!(missing(&s1, "inline").is_none() && missing(&s1, "shared").is_none());

    // Only b's nodes change: a's runtime (and the static one) are kept as they were, b's is new.
    d.set("b", &[3001, 3002]);
    let s2 = Snapshot::compile_discovered(&r, 1, &shared, Some(&s1), Some(&d)).expect("compile");
    assert!(Arc::ptr_eq(up(&s1, "inline"), up(&s2, "inline")));
    assert!(Arc::ptr_eq(up(&s1, "static"), up(&s2, "static")));
    assert!(!Arc::ptr_eq(up(&s1, "shared"), up(&s2, "shared")));
    assert_eq!(ports(&s2, "shared"), [3001, 3002]);

    // a's change reaches its route although the route itself did not change (its compile is not reused).
    d.set("a", &[2003]);
    let s3 = Snapshot::compile_discovered(&r, 1, &shared, Some(&s2), Some(&d)).expect("compile");
    assert_eq!(ports(&s3, "inline"), [2003]);
    assert!(Arc::ptr_eq(up(&s2, "shared"), up(&s3, "shared")));

    // Every provider gone: 503 again.
    d.set("a", &[]);
    let s4 = Snapshot::compile_discovered(&r, 1, &shared, Some(&s3), Some(&d)).expect("compile");
    assert_eq!(missing(&s4, "inline").map(|m| m.0), Some(503));
}
