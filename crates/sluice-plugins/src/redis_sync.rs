//! The Redis plumbing of the limit plugins' `redis` / `redis-cluster` policies: the policy fields of their
//! configurations ([`RedisConf`]) and blocking connections ([`Conn`]), shared with limit-count's and limit-conn's
//! awaited calls ([`crate::redis_lease`]); and limit-req's syncs: one background thread per backend that batches
//! every active key's locally admitted requests into Redis each interval and marks the backend down while Redis
//! cannot be reached ([`Syncers`]). Not here: each plugin's Lua script and counter maths.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::now_ms;
use crate::util::reject;
use crate::Flow;

/// Where the counters live.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Backend {
    Single { url: String },
    Cluster { urls: Vec<String> },
}

/// The Redis fields of limit-count's and limit-req's configurations, named and defaulted as APISIX's.
#[derive(Deserialize)]
pub(crate) struct RedisConf {
    #[serde(default = "local")]
    policy: String,
    redis_host: Option<String>,
    #[serde(default = "port")]
    redis_port: u16,
    redis_username: Option<String>,
    redis_password: Option<String>,
    #[serde(default)]
    redis_database: u32,
    #[serde(default = "ms1000")]
    redis_timeout: u64,
    #[serde(default)]
    redis_ssl: bool,
    #[serde(default)]
    redis_cluster_nodes: Vec<String>,
}

fn local() -> String {
    "local".into()
}
fn port() -> u16 {
    6379
}
fn ms1000() -> u64 {
    1000
}

/// Adds the schema properties of [`RedisConf`] (and `allow_degradation`) to a plugin's object schema.
pub(crate) fn with_redis_schema(mut schema: Value) -> Value {
    let redis = json!({
        "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster"], "default": "local"},
        "allow_degradation": {"type": "boolean", "default": false},
        "redis_host": {"type": "string", "minLength": 2},
        "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
        "redis_username": {"type": "string", "minLength": 1},
        "redis_password": {"type": "string", "minLength": 0},
        "redis_database": {"type": "integer", "minimum": 0, "default": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_ssl": {"type": "boolean", "default": false},
        "redis_cluster_nodes": {"type": "array", "minItems": 1,
                                "items": {"type": "string", "minLength": 2, "maxLength": 100}},
        "redis_cluster_name": {"type": "string"}
    });
    if let (Some(props), Value::Object(redis)) = (
        schema.get_mut("properties").and_then(Value::as_object_mut),
        redis,
    ) {
        props.extend(redis);
    }
    schema
}

impl RedisConf {
    pub(crate) fn timeout_ms(&self) -> u64 {
        self.redis_timeout
    }

    /// The backend to sync with and how to reach it; `None` for policy `local`.
    pub(crate) fn connect(&self, interval: Duration) -> Result<Option<Connect>, String> {
        let auth = match (&self.redis_username, &self.redis_password) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            (None, Some(p)) if !p.is_empty() => format!(":{p}@"),
            _ => String::new(),
        };
        let scheme = if self.redis_ssl { "rediss" } else { "redis" };
        let backend = match self.policy.as_str() {
            "local" => return Ok(None),
            "redis" => {
                let host = self
                    .redis_host
                    .as_deref()
                    .ok_or("property \"redis_host\" is required")?;
                Backend::Single {
                    url: format!(
                        "{scheme}://{auth}{host}:{}/{}",
                        self.redis_port, self.redis_database
                    ),
                }
            }
            _ => {
                if self.redis_cluster_nodes.len() < 2 {
                    return Err("property \"redis_cluster_nodes\" needs at least 2 nodes".into());
                }
                Backend::Cluster {
                    urls: self
                        .redis_cluster_nodes
                        .iter()
                        .map(|n| format!("{scheme}://{n}"))
                        .collect(),
                }
            }
        };
        Ok(Some(Connect {
            backend,
            password: self.redis_password.clone().filter(|p| !p.is_empty()),
            timeout: Duration::from_millis(self.redis_timeout),
            interval,
        }))
    }
}

/// A 64-bit FNV-1a: the same on every node (unlike the per-process seeded hashes), so every node names a
/// configuration's Redis keys alike.
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A blocking connection to one Redis or a Redis Cluster (sync threads only).
pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(redis::cluster::ClusterConnection),
}

impl Conn {
    pub(crate) fn open(
        b: &Backend,
        timeout: Duration,
        password: Option<&str>,
    ) -> redis::RedisResult<Conn> {
        match b {
            Backend::Single { url } => {
                let c = redis::Client::open(url.as_str())?;
                let con = c.get_connection_with_timeout(timeout)?;
                con.set_read_timeout(Some(timeout))?;
                con.set_write_timeout(Some(timeout))?;
                Ok(Conn::Single(con))
            }
            Backend::Cluster { urls } => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                if let Some(p) = password {
                    builder = builder.password(p.to_owned());
                }
                Ok(Conn::Cluster(builder.build()?.get_connection()?))
            }
        }
    }

    pub(crate) fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c),
        }
    }
}

