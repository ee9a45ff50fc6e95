//! The in-process gateway fixture: APISIX resources as a JSON value -> `Snapshot::compile` -> `Gateway` on
//! 127.0.0.1:0 with N workers. Shuts down (gracefully, bounded) and joins on drop.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use sluice_model::Resources;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Running, Snapshot};

pub struct Gw {
    pub gateway: Gateway,
    pub addr: SocketAddr,
    running: Option<Running>,
    revision: std::cell::Cell<u64>,
}

pub fn compile(resources: &Value, revision: u64) -> Snapshot {
    let res: Resources = serde_json::from_value(resources.clone()).expect("resources JSON");
    Snapshot::compile(&res, revision).unwrap_or_else(|e| panic!("compile: {e}"))
}

/// The test default: short grace so a broken drain cannot stall the suite.
pub fn test_config() -> ProxyConfig {
    ProxyConfig {
        graceful_timeout: Duration::from_secs(3),
        ..ProxyConfig::default()
    }
}

impl Gw {
    /// One worker: pools and balancer state are per worker, so counts are exact.
    pub fn start(resources: Value) -> Gw {
        Self::start_with(resources, 1, test_config())
    }

    pub fn start_with(resources: Value, workers: usize, cfg: ProxyConfig) -> Gw {
        let snap = compile(&resources, 1);
        let gateway = Gateway::new(cfg, snap);
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let listeners = Listeners::bind(&[addr], workers).expect("bind gateway");
        let addr = listeners.local_addrs[0];
        let running = gateway.start(listeners).expect("start gateway");
        Gw {
            gateway,
            addr,
            running: Some(running),
            revision: std::cell::Cell::new(1),
        }
    }

    pub fn publish(&self, resources: Value) {
        let r = self.revision.get() + 1;
        self.revision.set(r);
        self.gateway.publish(compile(&resources, r));
    }

    /// Graceful shutdown and join, on a blocking thread so the test runtime keeps serving origins meanwhile.
    pub async fn shutdown(mut self) {
        self.gateway.shutdown();
        if let Some(r) = self.running.take() {
            super::t(tokio::task::spawn_blocking(move || r.join()))
                .await
                .expect("join workers");
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.gateway.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

/// `{"routes": [{"id": 1, "uri": uri, "upstream": {"nodes": {addr: 1}}}]}`
pub fn one_route(uri: &str, upstream: Value) -> Value {
    serde_json::json!({"routes": [{"id": 1, "uri": uri, "upstream": upstream}]})
}

/// A roundrobin upstream over these nodes with weight 1 each.
pub fn rr(nodes: &[SocketAddr]) -> Value {
    let m: serde_json::Map<String, Value> = nodes
        .iter()
        .map(|a| (a.to_string(), Value::from(1)))
        .collect();
    serde_json::json!({"type": "roundrobin", "nodes": m})
}
