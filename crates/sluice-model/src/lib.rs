//! Sluice's configuration model: the APISIX resource types (routes, services, upstreams, consumers, ...), the node
//! configuration (`conf/config.yaml`), and the pure merge rules APISIX applies between them.
//!
//! This crate does no IO and knows no file format: the store parses YAML/JSON into these types, the proxy compiles
//! them into runtime structures. Field names and defaults follow APISIX 3.x (`apisix/schema_def.lua`).

mod extra;
mod merge;
mod node;
mod resource;
pub mod schema;

pub use extra::{ConsumerGroup, Credential, PluginMetadata, Proto, Secret};
pub use merge::{merge_route_service, EffectiveRoute};
pub use node::{
    CheckedConfig, DataEncryptionSection, ListenAddr, NginxTime, NodeConfig, WorkerCount,
};
pub use resource::*;

/// Every resource set the data plane consumes, as one value: what a provider (standalone file, embedded store,
/// etcd) hands to the compiler.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Resources {
    pub routes: Vec<Route>,
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
}
