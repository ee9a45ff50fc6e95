//! `sluice test`: every check `sluice start` makes on its configuration, without binding a port or opening a
//! store, as `nginx -t` and `apisix test`. Prints what it checked; any failure is the error (exit status 1).

use std::path::{Path, PathBuf};

use sluice_model::Resources;
use sluice_proxy::Snapshot;
use sluice_store::standalone;

pub fn run(config: &Path, apisix_yaml: Option<PathBuf>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let loaded = crate::start::load(config)?;
    let node = &loaded.checked.config;
    for w in &loaded.checked.warnings {
        out.push(format!("warning: {}: {w}", config.display()));
    }
    // `proxy_mode: stream` opens no HTTP listener.
    let addrs = if node.apisix.proxy_modes().0 {
        sluice_proxy::listen_addrs(node)?
    } else {
        Vec::new()
    };
    // proxy-cache's zones: checked here; the resources below compile against them (a disk zone a route names
    // is opened, its directory created, as `nginx -t` creates proxy_cache_path).
    let zones = std::sync::Arc::new(sluice_plugins::ProxyCacheZones::from_conf(
        node.apisix.proxy_cache.as_ref(),
    )?);
    let provider = sluice_store::provider_name(node);
    out.push(format!(
        "{}: ok (role {}, config_provider {provider}, listen {})",
        config.display(),
        node.deployment.role,
        addrs
            .iter()
            .map(|(a, _)| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let stream = sluice_proxy::stream_listen(node)?;
    if !stream.is_empty() {
        out.push(format!(
            "{}: stream proxy on tcp [{}] udp [{}]",
            config.display(),
            stream
                .tcp
                .iter()
                .map(|(a, tls)| if *tls {
                    format!("{a} (tls)")
                } else {
                    a.to_string()
                })
                .collect::<Vec<_>>()
                .join(" "),
            stream
                .udp
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    sluice_store::control_addr(&loaded.text)?;
    if let Some(zk) = loaded.checked.doc.pointer("/discovery/zookeeper") {
        let zk = sluice_discovery::ZkConfig::from_value(zk)?;
        out.push(format!(
            "{}: zookeeper discovery on {} under {}",
            config.display(),
            zk.connect_string,
            zk.root
        ));
    }
    if let Some(dns) = loaded.checked.doc.pointer("/discovery/dns") {
        let dns = sluice_discovery::dns::DnsConfig::from_value(dns)?;
        out.push(format!(
            "{}: dns discovery through {}",
            config.display(),
            dns.servers
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    if let Some(c) = loaded.checked.doc.pointer("/discovery/consul") {
        let c = sluice_discovery::consul::ConsulConfig::from_value(c)?;
        out.push(format!(
            "{}: consul discovery from {}",
            config.display(),
            c.servers.join(" ")
        ));
    }
    if provider == "etcd" {
        sluice_store::etcd::EtcdConfig::from_node_config(node)?;
    }
    if provider != "yaml" && node.apisix.enable_admin {
        let admin = sluice_admin::AdminConfig::from_node_config(node)?;
        out.push(format!(
            "{}: Admin API on {} with {} key(s)",
            config.display(),
            admin.listen,
            admin.keys.len()
        ));
    }
    out.push(format!(
        "pid file: {}",
        crate::instance::pid_path(config, node).display()
    ));
    let resources = apisix_yaml.unwrap_or_else(|| config.with_file_name("apisix.yaml"));
    if provider == "yaml" {
        out.push(check_resources(&resources, &zones)?);
    } else if resources.exists() {
        // Only imported into an empty store (or with `sluice import`), but then it must be valid.
        let line = check_resources(&resources, &zones)?;
        out.push(format!(
            "{line} (imported only into an empty store, or by `sluice import`)"
        ));
    }
    out.push("configuration test is successful".into());
    Ok(out)
}

/// Parses apisix.yaml and compiles it as the data plane would.
fn check_resources(
    path: &Path,
    zones: &std::sync::Arc<sluice_plugins::ProxyCacheZones>,
) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let res: Resources =
        standalone::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(e) = res.missing_reference() {
        return Err(format!("{}: {e}", path.display()));
    }
    let shared = sluice_plugins::Shared::default().with_proxy_cache(zones.clone());
    Snapshot::compile_with(&res, 0, &shared).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "{}: ok ({} routes, {} services, {} upstreams, {} consumers)",
        path.display(),
        res.routes.len(),
        res.services.len(),
        res.upstreams.len(),
        res.consumers.len()
    ))
}
