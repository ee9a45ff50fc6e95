//! Configuration of the Sluice gateway for a scenario: `config.yaml` (listen port, worker count,
//! standalone yaml provider) and `apisix.yaml` (routes, upstream, consumers, plugins in APISIX's
//! standalone format). `configure` is the single seam: today it writes the standalone file, later
//! it can PUT the same resources to the Admin API. Also nginx and HAProxy configs for the plain
//! proxy side-by-side. Text is generated directly (no serde_yaml) to keep 100,000 routes cheap.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use crate::scenario::{Plugins, Scenario, Workers};

/// Path every scenario's measured request goes to.
pub const PATH: &str = "/hello";
/// Key of the consumer the benchmark authenticates as (header `apikey`).
pub const API_KEY: &str = "auth-one";

/// Headers every request of the scenario carries.
pub fn request_headers(s: &Scenario) -> Vec<(String, String)> {
    let mut h = if s.plugins.needs_key() {
        vec![("apikey".to_string(), API_KEY.to_string())]
    } else {
        Vec::new()
    };
    h.extend(s.extra_headers.iter().cloned());
    h
}

/// The uri of route `id` (1-based) as `standalone_yaml` writes it.
pub fn route_uri(id: usize) -> String {
    if id == 1 {
        PATH.to_string()
    } else {
        format!("/r/{id}")
    }
}

/// The key of consumer `i` (0-based) as `standalone_yaml` writes it: `jack` has `auth-one`, `user{i}` has
/// `auth-{i}`.
pub fn consumer_key(i: usize) -> String {
    if i == 0 {
        API_KEY.to_string()
    } else {
        format!("auth-{i}")
    }
}

/// Headers of the load itself: `request_headers` without the key when the scenario rotates keys.
pub fn load_headers(s: &Scenario) -> Vec<(String, String)> {
    if s.spread && !spread(s).is_empty() {
        s.extra_headers.clone()
    } else {
        request_headers(s)
    }
}

/// The rotation of a `spread` scenario (empty otherwise): entry k is route k mod routes, with consumer
/// k mod consumers' key when the plugins want one; max(routes, consumers) entries.
pub fn spread(s: &Scenario) -> Vec<(String, Vec<(String, String)>)> {
    if !s.spread {
        return Vec::new();
    }
    let routes = s.routes.max(1);
    let keys = s.consumers.max(1);
    (0..routes.max(keys))
        .map(|k| {
            let h = if s.plugins.needs_key() {
                vec![("apikey".to_string(), consumer_key(k % keys))]
            } else {
                Vec::new()
            };
            (route_uri(k % routes + 1), h)
        })
        .collect()
}

/// Worker count as the gateway config spells it.
fn workers_value(w: Workers) -> &'static str {
    match w {
        Workers::One => "1",
        Workers::All => "auto",
    }
}

/// The access log setting: off (like the peers' `access_log off`), or on in `dir/access.log`.
fn access_log_value(dir: &Path, on: bool) -> String {
    if on {
        format!("    access_log: {}\n", dir.join("access.log").display())
    } else {
        "    enable_access_log: false\n".into()
    }
}

/// YAML added to every node config this process writes (`--node-config-append`).
static APPEND: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn append_to_node_config(text: String) {
    let _ = APPEND.set(text);
}

/// Writes `config.yaml` for a gateway listening on `port`.
pub fn write_node_config(
    dir: &Path,
    port: u16,
    workers: Workers,
    access_log: bool,
) -> Result<(), String> {
    let text = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  ssl:\n    enable: false\nnginx_config:\n  worker_processes: {}\n  http:\n{}deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n",
        workers_value(workers),
        access_log_value(dir, access_log)
    );
    let text = match APPEND.get() {
        Some(extra) => format!("{text}{extra}"),
        None => text,
    };
    write(dir, "config.yaml", &text)
}

/// Admin key of the traditional-mode gateway the live-apply scenarios start (loopback only).
pub const ADMIN_KEY: &str = "sluice-bench-admin-key-7f3a9c";

