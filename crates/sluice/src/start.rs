//! `sluice start`: read the node configuration, take resources from the configured provider, compile and publish
//! them, start the workers, re-publish on every change, serve the Admin API. Signals as nginx's master: HUP
//! re-reads config.yaml (live parts applied, the rest named as needing a restart), USR1 is left to the log files,
//! QUIT drains and exits, TERM and INT exit at once. docs/operations.md has the operator's view.
//!
//! Providers: `data_plane` + `yaml` is APISIX's standalone mode (apisix.yaml, read-only); `traditional` uses the
//! embedded store (default) or etcd, written through the Admin API. The control plane (providers, reload, Admin
//! API, signals) runs on its own small runtime; the data-plane workers never wait on it: they only see a new
//! snapshot pointer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_model::{CheckedConfig, NodeConfig, Resources};
use sluice_proxy::{Gateway, ListenerKind, Listeners, ProxyConfig, Snapshot};
use sluice_store::{kv, standalone, ConfigRx};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinHandle;

use crate::apply::Applier;
use crate::catalog::RegistryCatalog;
use crate::instance::{self, PidLock};

/// config.yaml as read: the text (the control API address is read from it) and the checked model.
pub struct Loaded {
    pub text: String,
    pub checked: CheckedConfig,
}

/// Reads and checks config.yaml; errors name the file and the key.
pub fn load(config: &Path) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| format!("reading {}: {e}", config.display()))?;
    let checked = sluice_store::read_node_config(&text, &config.display().to_string())?;
    Ok(Loaded { text, checked })
}

