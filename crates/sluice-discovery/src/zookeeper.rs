//! Dubbo providers from Zookeeper, for the interfaces upstreams name, from both ways Dubbo registers them:
//!
//! * interface level (Dubbo 2, and Dubbo 3's default dual registration): the children of
//!   `{root}/{interface}/providers`, one URL-encoded provider URL each, an ephemeral node that vanishes with its
//!   provider's session;
//! * application level (Dubbo 3, `register-mode=instance`): the applications `{root}/mapping/{interface}` names,
//!   their instances under `{services_root}/{application}`, and what each serves per its metadata revision, from
//!   `{root}/metadata/{application}/{revision}` or else the instance's own `MetadataService` (see
//!   [`crate::application`]).
//!
//! An interface's providers are the union of both (one node per address). One task per process holds the
//! session. An interface is listed the first time the compiler asks for it; the interface-level list again each
//! time its children watch fires (a missing providers node is watched for its creation), the application-level one
//! each time a persistent recursive watch on `{root}/mapping` or `{services_root}` reports a change that concerns
//! it (its mapping, an instance of one of its applications). While Zookeeper is unreachable the client reconnects
//! on its own and the last known providers stay in use; after a reconnection the application-level lists are read
//! again (persistent watches can miss what happened meanwhile); when the session expired, a new session lists
//! every interface again. Every change of a provider list bumps the generation the binary follows to recompile.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{Map, Value};
use sluice_model::Node;
use tokio::sync::{mpsc, watch};
use zookeeper_client as zk;

use crate::application::{self, Instance};
use crate::provider::{self, Provider};
use crate::Known;

/// `discovery.zookeeper` in config.yaml.
#[derive(Debug, Clone, PartialEq)]
pub struct ZkConfig {
    /// `host:port,host:port` (Zookeeper's connect string).
    pub connect_string: String,
    /// Where Dubbo registers, `/dubbo` by default (interface-level providers, mappings, metadata).
    pub root: String,
    /// Where Dubbo 3 registers application instances, `/services` by default (Dubbo's `rootPath`).
    pub services_root: String,
    pub session_timeout: Duration,
    pub connect_timeout: Duration,
}

impl ZkConfig {
    pub fn from_value(v: &Value) -> Result<ZkConfig, String> {
        let bad = |k: &str, what: &str| format!("discovery.zookeeper.{k}: {what}");
        let hosts: Vec<String> = match (v.get("hosts"), v.get("connect_string")) {
            (Some(Value::String(s)), None) => vec![s.clone()],
            (Some(Value::Array(l)), None) => l
                .iter()
                .map(|h| h.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("hosts", "a list of host:port strings"))?,
            (None, Some(Value::String(s))) => vec![s.clone()],
            (Some(_), Some(_)) => {
                return Err("discovery.zookeeper: hosts or connect_string, not both".into())
            }
            _ => return Err(bad("hosts", "required (a list of host:port)")),
        };
        let connect_string = hosts.join(",");
        if connect_string.is_empty() || connect_string.contains('/') {
            return Err(bad(
                "hosts",
                "host:port entries without a path (use root for one)",
            ));
        }
        let root = v
            .get("root")
            .map(|r| r.as_str().ok_or_else(|| bad("root", "a string")))
            .transpose()?
            .unwrap_or("/dubbo")
            .trim_end_matches('/')
            .to_owned();
        if !root.is_empty() && !valid_path(&root) {
            return Err(bad("root", "an absolute Zookeeper path such as /dubbo"));
        }
        let services_root = v
            .get("services_root")
            .map(|r| r.as_str().ok_or_else(|| bad("services_root", "a string")))
            .transpose()?
            .unwrap_or("/services")
            .trim_end_matches('/')
            .to_owned();
        if !valid_path(&services_root) {
            return Err(bad(
                "services_root",
                "an absolute Zookeeper path such as /services",
            ));
        }
        let secs = |k: &str, default: f64| -> Result<Duration, String> {
            let s = match v.get(k) {
                None => default,
                Some(n) => n
                    .as_f64()
                    .filter(|s| *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| bad(k, "seconds, above 0 and at most 3600"))?,
            };
            Ok(Duration::from_secs_f64(s))
        };
        Ok(ZkConfig {
            connect_string,
            root,
            services_root,
            session_timeout: secs("session_timeout", 30.0)?,
            connect_timeout: secs("connect_timeout", 5.0)?,
        })
    }
}