/// Writes `config.yaml` for a traditional-mode gateway: embedded store under `data/`, Admin API on loopback
/// `admin_port` with [`ADMIN_KEY`]. The first start seeds the store from `apisix.yaml`.
pub fn write_traditional_config(
    dir: &Path,
    port: u16,
    admin_port: u16,
    workers: Workers,
) -> Result<(), String> {
    let text = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  enable_control: false\nnginx_config:\n  worker_processes: {}\n  http:\n    enable_access_log: false\ndeployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n  admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n    admin_key:\n      - name: admin\n        key: {ADMIN_KEY}\n        role: admin\nsluice:\n  data_dir: data\n",
        workers_value(workers)
    );
    write(dir, "config.yaml", &text)
}

/// Puts the scenario's resources into the gateway (standalone file for now).
pub fn configure(
    dir: &Path,
    s: &Scenario,
    upstream: SocketAddr,
    keepalive: usize,
) -> Result<(), String> {
    write(dir, "apisix.yaml", &standalone_yaml(s, upstream, keepalive))
}

/// APISIX standalone `apisix.yaml` for the scenario: route 1 is `/hello`, the others `/r/N`.
pub fn standalone_yaml(s: &Scenario, upstream: SocketAddr, keepalive: usize) -> String {
    let mut y = String::with_capacity(s.routes.max(1) * 260 + 256);
    y.push_str("routes:\n");
    // JSON is YAML's flow syntax: `--route-plugins` goes in as given.
    let plugins = match &s.route_plugins {
        Some(json) => format!("    plugins: {json}\n"),
        None => plugins_yaml(s.plugins),
    };
    for i in 1..=s.routes.max(1) {
        let uri = route_uri(i);
        let _ = write!(
            y,
            "  - id: {i}\n    uri: {uri}\n{plugins}    upstream:\n      type: roundrobin\n      nodes:\n        \"{upstream}\": 1\n      keepalive_pool: {{size: {keepalive}, idle_timeout: 60, requests: 100000}}\n"
        );
    }
    if s.consumers > 0 || s.plugins.needs_key() {
        y.push_str("consumers:\n");
        y.push_str("  - username: jack\n    plugins:\n      key-auth: {key: auth-one}\n");
        for i in 1..s.consumers {
            let _ = write!(
                y,
                "  - username: user{i}\n    plugins:\n      key-auth: {{key: auth-{i}}}\n"
            );
        }
    }
    y.push_str("#END\n");
    y
}

fn plugins_yaml(p: Plugins) -> String {
    if p == Plugins::None {
        return String::new();
    }
    let mut y = String::from("    plugins:\n");
    for name in p.names() {
        match *name {
            "limit-count" => y.push_str(
                "      limit-count: {count: 2000000000, time_window: 60, rejected_code: 503, key: remote_addr}\n",
            ),
            other => {
                let _ = writeln!(y, "      {other}: {{}}");
            }
        }
    }
    y
}

/// nginx as a plain proxy: same worker count, access log off, upstream keepalive sized to the
/// concurrency. `master` false runs a single process (for callgrind).
pub fn nginx_conf(
    dir: &Path,
    port: u16,
    upstream: SocketAddr,
    workers: usize,
    keepalive: usize,
    master: bool,
    h2c: bool,
) -> String {
    let d = dir.display();
    format!(
        "worker_processes {workers};\ndaemon off;\nmaster_process {};\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\nworker_rlimit_nofile 16384;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/tmp-body;\n  proxy_temp_path {d}/tmp-proxy;\n  fastcgi_temp_path {d}/tmp-fcgi;\n  uwsgi_temp_path {d}/tmp-uwsgi;\n  scgi_temp_path {d}/tmp-scgi;\n  keepalive_requests 1000000;\n  upstream backend {{\n    server {upstream};\n    keepalive {keepalive};\n    keepalive_requests 1000000;\n  }}\n  server {{\n    listen 127.0.0.1:{port}{};\n    location / {{\n      proxy_pass http://backend;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
        if master { "on" } else { "off" },
        if h2c { " http2" } else { "" }
    )
}

/// The plain `location / { proxy_pass ... }` block of `nginx_conf`.
const NGINX_PLAIN_LOCATION: &str = "    location / {\n      proxy_pass http://backend;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }\n";

