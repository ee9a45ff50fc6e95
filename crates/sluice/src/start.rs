//! `sluice start`: read the node configuration, load resources from the configured provider, compile and publish
//! them, start the workers, re-publish on every change, and drain on SIGTERM/SIGQUIT/SIGINT.
//!
//! The control plane (providers, reload, signals) runs on its own small runtime; the data-plane workers never wait
//! on it: they only see a new snapshot pointer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_model::{NodeConfig, Resources};
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Snapshot};
use sluice_store::standalone;

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

    let check: standalone::Checker = Arc::new(|r: &Resources| Snapshot::compile(r, 0).map(|_| ()));
    let stamp = standalone::file_stamp(&resources_path);
    let initial = standalone::load(&resources_path, &check)?;
    // Plugin state (limit counters, metrics) lives as long as the process, across every reload.
    let plugin_state = Arc::new(sluice_plugins::Shared::default());
    let snapshot = Snapshot::compile_with(&initial.resources, initial.revision, &plugin_state)?;

    let addrs = node
        .apisix
        .node_listen
        .iter()
        .map(|l| l.socket_addr())
        .collect::<Result<Vec<_>, _>>()?;
    let listeners =
        Listeners::bind(&addrs, workers).map_err(|e| format!("binding {addrs:?}: {e}"))?;
    let gateway = Gateway::new(ProxyConfig::from_node(&node), snapshot);
    let running = gateway
        .start(listeners)
        .map_err(|e| format!("starting workers: {e}"))?;
    tracing::info!(
        listen = ?addrs,
        workers,
        routes = initial.resources.routes.len(),
        resources = %resources_path.display(),
        "sluice started"
    );

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("control runtime: {e}"))?;
    let poll = Duration::from_secs_f64(node.sluice.config_poll_interval.max(0.05));
    control.block_on(async {
        let mut rx = standalone::Watcher::new(resources_path.clone(), poll, check)
            .spawn_after(initial, stamp);
        let gw = gateway.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let v = rx.borrow_and_update().clone();
                let prev = gw.snapshot();
                match Snapshot::compile_next(&v.resources, v.revision, &plugin_state, Some(&prev)) {
                    Ok(s) => {
                        let routes = s.route_count();
                        gw.publish(s);
                        tracing::info!(revision = v.revision, routes, "configuration applied");
                    }
                    Err(e) => tracing::error!(error = %e, "configuration rejected"),
                }
            }
        });
        wait_for_signal().await;
    });
    tracing::info!("shutting down: draining connections");
    gateway.shutdown();
    running.join();
    tracing::info!("stopped");
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