/// How the process was asked to end.
enum Stop {
    /// SIGQUIT: stop accepting, finish the requests in flight (up to `graceful_shutdown_timeout`), exit.
    Graceful,
    /// SIGTERM / SIGINT: stop at once; open connections are closed (nginx's fast shutdown).
    Fast(&'static str),
}

pub fn run(
    config: &Path,
    apisix_yaml: Option<PathBuf>,
    workers: Option<usize>,
) -> Result<(), String> {
    let loaded = load(config)?;
    for w in &loaded.checked.warnings {
        tracing::warn!("{}: {w}", config.display());
    }
    let node = loaded.checked.config.clone();
    let workers = workers.unwrap_or_else(|| node.nginx_config.worker_processes.resolve());
    let resources_path = apisix_yaml.unwrap_or_else(|| config.with_file_name("apisix.yaml"));
    let conf_dir = config.parent().unwrap_or(Path::new(".")).to_path_buf();
    // proxy-wasm modules (`wasm.plugins`) become plugins before any configuration is compiled.
    crate::wasm::install(&node, &conf_dir)?;
    // One instance per pid file, and never two on the same ports (SO_REUSEPORT would share them silently).
    let pid_lock = PidLock::acquire(&instance::pid_path(config, &node))?;
    // A control plane serves the Admin API only; the data planes watching its etcd proxy.
    let control_plane = node.deployment.role == "control_plane";
    let workers = if control_plane { 1 } else { workers };
    // `proxy_mode` (APISIX): `http` (default), `stream` or `http&stream`; stream listeners from `stream_proxy`.
    let (http_on, _) = node.apisix.proxy_modes();
    let stream = if control_plane {
        sluice_proxy::StreamListen::default()
    } else {
        sluice_proxy::stream_listen(&node)?
    };
    let mut addrs = if control_plane || !http_on {
        Vec::new()
    } else {
        sluice_proxy::listen_addrs(&node)?
    };
    // `proxy_protocol.enable_tcp_pp`: every stream TCP listener takes a PROXY header first.
    let tcp_pp = node
        .apisix
        .proxy_protocol
        .as_ref()
        .is_some_and(|p| p.enable_tcp_pp);
    addrs.extend(stream.tcp.iter().map(|&(a, tls)| {
        let kind = if tls {
            ListenerKind::StreamTls
        } else {
            ListenerKind::Stream
        };
        (a, kind.with_proxy_protocol(tcp_pp))
    }));
    instance::ports_free(&addrs.iter().map(|(a, _)| *a).collect::<Vec<_>>())?;

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("control runtime: {e}"))?;
    let config = config.to_path_buf();
    let stop = control.block_on(async move {
        // First, so a signal sent while starting is never the default action (HUP and USR1 would kill).
        let mut signals = Signals::install()?;
        // Plugin state (limit counters, metrics) lives as long as the process, across every reload.
        // proxy-cache's zones (`apisix.proxy_cache`) hold cached answers for the process's life.
        let cache_zones = Arc::new(sluice_plugins::ProxyCacheZones::from_conf(
            node.apisix.proxy_cache.as_ref(),
        )?);
        let plugin_state = Arc::new(
            sluice_plugins::Shared::default()
                .with_plugin_attr(node.plugin_attr.clone())
                .with_proxy_cache(cache_zones.clone()),
        );
        crate::wasm::export_metrics(&node, &plugin_state);
        // Standalone files and the first-start seed are checked with throwaway plugin state (sharing the cache
        // zones, which routes name); Admin API writes are dry-run by the applier (below), which keeps the compile
        // for the apply.
        let check: standalone::Checker = Arc::new(move |r: &Resources| {
            let shared = sluice_plugins::Shared::default().with_proxy_cache(cache_zones.clone());
            Snapshot::compile_with(r, 0, &shared).map(|_| ())
        });

        let provider = sluice_store::provider_name(&node).to_owned();
        let mut server_info = None;
        // The data directory's lock is held until the process ends.
        // APISIX's API-driven standalone mode: `traditional` + `yaml` starts empty and takes its whole
        // configuration through `PUT /apisix/admin/configs` (a data plane + yaml reads apisix.yaml).
        let api_driven = provider == "yaml" && node.deployment.role == "traditional";
        let configs_api = api_driven.then(|| Arc::new(sluice_store::api::ApiStandalone::default()));
        let (mut rx, store, _data_lock): (ConfigRx, Option<Arc<dyn kv::Store>>, _) =
            if let Some(api) = &configs_api {
                (
                    kv::Store::subscribe(api.as_ref()),
                    Some(api.clone() as Arc<dyn kv::Store>),
                    None,
                )
            } else if provider == "yaml" {
                let stamp = standalone::file_stamp(&resources_path);
                let initial = standalone::load(&resources_path, &check)?;
                let poll = Duration::from_secs_f64(node.sluice.config_poll_interval.max(0.05));
                let rx = standalone::Watcher::new(resources_path.clone(), poll, check.clone())
                    .spawn_after(initial, stamp);
                // No registry without a store, but the control API's /v1/server_info still reports this node,
                // with an id kept as in traditional mode (APISIX keeps conf/apisix.uid in every mode).
                let data_dir = conf_dir.join(&node.sluice.data_dir);
                let id = std::fs::create_dir_all(&data_dir)
                    .map_err(|e| e.to_string())
                    .and_then(|()| sluice_store::node::node_id(&data_dir));
                match id {
                    Ok(id) => {
                        server_info = Some(sluice_store::node::server_info(
                            &id,
                            env!("CARGO_PKG_VERSION"),
                            sluice_store::node::unix_now(),
                        ))
                    }
                    Err(e) => tracing::warn!(error = %e, "no node id for /v1/server_info"),
                }
                (rx, None, None)
            } else {
                let data_dir = conf_dir.join(&node.sluice.data_dir);
                std::fs::create_dir_all(&data_dir)
                    .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
                let data_lock = PidLock::acquire_data_dir(&data_dir)?;
                let store = sluice_store::open_store(
                    &node,
                    &data_dir,
                    sluice_plugins::registry::secret_fields,
                )
                .await?;
                seed_if_empty(store.as_ref(), &resources_path, &check).await?;
                let id = sluice_store::node::node_id(&data_dir)?;
                // The registry lists the nodes that serve traffic (`?nodes=all` counts them): not a control plane.
                server_info = (!control_plane).then(|| {
                    sluice_store::node::server_info(
                        &id,
                        env!("CARGO_PKG_VERSION"),
                        sluice_store::node::unix_now(),
                    )
                });
                (store.subscribe(), Some(store), Some(data_lock))
            };

        // Service discovery (config.yaml's `discovery`): watchers on this runtime; upstreams with a
        // `discovery_type` compile with the nodes they last saw, and a change recompiles (the applier).
        let (registry, discovered) =
            sluice_discovery::Registry::start(loaded.checked.doc.get("discovery"))?;
        let discovery: Option<Arc<dyn sluice_model::Discovery>> = Some(registry);
        let discovered = Some(discovered);
        let initial = rx.borrow_and_update().clone();
        let snapshot = Snapshot::compile_discovered(
            &initial.resources,
            initial.revision,
            &plugin_state,
            None,
            discovery.as_deref(),
        )?;
        // node_listen (cleartext) and apisix.ssl.listen (TLS, 9443 unless disabled).
        let mut listeners = Listeners::bind_kinds(&addrs, workers)
            .map_err(|e| format!("binding {addrs:?}: {e}"))?;
        listeners
            .bind_udp(&stream.udp)
            .map_err(|e| format!("binding udp {:?}: {e}", stream.udp))?;
        // The access log's writer thread; workers hand it batches (nginx_config.http.access_log).
        let access_log =
            sluice_proxy::AccessLogConfig::from_node(&node, &crate::logging::prefix(&config))?
                .map(sluice_proxy::AccessLog::open)
                .transpose()?;
        // The stream access log (nginx_config.stream), a writer of its own.
        let stream_log = if stream.tcp.is_empty() {
            None
        } else {
            sluice_proxy::stream_access_log(&node, &crate::logging::prefix(&config))?
                .map(|(cfg, f)| sluice_proxy::AccessLog::open(cfg).map(|l| (l, Arc::new(f))))
                .transpose()?
        };
        let mut proxy_cfg = ProxyConfig::from_node(&node);
        proxy_cfg.access_log = access_log.as_ref().map(|l| l.handle());
        proxy_cfg.stream_access_log = stream_log.as_ref().map(|(l, f)| (l.handle(), f.clone()));
        tokio::spawn(crate::logging::reopen_on_usr1(proxy_cfg.access_log.clone()));
        if let Some((h, _)) = &proxy_cfg.stream_access_log {
            tokio::spawn(crate::logging::reopen_on_usr1(Some(h.clone())));
        }
        let gateway = Gateway::new(proxy_cfg, snapshot);
        let running = gateway
            .start(listeners)
            .map_err(|e| format!("starting workers: {e}"))?;
        let (applied_tx, applied_rx) = tokio::sync::watch::channel(initial.revision);
        let applier = Applier::new(plugin_state.clone(), gateway.clone(), discovery);
        // The node registry (etcd): off the request path, on this runtime; the key lives as long as the applier.
        // server-info's `plugin_attr.server-info.report_ttl` (APISIX's lease) overrides `sluice.node_ttl`.
        let ttl = sluice_plugins::server_info::report_ttl(
            node.plugin_attr
                .as_ref()
                .and_then(|a| a.get(sluice_plugins::server_info::NAME)),
        )?
        .unwrap_or(node.sluice.node_ttl);
        if let (Some(store), Some(info)) = (&store, &server_info) {
            store.announce(
                info.clone(),
                applied_rx.clone(),
                Duration::from_secs(ttl.max(1)),
            );
        }
        // Active health checks (`checks.active`) probe from this runtime, never from a worker; they stop at shutdown.
        tokio::spawn(gateway.run_health_checks());
        // Live traffic counters: one second closed at a time, for the Admin API's /stats.
        tokio::spawn(gateway.run_stats());
        // Stream routes' live counters in the prometheus exposition (`apisix_stream_connection_total`, ...).
        {
            let g = gateway.clone();
            plugin_state.metrics().add_text_source(move |out| {
                sluice_proxy::render_stream_prometheus(&g.stream_stats(), out)
            });
        }

        let mut side = Side {
            config: config.clone(),
            boot: loaded.checked.doc.clone(),
            doc: loaded.checked.doc.clone(),
            text: loaded.text.clone(),
            node: node.clone(),
            gateway: gateway.clone(),
            plugin_state: plugin_state.clone(),
            rx: rx.clone(),
            store: store.clone(),
            applier: applier.clone(),
            applied_rx,
            proxy: crate::dataplane::proxy_target(&addrs),
            server_info,
            configs: configs_api,
            admin: None,
            metrics: None,
            control: None,
        };
        side.start_metrics().await?;
        side.start_control().await?;
        side.start_admin(true).await?;
        tracing::info!(
            listen = ?addrs,
            workers,
            provider = %provider,
            routes = initial.resources.routes.len(),
            revision = initial.revision,
            pid = std::process::id(),
            "sluice started"
        );

        tokio::spawn(applier.run(rx, applied_tx, discovered));
        // The first start is a large apply: its peak (the store's load or seed, the first compile) goes back.
        crate::release_memory_after_apply(true);
        let stop = loop {
            match signals.next().await {
                Sig::Hup => side.reload().await,
                // Log files are reopened by the logging layer's own USR1 listener; this one only keeps USR1 from
                // killing the process.
                Sig::Usr1 => tracing::info!("SIGUSR1 received: log files are reopened, serving on"),
                Sig::Quit => break Stop::Graceful,
                Sig::Term => break Stop::Fast("SIGTERM"),
                Sig::Int => break Stop::Fast("SIGINT"),
            }
        };
        match stop {
            Stop::Graceful => {
                tracing::info!("SIGQUIT: graceful shutdown, draining connections");
                gateway.shutdown();
                tokio::task::spawn_blocking(move || running.join())
                    .await
                    .map_err(|e| format!("joining workers: {e}"))?;
            }
            Stop::Fast(sig) => {
                tracing::info!("{sig}: fast shutdown, open connections are closed");
                gateway.shutdown();
            }
        }
        if let Some((l, _)) = stream_log {
            let _ = tokio::task::spawn_blocking(move || l.close()).await;
        }
        if let Some(l) = access_log {
            // Graceful: the workers handed their last lines over as they exited. Fast: what they had handed over
            // (lines still in a worker's buffer, at most FLUSH_EVERY's worth, are lost, as the requests are).
            let _ = tokio::task::spawn_blocking(move || l.close()).await;
        }
        Ok::<Stop, String>(stop)
    });
    // Nothing left worth waiting for: the workers were joined (graceful) or are cut off by the exit (fast).
    control.shutdown_background();
    let stop = stop?;
    drop(pid_lock);
    tracing::info!(
        "stopped{}",
        if matches!(stop, Stop::Fast(_)) {
            " (fast)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The control-runtime servers that follow config.yaml on SIGHUP (Admin API, control API, metrics), and what
/// a reload compares against.
struct Side {
    config: PathBuf,
    /// The document the process started with: changes to settings that need a restart are reported against it.
    boot: Value,
    /// The document last applied.
    doc: Value,
    text: String,
    node: NodeConfig,
    gateway: Gateway,
    plugin_state: Arc<sluice_plugins::Shared>,
    rx: ConfigRx,
    store: Option<Arc<dyn kv::Store>>,
    applier: Arc<Applier>,
    applied_rx: tokio::sync::watch::Receiver<u64>,
    /// The request tester's target (`crate::dataplane::proxy_target`).
    proxy: Option<std::net::SocketAddr>,
    /// This node's `server_info` (see `sluice_store::node`), for `/apisix/admin/nodes`.
    server_info: Option<serde_json::Map<String, Value>>,
    /// API-driven standalone mode's configuration (`/apisix/admin/configs`).
    configs: Option<Arc<sluice_store::api::ApiStandalone>>,
    admin: Served,
    metrics: Served,
    control: Served,
}

/// Key prefixes a reload applies live, and which server each restarts.
const LIVE: &[(&str, Part)] = &[
    ("deployment.admin", Part::Admin),
    ("apisix.enable_admin", Part::Admin),
    ("plugin_attr.prometheus", Part::Metrics),
    ("apisix.control", Part::Control),
    ("apisix.enable_control", Part::Control),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Admin,
    Metrics,
    Control,
}

fn under(path: &str, prefix: &str) -> bool {
    path == prefix || path.starts_with(&format!("{prefix}."))
}

/// Paths (`a.b.c`) whose values differ between `old` and `new`; lists compare whole.
fn changed(old: &Value, new: &Value, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                let null = Value::Null;
                changed(
                    a.get(k).unwrap_or(&null),
                    b.get(k).unwrap_or(&null),
                    &p,
                    out,
                );
            }
        }
        // An absent or empty section is an empty map: compare what is below it key by key.
        (Value::Null, Value::Object(_)) => {
            changed(&Value::Object(Default::default()), new, at, out)
        }
        (Value::Object(_), Value::Null) => {
            changed(old, &Value::Object(Default::default()), at, out)
        }
        (a, b) if a != b => out.push(at.to_owned()),
        _ => {}
    }
}

