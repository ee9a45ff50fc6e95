//! The plugin registry: one line per plugin, in descending priority order (checked by a test). Adding a plugin is
//! its file plus one line here.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::{CompileEnv, Plugin};

/// Builds a plugin instance from a checked configuration.
pub type CompileFn = fn(&Value, &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String>;

pub struct Entry {
    pub name: &'static str,
    pub priority: i32,
    /// An auth plugin (APISIX `type = 'auth'`): its object in a consumer is a credential, not a plugin to run.
    pub auth: bool,
    /// The plugin's JSON schema (served by the Admin API's schema endpoints).
    pub schema: fn() -> Value,
    /// Validates a configuration: schema plus cross-field rules, with APISIX's error text.
    pub check: fn(&Value) -> Result<(), String>,
    pub compile: CompileFn,
    /// The plugin's secret fields: APISIX's `encrypt_fields` (encrypted at rest, redacted for viewer keys).
    pub secrets: sluice_secrets::SecretFields,
}

pub static REGISTRY: &[Entry] = &[
    crate::real_ip::ENTRY,
    crate::request_id::ENTRY,
    crate::opentelemetry::ENTRY,
    crate::zipkin::ENTRY,
    crate::fault_injection::ENTRY,
    crate::mocking::ENTRY,
    crate::cors::ENTRY,
    crate::ip_restriction::ENTRY,
    crate::ua_restriction::ENTRY,
    crate::referer_restriction::ENTRY,
    crate::csrf::ENTRY,
    crate::uri_blocker::ENTRY,
    crate::request_validation::ENTRY,
    crate::openid_connect::ENTRY,
    crate::hmac_auth::ENTRY,
    crate::basic_auth::ENTRY,
    crate::jwt_auth::ENTRY,
    crate::key_auth::ENTRY,
    crate::consumer_restriction::ENTRY,
    crate::forward_auth::ENTRY,
    crate::proxy_cache::ENTRY,
    crate::body_transformer::ENTRY,
    crate::proxy_mirror::ENTRY,
    crate::proxy_rewrite::ENTRY,
    crate::api_breaker::ENTRY,
    crate::limit_conn::ENTRY,
    crate::limit_count::ENTRY,
    crate::limit_req::ENTRY,
    crate::brotli::ENTRY,
    crate::gzip::ENTRY,
    crate::server_info::ENTRY,
    crate::traffic_split::ENTRY,
    crate::redirect::ENTRY,
    crate::response_rewrite::ENTRY,
    crate::dubbo_proxy::ENTRY,
    crate::grpc_transcode::ENTRY,
    crate::grpc_web::ENTRY,
    crate::http_dubbo::ENTRY,
    crate::public_api::ENTRY,
    crate::prometheus::ENTRY,
    crate::loki_logger::ENTRY,
    crate::elasticsearch_logger::ENTRY,
    crate::echo::ENTRY,
    crate::http_logger::ENTRY,
    crate::tcp_logger::ENTRY,
    crate::kafka_logger::ENTRY,
    crate::syslog::ENTRY,
    crate::udp_logger::ENTRY,
    crate::file_logger::ENTRY,
    crate::clickhouse_logger::ENTRY,
];

pub fn find(name: &str) -> Option<&'static Entry> {
    REGISTRY
        .iter()
        .find(|e| e.name == name)
        .or_else(|| EXTERNAL.get()?.1.iter().find(|e| e.name == name))
}

/// Every plugin: the built-in ones, then the external ones installed at startup.
pub fn all() -> impl Iterator<Item = &'static Entry> {
    REGISTRY
        .iter()
        .chain(EXTERNAL.get().into_iter().flat_map(|(_, e)| e.iter()))
}

/// A plugin loaded at startup rather than compiled in (a Wasm module declared in config.yaml's `wasm` section).
/// Once installed with [`install_external`], it is a registry entry like any other: routes, services, global
/// rules, consumers and the Admin API's checks find it by name.
pub trait External: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn priority(&self) -> i32;
    fn schema(&self) -> Value;
    fn check(&self, conf: &Value) -> Result<(), String>;
    fn compile(&self, conf: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String>;
}

/// How many external plugins one process can install.
pub const MAX_EXTERNAL: usize = 32;

type Externals = (Vec<Box<dyn External>>, Vec<Entry>);
static EXTERNAL: OnceLock<Externals> = OnceLock::new();

fn external(i: usize) -> &'static dyn External {
    // An entry `i` exists only once the list is installed with at least `i + 1` plugins.
    match EXTERNAL.get().and_then(|(l, _)| l.get(i)) {
        Some(p) => p.as_ref(),
        None => unreachable!("external plugin entry {i} without its plugin"),
    }
}

fn ext_schema<const I: usize>() -> Value {
    external(I).schema()
}
fn ext_check<const I: usize>(conf: &Value) -> Result<(), String> {
    external(I).check(conf)
}
fn ext_compile<const I: usize>(
    conf: &Value,
    env: &CompileEnv<'_>,
) -> Result<Arc<dyn Plugin>, String> {
    external(I).compile(conf, env)
}

type Fns = (fn() -> Value, fn(&Value) -> Result<(), String>, CompileFn);

macro_rules! ext_fns {
    ($($i:literal)*) => { [$((ext_schema::<$i>, ext_check::<$i>, ext_compile::<$i>),)*] };
}

/// Entries hold plain `fn`s: external plugin `i` is reached through the `i`-th instantiation of these.
static EXT_FNS: [Fns; MAX_EXTERNAL] =
    ext_fns!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);

