//! The declared resources: for each Admin API collection its names, schema, id rule, the references it holds
//! (checked on write) and the references other resources hold to it (checked on delete), in the manner of
//! APISIX's `apisix/admin/{routes,upstreams,...}.lua`. The generic verbs in `handlers.rs` do the rest.

use serde_json::{Map, Value};
use sluice_model::schema;
use sluice_store::kv::Snapshot;

use crate::{PluginCatalog, Reply};

/// How a resource's plugins are checked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PluginsField {
    None,
    /// `plugins` checked against each plugin's schema (routes, services, ...).
    Plugins,
    /// Consumers: errors prefixed "invalid plugins configuration: ".
    ConsumerPlugins,
    /// Stream routes: stream plugins, whose schemas the data plane's compile checks (`sluice-proxy` stream).
    Stream,
}

pub(crate) struct Kind {
    /// Collection name in the URL and key space: `routes`.
    pub name: &'static str,
    /// Singular, as in APISIX error texts: `route`.
    pub kind: &'static str,
    pub schema: fn() -> Value,
    /// The body field that carries the id (`id`, or `username` for consumers).
    pub id_field: &'static str,
    /// POST (generated id) allowed.
    pub post: bool,
    /// PATCH allowed (APISIX's `unsupported_methods`: not on consumers, credentials, plugin_metadata, protos).
    pub patch: bool,
    pub plugins: PluginsField,
    /// (field, target collection, what APISIX calls it in "failed to fetch X info by X id").
    pub refs: &'static [(&'static str, &'static str, &'static str)],
    /// Collections whose field points here: (collection, singular, field, message prefix).
    pub used_by: &'static [(&'static str, &'static str, &'static str, &'static str)],
}

const USED_BY_UPSTREAM: &[(&str, &str, &str, &str)] = &[
    (
        "routes",
        "route",
        "upstream_id",
        "can not delete this upstream, ",
    ),
    (
        "services",
        "service",
        "upstream_id",
        "can not delete this upstream, ",
    ),
];

pub(crate) const KINDS: &[Kind] = &[
    Kind {
        name: "routes",
        kind: "route",
        schema: schema::route,
        id_field: "id",
        post: true,
        patch: true,
        plugins: PluginsField::Plugins,
        refs: &[
            ("upstream_id", "upstreams", "upstream"),
            ("service_id", "services", "service"),
            ("plugin_config_id", "plugin_configs", "plugin config"),
        ],
        used_by: &[],
    },
    Kind {
        name: "stream_routes",
        kind: "stream route",
        schema: schema::stream_route,
        id_field: "id",
        post: true,
        // APISIX's stream_routes `unsupported_methods = { "patch" }`.
        patch: false,
        plugins: PluginsField::Stream,
        refs: &[
            ("upstream_id", "upstreams", "upstream"),
            ("service_id", "services", "service"),
        ],
        used_by: &[],
    },
    Kind {
        name: "services",
        kind: "service",
        schema: schema::service,
        id_field: "id",
        post: true,
        patch: true,
        plugins: PluginsField::Plugins,
        refs: &[("upstream_id", "upstreams", "upstream")],
        used_by: &[
            (
                "routes",
                "route",
                "service_id",
                "can not delete this service directly, ",
            ),
            (
                "stream_routes",
                "stream_route",
                "service_id",
                "can not delete this service directly, ",
            ),
        ],
    },
    Kind {
        name: "upstreams",
        kind: "upstream",
        schema: schema::upstream,
        id_field: "id",
        post: true,
        patch: true,
        plugins: PluginsField::None,
        refs: &[],
        used_by: USED_BY_UPSTREAM,
    },
    Kind {
        name: "consumers",
        kind: "consumer",
        schema: schema::consumer,
        id_field: "username",
        post: false,
        patch: false,
        plugins: PluginsField::ConsumerPlugins,
        refs: &[("group_id", "consumer_groups", "consumer group")],
        used_by: &[],
    },
    Kind {
        name: "ssls",
        kind: "ssl",
        schema: schema::ssl,
        id_field: "id",
        post: true,
        patch: true,
        plugins: PluginsField::None,
        refs: &[],
        used_by: &[],
    },
    Kind {
        name: "global_rules",
        kind: "global rule",
        schema: schema::global_rule,
        id_field: "id",
        post: false,
        patch: true,
        plugins: PluginsField::Plugins,
        refs: &[],
        used_by: &[],
    },
    Kind {
        name: "plugin_configs",
        kind: "plugin config",
        schema: schema::plugin_config,
        id_field: "id",
        post: false,
        patch: true,
        plugins: PluginsField::Plugins,
        refs: &[],
        used_by: &[(
            "routes",
            "route",
            "plugin_config_id",
            "can not delete this plugin config, ",
        )],
    },
    Kind {
        name: "consumer_groups",
        kind: "consumer group",
        schema: schema::consumer_group,
        id_field: "id",
        post: false,
        patch: true,
        plugins: PluginsField::Plugins,
        refs: &[],
        used_by: &[(
            "consumers",
            "consumer",
            "group_id",
            "can not delete this consumer group, ",
        )],
    },
    Kind {
        name: "protos",
        kind: "proto",
        schema: schema::proto,
        id_field: "id",
        post: true,
        patch: false,
        plugins: PluginsField::None,
        refs: &[],
        used_by: &[],
    },
    Kind {
        name: "secrets",
        kind: "secret",
        schema: schema::secret,
        id_field: "id",
        post: false,
        patch: true,
        plugins: PluginsField::None,
        refs: &[],
        used_by: &[],
    },
    Kind {
        name: "plugin_metadata",
        kind: "plugin_metadata",
        schema: schema::plugin_metadata,
        id_field: "id",
        post: false,
        patch: false,
        plugins: PluginsField::None,
        refs: &[],
        used_by: &[],
    },
];

