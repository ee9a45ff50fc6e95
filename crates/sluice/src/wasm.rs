//! config.yaml's `wasm.plugins`: each proxy-wasm module is loaded, compiled and registered as a plugin of its name
//! before any configuration is compiled (see `sluice-wasm`). The modules are fixed for the life of the process.

use std::path::Path;
use std::time::Duration;

use sluice_model::NodeConfig;

/// Loads the node's wasm modules and registers them as plugins. A missing file, a file that is not a proxy-wasm
/// module, a name already taken: the error names the plugin and the file, and the node does not start.
pub fn install(node: &NodeConfig, conf_dir: &Path) -> Result<(), String> {
    if node.wasm.plugins.is_empty() {
        return Ok(());
    }
    let mut specs = Vec::with_capacity(node.wasm.plugins.len());
    for p in &node.wasm.plugins {
        let call_timeout = match p.call_timeout {
            None => sluice_wasm::DEFAULT_CALL_TIMEOUT,
            Some(t) if t > 0.0 && t <= 60.0 => Duration::from_secs_f64(t),
            Some(t) => {
                return Err(format!(
                    "wasm plugin {}: call_timeout {t} is not in (0, 60]",
                    p.name
                ))
            }
        };
        specs.push(sluice_wasm::Spec {
            name: p.name.clone(),
            priority: p.priority,
            file: conf_dir.join(&p.file),
            rewrite_phase: p.http_request_phase == "rewrite",
            call_timeout,
            memory_limit: p
                .memory_limit
                .map_or(sluice_wasm::DEFAULT_MEMORY_LIMIT, |m| m as usize),
            max_body_size: p
                .max_body_size
                .map_or(sluice_wasm::DEFAULT_MAX_BODY_SIZE, |m| m as usize),
        });
    }
    for m in sluice_wasm::install(&specs)? {
        tracing::info!("wasm plugin {} loaded", m.name());
    }
    Ok(())
}

/// Puts the metrics the node's wasm filters define (`proxy_define_metric`) into the prometheus exposition
/// (`/apisix/prometheus/metrics`), as `apisix_wasm_<name>{plugin="<plugin>"}`.
pub fn export_metrics(node: &NodeConfig, shared: &sluice_plugins::Shared) {
    if !node.wasm.plugins.is_empty() {
        shared
            .metrics()
            .add_text_source(sluice_wasm::render_metrics);
    }
}
