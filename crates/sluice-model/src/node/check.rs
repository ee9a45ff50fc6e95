//! Strict reading of `config.yaml`: every key is looked up in one table of key paths. A key Sluice reads is
//! type-checked; a key APISIX knows but Sluice does not use is accepted with one warning naming it (an APISIX
//! user's file still starts); any other key is an error with its path and a "did you mean". The APISIX keys come
//! from apache/apisix `apisix/cli/config.lua` (defaults), `apisix/cli/schema.lua` and `conf/config.yaml.example`.
//!
//! To teach Sluice a new key: add one [`Key`] line to [`KEYS`] (or flip an `apisix(..)` line to `sluice(..)` when
//! Sluice starts reading an APISIX key) and the field to the model in `node.rs`.

use serde_json::{Map, Value};

/// What a key's value must be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Bool,
    /// A whole number in the range.
    Int(u64, u64),
    /// A number (seconds, sizes): integer or decimal, not negative.
    Num,
    Str,
    /// One of these strings.
    Enum(&'static [&'static str]),
    /// A TCP port, 1-65535.
    Port,
    /// `auto` or a positive whole number.
    Workers,
    /// A port, an `{ip, port}` map, or a list of them (`node_listen`, `ssl.listen`); maps are checked as `path[]`.
    Listen,
    /// A list of strings.
    StrList,
    /// A string or a list of strings.
    StrOrList,
    /// A list whose items are checked as `path[]`.
    List,
    /// A map whose keys are checked against the table.
    Map,
    /// Anything; nothing below is checked (free-form: nginx snippets, discovery, other plugins' attributes).
    Any,
}

/// Who reads a key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Use {
    Sluice,
    /// APISIX has it, Sluice ignores it; the text (may be empty) says what to use instead.
    Apisix(&'static str),
}

pub(crate) struct Key {
    /// Dot-separated; `*` is any map key, `[]` a list item.
    pub path: &'static str,
    pub kind: Kind,
    pub used: Use,
}

const fn s(path: &'static str, kind: Kind) -> Key {
    Key {
        path,
        kind,
        used: Use::Sluice,
    }
}

/// An APISIX key Sluice ignores; its value is not checked.
const fn a(path: &'static str) -> Key {
    Key {
        path,
        kind: Kind::Any,
        used: Use::Apisix(""),
    }
}

/// An APISIX key Sluice ignores, with what Sluice reads instead.
const fn ah(path: &'static str, hint: &'static str) -> Key {
    Key {
        path,
        kind: Kind::Any,
        used: Use::Apisix(hint),
    }
}

const ROLES: &[&str] = &["traditional", "data_plane", "control_plane"];
const CONTROL_PLANE_PROVIDERS: &[&str] = &["etcd"];
const TRADITIONAL_PROVIDERS: &[&str] = &["embedded", "etcd", "yaml"];
const DATA_PLANE_PROVIDERS: &[&str] = &["yaml", "etcd"];
const ADMIN_ROLES: &[&str] = &["admin", "viewer"];

use Kind::*;