/// A plugin's per-key state that a sync thread keeps in step with Redis.
pub(crate) trait Synced: Send + Sync + 'static {
    /// The plugin, for thread names and logs.
    const PLUGIN: &'static str;
    /// APISIX's 500 message while Redis is down.
    const DOWN_MSG: &'static str;
    /// Requests admitted here and not yet pushed.
    fn pending(&self) -> &AtomicU64;
    /// Last time (ms) a request used the key.
    fn touched(&self) -> &AtomicU64;
    /// How long (ms) an untouched key with nothing pending is kept before it is dropped.
    fn idle_ms(&self) -> u64;
    /// What Redis answers to a push.
    type Answer;
    /// Adds `pending` admitted requests to the key in Redis (one script run).
    fn push(&self, con: &mut Conn, key: &str, pending: u64) -> redis::RedisResult<Self::Answer>;
    /// Adopts Redis' answer, once the pushed requests are off the local pending count.
    fn adopt(&self, answer: Self::Answer);
}

/// One Redis backend: its keys, health and sync thread.
pub(crate) struct Syncer<E> {
    entries: RwLock<HashMap<String, Arc<E>>>,
    healthy: AtomicBool,
}

impl<E: Synced> Syncer<E> {
    /// While Redis cannot be reached: the request passes unlimited with `allow_degradation`, else gets 500
    /// (APISIX's answers); `None` while the backend is healthy.
    pub(crate) fn down(&self, allow_degradation: bool) -> Option<Flow> {
        if self.healthy.load(Ordering::Acquire) {
            None
        } else if allow_degradation {
            Some(Flow::Continue)
        } else {
            Some(Flow::Respond(reject(500, Some(E::DOWN_MSG))))
        }
    }

    /// The state of a Redis key, made by `make` on first use.
    pub(crate) fn entry(&self, key: &str, make: impl FnOnce() -> E) -> Arc<E> {
        if let Ok(m) = self.entries.read() {
            if let Some(e) = m.get(key) {
                return e.clone();
            }
        }
        let mut m = match self.entries.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        m.entry(key.to_owned())
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }
}

/// How to reach a backend and how often to sync with it.
pub(crate) struct Connect {
    pub backend: Backend,
    pub password: Option<String>,
    pub timeout: Duration,
    pub interval: Duration,
}

type SyncerId = (Backend, u64);

/// The backends of one [`crate::Shared`] for one plugin, each with its sync thread.
pub(crate) struct Syncers<E> {
    /// By backend and interval (µs).
    syncers: Mutex<HashMap<SyncerId, Arc<Syncer<E>>>>,
}

impl<E> Default for Syncers<E> {
    fn default() -> Self {
        Syncers {
            syncers: Mutex::default(),
        }
    }
}

impl<E: Synced> Syncers<E> {
    /// The syncer for a backend and interval (started on first use). Compile-time only.
    pub(crate) fn syncer(&self, c: Connect) -> Arc<Syncer<E>> {
        let mut m = match self.syncers.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let id = (c.backend.clone(), c.interval.as_micros() as u64);
        if let Some(s) = m.get(&id) {
            return s.clone();
        }
        let s = Arc::new(Syncer {
            entries: RwLock::default(),
            healthy: AtomicBool::new(true),
        });
        // Probe once now so a backend that is down from the start is known before the first request.
        let conn = Conn::open(&c.backend, c.timeout, c.password.as_deref()).ok();
        s.healthy.store(conn.is_some(), Ordering::Release);
        let weak = Arc::downgrade(&s);
        let spawned = std::thread::Builder::new()
            .name(format!("sluice-{}-sync", E::PLUGIN))
            .spawn(move || sync_loop(weak, c, conn));
        if spawned.is_err() {
            s.healthy.store(false, Ordering::Release);
        }
        m.insert(id, s.clone());
        s
    }
}

fn sync_loop<E: Synced>(weak: Weak<Syncer<E>>, c: Connect, mut conn: Option<Conn>) {
    loop {
        std::thread::sleep(c.interval);
        let Some(s) = weak.upgrade() else { return };
        if conn.is_none() {
            conn = Conn::open(&c.backend, c.timeout, c.password.as_deref()).ok();
        }
        let ok = match conn.as_mut() {
            Some(con) => sync_once(&s, con),
            None => false,
        };
        if !ok {
            conn = None;
        }
        s.healthy.store(ok, Ordering::Release);
    }
}

/// Pushes every active key's pending count; false when Redis failed (pending counts are kept for later).
fn sync_once<E: Synced>(s: &Syncer<E>, con: &mut Conn) -> bool {
    let entries: Vec<(String, Arc<E>)> = match s.entries.read() {
        Ok(m) => m.iter().map(|(k, e)| (k.clone(), e.clone())).collect(),
        Err(_) => return false,
    };
    let mut idle = Vec::new();
    for (key, e) in entries {
        let pending = e.pending().load(Ordering::Acquire);
        let touched = e.touched().load(Ordering::Relaxed);
        if pending == 0 && now_ms().saturating_sub(touched) > e.idle_ms() {
            idle.push(key);
            continue;
        }
        match e.push(con, &key, pending) {
            Ok(answer) => {
                e.pending().fetch_sub(pending, Ordering::AcqRel);
                e.adopt(answer);
            }
            Err(err) => {
                tracing::warn!(error = %err, "{}: redis sync failed", E::PLUGIN);
                return false;
            }
        }
    }
    if !idle.is_empty() {
        if let Ok(mut m) = s.entries.write() {
            for k in idle {
                if m.get(&k)
                    .is_some_and(|e| e.pending().load(Ordering::Acquire) == 0)
                {
                    m.remove(&k);
                }
            }
        }
    }
    true
}