/// A side server: its address, the listening socket it was bound with, and the task serving a duplicate of it.
type Served = Option<(SocketAddr, std::net::TcpListener, JoinHandle<()>)>;

/// A listener for a side server on `addr`. The same address reuses the socket `old` serves (a duplicate of its
/// descriptor, so connections waiting in its backlog are accepted by the new server, not reset); a new address
/// is bound before `old` is stopped, so a failed move keeps the old server. The caller stores the result.
async fn rebind(
    addr: SocketAddr,
    old: &mut Served,
) -> std::io::Result<(std::net::TcpListener, tokio::net::TcpListener)> {
    let sock = match old.as_ref() {
        Some((a, l, _)) if *a == addr => l.try_clone()?,
        _ => {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            l
        }
    };
    let dup = tokio::net::TcpListener::from_std(sock.try_clone()?)?;
    stop_server(old).await;
    Ok((sock, dup))
}

async fn stop_server(old: &mut Served) {
    if let Some((_, _, h)) = old.take() {
        // Connections it accepted run in their own tasks and finish; only the accept loop stops.
        h.abort();
        let _ = h.await;
    }
}

impl Side {
    /// The metrics server per `plugin_attr.prometheus`; a taken port costs the metrics, not the gateway.
    async fn start_metrics(&mut self) -> Result<(), String> {
        let Some(addr) = metrics_addr(&self.node)? else {
            stop_server(&mut self.metrics).await;
            return Ok(());
        };
        match rebind(addr, &mut self.metrics).await {
            Ok((sock, l)) => {
                tracing::info!(listen = %addr, "prometheus metrics at /apisix/prometheus/metrics");
                let h = tokio::spawn(sluice_plugins::serve_metrics(l, self.plugin_state.clone()));
                self.metrics = Some((addr, sock, h));
            }
            Err(e) => {
                tracing::error!(listen = %addr, error = %e, "cannot serve prometheus metrics")
            }
        }
        Ok(())
    }