#[rustfmt::skip]
pub(crate) const KEYS: &[Key] = &[
    // apisix
    s("apisix", Map),
    s("apisix.node_listen", Listen),
    s("apisix.node_listen[].ip", Str),
    s("apisix.node_listen[].port", Port),
    a("apisix.node_listen[].enable_http2"),
    a("apisix.node_listen[].enable_http3"),
    s("apisix.enable_admin", Bool),
    s("apisix.enable_http2", Bool),
    s("apisix.enable_control", Bool),
    s("apisix.control", Map),
    s("apisix.control.ip", Str),
    s("apisix.control.port", Port),
    s("apisix.ssl", Map),
    s("apisix.ssl.enable", Bool),
    s("apisix.ssl.listen", Listen),
    s("apisix.ssl.listen[].ip", Str),
    s("apisix.ssl.listen[].port", Port),
    a("apisix.ssl.listen[].enable_http2"),
    a("apisix.ssl.listen[].enable_http3"),
    s("apisix.ssl.fallback_sni", Str),
    a("apisix.ssl.ssl_protocols"),
    a("apisix.ssl.ssl_ciphers"),
    a("apisix.ssl.ssl_session_tickets"),
    s("apisix.ssl.ssl_trusted_certificate", Str),
    a("apisix.ssl.key_encrypt_salt"),
    a("apisix.enable_dev_mode"),
    a("apisix.enable_reuseport"),
    a("apisix.show_upstream_status_in_response_header"),
    a("apisix.enable_ipv6"),
    a("apisix.enable_server_tokens"),
    a("apisix.extra_lua_path"),
    a("apisix.extra_lua_cpath"),
    a("apisix.lua_module_hook"),
    s("apisix.proxy_protocol", Map),
    s("apisix.proxy_protocol.listen_http_port", Port),
    s("apisix.proxy_protocol.listen_https_port", Port),
    s("apisix.proxy_protocol.enable_tcp_pp", Bool),
    s("apisix.proxy_protocol.enable_tcp_pp_to_upstream", Bool),
    s("apisix.proxy_cache", Map),
    s("apisix.proxy_cache.cache_ttl", Any),
    s("apisix.proxy_cache.zones", List),
    s("apisix.proxy_cache.zones[]", Map),
    s("apisix.proxy_cache.zones[].name", Str),
    s("apisix.proxy_cache.zones[].memory_size", Str),
    s("apisix.proxy_cache.zones[].disk_size", Str),
    s("apisix.proxy_cache.zones[].disk_path", Str),
    s("apisix.proxy_cache.zones[].cache_levels", Str),
    a("apisix.delete_uri_tail_slash"),
    s("apisix.normalize_uri_like_servlet", Bool),
    a("apisix.router"),
    s("apisix.proxy_mode", Enum(&["http", "stream", "http&stream"])),
    s("apisix.stream_proxy", Map),
    s("apisix.stream_proxy.tcp", Any),
    s("apisix.stream_proxy.udp", Any),
    s("apisix.stream_proxy.only", Bool),
    a("apisix.dns_resolver"),
    a("apisix.dns_resolver_valid"),
    a("apisix.resolver_timeout"),
    a("apisix.enable_resolv_search_opt"),
    a("apisix.disable_sync_configuration_during_start"),
    a("apisix.worker_startup_time_threshold"),
    s("apisix.data_encryption", Map),
    s("apisix.data_encryption.enable_encrypt_fields", Bool),
    s("apisix.data_encryption.keyring", StrOrList),
    a("apisix.events"),
    a("apisix.lru"),
    a("apisix.status"),
    a("apisix.disable_upstream_healthcheck"),
    a("apisix.trusted_addresses"),
    a("apisix.admin_key"),
    a("apisix.config_center"),
    a("apisix.id"),
    a("apisix.tracing"),
    // nginx_config
    s("nginx_config", Map),
    s("nginx_config.worker_processes", Workers),
    a("nginx_config.user"),
    s("nginx_config.error_log", Str),
    s("nginx_config.error_log_level", Enum(&["debug", "info", "notice", "warn", "error", "crit", "alert", "emerg"])),
    a("nginx_config.enable_cpu_affinity"),
    a("nginx_config.worker_rlimit_nofile"),
    ah("nginx_config.worker_shutdown_timeout", "sluice.graceful_shutdown_timeout"),
    a("nginx_config.max_pending_timers"),
    a("nginx_config.max_running_timers"),
    ah("nginx_config.event", "sluice.max_connections"),
    a("nginx_config.envs"),
    a("nginx_config.meta"),
    s("nginx_config.stream", Map),
    s("nginx_config.stream.enable_access_log", Bool),
    s("nginx_config.stream.access_log", Str),
    s("nginx_config.stream.access_log_format", Str),
    s("nginx_config.stream.access_log_format_escape", Enum(&["default", "json", "none"])),
    a("nginx_config.stream.lua_shared_dict"),
    a("nginx_config.main_configuration_snippet"),
    a("nginx_config.http_configuration_snippet"),
    a("nginx_config.http_server_configuration_snippet"),
    a("nginx_config.http_server_location_configuration_snippet"),
    a("nginx_config.http_admin_configuration_snippet"),
    a("nginx_config.http_end_configuration_snippet"),
    a("nginx_config.stream_configuration_snippet"),
    s("nginx_config.http", Map),
    s("nginx_config.http.enable_access_log", Bool),
    s("nginx_config.http.access_log", StrOrList),
    s("nginx_config.http.access_log_buffer", Int(0, 1 << 30)),
    s("nginx_config.http.access_log_format", Str),
    s("nginx_config.http.access_log_format_escape", Enum(&["default", "json", "none"])),
    ah("nginx_config.http.keepalive_timeout", "sluice.keepalive_timeout"),
    ah("nginx_config.http.client_header_timeout", "sluice.client_header_timeout"),
    s("nginx_config.http.client_body_timeout", Any),
    ah("nginx_config.http.client_max_body_size", "sluice.client_max_body_size"),
    a("nginx_config.http.send_timeout"),
    a("nginx_config.http.underscores_in_headers"),
    a("nginx_config.http.real_ip_header"),
    a("nginx_config.http.real_ip_recursive"),
    a("nginx_config.http.real_ip_from"),
    a("nginx_config.http.custom_lua_shared_dict"),
    a("nginx_config.http.proxy_ssl_server_name"),
    a("nginx_config.http.upstream"),
    a("nginx_config.http.charset"),
    a("nginx_config.http.variables_hash_max_size"),
    a("nginx_config.http.lua_shared_dict"),
    // deployment
    s("deployment", Map),
    s("deployment.role", Enum(ROLES)),
    s("deployment.role_traditional", Map),
    s("deployment.role_traditional.config_provider", Enum(TRADITIONAL_PROVIDERS)),
    s("deployment.role_data_plane", Map),
    s("deployment.role_data_plane.config_provider", Enum(DATA_PLANE_PROVIDERS)),
    s("deployment.role_control_plane", Map),
    s("deployment.role_control_plane.config_provider", Enum(CONTROL_PLANE_PROVIDERS)),
    a("deployment.certs"),
    a("deployment.fallback_cp"),
    s("deployment.admin", Map),
    s("deployment.admin.admin_key_required", Bool),
    s("deployment.admin.admin_key", List),
    s("deployment.admin.admin_key[]", Map),
    s("deployment.admin.admin_key[].name", Str),
    s("deployment.admin.admin_key[].key", Str),
    s("deployment.admin.admin_key[].role", Enum(ADMIN_ROLES)),
    s("deployment.admin.allow_admin", StrList),
    s("deployment.admin.admin_listen", Map),
    s("deployment.admin.admin_listen.ip", Str),
    s("deployment.admin.admin_listen.port", Port),
    a("deployment.admin.enable_admin_cors"),
    s("deployment.admin.enable_admin_ui", Bool),
    a("deployment.admin.https_admin"),
    a("deployment.admin.admin_api_mtls"),
    a("deployment.admin.admin_api_version"),
    s("deployment.etcd", Map),
    s("deployment.etcd.host", StrOrList),
    s("deployment.etcd.prefix", Str),
    s("deployment.etcd.timeout", Num),
    a("deployment.etcd.watch_timeout"),
    a("deployment.etcd.startup_retry"),
    a("deployment.etcd.resync_delay"),
    a("deployment.etcd.health_check_timeout"),
    s("deployment.etcd.user", Str),
    s("deployment.etcd.password", Str),
    s("deployment.etcd.tls", Map),
    s("deployment.etcd.tls.cert", Str),
    s("deployment.etcd.tls.key", Str),
    s("deployment.etcd.tls.verify", Bool),
    s("deployment.etcd.tls.sni", Str),
    a("deployment.etcd.use_grpc"),
    // plugins
    s("plugins", StrList),
    a("stream_plugins"),
    s("plugin_attr", Map),
    a("plugin_attr.*"),
    s("plugin_attr.dubbo-proxy", Map),
    s("plugin_attr.dubbo-proxy.upstream_multiplex_count", Int(1, 4096)),
    s("plugin_attr.opentelemetry", Map),
    s("plugin_attr.opentelemetry.trace_id_source", Enum(&["x-request-id", "random"])),
    s("plugin_attr.opentelemetry.resource", Any),
    s("plugin_attr.opentelemetry.collector", Map),
    s("plugin_attr.opentelemetry.collector.address", Str),
    s("plugin_attr.opentelemetry.collector.request_timeout", Int(1, 600)),
    s("plugin_attr.opentelemetry.collector.request_headers", Any),
    s("plugin_attr.opentelemetry.batch_span_processor", Map),
    s("plugin_attr.opentelemetry.batch_span_processor.drop_on_queue_full", Bool),
    s("plugin_attr.opentelemetry.batch_span_processor.max_queue_size", Int(1, 1 << 20)),
    s("plugin_attr.opentelemetry.batch_span_processor.max_export_batch_size", Int(1, 1 << 16)),
    s("plugin_attr.opentelemetry.batch_span_processor.batch_timeout", Num),
    s("plugin_attr.opentelemetry.batch_span_processor.inactive_timeout", Num),
    s("plugin_attr.opentelemetry.set_ngx_var", Bool),
    s("plugin_attr.prometheus", Map),
    s("plugin_attr.prometheus.enable_export_server", Bool),
    s("plugin_attr.prometheus.export_addr", Map),
    s("plugin_attr.prometheus.export_addr.ip", Str),
    s("plugin_attr.prometheus.export_addr.port", Port),
    s("plugin_attr.prometheus.default_buckets", List),
    s("plugin_attr.prometheus.default_buckets[]", Num),
    a("plugin_attr.prometheus.export_uri"),
    a("plugin_attr.prometheus.metric_prefix"),
    a("plugin_attr.prometheus.refresh_interval"),
    a("plugin_attr.prometheus.metrics"),
    s("discovery", Map),
    // Other registries (eureka, nacos, kubernetes, ...) are APISIX's; Sluice reads Consul's, Zookeeper's and DNS.
    a("discovery.*"),
    s("discovery.dns", Map),
    s("discovery.dns.servers", StrList),
    s("discovery.dns.order", StrList),
    // Checked key by key where it is read (sluice-discovery's consul.rs), with messages naming the key.
    s("discovery.consul", Any),
    s("discovery.zookeeper", Map),
    s("discovery.zookeeper.hosts", StrOrList),
    s("discovery.zookeeper.connect_string", Str),
    s("discovery.zookeeper.root", Str),
    s("discovery.zookeeper.session_timeout", Num),
    s("discovery.zookeeper.connect_timeout", Num),
    a("graphql"),
    a("ext-plugin"),
    // wasm: APISIX's `wasm.plugins` (name, priority, file, http_request_phase) plus Sluice's per-call limits.
    s("wasm", Map),
    s("wasm.plugins", List),
    s("wasm.plugins[]", Map),
    s("wasm.plugins[].name", Str),
    s("wasm.plugins[].priority", Int(0, i32::MAX as u64)),
    s("wasm.plugins[].file", Str),
    s("wasm.plugins[].http_request_phase", Enum(&["access", "rewrite"])),
    s("wasm.plugins[].call_timeout", Num),
    s("wasm.plugins[].memory_limit", Int(1 << 16, 4 << 30)),
    s("wasm.plugins[].max_body_size", Int(1, 1 << 30)),
    a("xrpc"),
    a("etcd"),
    // Sluice's own section
    s("sluice", Map),
    s("sluice.client_header_timeout", Num),
    s("sluice.keepalive_timeout", Num),
    s("sluice.graceful_shutdown_timeout", Num),
    s("sluice.client_max_body_size", Int(0, u64::MAX)),
    s("sluice.max_connections", Int(1, u32::MAX as u64)),
    s("sluice.config_poll_interval", Num),
    s("sluice.data_dir", Str),
    s("sluice.pid_file", Str),
    s("sluice.node_ttl", Int(1, 86400)),
];

