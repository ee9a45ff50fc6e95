//! The etcd v3 provider, laid out exactly as APISIX's (prefix `/apisix`, keys `/apisix/routes/1`, JSON values),
//! so an APISIX etcd dataset reads as is and several Sluice nodes on one etcd converge through its watch.
//!
//! A background task keeps an in-memory [`Snapshot`]: a full range read, then a prefix watch from the next
//! revision. On any error (etcd gone, watch cancelled, compaction) it marks the store unhealthy, keeps the last
//! configuration (the data plane never sees a partial one), retries with capped exponential backoff, and
//! resynchronises fully on return. Writes are single etcd transactions guarded by mod-revision compares.
//! With `last_known_good` set (the binary sets it to `<data dir>/etcd-last-known-good.json`), the applied key
//! space is also copied to a local file (at most once a second, atomically, values as stored so secret fields stay
//! encrypted), and a node that starts while etcd is unreachable serves that copy and catches up when etcd returns.
//! `https://` endpoints use TLS (`deployment.etcd.tls`: client certificate for etcd's `--client-cert-auth`, `sni`;
//! the CA from `apisix.ssl.ssl_trusted_certificate`, else the system's roots), and `deployment.etcd.user` /
//! `password` authenticate (the client renews its token when etcd expires it).
//! Not here: history (etcd compacts it; see docs/admin-api.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use serde_json::Value;
use sluice_model::NodeConfig;
use sluice_secrets::DataEncryption;
use tokio::sync::watch;

use crate::kv::{
    patch_resources, BoxFuture, Entry, Op, Revision, Snapshot, Store, StoreError, KINDS,
};
use crate::{ConfigRx, ConfigTx, Versioned};

/// `deployment.etcd` as APISIX reads it: `host` list of `http(s)://ip:port`, `prefix`, `timeout` (seconds),
/// `user`/`password`, `tls`.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub timeout: Duration,
    /// Where the last applied key space is copied, to start from it while etcd is unreachable.
    pub last_known_good: Option<PathBuf>,
    /// `deployment.etcd.user` and `password`.
    pub auth: Option<(String, Secret)>,
    /// For `https://` endpoints.
    pub tls: EtcdTls,
}

/// TLS towards etcd. PEM contents are read when the configuration is, so a missing file fails the start.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EtcdTls {
    /// Trusted CAs (`apisix.ssl.ssl_trusted_certificate`); `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and key (`deployment.etcd.tls.cert` / `key`).
    pub identity: Option<(Vec<u8>, Secret)>,
    /// `deployment.etcd.tls.sni`: the name checked in etcd's certificate, instead of the endpoint's host.
    pub sni: Option<String>,
}

