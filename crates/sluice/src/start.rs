//! `sluice start`: read the node configuration, take resources from the configured provider, compile and publish
//! them, start the workers, re-publish on every change, serve the Admin API, and drain on SIGTERM/SIGQUIT/SIGINT.
//!
//! Providers: `data_plane` + `yaml` is APISIX's standalone mode (apisix.yaml, read-only); `traditional` uses the
//! embedded store (default) or etcd, written through the Admin API. The control plane (providers, reload, Admin
//! API, signals) runs on its own small runtime; the data-plane workers never wait on it: they only see a new
//! snapshot pointer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_model::{NodeConfig, Resources};
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Snapshot};
use sluice_store::{kv, standalone, ConfigRx};

use crate::apply::Applier;
use crate::catalog::RegistryCatalog;

pub fn run(
    config: &Path,
    apisix_yaml: Option<PathBuf>,
    workers: Option<usize>,
) -> Result<(), String> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("reading {}: {e}", config.display()))?;
    let node: NodeConfig = sluice_store::parse_node_config(&text)?;
    let workers = workers.unwrap_or_else(|| node.nginx_config.worker_processes.resolve());
    let resources_path = apisix_yaml.unwrap_or_else(|| config.with_file_name("apisix.yaml"));
    let conf_dir = config.parent().unwrap_or(Path::new(".")).to_path_buf();

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("control runtime: {e}"))?;
    control.block_on(async move {
        // Plugin state (limit counters, metrics) lives as long as the process, across every reload.
        let plugin_state = Arc::new(sluice_plugins::Shared::default());
        // Standalone files and the first-start seed are checked with throwaway plugin state; Admin API writes
        // are dry-run by the applier (below), which keeps the compile for the apply.
        let check: standalone::Checker =
            Arc::new(|r: &Resources| Snapshot::compile(r, 0).map(|_| ()));

        let provider = sluice_store::provider_name(&node).to_owned();
        let (mut rx, store): (ConfigRx, Option<Arc<dyn kv::Store>>) = if provider == "yaml" {
            let stamp = standalone::file_stamp(&resources_path);
            let initial = standalone::load(&resources_path, &check)?;
            let poll = Duration::from_secs_f64(node.sluice.config_poll_interval.max(0.05));
            let rx = standalone::Watcher::new(resources_path.clone(), poll, check.clone())
                .spawn_after(initial, stamp);
            (rx, None)
        } else {
            let data_dir = conf_dir.join(&node.sluice.data_dir);
            std::fs::create_dir_all(&data_dir)
                .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
            let store = sluice_store::open_store(&node, &data_dir).await?;
            seed_if_empty(store.as_ref(), &resources_path, &check).await?;
            (store.subscribe(), Some(store))
        };

        let initial = rx.borrow_and_update().clone();
        let snapshot = Snapshot::compile_with(&initial.resources, initial.revision, &plugin_state)?;
        // node_listen (cleartext) and apisix.ssl.listen (TLS, 9443 unless disabled).
        let addrs = sluice_proxy::listen_addrs(&node)?;
        let listeners = Listeners::bind_kinds(&addrs, workers)
            .map_err(|e| format!("binding {addrs:?}: {e}"))?;
        // The access log's writer thread; workers hand it batches (nginx_config.http.access_log).
        let access_log = sluice_proxy::AccessLogConfig::from_node(&node, &crate::logging::prefix(config))?
            .map(sluice_proxy::AccessLog::open)
            .transpose()?;
        let mut proxy_cfg = ProxyConfig::from_node(&node);
        proxy_cfg.access_log = access_log.as_ref().map(|l| l.handle());
        tokio::spawn(crate::logging::reopen_on_usr1(proxy_cfg.access_log.clone()));
        let gateway = Gateway::new(proxy_cfg, snapshot);
        let running = gateway
            .start(listeners)
            .map_err(|e| format!("starting workers: {e}"))?;
        let (applied_tx, applied_rx) = tokio::sync::watch::channel(initial.revision);
        let applier = Applier::new(plugin_state.clone(), gateway.clone());
        // Active health checks (`checks.active`) probe from this runtime, never from a worker; they stop at shutdown.
        tokio::spawn(gateway.run_health_checks());
        if let Some(addr) = metrics_addr(&node)? {
            // A taken port costs the metrics, not the gateway: log it and serve traffic anyway.
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    tracing::info!(listen = %addr, "prometheus metrics at /apisix/prometheus/metrics");
                    tokio::spawn(sluice_plugins::serve_metrics(l, plugin_state.clone()));
                }
                Err(e) => tracing::error!(listen = %addr, error = %e, "cannot serve prometheus metrics"),
            }
        }

        if let Some(addr) = sluice_store::control_addr(&text)? {
            // As the metrics: a taken port costs the control API, not the gateway.
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    tracing::info!(listen = %addr, "control API at /v1/healthcheck");
                    tokio::spawn(crate::control::serve(l, gateway.clone(), rx.clone()));
                }
                Err(e) => tracing::error!(listen = %addr, error = %e, "cannot serve the control API"),
            }
        }

        if let Some(store) = store.clone().filter(|_| node.apisix.enable_admin) {
            let admin = sluice_admin::AdminConfig::from_node_config(&node)?;
            let listener = tokio::net::TcpListener::bind(admin.listen)
                .await
                .map_err(|e| format!("binding the Admin API on {}: {e}", admin.listen))?;
            tracing::info!(listen = %admin.listen, "admin API listening");
            let dry_run = applier.clone();
            let checker: sluice_admin::Checker = Arc::new(move |r: &Resources| dry_run.dry_run(r));
            let state = sluice_admin::AdminState::new(
                admin,
                store,
                checker,
                Arc::new(RegistryCatalog),
                applied_rx,
            );
            tokio::spawn(sluice_admin::serve(listener, state));
        }
        tracing::info!(
            listen = ?addrs,
            workers,
            provider = %provider,
            routes = initial.resources.routes.len(),
            revision = initial.revision,
            "sluice started"
        );

        tokio::spawn(applier.run(rx, applied_tx));
        wait_for_signal().await;
        tracing::info!("shutting down: draining connections");
        gateway.shutdown();
        tokio::task::spawn_blocking(move || running.join())
            .await
            .map_err(|e| format!("joining workers: {e}"))?;
        if let Some(l) = access_log {
            // The workers handed their last lines over as they exited: write them.
            let _ = tokio::task::spawn_blocking(move || l.close()).await;
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// `plugin_attr.prometheus`: APISIX serves metrics on 127.0.0.1:9091 unless `enable_export_server` is false.
fn metrics_addr(node: &NodeConfig) -> Result<Option<SocketAddr>, String> {
    let attr = node.plugin_attr.as_ref().and_then(|a| a.get("prometheus"));
    if attr
        .and_then(|p| p.get("enable_export_server"))
        .and_then(|v| v.as_bool())
        == Some(false)
    {
        return Ok(None);
    }
    let export = attr.and_then(|p| p.get("export_addr"));
    let ip = export
        .and_then(|e| e.get("ip"))
        .and_then(|v| v.as_str())
        .unwrap_or("127.0.0.1");
    let port = export
        .and_then(|e| e.get("port"))
        .and_then(|v| v.as_u64())
        .unwrap_or(9091);
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| format!("invalid plugin_attr.prometheus.export_addr.ip {ip:?}"))?;
    let port = u16::try_from(port)
        .map_err(|_| format!("invalid plugin_attr.prometheus.export_addr.port {port}"))?;
    Ok(Some(SocketAddr::new(ip, port)))
}

