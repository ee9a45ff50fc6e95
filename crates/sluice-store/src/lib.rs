//! Configuration providers. Each provider produces versioned [`Resources`] on a `tokio::sync::watch` channel; the
//! binary compiles every new value into a data-plane snapshot and publishes it. Providers never touch the data
//! plane, and the data plane never depends on this crate.

pub mod embedded;
pub mod kv;
pub mod standalone;

use std::sync::Arc;

use sluice_model::{NodeConfig, Resources};

/// One complete configuration as a provider saw it, with the revision it had there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Versioned {
    pub revision: u64,
    pub resources: Resources,
}

pub type ConfigRx = tokio::sync::watch::Receiver<Arc<Versioned>>;
pub type ConfigTx = tokio::sync::watch::Sender<Arc<Versioned>>;

/// Parses `conf/config.yaml`. An empty file means all defaults.
pub fn parse_node_config(text: &str) -> Result<NodeConfig, String> {
    if text.trim().is_empty() {
        return Ok(NodeConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| format!("invalid config.yaml: {e}"))
}