/// A password or private key: never printed.
#[derive(Clone, PartialEq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl EtcdConfig {
    pub fn from_node_config(cfg: &NodeConfig) -> Result<EtcdConfig, String> {
        let e = cfg.deployment.etcd.clone().unwrap_or(Value::Null);
        let endpoints: Vec<String> = match e.get("host") {
            Some(Value::Array(h)) => h
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Some(Value::String(h)) => vec![h.clone()],
            _ => vec!["http://127.0.0.1:2379".into()],
        };
        if endpoints.is_empty() {
            return Err("deployment.etcd.host: no endpoints".into());
        }
        let prefix = e
            .get("prefix")
            .and_then(Value::as_str)
            .unwrap_or("/apisix")
            .trim_end_matches('/')
            .to_owned();
        let timeout = e.get("timeout").and_then(Value::as_f64).unwrap_or(30.0);
        let auth =
            match (e.get("user"), e.get("password")) {
                (None, None) => None,
                (Some(Value::String(u)), Some(Value::String(p))) if !u.is_empty() => {
                    Some((u.clone(), Secret(p.clone().into_bytes())))
                }
                _ => return Err(
                    "deployment.etcd.user and deployment.etcd.password: both strings, or neither"
                        .into(),
                ),
            };
        let read = |key: &str, path: &str| {
            std::fs::read(path).map_err(|err| format!("{key}: reading {path}: {err}"))
        };
        let t = e.get("tls").cloned().unwrap_or(Value::Null);
        if t.get("verify") == Some(&Value::Bool(false)) {
            return Err(
                "deployment.etcd.tls.verify: false is not supported; give etcd's CA in \
                        apisix.ssl.ssl_trusted_certificate instead"
                    .into(),
            );
        }
        let ca = match cfg
            .apisix
            .ssl
            .as_ref()
            .and_then(|ssl| ssl.get("ssl_trusted_certificate"))
            .and_then(Value::as_str)
        {
            None | Some("system") => None,
            Some(path) => Some(read("apisix.ssl.ssl_trusted_certificate", path)?),
        };
        let identity = match (
            t.get("cert").and_then(Value::as_str),
            t.get("key").and_then(Value::as_str),
        ) {
            (None, None) => None,
            (Some(c), Some(k)) => Some((
                read("deployment.etcd.tls.cert", c)?,
                Secret(read("deployment.etcd.tls.key", k)?),
            )),
            _ => return Err("deployment.etcd.tls: cert and key go together".into()),
        };
        let tls = EtcdTls {
            ca,
            identity,
            sni: t.get("sni").and_then(Value::as_str).map(str::to_owned),
        };
        Ok(EtcdConfig {
            endpoints,
            prefix,
            timeout: Duration::from_secs_f64(timeout.max(0.1)),
            last_known_good: None,
            auth,
            tls,
        })
    }

    fn connect_options(&self) -> ConnectOptions {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(self.timeout.min(Duration::from_secs(5)))
            .with_timeout(self.timeout)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        if let Some((user, password)) = &self.auth {
            opts = opts.with_user(user, String::from_utf8_lossy(&password.0));
        }
        if self.endpoints.iter().any(|e| e.starts_with("https://")) {
            let t = &self.tls;
            let mut tls = TlsOptions::new();
            tls = match &t.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = &t.identity {
                tls = tls.identity(Identity::from_pem(cert, &key.0));
            }
            if let Some(sni) = &t.sni {
                tls = tls.domain_name(sni);
            }
            opts = opts.with_tls(tls);
        }
        opts
    }
}

pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: EtcdConfig,
    /// `None` until etcd first answered: with `user`/`password` connecting authenticates, which needs etcd.
    client: std::sync::Mutex<Option<Client>>,
    snapshot: RwLock<Arc<Snapshot>>,
    healthy: AtomicBool,
    tx: ConfigTx,
    /// The snapshot's revision, so a writer can wait until its own write is visible.
    seen: watch::Sender<u64>,
    /// Values are stored as APISIX stores them (secret fields encrypted); decrypted for the data plane's view.
    de: Arc<DataEncryption>,
}

fn unavailable<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

impl EtcdStore {
    /// Connects, loads everything under the prefix, and starts the watch task. When etcd is unreachable at
    /// startup this fails (as APISIX does), unless `cfg.last_known_good` holds a copy for this prefix: then the
    /// store starts from it, unhealthy, and resynchronises when etcd answers. Later outages are survived either way.
    pub async fn connect(cfg: EtcdConfig) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with(cfg, Arc::default()).await
    }

    /// As [`EtcdStore::connect`], decrypting secret fields with `de` for the data plane.
    pub async fn connect_with(
        cfg: EtcdConfig,
        de: Arc<DataEncryption>,
    ) -> Result<EtcdStore, StoreError> {
        // Without credentials this makes no request (the channel connects lazily); with them it authenticates.
        let client = Client::connect(&cfg.endpoints, Some(cfg.connect_options())).await;
        let (client, connect_err) = match client {
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(unavailable(e))),
        };
        let (tx, _) = watch::channel(Arc::new(Versioned::default()));
        let (seen, _) = watch::channel(0);
        let lkg = cfg.last_known_good.clone();
        let inner = Arc::new(Inner {
            cfg,
            client: std::sync::Mutex::new(client),
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            healthy: AtomicBool::new(false),
            tx,
            seen,
            de,
        });
        let mut written = 0;
        let first = match connect_err {
            Some(e) => Err(e),
            None => inner.full_sync().await,
        };
        let start = match first {
            Ok(rev) => Some(rev),
            Err(e) => {
                let Some(path) = &lkg else { return Err(e) };
                let snap = match read_last_known_good(path, &inner.cfg.prefix) {
                    Ok(Some(snap)) => snap,
                    Ok(None) => {
                        return Err(StoreError::Unavailable(format!(
                            "{e}; no last known good copy at {} to start from",
                            path.display()
                        )))
                    }
                    Err(why) => {
                        return Err(StoreError::Unavailable(format!(
                            "{e}; and the last known good copy {} cannot be used: {why}",
                            path.display()
                        )))
                    }
                };
                tracing::warn!(
                    error = %e,
                    file = %path.display(),
                    revision = snap.revision,
                    "etcd unreachable at start; serving the last known good configuration until it answers"
                );
                written = snap.revision;
                inner.publish(snap, None);
                None
            }
        };
        tokio::spawn(sync_loop(Arc::downgrade(&inner), start));
        if let Some(path) = lkg {
            tokio::spawn(keep_last_known_good(Arc::downgrade(&inner), path, written));
        }
        Ok(EtcdStore { inner })
    }
}

