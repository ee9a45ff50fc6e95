use std::sync::Arc;

use serde_json::json;
use sluice_model::Resources;
use sluice_plugins::Shared;

use crate::snapshot::Snapshot;

fn res(v: serde_json::Value) -> Resources {
    serde_json::from_value(v).expect("resources")
}

fn route(id: &str, uri: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut r = json!({"id": id, "uri": uri,
        "plugins": {"proxy-rewrite": {"uri": "/rewritten"}},
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}});
    if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            if v.is_null() {
                o.remove(k);
            } else {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    r
}

fn base() -> serde_json::Value {
    json!({
        "routes": [
            route("1", "/a", json!({})),
            route("2", "/b", json!({})),
            route("3", "/c", json!({"upstream": null, "service_id": "s1"})),
            route("4", "/d", json!({"upstream": null, "upstream_id": "u1"})),
        ],
        "services": [{"id": "s1", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1981": 1}}}],
        "upstreams": [{"id": "u1", "type": "roundrobin", "nodes": {"127.0.0.1:1982": 1}}],
        "consumers": [{"username": "jack", "plugins": {"key-auth": {"key": "k1"}}}]
    })
}

fn chain(s: &Snapshot, id: &str) -> Arc<sluice_plugins::Chain> {
    let r = s.routes().find(|r| &*r.id == id).expect("route");
    r.plugins.clone().expect("chain")
}

fn same(a: &Snapshot, b: &Snapshot, id: &str) -> bool {
    Arc::ptr_eq(&chain(a, id), &chain(b, id))
}

#[test]
fn unchanged_routes_keep_their_compile_and_changed_ones_recompile() {
    let shared = Shared::default();
    let v0 = base();
    let s0 = Snapshot::compile_with(&res(v0.clone()), 1, &shared).expect("compile");

    // Route 2 changes; 1, 3 and 4 are reused as they were.
    let mut v1 = v0.clone();
    v1["routes"][1] = route("2", "/b2", json!({}));
    let s1 = Snapshot::compile_next(&res(v1.clone()), 2, &shared, Some(&s0)).expect("compile");
    assert!(same(&s0, &s1, "1") && same(&s0, &s1, "3") && same(&s0, &s1, "4"));
    assert!(!same(&s0, &s1, "2"));
    // The inline upstream of a reused route is still registered for the health checker and the next compile.
    assert!(s1.upstream_entries().any(|(k, _)| k == "r:1"));

    // Deleting route 1 shifts every index; what remains keeps its compile and its order.
    let mut v2 = v1.clone();
    if let Some(a) = v2["routes"].as_array_mut() {
        a.remove(0);
    }
    let s2 = Snapshot::compile_next(&res(v2.clone()), 3, &shared, Some(&s1)).expect("compile");
    let ids: Vec<&str> = s2.routes().map(|r| &*r.id).collect();
    assert_eq!(ids, ["2", "3", "4"]);
    assert!(same(&s1, &s2, "2") && same(&s1, &s2, "3"));

    // A service change recompiles its routes only; an upstream change recompiles the routes that use it.
    let mut v3 = v2.clone();
    v3["services"][0]["upstream"]["nodes"] = json!({"127.0.0.1:1983": 1});
    v3["upstreams"][0]["nodes"] = json!({"127.0.0.1:1984": 1});
    let s3 = Snapshot::compile_next(&res(v3.clone()), 4, &shared, Some(&s2)).expect("compile");
    assert!(same(&s2, &s3, "2"));
    assert!(!same(&s2, &s3, "3") && !same(&s2, &s3, "4"));
    let r4 = s3.routes().find(|r| &*r.id == "4").expect("route 4");
    assert_eq!(r4.upstream.nodes[0].addr.port(), 1984);

    // Consumers are part of every chain's environment: any change there recompiles everything.
    let mut v4 = v3.clone();
    v4["consumers"][0]["plugins"]["key-auth"]["key"] = json!("k2");
    let s4 = Snapshot::compile_next(&res(v4), 5, &shared, Some(&s3)).expect("compile");
    assert!(!same(&s3, &s4, "2") && !same(&s3, &s4, "3"));
}

#[test]
fn other_plugin_state_or_errors_never_reuse() {
    let shared = Shared::default();
    let v0 = base();
    let s0 = Snapshot::compile_with(&res(v0.clone()), 1, &shared).expect("compile");
    // Chains hold their plugin state: compiled under another `Shared`, nothing is taken from `s0`.
    let other = Shared::default();
    let s1 = Snapshot::compile_next(&res(v0.clone()), 2, &other, Some(&s0)).expect("compile");
    assert!(!same(&s0, &s1, "1"));
    // A reference that broke (service deleted with `?force=true`) is seen even though the route itself did not
    // change: the route stays routable and answers 404 (APISIX), and the service coming back heals it.
    let mut v2 = v0.clone();
    v2["services"] = json!([]);
    let s2 = Snapshot::compile_next(&res(v2), 3, &shared, Some(&s0)).expect("compile");
    let dangling =
        |s: &Snapshot, id: &str| s.routes().find(|r| &*r.id == id).expect("route").dangling;
    assert_eq!(dangling(&s2, "3"), Some(404));
    assert_eq!(dangling(&s2, "1"), None);
    let s3 = Snapshot::compile_next(&res(v0), 4, &shared, Some(&s2)).expect("compile");
    assert_eq!(dangling(&s3, "3"), None);
    assert_eq!(
        s3.routes()
            .find(|r| &*r.id == "3")
            .expect("route")
            .upstream
            .nodes[0]
            .addr
            .port(),
        1981
    );
}

#[test]
fn prepare_validates_fresh_routes_and_finish_builds_the_router() {
    let shared = Shared::default();
    let v0 = base();
    let s0 = Snapshot::compile_with(&res(v0.clone()), 1, &shared).expect("compile");
    // A fresh route the router refuses fails the preparation, named, while the others are reused.
    let mut bad = v0.clone();
    bad["routes"][1] = route("2", "/b", json!({"remote_addrs": ["999.1.1.1"]}));
    let e = Snapshot::prepare_next(&res(bad), 2, &shared, Some(&s0))
        .err()
        .expect("bad remote_addrs");
    assert!(e.starts_with("route 2: "), "{e}");
    // A good one prepares, and finishing gives the same routes in the same order as a full compile.
    let mut good = v0;
    good["routes"][1] = route("2", "/b3", json!({}));
    let p = Snapshot::prepare_next(&res(good.clone()), 2, &shared, Some(&s0)).expect("prepare");
    let s = p.finish().expect("finish");
    let full = Snapshot::compile_with(&res(good), 2, &Shared::default()).expect("compile");
    let ids = |s: &Snapshot| s.routes().map(|r| r.id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(&s), ids(&full));
    assert_eq!(s.router.len(), 4);
}

/// The route id `s` routes `GET host path` to.
fn routed(s: &Snapshot, host: Option<&str>, path: &str) -> Option<String> {
    let q = crate::inspect::MatchInput {
        method: "GET",
        host,
        uri: path,
        headers: &[],
        remote: std::net::IpAddr::from([127, 0, 0, 1]),
        consumer: None,
    };
    s.match_request(&q, false)
        .expect("match")
        .map(|o| o.route_id)
}

#[test]
fn router_is_kept_when_no_route_matching_changes() {
    let shared = Shared::default();
    let v0 = base();
    let s0 = Snapshot::compile_with(&res(v0.clone()), 1, &shared).expect("compile");
    // Route 2's upstream and plugins change: same matching, the router is the previous one.
    let mut v1 = v0.clone();
    v1["routes"][1]["upstream"]["nodes"] = json!({"127.0.0.1:1985": 1});
    v1["routes"][1]["plugins"] = json!({});
    let s1 = Snapshot::compile_next(&res(v1.clone()), 2, &shared, Some(&s0)).expect("compile");
    assert!(Arc::ptr_eq(&s0.router, &s1.router));
    assert!(same(&s0, &s1, "1"));
    let r2 = s1.routes().find(|r| &*r.id == "2").expect("route 2");
    assert_eq!(r2.upstream.nodes[0].addr.port(), 1985);
    // Its uri changes: a new router, which routes the new uri and no longer the old one.
    let mut v2 = v1.clone();
    v2["routes"][1]["uri"] = json!("/b2");
    let s2 = Snapshot::compile_next(&res(v2.clone()), 3, &shared, Some(&s1)).expect("compile");
    assert!(!Arc::ptr_eq(&s1.router, &s2.router));
    assert_eq!(routed(&s2, None, "/b2").as_deref(), Some("2"));
    assert_eq!(routed(&s2, None, "/b"), None);
    // A new route (every later index shifts) and a deleted one rebuild it too; a host change as well.
    for edit in [
        json!({"add": route("15", "/new", json!({}))}),
        json!({"remove": 0}),
        json!({"host": "a.example.com"}),
    ] {
        let mut v = v2.clone();
        let routes = v["routes"].as_array_mut().expect("routes");
        if let Some(r) = edit.get("add") {
            routes.insert(1, r.clone());
        } else if let Some(i) = edit.get("remove").and_then(|i| i.as_u64()) {
            routes.remove(i as usize);
        } else {
            routes[2]["host"] = edit["host"].clone();
        }
        let s = Snapshot::compile_next(&res(v.clone()), 4, &shared, Some(&s2)).expect("compile");
        assert!(!Arc::ptr_eq(&s2.router, &s.router), "{edit}");
        let full = Snapshot::compile_with(&res(v), 4, &Shared::default()).expect("compile");
        for (host, path) in [
            (None, "/a"),
            (None, "/b2"),
            (None, "/c"),
            (None, "/d"),
            (None, "/new"),
        ]
        .into_iter()
        .chain([(Some("a.example.com"), "/c"), (Some("b.example.com"), "/c")])
        {
            assert_eq!(
                routed(&s, host, path),
                routed(&full, host, path),
                "{edit} {path}"
            );
        }
    }
}

/// Random route sets edited at random (add, delete, change uri, host, method, priority or upstream): each
/// successor compiled from the previous snapshot routes every probe as a compile from scratch does, and keeps
/// the previous router exactly when no route's matching changed.
#[test]
fn successive_compiles_route_like_full_compiles() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let uris = ["/a", "/a/*", "/b", "/b/:id", "/c*", "/", "/*", "/a/b"];
    let hosts = [None, Some("x.test"), Some("*.test")];
    let mk = |rng: &mut rand::rngs::StdRng, id: u32| {
        let mut r = json!({"id": id.to_string(), "uri": uris[rng.gen_range(0..uris.len())],
            "priority": rng.gen_range(0..3),
            "upstream": {"type": "roundrobin", "nodes": {format!("127.0.0.1:{}", 2000 + rng.gen_range(0..3)): 1}}});
        if let Some(h) = hosts[rng.gen_range(0..hosts.len())] {
            r["host"] = json!(h);
        }
        if rng.gen_bool(0.3) {
            r["methods"] = json!(["POST"]);
        }
        r
    };
    let probes = ["/a", "/a/x", "/a/b", "/b", "/b/7", "/c", "/cd", "/", "/zz"];
    let shared = Shared::default();
    for round in 0..20 {
        let mut routes: Vec<serde_json::Value> =
            (0..rng.gen_range(1..12)).map(|i| mk(&mut rng, i)).collect();
        let mut next_id = 100;
        let mut prev =
            Snapshot::compile_with(&res(json!({"routes": routes})), 1, &shared).expect("compile");
        for step in 0..15 {
            let i = rng.gen_range(0..routes.len());
            let matching = match rng.gen_range(0..5) {
                0 => {
                    next_id += 1;
                    routes.insert(i, mk(&mut rng, next_id));
                    true
                }
                1 if routes.len() > 1 => {
                    routes.remove(i);
                    true
                }
                2 => {
                    let id = routes[i]["id"].as_str().map(str::to_owned).expect("id");
                    let mut r = mk(&mut rng, 0);
                    r["id"] = json!(id);
                    routes[i] = r;
                    true
                }
                _ => {
                    let port = 2000 + rng.gen_range(0..3);
                    routes[i]["upstream"]["nodes"] = json!({format!("127.0.0.1:{port}"): 1});
                    false
                }
            };
            let v = res(json!({"routes": routes}));
            let next = Snapshot::compile_next(&v, 2, &shared, Some(&prev)).expect("compile");
            let full = Snapshot::compile_with(&v, 2, &Shared::default()).expect("compile");
            if !matching {
                assert!(
                    Arc::ptr_eq(&prev.router, &next.router),
                    "round {round} step {step}"
                );
            }
            for host in [None, Some("x.test"), Some("y.test")] {
                for p in probes {
                    assert_eq!(
                        routed(&next, host, p),
                        routed(&full, host, p),
                        "round {round} step {step} {host:?} {p}"
                    );
                }
            }
            prev = next;
        }
    }
}

fn arc_route(v: serde_json::Value) -> Arc<sluice_model::Route> {
    Arc::new(serde_json::from_value(v).expect("route"))
}

/// The Admin API's writes: each configuration is the previous one with a few routes added, replaced or removed in
/// place (the other `Arc`s shared), so the successor is compiled route by route. Every step must route every probe
/// exactly as a compile from scratch does, the same when something besides routes changes (the full compile from
/// the previous snapshot), and keep the previous router when no route's matching changed.
#[test]
fn per_route_successors_route_like_full_compiles() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let uris = ["/a", "/a/*", "/b", "/b/:id", "/*", "/a/b"];
    let mk = |rng: &mut rand::rngs::StdRng, id: u32| {
        let mut r = json!({"id": format!("{id:05}"), "uri": uris[rng.gen_range(0..uris.len())],
            "priority": rng.gen_range(0..2),
            "upstream": {"type": "roundrobin", "nodes": {format!("127.0.0.1:{}", 2000 + rng.gen_range(0..3)): 1}}});
        if rng.gen_bool(0.2) {
            r["host"] = json!("x.test");
        }
        if rng.gen_bool(0.1) {
            r["status"] = json!(0);
        }
        r
    };
    let probes = ["/a", "/a/x", "/a/b", "/b", "/b/7", "/", "/zz"];
    let shared = Shared::default();
    for round in 0..12 {
        let mut res = Resources::default();
        for i in 0..rng.gen_range(1..40) {
            res.routes.push_back(arc_route(mk(&mut rng, i * 10)));
        }
        let mut prev = Snapshot::compile_with(&res, 1, &shared).expect("compile");
        let mut next_id = 1000;
        for step in 0..40 {
            let n = res.routes.len();
            let i = rng.gen_range(0..n);
            // Several inserts in a row at one place use up the room between two orders (renumbered then).
            let matching = match rng.gen_range(0..6) {
                0 | 1 => {
                    next_id += 1;
                    res.routes.insert(i, arc_route(mk(&mut rng, next_id)));
                    true
                }
                2 if n > 1 => {
                    res.routes.remove(i);
                    true
                }
                3 => {
                    let mut r = mk(&mut rng, 0);
                    r["id"] = json!(res.routes[i].id.0.clone());
                    res.routes.set(i, arc_route(r));
                    true
                }
                _ => {
                    let mut r = serde_json::to_value(&*res.routes[i]).expect("json");
                    r["upstream"]["nodes"] =
                        json!({format!("127.0.0.1:{}", 2000 + rng.gen_range(0..3)): 1});
                    res.routes.set(i, arc_route(r));
                    false
                }
            };
            let next = Snapshot::compile_next(&res, 2, &shared, Some(&prev)).expect("compile");
            let full = Snapshot::compile_with(&res, 2, &Shared::default()).expect("compile");
            // Something else changes too: the full compile, from the previous snapshot.
            let mut other = res.clone();
            other.consumers = serde_json::from_value(
                json!([{"username": format!("c{step}"), "plugins": {"key-auth": {"key": "k"}}}]),
            )
            .expect("consumers");
            let slow = Snapshot::compile_next(&other, 2, &shared, Some(&prev)).expect("compile");
            if !matching {
                assert!(
                    Arc::ptr_eq(&prev.router, &next.router),
                    "round {round} step {step}"
                );
            }
            assert_eq!(next.route_count(), full.route_count());
            for host in [None, Some("x.test")] {
                for p in probes {
                    let want = routed(&full, host, p);
                    assert_eq!(
                        routed(&next, host, p),
                        want,
                        "round {round} step {step} {host:?} {p}"
                    );
                    assert_eq!(
                        routed(&slow, host, p),
                        want,
                        "full, round {round} step {step} {host:?} {p}"
                    );
                }
            }
            // Continue from either (`slow` was compiled from `other`'s configuration).
            prev = if rng.gen_bool(0.3) {
                res = other;
                slow
            } else {
                next
            };
        }
    }
}