    /// The control API per `apisix.control`; as the metrics, a taken port costs the control API only.
    async fn start_control(&mut self) -> Result<(), String> {
        let Some(addr) = sluice_store::control_addr(&self.text)? else {
            stop_server(&mut self.control).await;
            return Ok(());
        };
        match rebind(addr, &mut self.control).await {
            Ok((sock, l)) => {
                tracing::info!(listen = %addr, "control API at /v1/healthcheck");
                // /v1/server_info is the server-info plugin's endpoint: served while the plugin is enabled.
                let enabled = self
                    .node
                    .plugins
                    .as_ref()
                    .is_none_or(|p| p.iter().any(|n| n == sluice_plugins::server_info::NAME));
                let info = self
                    .server_info
                    .clone()
                    .filter(|_| enabled)
                    .map(|i| (i, self.applied_rx.clone()));
                let h = tokio::spawn(crate::control::serve(
                    l,
                    self.gateway.clone(),
                    self.rx.clone(),
                    info,
                ));
                self.control = Some((addr, sock, h));
            }
            Err(e) => tracing::error!(listen = %addr, error = %e, "cannot serve the control API"),
        }
        Ok(())
    }

    /// The Admin API (traditional and control_plane roles: a data plane only watches, as APISIX's). At start a
    /// failure is fatal; on reload it is logged.
    async fn start_admin(&mut self, first: bool) -> Result<(), String> {
        let serves_admin =
            self.node.apisix.enable_admin && self.node.deployment.role != "data_plane";
        let Some(store) = self.store.clone().filter(|_| serves_admin) else {
            stop_server(&mut self.admin).await;
            return Ok(());
        };
        let admin = sluice_admin::AdminConfig::from_node_config(&self.node)?;
        let addr = admin.listen;
        let (sock, listener) = match rebind(addr, &mut self.admin).await {
            Ok(l) => l,
            Err(e) if first => return Err(format!("binding the Admin API on {addr}: {e}")),
            Err(e) => {
                tracing::error!(listen = %addr, error = %e, "cannot serve the Admin API");
                return Ok(());
            }
        };
        tracing::info!(listen = %addr, "admin API listening");
        let dry_run = self.applier.clone();
        let checker: sluice_admin::Checker = Arc::new(move |r: &Resources| dry_run.dry_run(r));
        let mut state = sluice_admin::AdminState::new(
            admin,
            store,
            checker,
            Arc::new(RegistryCatalog),
            self.applied_rx.clone(),
        )
        .with_server_info(self.server_info.clone().unwrap_or_default())
        .with_data_plane(Arc::new(crate::dataplane::GatewayPlane {
            gateway: self.gateway.clone(),
            config: self.rx.clone(),
            proxy: self.proxy,
        }));
        if let Some(api) = &self.configs {
            state = state.with_configs(api.clone());
        }
        self.admin = Some((
            addr,
            sock,
            tokio::spawn(sluice_admin::serve(listener, state)),
        ));
        Ok(())
    }