/// The last-known-good file: the key space as stored in etcd under `prefix`, at `revision`.
#[derive(serde::Serialize, serde::Deserialize)]
struct LastKnownGood {
    prefix: String,
    revision: u64,
    entries: BTreeMap<String, Entry>,
}

/// `Ok(None)`: no file. A file for another prefix or that does not parse is an error, never a silent empty start.
fn read_last_known_good(path: &Path, prefix: &str) -> Result<Option<Snapshot>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let lkg: LastKnownGood = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if lkg.prefix != prefix {
        return Err(format!(
            "it holds prefix {:?}, this node uses {prefix:?}",
            lkg.prefix
        ));
    }
    Ok(Some(Snapshot {
        revision: lkg.revision,
        entries: lkg.entries.into_iter().collect(),
    }))
}

/// Written to a temporary file, synced, then renamed over the old copy: a crash leaves the old or the new one.
fn write_last_known_good(path: &Path, prefix: &str, snap: &Snapshot) -> std::io::Result<()> {
    use std::io::Write;
    let body = serde_json::to_vec(&LastKnownGood {
        prefix: prefix.to_owned(),
        revision: snap.revision,
        entries: snap
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })?;
    let tmp = path.with_extension("json.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Copies each configuration the watch publishes to `path`, at most once a second, off the runtime's threads.
/// `written`: the revision the file already holds (the store started from it), else 0.
async fn keep_last_known_good(inner: std::sync::Weak<Inner>, path: PathBuf, mut written: u64) {
    let Some(mut rx) = inner.upgrade().map(|me| me.tx.subscribe()) else {
        return;
    };
    loop {
        let Some(me) = inner.upgrade() else { return };
        let snap = me.current();
        let prefix = me.cfg.prefix.clone();
        drop(me);
        if snap.revision != written {
            let p = path.clone();
            let rev = snap.revision;
            match tokio::task::spawn_blocking(move || write_last_known_good(&p, &prefix, &snap))
                .await
            {
                Ok(Ok(())) => written = rev,
                Ok(Err(e)) => {
                    tracing::warn!(file = %path.display(), error = %e, "last known good copy not written")
                }
                Err(_) => return,
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `/apisix/routes/1` -> `routes/1`, for resource keys only (APISIX also keeps `/apisix/plugins`, data-plane
/// heartbeats and v2 directory placeholders there).
fn relative(prefix: &str, key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    let rel = key.strip_prefix(prefix)?.strip_prefix('/')?;
    let (kind, id) = rel.split_once('/')?;
    (KINDS.contains(&kind) && !id.is_empty()).then(|| rel.to_owned())
}

impl Inner {
    /// The etcd client, connecting (and authenticating) first if that has not succeeded yet.
    async fn client(&self) -> Result<Client, StoreError> {
        if let Some(c) = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Ok(c.clone());
        }
        let c = Client::connect(&self.cfg.endpoints, Some(self.cfg.connect_options()))
            .await
            .map_err(unavailable)?;
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    fn current(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Publishes `next`. With `touched` (the keys changed since the published view), only those are decoded
    /// again; a full sync passes `None` and decodes everything.
    fn publish(&self, next: Snapshot, touched: Option<(u64, &[String])>) {
        let revision = next.revision;
        let published = self.tx.borrow().clone();
        let resources = match touched {
            Some((base, keys)) if published.revision == base && base != 0 => patch_resources(
                &published.resources,
                &next,
                keys.iter().map(String::as_str),
                &self.de,
            ),
            _ => next.to_resources(&self.de),
        };
        let next = Arc::new(next);
        match self.snapshot.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
        self.tx.send_replace(Arc::new(Versioned {
            revision,
            resources,
            token: 0,
        }));
        self.seen.send_replace(revision);
    }

    /// Reads the whole prefix and replaces the snapshot; returns the etcd revision it reflects.
    async fn full_sync(&self) -> Result<i64, StoreError> {
        let mut c = self.client().await?;
        let resp = c
            .get(
                format!("{}/", self.cfg.prefix),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut snap = Snapshot {
            revision: revision.max(0) as u64,
            ..Snapshot::default()
        };
        for kv in resp.kvs() {
            let Some(key) = relative(&self.cfg.prefix, kv.key()) else {
                continue;
            };
            match Entry::from_json(
                kv.value(),
                kv.create_revision().max(0) as u64,
                kv.mod_revision().max(0) as u64,
            ) {
                Ok(entry) => {
                    snap.entries.insert(key, entry);
                }
                Err(e) => tracing::error!(key, error = %e, "etcd value is not JSON; skipped"),
            }
        }
        if *self.current() != snap || self.tx.borrow().revision == 0 {
            self.publish(snap, None);
        }
        self.healthy.store(true, Ordering::Relaxed);
        Ok(revision)
    }

    /// Follows the watch from `from` until it fails; returns why.
    async fn follow(&self, from: i64) -> StoreError {
        let mut c = match self.client().await {
            Ok(c) => c,
            Err(e) => return e,
        };
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from + 1);
        let mut stream = match c.watch(format!("{}/", self.cfg.prefix), Some(opts)).await {
            Ok(s) => s,
            Err(e) => return unavailable(e),
        };
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => return unavailable("watch stream closed"),
                Err(e) => return unavailable(e),
            };
            if msg.compact_revision() != 0 || msg.canceled() {
                return unavailable(format!(
                    "watch cancelled (compacted at {}): {}",
                    msg.compact_revision(),
                    msg.cancel_reason()
                ));
            }
            // The creation reply carries the cluster's current revision, but the events from `from` come
            // after it: counting it as seen would let a commit return before its own event is applied.
            if msg.created() && msg.events().is_empty() {
                continue;
            }
            let revision = msg.header().map_or(0, |h| h.revision()).max(0) as u64;
            // Only resource keys make a new configuration: node registry reports (every node's, every second
            // while revisions move) would otherwise be published and applied as new revisions, and the applied
            // revision they report would move again. `seen` still follows, so `sync` and commits do not wait.
            let ours = msg.events().iter().any(|ev| {
                ev.kv()
                    .is_some_and(|kv| relative(&self.cfg.prefix, kv.key()).is_some())
            });
            if !ours {
                self.seen.send_if_modified(|s| {
                    let moved = revision > *s;
                    *s = (*s).max(revision);
                    moved
                });
                continue;
            }
            let cur = self.current();
            let mut next = (*cur).clone();
            let mut touched = Vec::with_capacity(msg.events().len());
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                let Some(key) = relative(&self.cfg.prefix, kv.key()) else {
                    continue;
                };
                touched.push(key.clone());
                match ev.event_type() {
                    EventType::Put => match Entry::from_json(
                        kv.value(),
                        kv.create_revision().max(0) as u64,
                        kv.mod_revision().max(0) as u64,
                    ) {
                        Ok(entry) => {
                            next.entries.insert(key, entry);
                        }
                        Err(e) => {
                            tracing::error!(key, error = %e, "etcd value is not JSON; skipped")
                        }
                    },
                    EventType::Delete => {
                        next.entries.remove(&key);
                    }
                }
            }
            next.revision = revision.max(next.revision);
            self.publish(next, Some((cur.revision, &touched)));
        }
    }
}

/// Watch, and on failure back off (100 ms doubling to 5 s) and resync fully; `None` starts with the resync (the
/// store started from its last known good copy). Ends when the store is dropped.
async fn sync_loop(inner: std::sync::Weak<Inner>, start: Option<i64>) {
    let mut backoff = Duration::from_millis(100);
    let mut rev = start;
    loop {
        if let Some(from) = rev {
            let Some(me) = inner.upgrade() else { return };
            let err = me.follow(from).await;
            me.healthy.store(false, Ordering::Relaxed);
            tracing::warn!(error = %err, "etcd watch lost; keeping the last configuration and retrying");
        }
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            let Some(me) = inner.upgrade() else { return };
            match me.full_sync().await {
                Ok(r) => {
                    rev = Some(r);
                    backoff = Duration::from_millis(100);
                    tracing::info!(revision = r, "etcd resynchronised");
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "etcd still unavailable"),
            }
        }
    }
}

impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.current()
    }

    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let p = &inner.cfg.prefix;
            let mut compares = Vec::new();
            let mut actions = Vec::new();
            for op in &ops {
                let key = format!("{p}/{}", op.key());
                match op.expect_mod() {
                    Some(0) => compares.push(Compare::version(key.clone(), CompareOp::Equal, 0)),
                    Some(r) => compares.push(Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        r as i64,
                    )),
                    None => {}
                }
                actions.push(match op {
                    Op::Put { value, .. } => TxnOp::put(key, value.to_string(), None),
                    Op::Delete { .. } => TxnOp::delete(key, None),
                });
            }
            let mut c = inner.client().await.inspect_err(|_| {
                inner.healthy.store(false, Ordering::Relaxed);
            })?;
            let resp = c
                .txn(Txn::new().when(compares).and_then(actions))
                .await
                .map_err(|e| {
                    inner.healthy.store(false, Ordering::Relaxed);
                    unavailable(e)
                })?;
            if !resp.succeeded() {
                return Err(StoreError::Conflict(
                    "the configuration was modified concurrently; retry".into(),
                ));
            }
            let rev = resp.header().map_or(0, |h| h.revision()).max(0) as u64;
            // Read-your-writes: wait (bounded) until the watch has brought this revision into the snapshot.
            let mut seen = inner.seen.subscribe();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), seen.wait_for(|s| *s >= rev)).await;
            Ok(rev)
        })
    }

    fn history(
        &self,
        _after: u64,
        _limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Revision>, StoreError>> {
        Box::pin(async {
            Err(StoreError::Unsupported(
                "history is kept by the embedded store only; etcd compacts its own".into(),
            ))
        })
    }

    fn subscribe(&self) -> ConfigRx {
        self.inner.tx.subscribe()
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let inner = &self.inner;
            // Any read returns the cluster's current revision in its header; the watch then brings the snapshot
            // up to it.
            let mut c = inner.client().await?;
            let key = format!("{}/", inner.cfg.prefix);
            let resp = c
                .get(key, Some(GetOptions::new().with_count_only()))
                .await
                .map_err(unavailable)?;
            let rev = resp.header().map_or(0, |h| h.revision()).max(0) as u64;
            let mut seen = inner.seen.subscribe();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), seen.wait_for(|s| *s >= rev)).await;
            Ok(())
        })
    }

    fn data_encryption(&self) -> Arc<DataEncryption> {
        self.inner.de.clone()
    }

    fn healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    fn announce(
        &self,
        info: serde_json::Map<String, Value>,
        applied: watch::Receiver<u64>,
        ttl: Duration,
    ) {
        tokio::spawn(announce_loop(
            Arc::downgrade(&self.inner),
            self.inner.cfg.prefix.clone(),
            info,
            applied,
            ttl,
        ));
    }

    fn nodes(&self) -> BoxFuture<'_, Result<Option<Vec<Value>>, StoreError>> {
        self.registry_nodes()
    }
}