fn valid_path(p: &str) -> bool {
    p.starts_with('/')
        && p[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.chars().any(char::is_control))
}

/// An interface name usable as one path segment.
fn valid_interface(i: &str) -> bool {
    !i.is_empty()
        && i.len() <= 512
        && i != "."
        && i != ".."
        && !i.contains('/')
        && !i.chars().any(char::is_control)
}

/// The compiler's side: last known providers, and the task's inbox for interfaces not watched yet.
pub(crate) struct Handle {
    known: Known,
    want: mpsc::UnboundedSender<String>,
}

impl Handle {
    pub(crate) fn spawn(cfg: ZkConfig, changed: watch::Sender<u64>) -> Handle {
        let known = Known::default();
        let (want, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(cfg, known.clone(), rx, changed));
        Handle { known, want }
    }

    /// The nodes of `interface`'s providers that match `args` (`version`, `group`, `protocol` default `dubbo`),
    /// sorted by address; empty while the interface is not listed yet (its watch starts now).
    pub(crate) fn nodes(&self, interface: &str, args: Option<&Map<String, Value>>) -> Vec<Node> {
        if !valid_interface(interface) {
            tracing::warn!(
                interface,
                "zookeeper discovery: not a usable interface name"
            );
            return Vec::new();
        }
        let arg = |k: &str| args.and_then(|a| a.get(k)).and_then(Value::as_str);
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = known.get(interface) else {
            known.insert(interface.to_owned(), None);
            let _ = self.want.send(interface.to_owned());
            return Vec::new();
        };
        let protocol = arg("protocol").unwrap_or("dubbo");
        let mut seen = HashSet::new();
        list.iter()
            .flatten()
            .filter(|p| provider::matches(p, protocol, arg("version"), arg("group")))
            // One node per address (two entries of one provider, e.g. with `version: "*"`, are one node).
            .filter(|p| seen.insert((p.host.clone(), p.port)))
            .map(|p| Node {
                host: p.host.clone(),
                port: Some(p.port),
                weight: p.weight,
                priority: 0,
                metadata: None,
            })
            .collect()
    }
}

type Fired = Pin<Box<dyn Future<Output = String> + Send>>;

/// What each way of registering last gave, by interface; kept across sessions so a new session's first listing of
/// one way does not drop the other's providers meanwhile.
#[derive(Default)]
struct Sources {
    interface: HashMap<String, Vec<Provider>>,
    application: HashMap<String, Vec<Provider>>,
}

async fn run(
    cfg: ZkConfig,
    known: Known,
    mut want: mpsc::UnboundedReceiver<String>,
    changed: watch::Sender<u64>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut failures = 0u32;
    let mut sources = Sources::default();
    loop {
        let connect = zk::Client::connector()
            .with_session_timeout(cfg.session_timeout)
            .with_connection_timeout(cfg.connect_timeout)
            .with_fail_eagerly()
            .connect(&cfg.connect_string);
        let client = match tokio::time::timeout(cfg.connect_timeout * 2, connect).await {
            Ok(Ok(c)) => c,
            r => {
                let e = match r {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".into(),
                };
                // Once, then every 30th try: an outage keeps the last providers, so it is no emergency.
                if failures.is_multiple_of(30) {
                    tracing::warn!(hosts = %cfg.connect_string, error = %e,
                        "zookeeper discovery: cannot connect, serving the last known providers");
                }
                failures += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                // Interfaces asked for meanwhile are in `known`: the next session lists them all.
                while want.try_recv().is_ok() {}
                continue;
            }
        };
        tracing::info!(hosts = %cfg.connect_string, session = ?client.session_id(), "zookeeper discovery: session established");
        failures = 0;
        backoff = Duration::from_millis(100);
        session(&client, &cfg, &known, &mut sources, &mut want, &changed).await;
        tracing::warn!(
            "zookeeper discovery: session ended, reconnecting (last known providers kept)"
        );
    }
}

