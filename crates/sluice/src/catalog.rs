//! The Admin API's view of the plugin registry: names, schemas and checks come from `sluice-plugins`, the one
//! place each plugin declares them.

use serde_json::Value;
use sluice_plugins::registry;

pub struct RegistryCatalog;

impl sluice_admin::PluginCatalog for RegistryCatalog {
    fn names(&self) -> Vec<String> {
        registry::all().map(|e| e.name.to_owned()).collect()
    }
    fn schema(&self, name: &str) -> Option<Value> {
        registry::find(name).map(|e| (e.schema)())
    }
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        let e = registry::find(name).ok_or_else(|| format!("unknown plugin [{name}]"))?;
        (e.check)(conf)
    }
    fn is_auth(&self, name: &str) -> bool {
        registry::find(name).is_some_and(|e| e.auth)
    }
    fn consumer_schema(&self, name: &str) -> Option<Value> {
        registry::consumer_schema(name)
    }
}
