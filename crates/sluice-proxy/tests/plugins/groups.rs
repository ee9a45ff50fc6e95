//! Consumer groups through the real proxy (APISIX docs terminology/consumer-group.md, t/node/consumer-group.t):
//! a consumer's `group_id` pulls in the group's plugins, a consumer's own plugin of the same name wins, the group's
//! limit-count with `group` shares one quota across its consumers, and a dangling `group_id` is refused.

use serde_json::{json, Value};

use crate::{route, Gw, Origin};

fn cfg(origin: &Origin, consumers: Value, groups: Value) -> Value {
    json!({
        "routes": [route("r1", "/hello", origin, json!({"key-auth": {}}))],
        "consumers": consumers,
        "consumer_groups": groups,
    })
}

fn member(name: &str, group: &str, plugins: Value) -> Value {
    let mut p = plugins;
    p["key-auth"] = json!({"key": format!("key-{name}")});
    json!({"username": name, "plugins": p, "group_id": group})
}

fn status(gw: &Gw, who: &str) -> u16 {
    gw.get("/hello", &[("apikey", &format!("key-{who}"))])
        .status
}

#[test]
fn group_limit_count_is_shared_and_consumer_plugins_override() {
    let o = Origin::start();
    let groups = json!([{
        "id": "company_a",
        "plugins": {
            "limit-count": {"count": 3, "time_window": 60, "rejected_code": 429, "group": "grp_company_a"},
            "proxy-rewrite": {"headers": {"set": {"X-Group": "company_a"}}}
        }
    }]);
    let consumers = json!([
        member("jack", "company_a", json!({})),
        member("rose", "company_a", json!({})),
        // Same group, but its own limit-count replaces the group's (and counts on its own).
        member(
            "vip",
            "company_a",
            json!({"limit-count": {"count": 5, "time_window": 60, "rejected_code": 403}})
        ),
    ]);
    let gw = Gw::start(cfg(&o, consumers, groups));
    // One quota of 3 for jack and rose together.
    assert_eq!(status(&gw, "jack"), 200);
    assert_eq!(
        o.last().header("x-group"),
        Some("company_a"),
        "group plugins run"
    );
    assert_eq!(status(&gw, "rose"), 200);
    assert_eq!(status(&gw, "jack"), 200);
    assert_eq!(status(&gw, "rose"), 429);
    assert_eq!(status(&gw, "jack"), 429);
    // vip: 5 of its own, rejected with its own code, and still gets the group's other plugins.
    for _ in 0..5 {
        assert_eq!(status(&gw, "vip"), 200);
    }
    assert_eq!(o.last().header("x-group"), Some("company_a"));
    assert_eq!(status(&gw, "vip"), 403);
}

#[test]
fn group_without_plugins_and_dangling_group_id() {
    let o = Origin::start();
    let gw = Gw::start(cfg(
        &o,
        json!([member("jack", "empty", json!({}))]),
        json!([{"id": "empty", "plugins": {}}]),
    ));
    assert_eq!(status(&gw, "jack"), 200);
    drop(gw);
    let e = Gw::try_start(cfg(
        &o,
        json!([member("jack", "nope", json!({}))]),
        json!([]),
    ))
    .err()
    .expect("refused");
    assert!(
        e.contains("failed to fetch consumer group config by id: nope"),
        "{e}"
    );
    // A group's plugin with a bad configuration is refused like any consumer plugin.
    let e = Gw::try_start(cfg(
        &o,
        json!([member("jack", "bad", json!({}))]),
        json!([{"id": "bad", "plugins": {"limit-count": {"count": -1, "time_window": 60}}}]),
    ))
    .err()
    .expect("refused");
    assert!(e.contains("limit-count"), "{e}");
}
