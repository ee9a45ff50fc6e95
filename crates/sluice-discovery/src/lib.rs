//! Service discovery for upstreams that name a `discovery_type` (APISIX's `discovery_type` / `service_name` /
//! `discovery_args`), wired by the binary: a [`Registry`] answers the snapshot compiler's
//! [`sluice_model::Discovery`] questions from what its watchers last saw and says when that changed, so the binary
//! recompiles (unchanged upstreams keep their runtime). The data plane never depends on this crate.
//!
//! Registries: Zookeeper (`discovery.zookeeper` in config.yaml), Dubbo providers under
//! `{root}/{interface}/providers` and Dubbo 3 application-level instances, see [`zookeeper`]; DNS (`discovery.dns`: SRV, A, AAAA with TTLs), see [`dns`]; Consul (`discovery.consul`: blocking queries on the
//! catalog and health indexes), see [`consul`].

pub mod application;
pub mod consul;
pub mod dns;
pub mod provider;
pub mod zookeeper;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use sluice_model::{Discovery, Node};

pub use zookeeper::ZkConfig;

/// What the watchers know, shared with the compiler.
pub struct Registry {
    zk: Option<zookeeper::Handle>,
    dns: Option<dns::Handle>,
    consul: Option<consul::Handle>,
}

impl Registry {
    /// The registries `discovery` (config.yaml's section) configures, started on the current tokio runtime.
    /// Returns the registry and a receiver whose value changes whenever discovered nodes change.
    pub fn start(
        discovery: Option<&Value>,
    ) -> Result<(Arc<Registry>, tokio::sync::watch::Receiver<u64>), String> {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let zk = match discovery.and_then(|d| d.get("zookeeper")) {
            Some(v) => Some(zookeeper::Handle::spawn(
                ZkConfig::from_value(v)?,
                tx.clone(),
            )),
            None => None,
        };
        let dns = match discovery.and_then(|d| d.get("dns")) {
            Some(v) => Some(dns::Handle::spawn(
                dns::DnsConfig::from_value(v)?,
                tx.clone(),
            )?),
            None => None,
        };
        let consul = match discovery.and_then(|d| d.get("consul")) {
            Some(v) => Some(consul::Handle::spawn(
                consul::ConsulConfig::from_value(v)?,
                tx.clone(),
            )),
            None => None,
        };
        Ok((Arc::new(Registry { zk, dns, consul }), rx))
    }
}

impl Discovery for Registry {
    fn nodes(
        &self,
        discovery_type: &str,
        service_name: &str,
        args: Option<&Map<String, Value>>,
    ) -> Option<Vec<Node>> {
        match discovery_type {
            "zookeeper" => Some(self.zk.as_ref()?.nodes(service_name, args)),
            "dns" => Some(self.dns.as_ref()?.nodes(service_name)),
            "consul" => Some(self.consul.as_ref()?.nodes(service_name)),
            _ => None,
        }
    }
}

/// Last known providers by interface (`None`: not listed yet).
type Known = Arc<Mutex<HashMap<String, Option<Vec<provider::Provider>>>>>;