/// What checking found: errors make the file unusable, warnings name ignored APISIX keys.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// Checks `doc` (config.yaml as a JSON value) against [`KEYS`].
pub(crate) fn check(doc: &Value) -> Findings {
    let mut f = Findings::default();
    match doc {
        Value::Null => {}
        Value::Object(m) => walk_map("", m, &mut f),
        v => f.errors.push(format!(
            "the top level must be a map of sections (apisix, deployment, ...), got {}",
            describe(v)
        )),
    }
    f
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn matches(pattern: &str, path: &str) -> bool {
    let mut p = pattern.split('.');
    let mut k = path.split('.');
    loop {
        match (p.next(), k.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b || a == "*" => {}
            _ => return false,
        }
    }
}

/// The entry for `path`; an exact entry wins over a wildcard one.
fn lookup(path: &str) -> Option<&'static Key> {
    let mut best: Option<&Key> = None;
    for k in KEYS.iter().filter(|k| matches(k.path, path)) {
        let wild = |k: &Key| k.path.split('.').filter(|s| *s == "*").count();
        if best.is_none_or(|b| wild(k) < wild(b)) {
            best = Some(k);
        }
    }
    best
}

/// See `NodeConfig::reads_key`: the nearest entry at or above `path` decides.
pub(crate) fn reads(path: &str) -> bool {
    let mut p = path;
    loop {
        if let Some(k) = lookup(p) {
            return matches!(k.used, Use::Sluice);
        }
        match p.rsplit_once('.') {
            Some((up, _)) => p = up,
            None => return false,
        }
    }
}