/// Where node `id` reports: APISIX's `/data_plane/server_info/{id}` under the prefix.
fn server_info_key(prefix: &str, id: &str) -> String {
    format!("{prefix}/data_plane/server_info/{id}")
}

/// Keeps `info` at its server_info key under a lease of `ttl`: granted, written, kept alive every third of the
/// TTL, rewritten (at most once a second) when `applied` moves. If the lease is lost (etcd unreachable for longer
/// than the TTL) a new one is granted once etcd answers again. Ends when `applied`'s sender is dropped; the key
/// then expires with its lease (or at once when the process dies and stops renewing).
async fn announce_loop(
    inner: std::sync::Weak<Inner>,
    prefix: String,
    mut info: serde_json::Map<String, Value>,
    mut applied: watch::Receiver<u64>,
    ttl: Duration,
) {
    let key = server_info_key(
        &prefix,
        info.get("id").and_then(Value::as_str).unwrap_or(""),
    );
    let mut backoff = Duration::from_millis(100);
    loop {
        let began = tokio::time::Instant::now();
        let client = match inner.upgrade() {
            Some(me) => me.client().await,
            None => return,
        };
        let r = match client {
            Ok(client) => announce_once(&client, &key, &mut info, &mut applied, ttl)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match r {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(key, error = %e, "node registry: report lost; retrying");
                // A registration that held for a while starts its retries from the shortest wait again.
                if began.elapsed() > ttl {
                    backoff = Duration::from_millis(100);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn announce_once(
    client: &Client,
    key: &str,
    info: &mut serde_json::Map<String, Value>,
    applied: &mut watch::Receiver<u64>,
    ttl: Duration,
) -> Result<(), etcd_client::Error> {
    let mut c = client.clone();
    if info.get("etcd_version").and_then(Value::as_str) == Some("unknown") {
        if let Ok(st) = c.status().await {
            info.insert("etcd_version".into(), Value::from(st.version()));
        }
    }
    let secs = ttl.as_secs().max(1) as i64;
    let lease = c.lease_grant(secs, None).await?.id();
    let put = |c: &mut Client, rev: u64| {
        let body = Value::Object(crate::node::report(info, rev)).to_string();
        let mut c = c.clone();
        let key = key.to_owned();
        async move {
            c.put(key, body, Some(PutOptions::new().with_lease(lease)))
                .await
        }
    };
    let rev = *applied.borrow_and_update();
    put(&mut c, rev).await?;
    let (mut keeper, mut acks) = c.lease_keep_alive(lease).await?;
    let mut tick = tokio::time::interval(Duration::from_secs(secs as u64) / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                keeper.keep_alive().await?;
                match acks.message().await? {
                    Some(r) if r.ttl() > 0 => {}
                    _ => return Err(etcd_client::Error::LeaseKeepAliveError("lease expired".into())),
                }
            }
            changed = applied.changed() => {
                if changed.is_err() {
                    let _ = c.lease_revoke(lease).await;
                    return Ok(());
                }
                // At once (`?wait=applied&nodes=` waits on it), then at most one report a second: what is applied
                // meanwhile goes in the next one.
                let rev = *applied.borrow_and_update();
                put(&mut c, rev).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

impl EtcdStore {
    fn registry_nodes(&self) -> BoxFuture<'_, Result<Option<Vec<Value>>, StoreError>> {
        Box::pin(async move {
            let mut c = self.inner.client().await?;
            let resp = c
                .get(
                    server_info_key(&self.inner.cfg.prefix, ""),
                    Some(GetOptions::new().with_prefix()),
                )
                .await
                .map_err(unavailable)?;
            let mut out = Vec::with_capacity(resp.kvs().len());
            for kv in resp.kvs() {
                match serde_json::from_slice::<Value>(kv.value()) {
                    Ok(v @ Value::Object(_)) => out.push(v),
                    _ => {
                        tracing::debug!(key = ?kv.key_str(), "server_info is not a JSON object; skipped")
                    }
                }
            }
            Ok(Some(out))
        })
    }
}

#[cfg(test)]
mod tests;