    /// SIGHUP: re-read config.yaml; apply what can change live, name what needs a restart, keep serving. A
    /// file that does not pass the checks changes nothing.
    async fn reload(&mut self) {
        let path = self.config.display().to_string();
        let loaded = match load(&self.config) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("SIGHUP: reload refused, the running configuration is kept: {e}");
                return;
            }
        };
        let node = loaded.checked.config.clone();
        // Checks the live parts would fail on, before anything is touched.
        let precheck = metrics_addr(&node)
            .and_then(|_| sluice_store::control_addr(&loaded.text))
            .and_then(|_| match &self.store {
                Some(_) if node.apisix.enable_admin => {
                    sluice_admin::AdminConfig::from_node_config(&node).map(|_| ())
                }
                _ => Ok(()),
            });
        if let Err(e) = precheck {
            tracing::error!(
                "SIGHUP: reload refused, the running configuration is kept: {path}: {e}"
            );
            return;
        }
        for w in &loaded.checked.warnings {
            tracing::warn!("{path}: {w}");
        }
        let new = loaded.checked.doc.clone();
        let mut live = Vec::new();
        changed(&self.doc, &new, "", &mut live);
        let mut restart = Vec::new();
        changed(&self.boot, &new, "", &mut restart);
        let live_parts = |p: &str| {
            LIVE.iter()
                .find(|(pre, _)| under(p, pre))
                .map(|(_, part)| *part)
        };
        restart.retain(|p| live_parts(p).is_none() && NodeConfig::reads_key(p));
        let mut parts: Vec<Part> = live.iter().filter_map(|p| live_parts(p)).collect();
        parts.dedup();
        self.node = node;
        self.text = loaded.text;
        self.doc = new;
        let mut applied = Vec::new();
        for part in [Part::Admin, Part::Metrics, Part::Control] {
            if !parts.contains(&part) {
                continue;
            }
            let r = match part {
                Part::Admin => self.start_admin(false).await,
                Part::Metrics => self.start_metrics().await,
                Part::Control => self.start_control().await,
            };
            match r {
                Ok(()) => applied.push(format!("{part:?}")),
                Err(e) => tracing::error!("SIGHUP: {part:?}: {e}"),
            }
        }
        let changed_live: Vec<&str> = live
            .iter()
            .filter(|p| live_parts(p).is_some())
            .map(String::as_str)
            .collect();
        if changed_live.is_empty() {
            tracing::info!("SIGHUP: config.yaml re-read; no setting that applies live changed");
        } else {
            tracing::info!(
                changed = ?changed_live,
                restarted = ?applied,
                "SIGHUP: config.yaml re-read and applied"
            );
        }
        if !restart.is_empty() {
            tracing::warn!(
                "SIGHUP: these changed settings need a restart to apply (still running with the old values): {}",
                restart.join(", ")
            );
        }
    }
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
    // A store serving its last known good copy (etcd down at start) cannot take writes: seeding waits for a
    // start with the store reachable.
    if !store.snapshot().entries.is_empty() || !path.exists() || !store.healthy() {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let res = standalone::parse(&text)?;
    check(&res)?;
    // Stored as the Admin API stores them: secret fields encrypted.
    let de = store.data_encryption();
    let ops: Vec<kv::Op> = crate::import::entries(&res)
        .into_iter()
        .map(|(key, mut value)| {
            de.encrypt(&key, &mut value);
            kv::Op::Put {
                key,
                value,
                expect_mod: Some(0),
            }
        })
        .collect();
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

enum Sig {
    Hup,
    Usr1,
    Quit,
    Term,
    Int,
}

/// The signals the gateway handles; installing a handler replaces the default action (terminate) for each.
struct Signals {
    hup: Signal,
    usr1: Signal,
    quit: Signal,
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> Result<Signals, String> {
        let on = |k: SignalKind, name: &str| {
            signal(k).map_err(|e| format!("installing the {name} handler: {e}"))
        };
        Ok(Signals {
            hup: on(SignalKind::hangup(), "SIGHUP")?,
            usr1: on(SignalKind::user_defined1(), "SIGUSR1")?,
            quit: on(SignalKind::quit(), "SIGQUIT")?,
            term: on(SignalKind::terminate(), "SIGTERM")?,
            int: on(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    async fn next(&mut self) -> Sig {
        tokio::select! {
            _ = self.hup.recv() => Sig::Hup,
            _ = self.usr1.recv() => Sig::Usr1,
            _ = self.quit.recv() => Sig::Quit,
            _ = self.term.recv() => Sig::Term,
            _ = self.int.recv() => Sig::Int,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changed_paths_between_two_documents() {
        let old = json!({"apisix": {"node_listen": [9080], "ssl": {}},
            "deployment": {"admin": {"admin_key": [{"key": "a"}]}}});
        let new = json!({"apisix": {"node_listen": [9081], "ssl": null, "enable_admin": true},
            "deployment": {"admin": {"admin_key": [{"key": "b"}]}}, "sluice": {"keepalive_timeout": 5}});
        let mut out = Vec::new();
        changed(&old, &new, "", &mut out);
        assert_eq!(
            out,
            [
                "apisix.enable_admin",
                "apisix.node_listen",
                "deployment.admin.admin_key",
                "sluice.keepalive_timeout"
            ]
        );
        assert!(under("deployment.admin.admin_key", "deployment.admin"));
        assert!(!under("deployment.administrator", "deployment.admin"));
    }
}