/// First start of an empty store: import apisix.yaml (when present) so a fresh node serves its sample routes.
/// Afterwards the store is the source of truth and the file is ignored.
async fn seed_if_empty(
    store: &dyn kv::Store,
    path: &Path,
    check: &standalone::Checker,
) -> Result<(), String> {
    if !store.snapshot().entries.is_empty() || !path.exists() {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let res = standalone::parse(&text)?;
    check(&res)?;
    let mut ops = Vec::new();
    let mut put = |kind: &str, id: &str, v: serde_json::Value| {
        ops.push(kv::Op::Put {
            key: format!("{kind}/{id}"),
            value: v,
            expect_mod: Some(0),
        })
    };
    fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
    }
    for r in &res.routes {
        put("routes", &r.id.0, json(r));
    }
    for s in &res.services {
        put("services", &s.id.0, json(s));
    }
    for u in &res.upstreams {
        put(
            "upstreams",
            u.id.as_ref().map_or("", |i| i.0.as_str()),
            json(u),
        );
    }
    for c in &res.consumers {
        put("consumers", &c.username, json(c));
    }
    for g in &res.global_rules {
        put("global_rules", &g.id.0, json(g));
    }
    for p in &res.plugin_configs {
        put("plugin_configs", &p.id.0, json(p));
    }
    for s in &res.ssls {
        put("ssls", &s.id.0, json(s));
    }
    if ops.is_empty() {
        return Ok(());
    }
    let n = ops.len();
    store
        .commit(ops)
        .await
        .map_err(|e| format!("seeding the store from {}: {e}", path.display()))?;
    tracing::info!(resources = n, from = %path.display(), "empty store seeded");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut quit), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::quit()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = quit.recv() => {}
        _ = int.recv() => {}
    }
}