fn walk_map(parent: &str, m: &Map<String, Value>, f: &mut Findings) {
    for (key, v) in m {
        let path = join(parent, key);
        match lookup(&path) {
            Some(k) => check_value(&path, k, v, f),
            None => f.errors.push(unknown(parent, key, &path)),
        }
    }
}

fn unknown(parent: &str, key: &str, path: &str) -> String {
    let mut msg = format!("unknown key {path}");
    // Siblings first (a typo), then the same name elsewhere (a key indented under the wrong section).
    let siblings = KEYS.iter().filter_map(|k| {
        let (kp, last) = k.path.rsplit_once('.').unwrap_or(("", k.path));
        let same_parent = if parent.is_empty() {
            kp.is_empty()
        } else {
            !kp.is_empty() && matches(kp, parent)
        };
        same_parent.then_some((last, k.path))
    });
    let best = siblings
        .filter(|(last, _)| *last != "*")
        .map(|(last, _)| (strsim::damerau_levenshtein(last, key), last))
        .filter(|(d, last)| *d <= (last.len() / 3).max(2))
        .min_by_key(|(d, _)| *d);
    if let Some((_, last)) = best {
        msg.push_str(&format!(" (did you mean {}?)", join(parent, last)));
    } else if let Some(k) = KEYS
        .iter()
        .find(|k| k.path.rsplit('.').next() == Some(key) && !k.path.contains('*'))
    {
        msg.push_str(&format!(
            " (did you mean {}? check the indentation)",
            k.path.replace("[]", "[n]")
        ));
    }
    msg
}

