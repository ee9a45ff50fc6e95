//! The plugin registry: one line per plugin, in descending priority order (checked by a test). Adding a plugin is
//! its file plus one line here.

use std::sync::Arc;

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
    REGISTRY.iter().find(|e| e.name == name)
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
