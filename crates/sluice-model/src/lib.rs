//! Sluice's configuration model: the APISIX resource types (routes, services, upstreams, consumers, ...), the node
//! configuration (`conf/config.yaml`), and the pure merge rules APISIX applies between them.
//!
//! This crate does no IO and knows no file format: the store parses YAML/JSON into these types, the proxy compiles
//! them into runtime structures. Field names and defaults follow APISIX 3.x (`apisix/schema_def.lua`).

mod extra;
mod intern;
mod merge;
mod node;
mod nodemap;
mod resource;
/// The APISIX release Sluice implements (its Admin API, and what plugins report as APISIX's version: mocking's
/// `x-mock-by`, server-info's `version`).
pub const APISIX_VERSION: &str = "3.15.0";

pub mod schema;

pub use extra::{ConsumerGroup, Credential, PluginMetadata, Proto, Secret};
pub use merge::{merge_route_service, EffectiveRoute};
pub use node::{
    CacheZoneSection, CheckedConfig, DataEncryptionSection, ListenAddr, NginxTime, NodeConfig,
    ProxyCacheSection, ProxyProtocolSection, WasmPlugin, WasmSection, WorkerCount,
    DEFAULT_STREAM_ACCESS_LOG_FORMAT,
};
pub use nodemap::NodeMap;
pub use resource::*;

/// Every resource set the data plane consumes, as one value: what a provider (standalone file, embedded store,
/// etcd) hands to the compiler.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Resources {
    /// A persistent vector of `Arc`s: a configuration derived from another one (one route changed) clones it in
    /// O(1) and shares every unchanged route, and the compiler finds the changed routes by pointer without reading
    /// the others (issue 16: route scale). In id order, as the stores list them.
    pub routes: imbl::Vector<std::sync::Arc<Route>>,
    pub services: Vec<Service>,
    pub upstreams: Vec<Upstream>,
    pub consumers: Vec<Consumer>,
    pub global_rules: Vec<GlobalRule>,
    pub plugin_configs: Vec<PluginConfig>,
    pub ssls: Vec<Ssl>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<Credential>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consumer_groups: Vec<ConsumerGroup>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plugin_metadata: Vec<PluginMetadata>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protos: Vec<Proto>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Secret>,
    /// L4 routes (APISIX `stream_routes`), served on `apisix.stream_proxy` listeners.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stream_routes: Vec<StreamRoute>,
}

impl Resources {
    /// The first `upstream_id`, `service_id` or `plugin_config_id` of a route or service that names nothing, in
    /// the Admin API's words. The data plane serves such a route anyway (with APISIX's per-request status: a
    /// resource deleted with `?force=true` leaves it so); offline checks (`sluice test`, `sluice import`) refuse it.
    pub fn missing_reference(&self) -> Option<String> {
        let upstream = |id: &Id| self.upstreams.iter().any(|u| u.id.as_ref() == Some(id));
        for s in &self.services {
            if let Some(id) = s.upstream_id.as_ref().filter(|id| !upstream(id)) {
                return Some(format!(
                    "service {}: failed to fetch upstream info by upstream id [{id}]",
                    s.id
                ));
            }
        }
        for r in &self.routes {
            let e = if let Some(id) = r.upstream_id.as_ref().filter(|id| !upstream(id)) {
                format!("failed to fetch upstream info by upstream id [{id}]")
            } else if let Some(id) = r
                .service_id
                .as_ref()
                .filter(|id| !self.services.iter().any(|s| s.id == **id))
            {
                format!("failed to fetch service info by service id [{id}]")
            } else if let Some(id) = r
                .plugin_config_id
                .as_ref()
                .filter(|id| !self.plugin_configs.iter().any(|p| p.id == **id))
            {
                format!("failed to fetch plugin config info by plugin config id [{id}]")
            } else {
                continue;
            };
            return Some(format!("route {}: {e}", r.id));
        }
        None
    }
}