/// Installs the external plugins, once per process (at startup, before any configuration is compiled). Fails on
/// a name taken by a built-in plugin or by another external one, past [`MAX_EXTERNAL`], or when called twice.
pub fn install_external(list: Vec<Box<dyn External>>) -> Result<(), String> {
    if list.len() > MAX_EXTERNAL {
        return Err(format!("at most {MAX_EXTERNAL} external plugins"));
    }
    let mut entries = Vec::with_capacity(list.len());
    for (i, p) in list.iter().enumerate() {
        let name = p.name();
        if REGISTRY.iter().any(|e| e.name == name) || entries.iter().any(|e: &Entry| e.name == name)
        {
            return Err(format!("plugin name {name:?} is already taken"));
        }
        let (schema, check, compile) = EXT_FNS[i];
        entries.push(Entry {
            name,
            priority: p.priority(),
            auth: false,
            schema,
            check,
            compile,
            secrets: sluice_secrets::SecretFields::NONE,
        });
    }
    EXTERNAL
        .set((list, entries))
        .map_err(|_| "external plugins are already installed".to_owned())
}

/// An auth plugin's `consumer_schema` as APISIX serves it (`GET /apisix/admin/schema/plugins/{name}?schema_type=
/// consumer`): what a consumer's or credential's object for that plugin holds. `None` for other plugins.
pub fn consumer_schema(name: &str) -> Option<Value> {
    use serde_json::json;
    Some(match name {
        "key-auth" => json!({"type": "object", "properties": {"key": {"type": "string"}},
                             "encrypt_fields": ["key"], "required": ["key"]}),
        "basic-auth" => json!({"type": "object", "title": "work with consumer object",
                               "properties": {"username": {"type": "string"}, "password": {"type": "string"}},
                               "encrypt_fields": ["password"], "required": ["username", "password"]}),
        "hmac-auth" => json!({"type": "object", "title": "work with consumer object",
                              "properties": {"key_id": {"type": "string", "minLength": 1, "maxLength": 256},
                                             "secret_key": {"type": "string", "minLength": 1, "maxLength": 256}},
                              "encrypt_fields": ["secret_key"], "required": ["key_id", "secret_key"]}),
        "jwt-auth" => crate::jwt_auth::consumer_schema(),
        _ => return None,
    })
}

/// The plugins' secret-field declarations, as [`sluice_secrets::PluginFields`] (`None`: an unknown plugin).
pub fn secret_fields(name: &str) -> Option<&'static sluice_secrets::SecretFields> {
    find(name).map(|e| &e.secrets)
}

#[cfg(test)]
mod tests {
    use super::REGISTRY;

    #[test]
    fn names_unique_and_priorities_descending() {
        for w in REGISTRY.windows(2) {
            assert!(
                w[0].priority >= w[1].priority,
                "{} before {}",
                w[0].name,
                w[1].name
            );
        }
        let mut names: Vec<_> = REGISTRY.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len());
    }

    /// A declared secret field names a property of the plugin's schema (a typo would leave the secret in clear).
    /// APISIX's lists are kept whole, so its data reads the same; two name features Sluice does not offer yet
    /// (limit-count over Redis Sentinel, limit-conn over Redis).
    #[test]
    fn secret_fields_name_schema_properties() {
        let mut declared = 0;
        for e in REGISTRY {
            let schema = (e.schema)();
            for path in e.secrets.conf {
                declared += 1;
                let top = path.split('.').next().unwrap_or(path);
                let apisix_only = [
                    ("limit-count", "sentinel_password"),
                    ("limit-conn", "redis_password"),
                ];
                if apisix_only.contains(&(e.name, top)) {
                    continue;
                }
                assert!(
                    schema["properties"].get(top).is_some(),
                    "{}: secret field {path} is not in its schema",
                    e.name
                );
            }
        }
        assert!(declared >= 5, "the redis and logger secrets are declared");
        let consumer = |n: &str| super::secret_fields(n).and_then(|s| s.consumer);
        assert_eq!(consumer("key-auth"), Some(&["key"][..]));
        assert_eq!(consumer("basic-auth"), Some(&["password"][..]));
        assert_eq!(consumer("hmac-auth"), Some(&["secret_key"][..]));
        assert_eq!(consumer("jwt-auth"), Some(&["secret"][..]));
        assert!(super::secret_fields("no-such-plugin").is_none());
    }

    /// Every plugin has its page and a line in docs/plugins.md.
    #[test]
    fn every_plugin_is_documented() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs");
        let index = std::fs::read_to_string(format!("{root}/plugins.md")).unwrap_or_default();
        for e in REGISTRY {
            assert!(
                index.contains(&format!("[{}]", e.name)),
                "docs/plugins.md lacks {}",
                e.name
            );
            let page = format!("{root}/plugins/{}.md", e.name);
            assert!(std::path::Path::new(&page).exists(), "{page} missing");
        }
    }

    /// `SLUICE_SCHEMA_DUMP=path cargo test -p sluice-plugins dump_schemas -- --ignored` writes every schema.
    #[test]
    #[ignore]
    fn dump_schemas() {
        let all: serde_json::Map<String, serde_json::Value> = REGISTRY
            .iter()
            .map(|e| {
                (
                    e.name.to_owned(),
                    serde_json::json!({"priority": e.priority, "schema": (e.schema)()}),
                )
            })
            .collect();
        let path = std::env::var("SLUICE_SCHEMA_DUMP")
            .unwrap_or_else(|_| "/tmp/sluice-schemas.json".into());
        std::fs::write(path, serde_json::to_string_pretty(&all).unwrap()).unwrap();
    }

    #[test]
    fn every_schema_is_an_object_schema() {
        for e in REGISTRY {
            assert_eq!((e.schema)()["type"], "object", "{}", e.name);
        }
    }
}
