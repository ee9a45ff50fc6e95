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
//! The connections, sync thread and degradation are [`crate::redis_sync`]'s; this file owns the bucket script.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::counters::{leak, now_ms, rebase, Leak};
use crate::redis_sync::{Conn, Synced, Syncer, Syncers};

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

/// limit-req's Redis backends (one per [`crate::Shared`]).
pub(crate) type RemoteBuckets = Syncers<Bucket>;

/// The bucket of one Redis key as this node knows it.
pub(crate) struct Bucket {
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

impl Bucket {
    /// The bucket of a Redis key on a backend (created on first use).
    pub(crate) fn of(s: &Syncer<Bucket>, key: &str, rate: f64, burst: f64) -> Arc<Bucket> {
        s.entry(key, || Bucket {
            rate,
            // Long enough for a full burst to drain, then a minute.
            ttl_ms: ((burst + 1.0) / rate * 1000.0) as u64 + 60_000,
            word: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            touched: AtomicU64::new(now_ms()),
        })
    }
}

impl Synced for Bucket {
    const PLUGIN: &'static str = "limit-req";
    const DOWN_MSG: &'static str = "failed to limit req";
    /// The cluster-wide excess, in requests.
    type Answer = String;

    fn pending(&self) -> &AtomicU64 {
        &self.pending
    }
    fn touched(&self) -> &AtomicU64 {
        &self.touched
    }
    fn idle_ms(&self) -> u64 {
        self.ttl_ms
    }
    fn push(&self, con: &mut Conn, key: &str, pending: u64) -> redis::RedisResult<String> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT)
            .arg(1)
            .arg(key)
            .arg(self.rate)
            .arg(pending)
            .arg(self.ttl_ms);
        con.query(&cmd)
    }
    fn adopt(&self, excess: String) {
        // Requests admitted here since the push are in the next batch; the local state restarts from the
        // cluster's.
        rebase(&self.word, now_ms(), excess.parse().unwrap_or(0.0));
    }
}