/// nginx doing what the scenario's plugins do, as far as nginx can: one exact location per route (the
/// routing work), key-auth as a `map` of the `apikey` header to a consumer with APISIX's 401s for a
/// missing or unknown key, limit-count as `limit_req` on the client address with a rate it never reaches
/// (a per-request counter, as limit-count's). prometheus has no nginx equivalent and is left out. `conf`
/// is `nginx_conf`'s output; a scenario without plugins gets it back unchanged.
pub fn nginx_with_plugins(conf: &str, s: &Scenario) -> String {
    let names = s.plugins.names();
    let key = names.contains(&"key-auth");
    let count = names.contains(&"limit-count");
    if !(key || count) || s.route_plugins.is_some() {
        return conf.to_string();
    }
    let mut http = String::new();
    if key {
        http.push_str("  map $http_apikey $bench_consumer {\n    default \"\";\n");
        for i in 0..s.consumers.max(1) {
            let user = if i == 0 {
                "jack".to_string()
            } else {
                format!("user{i}")
            };
            let _ = writeln!(http, "    \"{}\" {user};", consumer_key(i));
        }
        http.push_str("  }\n");
    }
    if count {
        http.push_str(
            "  limit_req_zone $binary_remote_addr zone=bench_count:1m rate=1000000r/s;\n",
        );
    }
    let mut locs = String::new();
    for i in 1..=s.routes.max(1) {
        let _ = writeln!(locs, "    location = {} {{", route_uri(i));
        if key {
            locs.push_str("      if ($http_apikey = \"\") { return 401 '{\"message\":\"Missing API key in request\"}'; }\n");
            locs.push_str("      if ($bench_consumer = \"\") { return 401 '{\"message\":\"Invalid API key in request\"}'; }\n");
        }
        if count {
            locs.push_str("      limit_req zone=bench_count burst=1000000 nodelay;\n");
        }
        locs.push_str("      proxy_pass http://backend;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }\n");
    }
    conf.replacen(
        "  upstream backend {",
        &format!("{http}  upstream backend {{"),
        1,
    )
    .replacen(NGINX_PLAIN_LOCATION, &locs, 1)
}

/// HAProxy as a plain proxy: same thread count, idle server connections kept and reused.
pub fn haproxy_conf(
    port: u16,
    upstream: SocketAddr,
    threads: usize,
    keepalive: usize,
    h2c: bool,
) -> String {
    let proto = if h2c { " proto h2" } else { "" };
    format!(
        "global\n  nbthread {threads}\n  maxconn 8000\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  http-reuse always\nfrontend fe\n  bind 127.0.0.1:{port}{proto}\n  default_backend be\nbackend be\n  server s1 {upstream} pool-max-conn {keepalive}\n"
    )
}

