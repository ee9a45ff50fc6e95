//! traffic-split through the proxy (APISIX docs/en/latest/plugins/traffic-split.md, t/plugin/traffic-split*.t):
//! weights exact over whole rounds, `match` rules (any `vars` of a rule, all conditions of a `vars`), the route's
//! own upstream for entries without `upstream`/`upstream_id` and for unmatched requests, `upstream_id`
//! references, and configuration errors.

use serde_json::{json, Value};

use crate::{route, Gw, Origin};

fn inline(o: &Origin) -> Value {
    json!({"type": "roundrobin", "nodes": {o.addr.to_string(): 1}})
}

/// Which origin served each of `n` requests: counts for `a`, `b`, `c`.
fn spread(
    gw: &Gw,
    target: &str,
    headers: &[(&str, &str)],
    n: usize,
    os: [&Origin; 3],
) -> [usize; 3] {
    let before = os.map(Origin::count);
    for _ in 0..n {
        assert_eq!(gw.get(target, headers).status, 200);
    }
    let after = os.map(Origin::count);
    [0, 1, 2].map(|i| after[i] - before[i])
}

#[test]
fn weights_split_exactly_with_the_routes_upstream_as_an_entry() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [{
            "weighted_upstreams": [
                {"upstream": inline(&b), "weight": 3},
                {"upstream": inline(&c), "weight": 2},
                {"weight": 1}
            ]
        }]}}))]}),
    );
    // Exact over whole rounds of 6, across the gateway's worker threads.
    assert_eq!(spread(&gw, "/hello", &[], 60, [&a, &b, &c]), [10, 30, 20]);
}

#[test]
fn zero_weight_and_default_weighted_upstreams() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    // The route's upstream at weight 0 gets nothing (APISIX docs: blue-green release).
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [{
            "weighted_upstreams": [{"upstream": inline(&b), "weight": 1}, {"weight": 0}]
        }]}}))]}),
    );
    assert_eq!(spread(&gw, "/hello", &[], 8, [&a, &b, &c]), [0, 8, 0]);
    drop(gw);
    // A rule without weighted_upstreams defaults to [{weight: 1}]: the route's upstream.
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [
            {"match": [{"vars": [["arg_x", "==", "1"]]}]}
        ]}}))]}),
    );
    assert_eq!(spread(&gw, "/hello?x=1", &[], 4, [&a, &b, &c]), [4, 0, 0]);
}

#[test]
fn match_rules_pick_the_first_matching_rule() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [
            {
                // All conditions of one `vars`; any `vars` of the list.
                "match": [
                    {"vars": [["http_release", "==", "new_release"], ["arg_name", "==", "jack"]]},
                    {"vars": [["http_x_canary", "==", "1"]]}
                ],
                "weighted_upstreams": [{"upstream": inline(&b), "weight": 1}]
            },
            {
                "match": [{"vars": [["arg_name", "~~", "^ro"]]}],
                "weighted_upstreams": [{"upstream": inline(&c), "weight": 1}]
            }
        ]}}))]}),
    );
    let abc = [&a, &b, &c];
    let release = [("release", "new_release")];
    assert_eq!(spread(&gw, "/hello?name=jack", &release, 3, abc), [0, 3, 0]);
    assert_eq!(
        spread(&gw, "/hello", &[("X-Canary", "1")], 2, abc),
        [0, 2, 0]
    );
    // Only one condition of the first `vars`: the second rule or none.
    assert_eq!(spread(&gw, "/hello?name=jack", &[], 2, abc), [2, 0, 0]);
    assert_eq!(spread(&gw, "/hello?name=rose", &release, 2, abc), [0, 0, 2]);
    assert_eq!(spread(&gw, "/hello", &[], 2, abc), [2, 0, 0]);
}

#[test]
fn upstream_id_references_and_reload() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let conf = |up: &Origin| {
        json!({
            "upstreams": [{"id": "u1", "type": "roundrobin", "nodes": {up.addr.to_string(): 1}}],
            "routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [{
                "weighted_upstreams": [{"upstream_id": "u1", "weight": 1}, {"weight": 1}]
            }]}}))]
        })
    };
    let gw = Gw::start(conf(&b));
    assert_eq!(spread(&gw, "/hello", &[], 4, [&a, &b, &c]), [2, 2, 0]);
    // The upstream changes: the route follows it (a compile never keeps a stale reference).
    gw.reload(conf(&c), 2);
    assert_eq!(spread(&gw, "/hello", &[], 4, [&a, &b, &c]), [2, 0, 2]);

    // An upstream_id that names nothing (deleted with `?force=true`): the configuration loads, that pick answers
    // 502 as APISIX's `handle_upstream`, and the upstream coming back heals it.
    let split = json!({"traffic-split": {"rules": [{
        "weighted_upstreams": [{"upstream_id": "nope", "weight": 1}]
    }]}});
    let gw = Gw::start(json!({"routes": [route("r1", "/hello", &a, split.clone())]}));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 502);
    assert!(r.body.contains("502 Bad Gateway"), "{}", r.body);
    gw.reload(
        json!({"upstreams": [{"id": "nope", "type": "roundrobin", "nodes": {b.addr.to_string(): 1}}],
               "routes": [route("r1", "/hello", &a, split)]}),
        3,
    );
    assert_eq!(spread(&gw, "/hello", &[], 2, [&a, &b, &c]), [0, 2, 0]);
}

#[test]
fn configuration_errors() {
    let a = Origin::start();
    for (conf, want) in [
        (
            json!({"rules": [{"match": [{"vars": [["arg_x", "invalid-op", "1"]]}]}]}),
            "failed to validate the 'vars' expression",
        ),
        (
            json!({"rules": [{"weighted_upstreams": [{"weight": -1}]}]}),
            "weight",
        ),
        (json!({"rules": [{"nope": 1}]}), "additional properties"),
        (
            json!({"rules": [{"weighted_upstreams": [{"upstream": {"type": "roundrobin"}}]}]}),
            "property \"upstream\" validation failed",
        ),
    ] {
        let e = Gw::try_start(
            json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": conf}))]}),
        )
        .err()
        .expect("refused");
        assert!(e.contains("traffic-split"), "{e}");
        assert!(e.to_lowercase().contains(want), "{want}: {e}");
    }
    // Not in global rules: the upstream choice belongs to a route.
    let e = Gw::try_start(json!({
        "global_rules": [{"id": "1", "plugins": {"traffic-split": {"rules": [{
            "weighted_upstreams": [{"upstream": inline(&a), "weight": 1}]}]}}}],
        "routes": [route("r1", "/hello", &a, json!({}))]
    }))
    .err()
    .expect("refused");
    assert!(e.contains("routes only"), "{e}");
}

#[test]
fn inline_upstreams_behave_as_route_upstreams() {
    let (a, b) = (Origin::start(), Origin::start());
    // Nothing listens on a port just released: a connect failure there is retried on the other node.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gw = Gw::start(
        json!({"routes": [route("r1", "/hello", &a, json!({"traffic-split": {"rules": [{
            "weighted_upstreams": [{"weight": 1, "upstream": {
                "type": "roundrobin",
                "nodes": {dead.to_string(): 1, b.addr.to_string(): 1},
                "pass_host": "rewrite", "upstream_host": "split.example"
            }}]
        }]}}))]}),
    );
    for _ in 0..4 {
        assert_eq!(gw.get("/hello", &[]).status, 200);
    }
    assert_eq!(b.count(), 4);
    assert_eq!(a.count(), 0);
    assert_eq!(b.last().header("host"), Some("split.example"));
}