/// Ties between routes of the same uri and priority go to the one first in the configuration, also after routes
/// were added before it one by one (each taking an order between its neighbours' until there is no room left).
#[test]
fn routes_added_in_front_win_ties_in_configuration_order() {
    let shared = Shared::default();
    let mut res = Resources::default();
    let r = |id: String| {
        arc_route(json!({"id": id, "uri": "/x",
            "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}))
    };
    res.routes.push_back(r("first".into()));
    res.routes.push_back(r("last".into()));
    let mut s = Snapshot::compile_with(&res, 1, &shared).expect("compile");
    for i in 0..40 {
        // Always between the two: just before "last".
        let at = res.routes.len() - 1;
        res.routes.insert(at, r(format!("m{i:02}")));
        s = Snapshot::compile_next(&res, 2, &shared, Some(&s)).expect("compile");
        assert_eq!(routed(&s, None, "/x").as_deref(), Some("first"));
        // Remove "first" on a copy: the winner is then the earliest of the added ones.
        let mut without = res.clone();
        without.routes.remove(0);
        let w = Snapshot::compile_next(&without, 3, &shared, Some(&s)).expect("compile");
        assert_eq!(routed(&w, None, "/x").as_deref(), Some("m00"), "after {i}");
        // And the newest one in front of everything wins.
        let mut front = res.clone();
        front.routes.push_front(r("zfront".into()));
        let f = Snapshot::compile_next(&front, 3, &shared, Some(&s)).expect("compile");
        assert_eq!(
            routed(&f, None, "/x").as_deref(),
            Some("zfront"),
            "after {i}"
        );
    }
    assert_eq!(s.route_count(), 42);
}

/// The shared prefix and suffix of two route vectors, counted over their leaves, equal a route-by-route count
/// whatever edits split or merged the leaves.
#[test]
fn shared_runs_match_a_route_by_route_count() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mk = |i: usize| arc_route(json!({"id": i.to_string(), "uri": "/x"}));
    for _ in 0..60 {
        let a: imbl::Vector<_> = (0..rng.gen_range(0..600)).map(mk).collect();
        let mut b = a.clone();
        for _ in 0..rng.gen_range(0..4) {
            let n = b.len();
            match rng.gen_range(0..3) {
                0 => b.insert(rng.gen_range(0..=n), mk(9999)),
                1 if n > 0 => {
                    b.remove(rng.gen_range(0..n));
                }
                _ if n > 0 => {
                    b.set(rng.gen_range(0..n), mk(7777));
                }
                _ => {}
            }
        }
        let want_prefix = a
            .iter()
            .zip(b.iter())
            .take_while(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        let room = a.len().min(b.len()) - want_prefix;
        let want_suffix = a
            .iter()
            .rev()
            .zip(b.iter().rev())
            .take(room)
            .take_while(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        let prefix = super::super::shared_run(a.leaves(), b.leaves(), usize::MAX, false);
        let suffix = super::super::shared_run(a.leaves().rev(), b.leaves().rev(), room, true);
        assert_eq!((prefix, suffix), (want_prefix, want_suffix));
    }
}

/// A route added by a write whose traffic-split comes from its service still gets its split targets (the per-route
/// path leaves such a route to the full compile).
#[test]
fn a_route_added_under_a_traffic_split_service_gets_its_targets() {
    let shared = Shared::default();
    let mut res: Resources = serde_json::from_value(json!({
        "services": [{"id": "s", "plugins": {"traffic-split": {"rules": [{"weighted_upstreams": [
            {"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1990": 1}}, "weight": 1},
            {"weight": 1}
        ]}]}}, "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}],
        "routes": [{"id": "1", "uri": "/a", "service_id": "s"}]
    }))
    .expect("resources");
    let s0 = Snapshot::compile_with(&res, 1, &shared).expect("compile");
    assert_eq!(s0.served_by_id("1").map(|s| s.splits.len()), Some(1));
    res.routes.push_back(arc_route(
        json!({"id": "2", "uri": "/b", "service_id": "s"}),
    ));
    let s1 = Snapshot::compile_next(&res, 2, &shared, Some(&s0)).expect("compile");
    assert_eq!(s1.served_by_id("2").map(|s| s.splits.len()), Some(1));
    assert_eq!(s1.served_by_id("1").map(|s| s.splits.len()), Some(1));
}

/// Issue 16: upstream runtimes that set none of the rarely set parts share one `Rare`; one that sets some gets its
/// own with its values.
#[test]
fn runtimes_without_rare_settings_share_them() {
    let shared = Shared::default();
    let mut v = base();
    v["routes"][1]["upstream"]["retries"] = json!(2);
    v["routes"][1]["upstream"]["timeout"] = json!({"connect": 1, "send": 2, "read": 3});
    let s = Snapshot::compile_with(&res(v), 1, &shared).expect("compile");
    let up = |id: &str| {
        s.routes()
            .find(|r| &*r.id == id)
            .expect("route")
            .upstream
            .clone()
    };
    let (a, b, c, d) = (up("1"), up("2"), up("3"), up("4"));
    assert!(Arc::ptr_eq(&a.rare, &c.rare) && Arc::ptr_eq(&a.rare, &d.rare));
    assert!(!Arc::ptr_eq(&a.rare, &b.rare));
    assert_eq!((a.retries, b.retries), (None, Some(2)));
    assert!(a.timeouts.is_none());
    let t = b.timeouts.expect("timeouts");
    assert_eq!(
        (t.connect.as_secs(), t.send.as_secs(), t.read.as_secs()),
        (1, 2, 3)
    );
}

/// Issue 16: routes with equal inline upstreams (one `Arc` once decoded) share one runtime, in a full compile, in a
/// per-route successor and in a full compile after it; a route whose upstream differs, or has health checks (the
/// checker lists those per route), gets its own.
#[test]
fn equal_inline_upstreams_share_one_runtime() {
    let shared = Shared::default();
    let up = json!({"type": "roundrobin", "nodes": {"127.0.0.1:1990": 1}});
    let checked = json!({"type": "roundrobin", "nodes": {"127.0.0.1:1990": 1},
        "checks": {"active": {"http_path": "/status"}}});
    let r0 = res(json!({"routes": [
        {"id": "1", "uri": "/1", "upstream": up},
        {"id": "2", "uri": "/2", "upstream": up},
        {"id": "3", "uri": "/3", "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1990": 2}}},
        {"id": "4", "uri": "/4", "upstream": checked},
        {"id": "5", "uri": "/5", "upstream": checked},
    ]}));
    let rt = |s: &Snapshot, id: &str| s.served_by_id(id).expect("route").route.upstream.clone();
    let s0 = Snapshot::compile_with(&r0, 1, &shared).expect("compile");
    assert!(Arc::ptr_eq(&rt(&s0, "1"), &rt(&s0, "2")));
    assert!(!Arc::ptr_eq(&rt(&s0, "1"), &rt(&s0, "3")));
    assert!(!Arc::ptr_eq(&rt(&s0, "4"), &rt(&s0, "5")));
    assert_eq!(
        s0.upstream_runtimes().count(),
        2,
        "each checked route's runtime is listed"
    );

    // A route added by a write: compiled route by route, it finds the shared runtime.
    let mut r1 = r0.clone();
    r1.routes
        .push_back(arc_route(json!({"id": "6", "uri": "/6", "upstream": up})));
    let s1 = Snapshot::compile_next(&r1, 2, &shared, Some(&s0)).expect("compile");
    assert!(Arc::ptr_eq(&rt(&s1, "6"), &rt(&s0, "1")));
    assert!(Arc::ptr_eq(&rt(&s1, "2"), &rt(&s0, "1")));

    // Route 2's upstream changes: it alone gets a runtime of its own.
    let mut r2 = r1.clone();
    r2.routes.set(
        1,
        arc_route(json!({"id": "2", "uri": "/2",
            "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1990": 1, "127.0.0.1:1991": 1}}})),
    );
    let s2 = Snapshot::compile_next(&r2, 3, &shared, Some(&s1)).expect("compile");
    assert!(!Arc::ptr_eq(&rt(&s2, "2"), &rt(&s2, "1")));
    assert_eq!(rt(&s2, "2").nodes.len(), 2);
    assert!(Arc::ptr_eq(&rt(&s2, "6"), &rt(&s0, "1")));

    // Something besides routes changes: the full compile keeps the sharing (and the runtime).
    let mut r3 = r2.clone();
    r3.upstreams =
        res(json!({"upstreams": [{"id": "u9", "nodes": {"127.0.0.1:1999": 1}}]})).upstreams;
    let s3 = Snapshot::compile_next(&r3, 4, &shared, Some(&s2)).expect("compile");
    assert!(Arc::ptr_eq(&rt(&s3, "1"), &rt(&s0, "1")));
    assert!(Arc::ptr_eq(&rt(&s3, "6"), &rt(&s0, "1")));
    assert!(!Arc::ptr_eq(&rt(&s3, "4"), &rt(&s3, "5")));
}