fn check_value(path: &str, k: &Key, v: &Value, f: &mut Findings) {
    if let Use::Apisix(hint) = k.used {
        let mut w = format!("{path} is an APISIX setting Sluice does not use; ignored");
        if !hint.is_empty() {
            w.push_str(&format!(" (Sluice reads {hint})"));
        }
        f.warnings.push(w);
        return;
    }
    // A key left empty (`ssl:` with nothing below) means "the default", as in APISIX.
    if v.is_null() {
        return;
    }
    let bad = |f: &mut Findings, expected: &str| {
        f.errors
            .push(format!("{path}: expected {expected}, got {}", describe(v)))
    };
    match k.kind {
        Bool => {
            if !v.is_boolean() {
                bad(f, "true or false");
            }
        }
        Int(lo, hi) => match v.as_u64() {
            Some(n) if (lo..=hi).contains(&n) => {}
            _ => bad(f, &format!("a whole number from {lo} to {hi}")),
        },
        Num => {
            if v.as_f64().is_none_or(|n| n < 0.0 || !n.is_finite()) {
                bad(f, "a number (0 or more)");
            }
        }
        Str => {
            if !v.is_string() {
                bad(f, "a string");
            }
        }
        Enum(allowed) => {
            if !v.as_str().is_some_and(|s| allowed.contains(&s)) {
                bad(f, &format!("one of {}", allowed.join(", ")));
            }
        }
        Port => {
            if !is_port(v) {
                bad(f, "a port number from 1 to 65535");
            }
        }
        Workers => {
            let ok = v.as_str() == Some("auto") || v.as_u64().is_some_and(|n| n >= 1);
            if !ok {
                bad(f, "\"auto\" or a whole number of 1 or more");
            }
        }
        Listen => {
            const WHAT: &str = "a port number, an {ip, port} map or a list of them";
            let item = |f: &mut Findings, it: &Value| match it {
                Value::Object(m) => {
                    if !m.contains_key("port") {
                        f.errors.push(format!("{path}: an entry has no port"));
                    }
                    walk_map(&format!("{path}[]"), m, f);
                    true
                }
                _ => is_port(it),
            };
            let ok = match v {
                Value::Array(l) => l.iter().all(|it| item(f, it)),
                _ => item(f, v),
            };
            if !ok {
                bad(f, WHAT);
            }
        }
        StrList => {
            if !v.as_array().is_some_and(|l| l.iter().all(Value::is_string)) {
                bad(f, "a list of strings");
            }
        }
        StrOrList => {
            if !(v.is_string() || v.as_array().is_some_and(|l| l.iter().all(Value::is_string))) {
                bad(f, "a string or a list of strings");
            }
        }
        List => match v {
            Value::Array(l) => {
                let item_path = format!("{path}[]");
                if let Some(ik) = lookup(&item_path) {
                    for it in l {
                        check_value(&item_path, ik, it, f);
                    }
                }
            }
            _ => bad(f, "a list"),
        },
        Map => match v {
            Value::Object(m) => walk_map(path, m, f),
            _ => bad(f, "a map of keys"),
        },
        Any => {}
    }
}

