//! The response-side plugins' cost: a 1-worker gateway whose routes differ only in their response plugins, in
//! front of an origin given as the first argument (e.g. nginx answering a 1 KiB text/html body). Routes:
//! `/plain` (no plugins: the zero-copy path), `/observe` (header-only response-rewrite), `/gzip` (gzip level 1),
//! `/filters` (response-rewrite `filters`, one global substitution), `/echo` (echo `after_body`).
//! `cargo run --release -p sluice-proxy --example body_filter_bench -- 127.0.0.1:1980` prints the port; drive
//! it with `h2load --h1 -H 'Accept-Encoding: gzip' ...`, under callgrind for instructions per request
//! (scripts in docs/plugins/gzip.md).

use sluice_model::Resources;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Snapshot};

fn main() {
    let origin = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:1980".into());
    let route = |id: &str, plugins: serde_json::Value| {
        serde_json::json!({"id": id, "uri": format!("/{id}"), "plugins": plugins,
            "upstream": {"type": "roundrobin", "nodes": {origin.clone(): 1},
                         "keepalive_pool": {"size": 1024, "requests": 1_000_000}}})
    };
    let res: Resources = serde_json::from_value(serde_json::json!({"routes": [
        route("plain", serde_json::json!({})),
        route("observe", serde_json::json!({"response-rewrite": {"headers": {"set": {"X-A": "1"}}}})),
        route("gzip", serde_json::json!({"gzip": {}})),
        route("filters", serde_json::json!({"response-rewrite": {
            "filters": [{"regex": "hello", "replace": "HELLO", "scope": "global"}]}})),
        route("echo", serde_json::json!({"echo": {"after_body": "<!-- echo -->"}})),
    ]}))
    .expect("resources");
    let gw = Gateway::new(
        ProxyConfig::default(),
        Snapshot::compile(&res, 1).expect("compiles"),
    );
    let l = Listeners::bind(&["127.0.0.1:0".parse().expect("addr")], 1).expect("bind");
    println!("{}", l.local_addrs[0].port());
    let running = gw.start(l).expect("start");
    running.join();
}