pub(crate) const CREDENTIALS: Kind = Kind {
    name: "credentials",
    kind: "credential",
    schema: schema::credential,
    id_field: "id",
    post: false,
    patch: false,
    plugins: PluginsField::ConsumerPlugins,
    refs: &[],
    used_by: &[],
};

pub(crate) fn find(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Renders an id from JSON (APISIX accepts integer ids and stores them as given).
pub(crate) fn id_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// APISIX's forbidden-properties check: timestamps are the server's to set.
pub(crate) fn forbidden_times(conf: &Map<String, Value>) -> Result<(), Reply> {
    const TIMES: [&str; 2] = ["create_time", "update_time"];
    let nested = |field: &str, prefix: &str| -> Option<String> {
        let inner = conf.get(field)?.as_object()?;
        TIMES
            .iter()
            .find(|t| inner.contains_key(**t))
            .map(|t| format!("{prefix}{t}"))
    };
    let found = TIMES
        .iter()
        .find(|t| conf.contains_key(**t))
        .map(|t| t.to_string())
        .or_else(|| nested("upstream", "upstream."))
        .or_else(|| nested("plugins", "plugins."));
    match found {
        Some(f) => Err(Reply::error(
            400,
            format!("the property is forbidden:  {f}"),
        )),
        None => Ok(()),
    }
}

/// Schema, cross-field, plugin and reference checks of a complete candidate value (APISIX's `check_conf`).
pub(crate) fn check(
    kind: &Kind,
    conf: &Value,
    snap: &Snapshot,
    plugins: &dyn PluginCatalog,
) -> Result<(), Reply> {
    check_with(kind, &(kind.schema)(), conf, snap, plugins)
}

/// As [`check`], with the kind's schema built once by the caller (a bulk load checks thousands of values).
pub(crate) fn check_with(
    kind: &Kind,
    kind_schema: &Value,
    conf: &Value,
    snap: &Snapshot,
    plugins: &dyn PluginCatalog,
) -> Result<(), Reply> {
    let bad = |m: String| Err(Reply::error(400, m));
    if kind.name == "routes" {
        if conf.get("host").is_some() && conf.get("hosts").is_some() {
            return bad("only one of host or hosts is allowed".into());
        }
        if conf.get("remote_addr").is_some() && conf.get("remote_addrs").is_some() {
            return bad("only one of remote_addr or remote_addrs is allowed".into());
        }
    }
    if let Err(e) = schema::validate(kind_schema, conf) {
        return bad(format!("invalid configuration: {e}"));
    }
    if let Some(u) = conf.get("upstream") {
        check_upstream(u).or_else(bad)?;
    }
    if kind.name == "upstreams" {
        check_upstream(conf).or_else(bad)?;
    }
    for (field, target, what) in kind.refs {
        if let Some(id) = conf.get(*field).and_then(id_string) {
            if snap.get(&format!("{target}/{id}")).is_none() {
                return bad(format!(
                    "failed to fetch {what} info by {what} id [{id}], response code: 404"
                ));
            }
        }
    }
    if kind.name == "stream_routes" {
        check_stream_route(conf, snap).or_else(bad)?;
    }
    if let Some(p) = conf
        .get("plugins")
        .and_then(Value::as_object)
        .filter(|_| kind.plugins != PluginsField::Stream)
    {
        if let Err(e) = check_plugins(p, plugins) {
            return bad(match kind.plugins {
                PluginsField::ConsumerPlugins => format!("invalid plugins configuration: {e}"),
                _ => e,
            });
        }
        if kind.name == "credentials" && p.keys().any(|n| !plugins.is_auth(n)) {
            return bad("only supports auth type plugins in consumer credential".into());
        }
    }
    if kind.name == "protos" {
        compile_proto(conf, snap).or_else(bad)?;
    }
    Ok(())
}

/// APISIX's stream route `check_conf` beyond the schema: `protocol.superior_id` must name another stored stream
/// route of the same protocol (the data plane then refuses xRPC protocols, which Sluice does not implement).
fn check_stream_route(conf: &Value, snap: &Snapshot) -> Result<(), String> {
    let Some(sup) = conf
        .get("protocol")
        .and_then(|p| p.get("superior_id"))
        .and_then(id_string)
    else {
        return Ok(());
    };
    if conf.get("id").and_then(id_string).as_deref() == Some(&*sup) {
        return Err("stream route can not set itself as superior_id".into());
    }
    let Some(e) = snap.get(&format!("stream_routes/{sup}")) else {
        return Err(format!(
            "failed to fetch stream routes[{sup}], response code: 404"
        ));
    };
    let name = |v: &Value| {
        v.get("protocol")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match (name(&e.value()), name(conf)) {
        (Some(theirs), Some(ours)) if theirs != ours => Err(format!(
            "protocol mismatch: subordinate protocol [{ours}] does not match superior protocol [{theirs}]"
        )),
        _ => Ok(()),
    }
}

/// APISIX's proto `check_conf`: the content must compile (`.proto` text, else base64 of a `FileDescriptorSet`).
/// Imports resolve against the other proto resources by `name` (APISIX cannot import at all).
fn compile_proto(conf: &Value, snap: &Snapshot) -> Result<(), String> {
    let content = conf.get("content").and_then(Value::as_str).unwrap_or("");
    let name = conf
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| conf.get("id").and_then(id_string))
        .unwrap_or_else(|| "proto".into());
    let resolver = |import: &str| {
        snap.list("protos")
            .find(|(_, e)| e.get("name").as_ref().and_then(Value::as_str) == Some(import))
            .and_then(|(_, e)| {
                e.get("content")
                    .as_ref()
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
    };
    sluice_grpc::compile(&name, content, resolver)
        .map(drop)
        .map_err(|e| format!("invalid content: {}", e.0))
}

/// The auth plugins whose credential field must be unique across consumers and credentials (APISIX's
/// `plugin_unique_key_attrs` in apisix/consumer.lua).
pub(crate) const UNIQUE_KEYS: &[(&str, &str)] = &[
    ("key-auth", "key"),
    ("basic-auth", "username"),
    ("jwt-auth", "key"),
    ("hmac-auth", "key_id"),
    ("ldap-auth", "user_dn"),
    ("ldap-auth-advanced", "user_dn"),
];

/// APISIX's `check_duplicate_key`: a consumer (`credential` None) or one of its credentials may not reuse
/// another consumer's or credential's key. A consumer never conflicts with its own credentials; a credential
/// only with itself. Secret references (`$secret://`, `$env://`) are not compared, as in APISIX.
pub(crate) fn duplicate_key(
    plugins_conf: &Value,
    consumer: &str,
    credential: Option<&str>,
    snap: &Snapshot,
    de: &sluice_secrets::DataEncryption,
) -> Option<String> {
    let plugins_conf = plugins_conf.as_object()?;
    for (plugin, attr) in UNIQUE_KEYS {
        let Some(want) = plugins_conf
            .get(*plugin)
            .and_then(|c| c.get(*attr))
            .and_then(Value::as_str)
            .filter(|v| !v.starts_with("$secret://") && !v.starts_with("$env://"))
        else {
            continue;
        };
        for (key, e) in snap.under("consumers/") {
            let rest = &key["consumers/".len()..];
            let (owner, owner_cred) = match rest.split_once("/credentials/") {
                Some((u, id)) => (u, Some(id)),
                None if !rest.contains('/') => (rest, None),
                None => continue,
            };
            let is_self = match credential {
                Some(id) => owner == consumer && owner_cred == Some(id),
                None => owner == consumer,
            };
            if is_self {
                continue;
            }
            let v = e.value();
            let v = de.decrypted(key, &v);
            let found = v
                .get("plugins")
                .and_then(|p| p.get(*plugin))
                .and_then(|c| c.get(*attr))
                .and_then(Value::as_str);
            if found == Some(want) {
                let desc = match owner_cred {
                    Some(id) => format!("credential: {id} of consumer: {owner}"),
                    None => format!("consumer: {owner}"),
                };
                return Some(format!(
                    "duplicate {attr} of plugin {plugin} found with {desc}"
                ));
            }
        }
    }
    None
}

/// `apisix/upstream.lua` check_upstream_conf's rules that the schema cannot express.
fn check_upstream(u: &Value) -> Result<(), String> {
    let kind = u
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("roundrobin");
    if !matches!(kind, "roundrobin" | "chash" | "ewma" | "least_conn") {
        return Err(format!("invalid \"type\" field: {kind}"));
    }
    if kind == "chash" && u.get("key").is_none() {
        let hash_on = u.get("hash_on").and_then(Value::as_str).unwrap_or("vars");
        if hash_on != "consumer" {
            return Err("missing key".into());
        }
    }
    let rewrite = u.get("pass_host").and_then(Value::as_str) == Some("rewrite");
    if rewrite && u.get("upstream_host").is_none() {
        return Err("missing upstream_host".into());
    }
    Ok(())
}

/// APISIX's `plugin.check_schema` texts: unknown plugins and each plugin's own check.
pub(crate) fn check_plugins(
    p: &Map<String, Value>,
    catalog: &dyn PluginCatalog,
) -> Result<(), String> {
    for (name, conf) in p {
        if !catalog.names().iter().any(|n| n == name) {
            return Err(format!("unknown plugin [{name}]"));
        }
        catalog
            .check(name, conf)
            .map_err(|e| format!("failed to check the configuration of plugin {name} err: {e}"))?;
    }
    Ok(())
}

/// Who still points at `kind/id`, as APISIX's delete_checker message.
pub(crate) fn delete_blocker(kind: &Kind, id: &str, snap: &Snapshot) -> Option<String> {
    if kind.name == "protos" {
        return proto_user(id, snap);
    }
    if kind.name == "stream_routes" {
        // APISIX's stream_routes `delete_checker`: a subordinate route still names it as `superior_id`.
        return snap.list("stream_routes").find_map(|(other, e)| {
            let sup = e.get("protocol")?.get("superior_id").and_then(id_string)?;
            (sup == id).then(|| {
                format!(
                    "can not delete this stream route directly, stream route [{other}] is still using it as superior_id"
                )
            })
        });
    }
    for (coll, singular, field, prefix) in kind.used_by {
        for (other_id, e) in snap.list(coll) {
            if e.get(field).as_ref().and_then(id_string).as_deref() == Some(id) {
                return Some(format!(
                    "{prefix}{singular} [{other_id}] is still using it now"
                ));
            }
        }
    }
    None
}

/// APISIX's proto `delete_checker`: a `grpc-transcode` whose `proto_id` is this proto (compared as strings). APISIX
/// looks at routes and services; plugin configs and global rules hold plugins too, so they are checked as well.
fn proto_user(id: &str, snap: &Snapshot) -> Option<String> {
    for (coll, singular) in [
        ("routes", "route"),
        ("services", "service"),
        ("plugin_configs", "plugin config"),
        ("global_rules", "global rule"),
    ] {
        for (other_id, e) in snap.list(coll) {
            let plugins = e.get("plugins");
            let used = plugins
                .as_ref()
                .and_then(|p| p.get("grpc-transcode"))
                .and_then(|g| g.get("proto_id"))
                .and_then(id_string);
            if used.as_deref() == Some(id) {
                return Some(format!(
                    "can not delete this proto, {singular} [{other_id}] is still using it now"
                ));
            }
        }
    }
    None
}