fn is_port(v: &Value) -> bool {
    v.as_u64().is_some_and(|p| (1..=65535).contains(&p))
}

/// The offending value as the message shows it: scalars verbatim, containers by kind.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("{n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a map".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::NodeConfig;
    use serde_json::json;

    fn errors(doc: serde_json::Value) -> Vec<String> {
        NodeConfig::from_doc(&doc).expect_err("must be refused")
    }

    #[test]
    fn typos_are_errors_with_a_suggestion() {
        assert_eq!(
            errors(json!({"apisix": {"node_lsten": 9080}})),
            ["unknown key apisix.node_lsten (did you mean apisix.node_listen?)"]
        );
        assert_eq!(
            errors(json!({"deployment": {"role": "tradtional"}})),
            ["deployment.role: expected one of traditional, data_plane, control_plane, got the string \"tradtional\""]
        );
        // A key under the wrong section: the same name elsewhere.
        assert_eq!(
            errors(json!({"node_listen": 9080})),
            ["unknown key node_listen (did you mean apisix.node_listen? check the indentation)"]
        );
        assert_eq!(errors(json!({"zzz": 1})), ["unknown key zzz"]);
        // Every error at once, in file order.
        let e = errors(
            json!({"apisix": {"enable_admn": true, "enable_http2": "yes"},
            "sluice": {"keepalive_timout": 5}}),
        );
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e[2].contains("did you mean sluice.keepalive_timeout?"),
            "{e:?}"
        );
    }

    #[test]
    fn type_errors_name_key_value_and_type() {
        assert_eq!(
            errors(json!({"apisix": {"node_listen": "9O80"}})),
            ["apisix.node_listen: expected a port number, an {ip, port} map or a list of them, got the string \"9O80\""]
        );
        assert_eq!(
            errors(json!({"apisix": {"node_listen": [{"ip": "127.0.0.1", "port": 70000}]}})),
            ["apisix.node_listen[].port: expected a port number from 1 to 65535, got 70000"]
        );
        assert_eq!(
            errors(json!({"nginx_config": {"worker_processes": 0}})),
            ["nginx_config.worker_processes: expected \"auto\" or a whole number of 1 or more, got 0"]
        );
        assert_eq!(
            errors(json!({"deployment": {"admin": {"admin_key": [{"key": 5}]}}})),
            ["deployment.admin.admin_key[].key: expected a string, got 5"]
        );
        assert_eq!(
            errors(json!({"deployment": {"role_traditional": {"config_provider": "etc"}}})),
            ["deployment.role_traditional.config_provider: expected one of embedded, etcd, yaml, got the string \"etc\""]
        );
        assert_eq!(
            errors(json!({"sluice": {"keepalive_timeout": -1}})),
            ["sluice.keepalive_timeout: expected a number (0 or more), got -1"]
        );
        assert_eq!(
            errors(json!(["apisix"])),
            ["the top level must be a map of sections (apisix, deployment, ...), got a list"]
        );
    }

    #[test]
    fn apisix_keys_sluice_ignores_warn_once_each() {
        let c = NodeConfig::from_doc(&json!({
            "apisix": {"node_listen": [9080, {"ip": "127.0.0.1", "port": 9081, "enable_http3": true}],
                "proxy_cache": {"zones": [{"name": "x"}]}, "ssl": null,
                "data_encryption": {"enable_encrypt_fields": true, "keyring": ["a"]}},
            "nginx_config": {"http": {"client_body_timeout": "60s", "access_log": "logs/access.log",
                "access_log_format": "$remote_addr", "enable_access_log": true,
                "client_header_timeout": "60s"},
                "error_log": "logs/error.log", "error_log_level": "warn"},
            "plugin_attr": {"log-rotate": {"interval": 3600}, "prometheus": {"export_addr": {"port": 9092}}},
            "deployment": {"role": "traditional", "role_traditional": {"config_provider": "etcd"},
                "etcd": {"host": ["http://127.0.0.1:2379"], "prefix": "/apisix", "tls": {"verify": true}}},
        }))
        .expect("an APISIX file starts");
        assert_eq!(c.config.apisix.node_listen.len(), 2);
        assert_eq!(c.config.apisix.node_listen[1].port, 9081);
        let w = c.warnings.join("\n");
        let key = "apisix.node_listen[].enable_http3";
        assert_eq!(w.matches(key).count(), 1, "{key} in {w}");
        // Keys Sluice reads give no warning.
        for key in [
            "apisix.proxy_cache",
            "deployment.etcd.tls",
            "apisix.data_encryption",
            "nginx_config.http.client_body_timeout",
            "nginx_config.http.access_log",
            "nginx_config.http.enable_access_log",
            "nginx_config.error_log",
        ] {
            assert!(!w.contains(key), "{key} in {w}");
        }
        assert!(w.contains(
            "nginx_config.http.client_header_timeout is an APISIX setting Sluice does not use; ignored \
             (Sluice reads sluice.client_header_timeout)"
        ));
        // Attributes of plugins Sluice does not configure from here are one warning; prometheus's are read.
        assert!(
            w.contains("plugin_attr.log-rotate is an APISIX setting"),
            "{w}"
        );
        assert!(!w.contains("prometheus"), "{w}");
        assert_eq!(c.warnings.len(), 3, "{w}");
    }

    #[test]
    fn which_keys_sluice_reads() {
        assert!(NodeConfig::reads_key("deployment.admin.admin_key[].key"));
        assert!(NodeConfig::reads_key("apisix.node_listen"));
        assert!(!NodeConfig::reads_key(
            "nginx_config.http.lua_shared_dict.foo"
        ));
        assert!(!NodeConfig::reads_key("plugin_attr.log-rotate.interval"));
        assert!(NodeConfig::reads_key(
            "plugin_attr.opentelemetry.collector.address"
        ));
        assert!(NodeConfig::reads_key(
            "plugin_attr.opentelemetry.batch_span_processor.inactive_timeout"
        ));
        assert!(!NodeConfig::reads_key("nope"));
    }

    #[test]
    fn empty_document_and_empty_sections_are_defaults() {
        let d = NodeConfig::from_doc(&serde_json::Value::Null).expect("empty");
        assert_eq!(d.config, NodeConfig::default());
        let c = NodeConfig::from_doc(&json!({"apisix": null, "deployment": {"admin": null}}))
            .expect("nulls");
        assert_eq!(c.config, NodeConfig::default());
        assert!(c.warnings.is_empty());
    }
}
