//! limit-count's `redis` and `redis-cluster` policies: exact cluster-wide, with far fewer Redis round trips than
//! requests, by leasing slices of the window's quota.
//!
//! The Redis key holds what is left of the window (APISIX's layout: set to `count` with the window's expiry by the
//! first request, then decremented). A node asks for a lease with one script ([`SCRIPT`]) that opens the window
//! if needed and grants `min(left, max(waiting, min(left / DIVISOR, MAX_SLICE)))`: never more than is left, so the
//! grants of all nodes in a window add up to at most `count`. The node then admits requests locally from its
//! lease (one compare-and-swap on one word) until it runs out, and leases again. A lease is valid until the window
//! it came from ends, counted from when the lease request was sent (the window cannot end earlier), so unused
//! tokens are dropped rather than spilling into the next window. Slices shrink as the window runs low, so no node
//! hoards the rest; once Redis says nothing is left, the node refuses locally until that window ends.
//!
//! One lease request per key and node is in flight at a time: requests that find the lease empty wait for the one
//! in flight (the hook awaits it through [`crate::Ctx::await_io`]; the worker never blocks), and it is sized for
//! them. Redis unreachable: 500 `{"error_msg":"failed to limit count"}`, or the request passes uncounted with
//! `allow_degradation`, as APISIX; tokens already leased keep being served. The Redis thread is
//! [`crate::redis_lease`]'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::counters::{now_ms, Quota};
use crate::redis_lease::{Job, Leaser, Leasers};

/// KEYS[1]: the window. ARGV: count, window ms, requests waiting, divisor, max slice. Answers the grant, what is
/// left after it, and the window's remaining ms. A key without expiry (never written by this script) is reset.
const SCRIPT: &str = "local ttl = redis.call('pttl', KEYS[1]) \
local left \
local fresh = ttl < 0 \
if fresh then ttl = tonumber(ARGV[2]) left = tonumber(ARGV[1]) \
else left = tonumber(redis.call('get', KEYS[1])) or 0 end \
local want = math.max(tonumber(ARGV[3]), math.min(math.floor(left / tonumber(ARGV[4])), tonumber(ARGV[5]))) \
local grant = math.min(want, left) \
if fresh then redis.call('set', KEYS[1], left - grant, 'PX', ttl) \
elseif grant > 0 then redis.call('decrby', KEYS[1], grant) end \
return {grant, left - grant, ttl}";

/// A lease takes at most this share of what is left...
const DIVISOR: u64 = 8;
/// ...and at most this many requests.
const MAX_SLICE: u64 = 1 << 16;

/// The lease word: the tokens left in its low bits, the ms (counter epoch) until which they may be used above.
const TOKEN_BITS: u32 = 24;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;

fn pack(valid_until: u64, tokens: u64) -> u64 {
    // 40 bits of ms hold 34 years; a longer window is cut short there (tokens lost, never extended).
    (valid_until.min((1 << (64 - TOKEN_BITS)) - 1) << TOKEN_BITS) | tokens.min(TOKEN_MASK)
}

/// What a request waiting for a lease gets.
pub(crate) enum Outcome {
    Decided(Quota),
    /// Redis failed or cannot be reached.
    Failed,
    /// The lease ran out before this request's turn but the window has more: lease again.
    Again,
}

/// Where a request stands after looking at the node's lease.
pub(crate) enum Step {
    Decided(Quota),
    /// Await this, then (on [`Outcome::Again`]) look again.
    Wait(oneshot::Receiver<Outcome>),
}

#[derive(Default)]
struct Waiting {
    in_flight: bool,
    waiters: Vec<oneshot::Sender<Outcome>>,
}

/// One Redis key's window as this node leases it.
pub(crate) struct Window {
    key: String,
    count: u64,
    window_ms: u64,
    /// See [`pack`].
    lease: AtomicU64,
    /// What Redis had left after this node's last lease (for `X-RateLimit-Remaining`).
    left: AtomicU64,
    /// Until when (ms) Redis has nothing left: requests are refused without asking.
    empty_until: AtomicU64,
    /// When the window of the last lease ends (ms), for `X-RateLimit-Reset`.
    reset_at: AtomicU64,
    waiting: Mutex<Waiting>,
}

impl Window {
    fn quota(&self, allowed: bool, remaining: u64, now: u64) -> Quota {
        let reset_at = self.reset_at.load(Ordering::Relaxed);
        Quota {
            allowed,
            remaining,
            reset: if reset_at > now {
                (reset_at - now).div_ceil(1000)
            } else {
                self.window_ms.div_ceil(1000)
            },
        }
    }

