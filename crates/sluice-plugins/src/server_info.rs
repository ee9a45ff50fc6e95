//! server-info (priority 990, scope global), as APISIX's: the plugin has no request hooks; enabled in the node's
//! `plugins` list (Sluice: every built-in plugin unless the list is given) it makes the control API answer
//! `GET /v1/server_info` with this node's `id`, `hostname`, `version`, `boot_time` and `etcd_version`. APISIX's
//! other half, reporting that object to etcd under a lease, is Sluice's node registry
//! (`sluice_store::node`, `Store::announce`), which runs whatever the plugin list says: this file adds no second
//! writer. The control API (binary crate) serves the endpoint; the data plane never sees the store.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::registry::Entry;
use crate::{CompileEnv, PhaseMask, Plugin};

pub const NAME: &str = "server-info";
pub const PRIORITY: i32 = 990;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({"type": "object"})
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)
}

/// APISIX's `plugin_attr.server-info` schema: `report_ttl`, the registry key's lease in seconds.
pub fn report_ttl(attr: Option<&Value>) -> Result<Option<u64>, String> {
    let Some(attr) = attr else { return Ok(None) };
    let schema = json!({"type": "object", "properties": {
        "report_ttl": {"type": "integer", "minimum": 3, "maximum": 86400, "default": 60}}});
    sluice_model::schema::validate(&schema, attr)
        .map_err(|e| format!("plugin_attr.server-info: {e}"))?;
    Ok(attr.get("report_ttl").and_then(Value::as_u64))
}

struct ServerInfo;

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    Ok(Arc::new(ServerInfo))
}

impl Plugin for ServerInfo {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    // Configured on a route it does nothing per request, as in APISIX (scope global, no phases).
    fn phases(&self) -> PhaseMask {
        PhaseMask(0)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn report_ttl_follows_apisix_attr_schema() {
        assert_eq!(super::report_ttl(None), Ok(None));
        assert_eq!(
            super::report_ttl(Some(&json!({"report_ttl": 30}))),
            Ok(Some(30))
        );
        assert_eq!(super::report_ttl(Some(&json!({}))), Ok(None));
        assert!(super::report_ttl(Some(&json!({"report_ttl": 2}))).is_err());
        assert!(super::report_ttl(Some(&json!({"report_ttl": 86401}))).is_err());
        assert!(super::check(&json!({"anything": 1})).is_ok());
    }
}
