//! limit-count's `redis` and `redis-cluster` policies without a Redis round trip on the request path.
//!
//! Each window keeps, per gateway node, what Redis last said (`remote`: the cluster-wide count and the window's
//! remaining time) plus the requests admitted here since (`pending`). A request is decided locally against
//! `remote + pending`; one background thread per Redis backend pushes every window's `pending` with one
//! `INCRBY` script per key every `sync_interval` and reads the new total back. Accuracy: a node can admit at
//! most what the other nodes admitted during one sync interval beyond `count` (measured in the tests). When
//! Redis cannot be reached the backend is marked down: requests get 500 `{"error_msg":"failed to limit
//! count"}`, or pass uncounted with `allow_degradation`, as APISIX.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use crate::counters::{now_ms, Quota};

/// Sets the window on first use and adds the batch: returns the total and the remaining ms of the window.
const SCRIPT: &str = "local ttl = redis.call('pttl', KEYS[1]) \
if ttl < 0 then redis.call('set', KEYS[1], 0, 'PX', ARGV[2]) ttl = tonumber(ARGV[2]) end \
local v = redis.call('incrby', KEYS[1], ARGV[1]) \
return {v, ttl}";

/// Where the counters live.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Backend {
    Single { url: String },
    Cluster { urls: Vec<String> },
}

pub(crate) struct Window {
    key: String,
    window_ms: u64,
    pending: AtomicU64,
    remote: AtomicU64,
    /// Counter-epoch ms at which the window resets, as Redis last reported (0: unknown).
    reset_at: AtomicU64,
    /// Last time a request touched the window (ms): idle windows stop syncing.
    touched: AtomicU64,
}

impl Window {
    pub(crate) fn incoming(&self, limit: u64) -> Quota {
        let now = now_ms();
        self.touched.store(now, Ordering::Relaxed);
        let reset_at = self.reset_at.load(Ordering::Acquire);
        let live = reset_at > now;
        let remote = if live {
            self.remote.load(Ordering::Acquire)
        } else {
            0
        };
        let reset = if live {
            (reset_at - now).div_ceil(1000)
        } else {
            self.window_ms / 1000
        };
        let r = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (remote + p < limit).then_some(p + 1)
            });
        match r {
            Ok(p) => Quota {
                allowed: true,
                remaining: limit - remote - p - 1,
                reset,
            },
            Err(_) => Quota {
                allowed: false,
                remaining: 0,
                reset,
            },
        }
    }
}

/// One Redis backend: its windows, health and sync thread.
pub(crate) struct Syncer {
    windows: RwLock<HashMap<String, Arc<Window>>>,
    healthy: AtomicBool,
}

impl Syncer {
    pub(crate) fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    pub(crate) fn window(&self, key: String, window_ms: u64) -> Arc<Window> {
        if let Ok(m) = self.windows.read() {
            if let Some(w) = m.get(&key) {
                return w.clone();
            }
        }
        let mut m = match self.windows.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        m.entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Window {
                    key,
                    window_ms,
                    pending: AtomicU64::new(0),
                    remote: AtomicU64::new(0),
                    reset_at: AtomicU64::new(0),
                    touched: AtomicU64::new(now_ms()),
                })
            })
            .clone()
    }
}

/// A blocking connection to one Redis or a Redis Cluster (sync threads only; also limit-req's).
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

    fn push(&mut self, key: &str, n: u64, window_ms: u64) -> redis::RedisResult<(u64, i64)> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT).arg(1).arg(key).arg(n).arg(window_ms);
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c),
        }
    }
}

/// The backends of one [`crate::Shared`], each with its sync thread.
#[derive(Default)]
pub(crate) struct RemoteStore {
    syncers: Mutex<HashMap<(Backend, u64), Arc<Syncer>>>,
}

pub(crate) struct Connect {
    pub backend: Backend,
    pub password: Option<String>,
    pub timeout: Duration,
    pub interval: Duration,
}

impl RemoteStore {
    /// The syncer for a backend (started on first use). Compile-time only.
    pub(crate) fn syncer(&self, c: Connect) -> Arc<Syncer> {
        let mut m = match self.syncers.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let id = (c.backend.clone(), c.interval.as_micros() as u64);
        if let Some(s) = m.get(&id) {
            return s.clone();
        }
        let s = Arc::new(Syncer {
            windows: RwLock::default(),
            healthy: AtomicBool::new(true),
        });
        // Probe once now so a backend that is down from the start is known before the first request.
        let conn = Conn::open(&c.backend, c.timeout, c.password.as_deref()).ok();
        s.healthy.store(conn.is_some(), Ordering::Release);
        let weak = Arc::downgrade(&s);
        let spawned = std::thread::Builder::new()
            .name("sluice-limit-count-sync".into())
            .spawn(move || sync_loop(weak, c, conn));
        if spawned.is_err() {
            s.healthy.store(false, Ordering::Release);
        }
        m.insert(id, s.clone());
        s
    }
}

fn sync_loop(weak: Weak<Syncer>, c: Connect, mut conn: Option<Conn>) {
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

/// Pushes every active window's pending count; false when Redis failed (pending counts are kept for later).
fn sync_once(s: &Syncer, con: &mut Conn) -> bool {
    let now = now_ms();
    let windows: Vec<Arc<Window>> = match s.windows.read() {
        Ok(m) => m.values().cloned().collect(),
        Err(_) => return false,
    };
    let mut idle = Vec::new();
    for w in windows {
        let pending = w.pending.load(Ordering::Acquire);
        let touched = w.touched.load(Ordering::Relaxed);
        if pending == 0 && now.saturating_sub(touched) > w.window_ms.max(1000) {
            idle.push(w.key.clone());
            continue;
        }
        match con.push(&w.key, pending, w.window_ms) {
            Ok((total, ttl)) => {
                w.pending.fetch_sub(pending, Ordering::AcqRel);
                w.remote.store(total, Ordering::Release);
                let ttl = u64::try_from(ttl).unwrap_or(w.window_ms);
                w.reset_at.store(now_ms() + ttl, Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(error = %e, "limit-count: redis sync failed");
                return false;
            }
        }
    }
    if !idle.is_empty() {
        if let Ok(mut m) = s.windows.write() {
            for k in idle {
                if m.get(&k)
                    .is_some_and(|w| w.pending.load(Ordering::Acquire) == 0)
                {
                    m.remove(&k);
                }
            }
        }
    }
    true
}