/// A persistent recursive watch on `path` (which need not exist yet).
async fn watch_tree(client: &zk::Client, path: &str) -> Option<zk::PersistentWatcher> {
    match client
        .watch(path, zk::AddWatchMode::PersistentRecursive)
        .await
    {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(path, error = %e, "zookeeper discovery: cannot watch (application-level discovery follows changes only at reconnection)");
            None
        }
    }
}

/// The next event of `w` (never, without one).
async fn next_event(w: &mut Option<zk::PersistentWatcher>) -> zk::WatchedEvent {
    match w {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

/// Follows the interfaces in `known` over one session; returns when the session is over.
async fn session(
    client: &zk::Client,
    cfg: &ZkConfig,
    known: &Known,
    sources: &mut Sources,
    want: &mut mpsc::UnboundedReceiver<String>,
    changed: &watch::Sender<u64>,
) {
    let mut state = client.state_watcher();
    let mut watches: FuturesUnordered<Fired> = FuturesUnordered::new();
    let mut pending: BTreeSet<String> = known
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .cloned()
        .collect();
    let mut pending_apps = pending.clone();
    let mut retry: BTreeSet<String> = BTreeSet::new();
    let mut retry_apps: BTreeSet<String> = BTreeSet::new();
    // Entries skipped last time, by interface: each bad entry is logged once, not at every change of its list.
    let mut skipped: HashMap<String, HashSet<String>> = HashMap::new();
    // Application level: the applications each interface maps to, and metadata already read (a revision's
    // content never changes).
    let mut apps_of: HashMap<String, Vec<String>> = HashMap::new();
    let mut metadata: HashMap<(String, String), Vec<application::Service>> = HashMap::new();
    let mapping_root = format!("{}/mapping", cfg.root);
    let mut mapping_w = watch_tree(client, &mapping_root).await;
    let mut services_w = watch_tree(client, &cfg.services_root).await;
    let mut was_disconnected = false;
    loop {
        while let Some(iface) = pending.pop_first() {
            let path = format!("{}/{iface}/providers", cfg.root);
            match tokio::time::timeout(cfg.session_timeout, list(client, &path)).await {
                Ok(Ok((entries, watcher))) => {
                    let seen = skipped.entry(iface.clone()).or_default();
                    let providers = parse_entries(&iface, &entries, seen);
                    sources.interface.insert(iface.clone(), providers);
                    update(known, sources, &iface, changed);
                    watches.push(Box::pin(async move {
                        let _ = watcher.changed().await;
                        iface
                    }));
                }
                // The session is over: the caller starts a new one.
                Ok(Err(
                    zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed,
                )) => return,
                Ok(Err(e)) => {
                    tracing::debug!(%path, error = %e, "zookeeper discovery: listing failed, retrying");
                    retry.insert(iface);
                }
                Err(_) => {
                    retry.insert(iface);
                }
            }
        }
        while let Some(iface) = pending_apps.pop_first() {
            let listing = list_application_level(client, cfg, &iface, &mut metadata);
            match tokio::time::timeout(cfg.session_timeout, listing).await {
                Ok(Ok((apps, providers, incomplete))) => {
                    apps_of.insert(iface.clone(), apps);
                    sources.application.insert(iface.clone(), providers);
                    update(known, sources, &iface, changed);
                    if incomplete {
                        retry_apps.insert(iface);
                    }
                }
                Ok(Err(
                    zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed,
                )) => return,
                Ok(Err(e)) => {
                    tracing::debug!(interface = %iface, error = %e, "zookeeper discovery: application-level listing failed, retrying");
                    retry_apps.insert(iface);
                }
                Err(_) => {
                    retry_apps.insert(iface);
                }
            }
        }
        tokio::select! {
            Some(iface) = want.recv() => {
                pending.insert(iface.clone());
                pending_apps.insert(iface);
            }
            Some(iface) = watches.next(), if !watches.is_empty() => { pending.insert(iface); }
            ev = next_event(&mut mapping_w) => {
                if ev.event_type == zk::EventType::Session {
                    if ev.session_state.is_terminated() {
                        return;
                    }
                } else if let Some(iface) = ev.path.strip_prefix(&mapping_root).and_then(|p| p.strip_prefix('/')) {
                    if apps_of.contains_key(iface) {
                        pending_apps.insert(iface.to_owned());
                    }
                }
            }
            ev = next_event(&mut services_w) => {
                if ev.event_type == zk::EventType::Session {
                    if ev.session_state.is_terminated() {
                        return;
                    }
                } else if let Some(rest) = ev.path.strip_prefix(&cfg.services_root).and_then(|p| p.strip_prefix('/')) {
                    let app = rest.split('/').next().unwrap_or_default();
                    for (iface, apps) in &apps_of {
                        if apps.iter().any(|a| a == app) {
                            pending_apps.insert(iface.clone());
                        }
                    }
                }
            }
            s = state.changed() => {
                if s.is_terminated() {
                    return;
                }
                match s {
                    zk::SessionState::Disconnected => was_disconnected = true,
                    // Persistent watches may have missed what happened while disconnected: read again.
                    zk::SessionState::SyncConnected if was_disconnected => {
                        was_disconnected = false;
                        pending_apps.extend(apps_of.keys().cloned());
                    }
                    _ => {}
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(500)), if !retry.is_empty() || !retry_apps.is_empty() => {
                pending.append(&mut retry);
                pending_apps.append(&mut retry_apps);
            }
        }
    }
}

/// A node's data; `None` when it does not exist.
async fn data(client: &zk::Client, path: &str) -> Result<Option<Vec<u8>>, zk::Error> {
    match client.get_data(path).await {
        Ok((d, _)) => Ok(Some(d)),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Metadata revisions remembered per session; past this the memory starts over (a revision's metadata is read
/// again when next needed).
const MAX_REVISIONS: usize = 4096;

/// Why an instance's metadata could not be had.
enum NoMetadata {
    /// For now (connect, write or answer failed, no answer in time): the listing is retried.
    Unreachable(String),
    /// As it is (no node and no MetadataService on the dubbo protocol, an answer that is not metadata).
    Unusable(String),
}

/// `interface`'s application-level providers: the applications its mapping names, and the providers of each
/// running instance of those (per the metadata of the instance's revision, from Zookeeper or else asked from the
/// instance, those calls made together). An instance whose node or metadata does not parse, or whose metadata
/// cannot be had, is skipped; `true` in the answer when one was skipped for a failure that may pass (the caller
/// lists again soon).
async fn list_application_level(
    client: &zk::Client,
    cfg: &ZkConfig,
    interface: &str,
    metadata: &mut HashMap<(String, String), Vec<application::Service>>,
) -> Result<(Vec<String>, Vec<Provider>, bool), zk::Error> {
    let mapping = format!("{}/mapping/{interface}", cfg.root);
    let apps = match data(client, &mapping).await? {
        Some(d) => application::parse_mapping(&d),
        None => Vec::new(),
    };
    let mut instances: Vec<(String, String, Instance)> = Vec::new();
    for app in &apps {
        let dir = format!("{}/{app}", cfg.services_root);
        let children = match client.list_children(&dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(e),
        };
        for child in children {
            // Gone between the listing and now: its deletion event lists again.
            let Some(d) = data(client, &format!("{dir}/{child}")).await? else {
                continue;
            };
            match application::parse_instance(&d) {
                Ok(i) => instances.push((app.clone(), child, i)),
                Err(why) => {
                    tracing::debug!(%app, instance = %child, %why, "zookeeper discovery: instance skipped");
                }
            }
        }
    }
    // Revisions not known yet: their node, else one of their instances' MetadataService (all asked together).
    let mut asks = Vec::new();
    let mut failed: HashMap<(String, String), NoMetadata> = HashMap::new();
    for (app, _, instance) in &instances {
        let key = (app.clone(), instance.revision.clone());
        if metadata.contains_key(&key)
            || failed.contains_key(&key)
            || asks.iter().any(|(k, _)| *k == key)
        {
            continue;
        }
        let path = format!("{}/metadata/{app}/{}", cfg.root, instance.revision);
        match data(client, &path).await? {
            Some(d) => match application::parse_metadata(&d) {
                Ok(m) => {
                    if metadata.len() >= MAX_REVISIONS {
                        metadata.clear();
                    }
                    metadata.insert(key, m);
                }
                Err(why) => {
                    failed.insert(key, NoMetadata::Unusable(format!("{path}: {why}")));
                }
            },
            // metadata-type local: the instance serves it.
            None => match instance.metadata_port {
                Some(port) => {
                    asks.push((key, ask_metadata(instance, port, app, cfg.connect_timeout)))
                }
                None => {
                    let why = format!("no {path} and no MetadataService on the dubbo protocol");
                    failed.insert(key, NoMetadata::Unusable(why));
                }
            },
        }
    }
    let (keys, calls): (Vec<_>, Vec<_>) = asks.into_iter().unzip();
    for (key, r) in keys
        .into_iter()
        .zip(futures_util::future::join_all(calls).await)
    {
        match r {
            Ok(m) => {
                if metadata.len() >= MAX_REVISIONS {
                    metadata.clear();
                }
                metadata.insert(key, m);
            }
            Err(e) => {
                failed.insert(key, e);
            }
        }
    }
    let mut providers = Vec::new();
    let mut incomplete = false;
    for (app, child, instance) in &instances {
        let key = (app.clone(), instance.revision.clone());
        match (metadata.get(&key), failed.get(&key)) {
            (Some(m), _) => providers.extend(application::providers(interface, instance, m)),
            (None, Some(NoMetadata::Unreachable(why))) => {
                incomplete = true;
                tracing::debug!(%app, instance = %child, %why, "zookeeper discovery: metadata not had yet; instance skipped, retrying");
            }
            (None, Some(NoMetadata::Unusable(why))) => {
                tracing::warn!(%app, instance = %child, %why, "zookeeper discovery: no metadata for this instance's revision; instance skipped");
            }
            // Cleared meanwhile (MAX_REVISIONS): the next listing reads it again.
            (None, None) => incomplete = true,
        }
    }
    Ok((apps, providers, incomplete))
}

/// Asks an instance's `MetadataService` (dubbo protocol, hessian2) for its metadata at its revision; one call on a
/// connection of its own, bounded by `within` (connect, write and answer together).
async fn ask_metadata(
    instance: &Instance,
    port: u16,
    app: &str,
    within: Duration,
) -> Result<Vec<application::Service>, NoMetadata> {
    use sluice_dubbo::protocol::{self, FrameDecoder, Message, DEFAULT_MAX_PAYLOAD};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ip: std::net::IpAddr = instance
        .host
        .parse()
        .map_err(|_| NoMetadata::Unusable("bad address".to_owned()))?;
    let addr = std::net::SocketAddr::new(ip, port);
    let req = application::metadata_request(app, &instance.revision);
    let mut frame = Vec::new();
    protocol::encode_request(&req, 1, DEFAULT_MAX_PAYLOAD, &mut frame)
        .map_err(|e| NoMetadata::Unusable(e.to_string()))?;
    let io = |e: std::io::Error| NoMetadata::Unreachable(format!("MetadataService at {addr}: {e}"));
    let unusable = |e: String| NoMetadata::Unusable(format!("MetadataService at {addr}: {e}"));
    let call = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(io)?;
        s.write_all(&frame).await.map_err(io)?;
        let mut dec = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            while let Some(f) = dec.next_frame().map_err(|e| unusable(e.to_string()))? {
                // A heartbeat or anything else is not the answer.
                if let Message::Response {
                    id: 1,
                    status,
                    result,
                    ..
                } = protocol::decode(&f).map_err(|e| unusable(e.to_string()))?
                {
                    return application::parse_metadata_value(result, status).map_err(unusable);
                }
            }
            let n = s.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                return Err(NoMetadata::Unreachable(format!(
                    "MetadataService at {addr}: closed before answering"
                )));
            }
            dec.push(&buf[..n]);
        }
    };
    tokio::time::timeout(within, call).await.map_err(|_| {
        NoMetadata::Unreachable(format!(
            "MetadataService at {addr}: no answer within {within:?}"
        ))
    })?
}

/// The providers node's children with a watch on them; a missing node is no provider, watched for creation.
async fn list(
    client: &zk::Client,
    path: &str,
) -> Result<(Vec<String>, zk::OneshotWatcher), zk::Error> {
    loop {
        match client.list_and_watch_children(path).await {
            Err(zk::Error::NoNode) => {}
            r => return r,
        }
        match client.check_and_watch_stat(path).await? {
            (None, w) => return Ok((Vec::new(), w)),
            // Created in between: list it.
            (Some(_), _) => continue,
        }
    }
}

/// Parses interface-level entries. `skipped`: the entries that did not parse (logged when first seen).
fn parse_entries(
    interface: &str,
    entries: &[String],
    skipped: &mut HashSet<String>,
) -> Vec<Provider> {
    let mut bad = HashSet::new();
    let providers = entries
        .iter()
        .filter_map(|e| match provider::parse(e) {
            Ok(p) => Some(p),
            Err(why) => {
                if !skipped.contains(e) {
                    let shown: String = e.chars().take(200).collect();
                    tracing::warn!(interface, entry = %shown, %why, "zookeeper discovery: provider entry skipped");
                }
                bad.insert(e.clone());
                None
            }
        })
        .collect();
    *skipped = bad;
    providers
}

/// Records `interface`'s providers, both ways of registering together; a change bumps the generation.
fn update(known: &Known, sources: &Sources, interface: &str, changed: &watch::Sender<u64>) {
    let mut providers: Vec<Provider> = [&sources.interface, &sources.application]
        .iter()
        .filter_map(|m| m.get(interface))
        .flatten()
        .cloned()
        .collect();
    providers.sort_by(|a, b| {
        (&a.host, a.port, &a.version, &a.group, &a.protocol).cmp(&(
            &b.host,
            b.port,
            &b.version,
            &b.group,
            &b.protocol,
        ))
    });
    providers.dedup();
    let mut k = known.lock().unwrap_or_else(|p| p.into_inner());
    let slot = k.entry(interface.to_owned()).or_default();
    if slot.as_ref() != Some(&providers) {
        tracing::info!(
            interface,
            providers = providers.len(),
            "zookeeper discovery: providers changed"
        );
        *slot = Some(providers);
        drop(k);
        changed.send_modify(|g| *g += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_fields_and_defaults() {
        let c =
            ZkConfig::from_value(&json!({"hosts": ["127.0.0.1:2181", "127.0.0.2:2181"]})).unwrap();
        assert_eq!(c.connect_string, "127.0.0.1:2181,127.0.0.2:2181");
        assert_eq!(c.root, "/dubbo");
        assert_eq!(c.session_timeout, Duration::from_secs(30));
        let c = ZkConfig::from_value(
            &json!({"connect_string": "zk:2181", "root": "/reg/", "session_timeout": 6}),
        )
        .unwrap();
        assert_eq!(
            (c.connect_string.as_str(), c.root.as_str()),
            ("zk:2181", "/reg")
        );
        assert_eq!(c.session_timeout, Duration::from_secs(6));
        assert_eq!(c.services_root, "/services");
        let c =
            ZkConfig::from_value(&json!({"hosts": ["a:1"], "services_root": "/apps/"})).unwrap();
        assert_eq!(c.services_root, "/apps");
        for bad in [
            json!({"hosts": ["a:1"], "services_root": ""}),
            json!({"hosts": ["a:1"], "services_root": "services"}),
            json!({"hosts": ["a:1"], "services_root": "/a/../b"}),
            json!({}),
            json!({"hosts": [1]}),
            json!({"hosts": ["a:1"], "connect_string": "a:1"}),
            json!({"hosts": ["a:1/chroot"]}),
            json!({"hosts": ["a:1"], "root": "dubbo"}),
            json!({"hosts": ["a:1"], "root": "/a/../b"}),
            json!({"hosts": ["a:1"], "session_timeout": 0}),
        ] {
            assert!(ZkConfig::from_value(&bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn nodes_follow_args_once_per_address_and_ask_for_unknown_interfaces() {
        let (want, mut asked) = mpsc::unbounded_channel();
        let h = Handle {
            known: Known::default(),
            want,
        };
        let entry = |host: &str, q: &str| {
            provider::parse(&format!("dubbo%3A%2F%2F{host}%3A20880%2Fa.B%3F{q}")).unwrap()
        };
        h.known.lock().unwrap().insert(
            "a.B".into(),
            Some(vec![
                entry("10.0.0.1", "version%3D1.0.0%26weight%3D5"),
                entry("10.0.0.1", "version%3D2.0.0"),
                entry("10.0.0.2", "version%3D1.0.0%26group%3Dg"),
                entry("10.0.0.3", "version%3D1.0.0%26enabled%3Dfalse"),
            ]),
        );
        let args = |v: Value| v.as_object().cloned();
        let hosts = |a: Option<Map<String, Value>>| -> Vec<(String, u32)> {
            h.nodes("a.B", a.as_ref())
                .into_iter()
                .map(|n| (n.host, n.weight))
                .collect()
        };
        assert_eq!(
            hosts(args(json!({"version": "1.0.0"}))),
            [("10.0.0.1".into(), 5)]
        );
        assert_eq!(
            hosts(args(json!({"version": "1.0.0", "group": "g"}))),
            [("10.0.0.2".to_owned(), 100)]
        );
        // Any version and group: the disabled one stays out, 10.0.0.1 is one node.
        let all = hosts(args(json!({"version": "*", "group": "*"})));
        assert_eq!(all, [("10.0.0.1".into(), 5), ("10.0.0.2".into(), 100)]);
        assert!(hosts(args(json!({"version": "1.0.0", "protocol": "tri"}))).is_empty());
        // Not listed yet: no node, and the watcher is asked (once).
        assert!(h.nodes("c.D", None).is_empty());
        assert!(h.nodes("c.D", None).is_empty());
        assert_eq!(asked.try_recv().ok().as_deref(), Some("c.D"));
        assert!(asked.try_recv().is_err());
        // A name that would leave its path segment is never asked for.
        assert!(h.nodes("../x", None).is_empty());
        assert!(asked.try_recv().is_err());
    }

    #[test]
    fn interface_names_cannot_leave_their_segment() {
        assert!(valid_interface("org.apache.dubbo.DemoService"));
        for bad in ["", ".", "..", "a/b", "../x", "a\nb"] {
            assert!(!valid_interface(bad), "{bad:?}");
        }
    }
}