/// Writes `name` inside `dir`.
pub fn write(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let p = dir.join(name);
    std::fs::write(&p, text).map_err(|e| format!("write {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn standalone_yaml_matches_apisix_shapes() {
        let all = crate::scenario::all(Duration::from_secs(1));
        let find = |n: &str| all.iter().find(|s| s.name == n).expect("scenario").clone();
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let y = standalone_yaml(&find("route-1"), up, 64);
        assert!(
            y.starts_with("routes:\n  - id: 1\n    uri: /hello\n    upstream:\n"),
            "{y}"
        );
        assert!(y.contains("\"127.0.0.1:1980\": 1"));
        assert!(y.contains("keepalive_pool: {size: 64, idle_timeout: 60, requests: 100000}"));
        assert!(y.ends_with("#END\n") && !y.contains("consumers"));
        let y = standalone_yaml(&find("key-auth+limit-count-100"), up, 64);
        assert_eq!(y.matches("  - id: ").count(), 100);
        assert_eq!(y.matches("key-auth: {}").count(), 100);
        assert!(y.contains(
            "limit-count: {count: 2000000000, time_window: 60, rejected_code: 503, key: remote_addr}"
        ));
        assert_eq!(y.matches("  - username: ").count(), 100);
        assert!(y.contains("key-auth: {key: auth-one}"));
        let y = standalone_yaml(&find("limit-count+prometheus-1"), up, 64);
        assert!(y.contains("prometheus: {}") && y.contains("consumers:\n  - username: jack\n"));
        let mut one = find("route-1");
        one.route_plugins = Some(r#"{"mocking": {"response_example": "x: \"y\""}}"#.into());
        one.extra_headers = vec![("Accept-Encoding".into(), "br".into())];
        let y = standalone_yaml(&one, up, 64);
        let doc: serde_yaml::Value = serde_yaml::from_str(&y).expect("valid YAML");
        assert_eq!(
            doc["routes"][0]["plugins"]["mocking"]["response_example"].as_str(),
            Some("x: \"y\"")
        );
        assert_eq!(
            request_headers(&one),
            vec![("Accept-Encoding".to_string(), "br".to_string())]
        );
        let y = standalone_yaml(&find("routes-100k"), up, 64);
        assert!(y.contains("uri: /r/100000\n"));
    }

    #[test]
    fn spread_covers_every_route_and_consumer_key_of_the_config() {
        let all = crate::scenario::all(Duration::from_secs(1));
        let find = |n: &str| all.iter().find(|s| s.name == n).expect("scenario").clone();
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let s = find("key-auth+limit-count-100");
        let sp = spread(&s);
        assert_eq!(sp.len(), 100);
        let y = standalone_yaml(&s, up, 64);
        let doc: serde_yaml::Value = serde_yaml::from_str(&y).expect("valid YAML");
        let uris: std::collections::HashSet<&str> = doc["routes"]
            .as_sequence()
            .expect("routes")
            .iter()
            .filter_map(|r| r["uri"].as_str())
            .collect();
        let keys: std::collections::HashSet<&str> = doc["consumers"]
            .as_sequence()
            .expect("consumers")
            .iter()
            .filter_map(|c| c["plugins"]["key-auth"]["key"].as_str())
            .collect();
        let sent_uris: std::collections::HashSet<&str> =
            sp.iter().map(|(p, _)| p.as_str()).collect();
        let sent_keys: std::collections::HashSet<&str> =
            sp.iter().map(|(_, h)| h[0].1.as_str()).collect();
        assert_eq!(
            sent_uris, uris,
            "every route is hit and only configured ones"
        );
        assert_eq!(
            sent_keys, keys,
            "every consumer's key is sent and only configured ones"
        );
        assert!(sp.iter().all(|(_, h)| h.len() == 1 && h[0].0 == "apikey"));
        // The load's own headers then carry no key (the rotation does); the probes keep one.
        assert!(load_headers(&s).is_empty());
        assert_eq!(request_headers(&s)[0].0, "apikey");
        // limit-count-100: routes rotate, no key; 1-route scenarios do not rotate.
        let lc = spread(&find("limit-count-100"));
        assert!(lc.len() == 100 && lc.iter().all(|(_, h)| h.is_empty()));
        assert!(spread(&find("key-auth+limit-count-1")).is_empty());
        assert!(spread(&find("route-1")).is_empty());
    }

    #[test]
    fn nginx_gets_the_plugin_equivalent() {
        let all = crate::scenario::all(Duration::from_secs(1));
        let find = |n: &str| all.iter().find(|s| s.name == n).expect("scenario").clone();
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let plain = nginx_conf(Path::new("/tmp/x"), 9000, up, 1, 256, true, false);
        assert!(plain.contains(NGINX_PLAIN_LOCATION));
        assert_eq!(nginx_with_plugins(&plain, &find("route-1")), plain);
        let c = nginx_with_plugins(&plain, &find("key-auth+limit-count-100"));
        assert!(!c.contains("location / {"));
        assert_eq!(c.matches("    location = ").count(), 100);
        assert!(c.contains("    location = /hello {") && c.contains("    location = /r/100 {"));
        assert!(c.contains("    \"auth-one\" jack;") && c.contains("    \"auth-99\" user99;"));
        assert_eq!(c.matches("limit_req zone=bench_count").count(), 100);
        assert!(c.contains("limit_req_zone $binary_remote_addr zone=bench_count"));
        assert!(
            c.contains("Missing API key in request") && c.contains("Invalid API key in request")
        );
        let k = nginx_with_plugins(&plain, &find("key-auth-1"));
        assert!(k.contains("map $http_apikey") && !k.contains("limit_req"));
        let l = nginx_with_plugins(&plain, &find("limit-count+prometheus-1"));
        assert!(!l.contains("map $http_apikey") && l.contains("limit_req zone=bench_count"));
    }

    #[test]
    fn peer_configs() {
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let n = nginx_conf(Path::new("/tmp/x"), 9000, up, 1, 256, true, false);
        assert!(
            n.contains("keepalive 256;")
                && n.contains("access_log off;")
                && n.contains("worker_processes 1;")
        );
        let h = haproxy_conf(9001, up, 2, 256, false);
        assert!(
            h.contains("nbthread 2")
                && h.contains("pool-max-conn 256")
                && h.contains("http-reuse always")
        );
    }
}
