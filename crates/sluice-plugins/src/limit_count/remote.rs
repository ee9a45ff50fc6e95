//! limit-count's `redis` and `redis-cluster` policies without a Redis round trip on the request path.
//!
//! Each window keeps, per gateway node, what Redis last said (`remote`: the cluster-wide count and the window's
//! remaining time) plus the requests admitted here since (`pending`). A request is decided locally against
//! `remote + pending`; one background thread per Redis backend pushes every window's `pending` with one
//! `INCRBY` script per key every `sync_interval` and reads the new total back. Accuracy: a node can admit at
//! most what the other nodes admitted during one sync interval beyond `count` (measured in the tests). When
//! Redis cannot be reached the backend is marked down: requests get 500 `{"error_msg":"failed to limit
//! count"}`, or pass uncounted with `allow_degradation`, as APISIX. The connections, sync thread and
//! degradation are [`crate::redis_sync`]'s; this file owns the window script and arithmetic.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::counters::{now_ms, Quota};
use crate::redis_sync::{Conn, Synced, Syncer, Syncers};

/// Sets the window on first use and adds the batch: returns the total and the remaining ms of the window.
const SCRIPT: &str = "local ttl = redis.call('pttl', KEYS[1]) \
if ttl < 0 then redis.call('set', KEYS[1], 0, 'PX', ARGV[2]) ttl = tonumber(ARGV[2]) end \
local v = redis.call('incrby', KEYS[1], ARGV[1]) \
return {v, ttl}";

/// limit-count's Redis backends (one per [`crate::Shared`]).
pub(crate) type RemoteStore = Syncers<Window>;

/// A window of one Redis key as this node knows it.
pub(crate) struct Window {
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

impl Window {
    /// The window of a Redis key on a backend (created on first use).
    pub(crate) fn of(s: &Syncer<Window>, key: &str, window_ms: u64) -> std::sync::Arc<Window> {
        s.entry(key, || Window {
            window_ms,
            pending: AtomicU64::new(0),
            remote: AtomicU64::new(0),
            reset_at: AtomicU64::new(0),
            touched: AtomicU64::new(now_ms()),
        })
    }
}

impl Synced for Window {
    const PLUGIN: &'static str = "limit-count";
    const DOWN_MSG: &'static str = "failed to limit count";
    /// The cluster-wide count and the window's remaining ms.
    type Answer = (u64, i64);

    fn pending(&self) -> &AtomicU64 {
        &self.pending
    }
    fn touched(&self) -> &AtomicU64 {
        &self.touched
    }
    fn idle_ms(&self) -> u64 {
        self.window_ms.max(1000)
    }
    fn push(&self, con: &mut Conn, key: &str, pending: u64) -> redis::RedisResult<(u64, i64)> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT)
            .arg(1)
            .arg(key)
            .arg(pending)
            .arg(self.window_ms);
        con.query(&cmd)
    }
    fn adopt(&self, (total, ttl): (u64, i64)) {
        self.remote.store(total, Ordering::Release);
        let ttl = u64::try_from(ttl).unwrap_or(self.window_ms);
        self.reset_at.store(now_ms() + ttl, Ordering::Release);
    }
}
