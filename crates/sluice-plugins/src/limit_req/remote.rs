//! limit-req's `redis` and `redis-cluster` policies without a Redis round trip on the request path.
//!
//! Each key keeps a local leaky bucket (the same word as policy `local`, [`crate::counters::leak`]) that decides
//! requests and their delays, plus the count of requests admitted here since the last sync (`pending`). One
//! background thread per Redis backend pushes every active key's `pending` each [`SYNC`] with one script that
//! runs the leaky bucket in Redis (drained at `rate` by Redis' own clock, plus the batch) and answers the
//! cluster-wide excess, which becomes the local bucket's state. Accuracy: a node may admit, beyond `rate` and
//! `burst`, what other nodes admitted during one sync interval, and a key's first requests on a node are decided
//! before the node has heard from Redis. When Redis cannot be reached the backend is marked down: requests get
//! 500 `{"error_msg":"failed to limit req"}`, or pass unlimited with `allow_degradation`, as APISIX.
//! Connections come from limit-count's plumbing ([`crate::limit_count::remote::Conn`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use crate::counters::{leak, now_ms, rebase, Leak};
use crate::limit_count::remote::{Backend, Conn};

/// How often a backend's thread pushes and reads back.
pub(crate) const SYNC: Duration = Duration::from_millis(10);

/// ARGV: rate (requests/s), batch size, ttl ms. Drains by Redis' clock, adds the batch (a new key's first request
/// adds nothing, as lua-resty-limit-req), answers the excess in requests.
const SCRIPT: &str = "local t = redis.call('time') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
local rate, n = tonumber(ARGV[1]), tonumber(ARGV[2]) \
local s = redis.call('hmget', KEYS[1], 'excess', 'last') \
local excess, last = tonumber(s[1]), tonumber(s[2]) \
if excess == nil then excess = math.max(n - 1, 0) else \
excess = math.max(excess - rate * math.max(now - last, 0) / 1000, 0) + n end \
redis.call('hset', KEYS[1], 'excess', tostring(excess), 'last', now) \
redis.call('pexpire', KEYS[1], ARGV[3]) \
return tostring(excess)";

pub(crate) struct Bucket {
    key: String,
    rate: f64,
    ttl_ms: u64,
    word: AtomicU64,
    pending: AtomicU64,
    touched: AtomicU64,
}

impl Bucket {
    /// Decides one request locally; an admitted one is counted for the next push.
    pub(crate) fn incoming(&self, burst: f64) -> Leak {
        let now = now_ms();
        self.touched.store(now, Ordering::Relaxed);
        let r = leak(&self.word, now, self.rate, burst);
        if r.is_ok() {
            self.pending.fetch_add(1, Ordering::AcqRel);
        }
        r
    }
}

/// One Redis backend: its buckets, health and sync thread.
pub(crate) struct Syncer {
    buckets: RwLock<HashMap<String, Arc<Bucket>>>,
    healthy: AtomicBool,
}

impl Syncer {
    pub(crate) fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// The bucket of a Redis key (created on first use).
    pub(crate) fn bucket(&self, key: &str, rate: f64, burst: f64) -> Arc<Bucket> {
        if let Ok(m) = self.buckets.read() {
            if let Some(b) = m.get(key) {
                return b.clone();
            }
        }
        let mut m = match self.buckets.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        m.entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Bucket {
                    key: key.to_owned(),
                    rate,
                    // Long enough for a full burst to drain, then a minute.
                    ttl_ms: ((burst + 1.0) / rate * 1000.0) as u64 + 60_000,
                    word: AtomicU64::new(0),
                    pending: AtomicU64::new(0),
                    touched: AtomicU64::new(now_ms()),
                })
            })
            .clone()
    }
}

pub(crate) struct Connect {
    pub backend: Backend,
    pub password: Option<String>,
    pub timeout: Duration,
}

/// The backends of one [`crate::Shared`], each with its sync thread.
#[derive(Default)]
pub(crate) struct RemoteBuckets {
    syncers: Mutex<HashMap<Backend, Arc<Syncer>>>,
}

impl RemoteBuckets {
    /// The syncer for a backend (started on first use). Compile-time only.
    pub(crate) fn syncer(&self, c: Connect) -> Arc<Syncer> {
        let mut m = match self.syncers.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if let Some(s) = m.get(&c.backend) {
            return s.clone();
        }
        let s = Arc::new(Syncer {
            buckets: RwLock::default(),
            healthy: AtomicBool::new(true),
        });
        // Probe once now so a backend that is down from the start is known before the first request.
        let conn = Conn::open(&c.backend, c.timeout, c.password.as_deref()).ok();
        s.healthy.store(conn.is_some(), Ordering::Release);
        let weak = Arc::downgrade(&s);
        let backend = c.backend.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-limit-req-sync".into())
            .spawn(move || sync_loop(weak, c, conn));
        if spawned.is_err() {
            s.healthy.store(false, Ordering::Release);
        }
        m.insert(backend, s.clone());
        s
    }
}

fn sync_loop(weak: Weak<Syncer>, c: Connect, mut conn: Option<Conn>) {
    loop {
        std::thread::sleep(SYNC);
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

/// Pushes every active bucket's admitted requests and adopts Redis' excess; false when Redis failed (the
/// pending counts are kept for the next try).
fn sync_once(s: &Syncer, con: &mut Conn) -> bool {
    let buckets: Vec<Arc<Bucket>> = match s.buckets.read() {
        Ok(m) => m.values().cloned().collect(),
        Err(_) => return false,
    };
    let mut idle = Vec::new();
    for b in buckets {
        let pending = b.pending.load(Ordering::Acquire);
        if pending == 0 && now_ms().saturating_sub(b.touched.load(Ordering::Relaxed)) > b.ttl_ms {
            idle.push(b.key.clone());
            continue;
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT)
            .arg(1)
            .arg(&b.key)
            .arg(b.rate)
            .arg(pending)
            .arg(b.ttl_ms);
        match con.query::<String>(&cmd) {
            Ok(excess) => {
                b.pending.fetch_sub(pending, Ordering::AcqRel);
                // Requests admitted here since the push are in the next batch; the local state restarts from
                // the cluster's.
                rebase(&b.word, now_ms(), excess.parse().unwrap_or(0.0));
            }
            Err(e) => {
                tracing::warn!(error = %e, "limit-req: redis sync failed");
                return false;
            }
        }
    }
    if !idle.is_empty() {
        if let Ok(mut m) = s.buckets.write() {
            for k in idle {
                if m.get(&k)
                    .is_some_and(|b| b.pending.load(Ordering::Acquire) == 0)
                {
                    m.remove(&k);
                }
            }
        }
    }
    true
}