    /// Admits from the lease when it has a valid token (lock-free); `None` when it has none.
    fn take_local(&self, now: u64) -> Option<Quota> {
        let r = self
            .lease
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let tokens = w & TOKEN_MASK;
                (tokens > 0 && now < w >> TOKEN_BITS).then(|| w - 1)
            });
        r.ok().map(|w| {
            let left = self.left.load(Ordering::Relaxed);
            self.quota(true, left + (w & TOKEN_MASK) - 1, now)
        })
    }

    /// One request: decided locally, or to wait for the lease in flight (started here if none is).
    pub(crate) fn incoming(self: &Arc<Self>, leaser: &Arc<Leaser>) -> Step {
        let now = now_ms();
        if let Some(q) = self.take_local(now) {
            return Step::Decided(q);
        }
        if self.empty_until.load(Ordering::Acquire) > now {
            return Step::Decided(self.quota(false, 0, now));
        }
        let mut w = match self.waiting.lock() {
            Ok(w) => w,
            Err(p) => p.into_inner(),
        };
        // A lease may have landed since the first look (it is stored under this lock).
        if let Some(q) = self.take_local(now) {
            return Step::Decided(q);
        }
        let (tx, rx) = oneshot::channel();
        w.waiters.push(tx);
        if !w.in_flight {
            w.in_flight = true;
            let need = w.waiters.len() as u64;
            drop(w);
            let me = self.clone();
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(SCRIPT)
                .arg(1)
                .arg(&self.key)
                .arg(self.count)
                .arg(self.window_ms)
                .arg(need)
                .arg(DIVISOR)
                .arg(MAX_SLICE);
            let queued = leaser.run(Job {
                cmd,
                done: Box::new(move |answer, sent| me.leased(answer, sent)),
            });
            if !queued {
                self.fail_waiters();
            }
        }
        Step::Wait(rx)
    }

    /// On the Redis thread: the lease's answer (`sent`: when the request left), handed to the waiting requests.
    fn leased(&self, answer: Option<redis::Value>, sent: u64) {
        match answer.and_then(|v| redis::from_redis_value::<(u64, u64, i64)>(&v).ok()) {
            Some((grant, left, ttl)) => {
                let valid_until = sent + u64::try_from(ttl).unwrap_or(0);
                self.granted(grant, left, valid_until);
            }
            None => self.fail_waiters(),
        }
    }

    fn granted(&self, grant: u64, left: u64, valid_until: u64) {
        let now = now_ms();
        let mut w = match self.waiting.lock() {
            Ok(w) => w,
            Err(p) => p.into_inner(),
        };
        let waiters = std::mem::take(&mut w.waiters);
        w.in_flight = false;
        let served = (waiters.len() as u64).min(grant);
        let tokens = grant - served;
        self.left.store(left, Ordering::Relaxed);
        self.reset_at.store(valid_until, Ordering::Relaxed);
        if left == 0 {
            self.empty_until.store(valid_until, Ordering::Release);
        }
        // Whatever the word held is spent or from an ended window: a lease starts only when it is.
        self.lease
            .store(pack(valid_until, tokens), Ordering::Release);
        drop(w);
        for (i, tx) in waiters.into_iter().enumerate() {
            let i = i as u64;
            let outcome = if i < served {
                Outcome::Decided(self.quota(true, left + tokens + (served - 1 - i), now))
            } else if left == 0 {
                Outcome::Decided(self.quota(false, 0, now))
            } else {
                Outcome::Again
            };
            let _ = tx.send(outcome);
        }
    }

    fn fail_waiters(&self) {
        let waiters = {
            let mut w = match self.waiting.lock() {
                Ok(w) => w,
                Err(p) => p.into_inner(),
            };
            w.in_flight = false;
            std::mem::take(&mut w.waiters)
        };
        for tx in waiters {
            let _ = tx.send(Outcome::Failed);
        }
    }

    fn idle(&self, now: u64) -> bool {
        let ended = |a: &AtomicU64| a.load(Ordering::Relaxed) <= now;
        ended(&self.reset_at)
            && ended(&self.empty_until)
            && self.waiting.lock().is_ok_and(|w| !w.in_flight)
    }
}

/// The windows of one Redis backend on this node, by Redis key.
pub(crate) struct Windows {
    pub(crate) leaser: Arc<Leaser>,
    map: RwLock<HashMap<String, Arc<Window>>>,
}

impl Windows {
    /// The window of a Redis key (created on first use; windows whose lease ended are dropped now and then).
    pub(crate) fn window(&self, key: String, count: u64, window_ms: u64) -> Arc<Window> {
        if let Ok(m) = self.map.read() {
            if let Some(w) = m.get(&key) {
                return w.clone();
            }
        }
        let mut m = match self.map.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if m.len() >= 1024 && m.len().is_power_of_two() {
            let now = now_ms();
            m.retain(|_, w| Arc::strong_count(w) > 1 || !w.idle(now));
        }
        m.entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Window {
                    key,
                    count,
                    window_ms,
                    lease: AtomicU64::new(0),
                    left: AtomicU64::new(count),
                    empty_until: AtomicU64::new(0),
                    reset_at: AtomicU64::new(0),
                    waiting: Mutex::default(),
                })
            })
            .clone()
    }
}

/// limit-count's Redis backends on one node (one per [`crate::Shared`]).
#[derive(Default)]
pub(crate) struct RemoteStore {
    leasers: Leasers,
    windows: Mutex<HashMap<usize, Arc<Windows>>>,
}

impl RemoteStore {
    /// The windows of a backend. Compile-time only.
    pub(crate) fn windows(&self, c: crate::redis_sync::Connect) -> Arc<Windows> {
        let leaser = self.leasers.leaser(c, "limit-count");
        let mut m = match self.windows.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        m.entry(Arc::as_ptr(&leaser) as usize)
            .or_insert_with(|| {
                Arc::new(Windows {
                    leaser: leaser.clone(),
                    map: RwLock::default(),
                })
            })
            .clone()
    }
}

/// How long a request may wait for a lease: the Redis timeout for the connect and the script, and a margin.
pub(crate) fn wait_budget(redis_timeout: Duration) -> Duration {
    redis_timeout * 2 + Duration::from_millis(100)
}
