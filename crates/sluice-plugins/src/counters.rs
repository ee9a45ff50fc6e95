//! Lock-free per-key counters shared by every worker thread: limit-count's fixed windows, limit-conn's in-flight
//! counts and limit-req's leaky buckets. Keys are 64-bit hashes of the plugin scope and the request's key; the
//! maps are sharded `RwLock`s taken for reading on the hot path (a write only when a key is first seen), and each
//! counter is one `AtomicU64` updated by compare-and-swap, so counting is exact across threads.
//! Not here: what a key is (the plugins decide) or Redis (policy `redis` is not implemented).

use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use ahash::{AHashMap, RandomState};

const SHARDS: usize = 64;
/// A shard sweeps its expired entries when it grows past this many keys.
const SWEEP_AT: usize = 8192;

struct Sharded<V> {
    shards: Vec<RwLock<AHashMap<u64, V>>>,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl<V> Sharded<V> {
    fn shard(&self, key: u64) -> &RwLock<AHashMap<u64, V>> {
        &self.shards[(key >> 58) as usize % SHARDS]
    }

    /// Runs `f` on the entry for `key`, creating it with `make` (and sweeping with `keep`) when absent.
    fn with<R>(
        &self,
        key: u64,
        make: impl FnOnce() -> V,
        mut keep: impl FnMut(&mut V) -> bool,
        f: impl Fn(&V) -> R,
    ) -> R {
        let shard = self.shard(key);
        if let Ok(m) = shard.read() {
            if let Some(v) = m.get(&key) {
                return f(v);
            }
        }
        let mut m = match shard.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if m.len() >= SWEEP_AT {
            m.retain(|_, v| keep(v));
        }
        f(m.entry(key).or_insert_with(make))
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().map_or(0, |m| m.len()))
            .sum()
    }
}

/// Hashes any key parts into the 64-bit counter key (one process-wide seed).
pub(crate) fn key_hash(parts: impl Hash) -> u64 {
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(RandomState::new).hash_one(parts)
}

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since the process's counter epoch, plus one (so 0 means "never").
pub(crate) fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

/// [`now_ms`] at `t`, a clock read the caller already made (the request's start: no clock read per request).
pub(crate) fn ms_at(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_millis() as u64 + 1
}

/// A window word holds the count in its low 32 bits and the window start in its high 32 bits, in 10 ms ticks
/// since the counter epoch, compared with wrapping arithmetic. So counts up to 4.29e9 fit (APISIX's benchmark
/// configures 2e9), a window opens at most 10 ms before its first request, and windows up to 248 days work.
const COUNT_BITS: u32 = 32;
pub(crate) const MAX_COUNT: u64 = (1 << COUNT_BITS) - 2;
const TICK_MS: u64 = 10;

fn tick(now_ms: u64) -> u32 {
    (now_ms / TICK_MS) as u32
}

/// Milliseconds a window that opened at tick `start` has been open.
fn open_for(start: u32, now_ms: u64) -> u64 {
    u64::from(tick(now_ms).wrapping_sub(start)) * TICK_MS
}

struct Window {
    word: AtomicU64,
    len_ms: u64,
}

/// What a counted request learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub allowed: bool,
    pub remaining: u64,
    /// Seconds until the window resets.
    pub reset: u64,
}

/// limit-count's fixed windows: the first request opens a window of `time_window` seconds, as
/// lua-resty-limit-count does.
#[derive(Default)]
pub(crate) struct WindowStore(Sharded<Window>);

impl WindowStore {
    #[cfg(test)]
    pub(crate) fn incoming(&self, key: u64, limit: u64, window_ms: u64, cost: u64) -> Quota {
        self.incoming_at(now_ms(), key, limit, window_ms, cost)
    }

    /// [`WindowStore::incoming`] at `now` ([`now_ms`] or [`ms_at`]).
    pub(crate) fn incoming_at(
        &self,
        now: u64,
        key: u64,
        limit: u64,
        window_ms: u64,
        cost: u64,
    ) -> Quota {
        self.0.with(
            key,
            || Window {
                word: AtomicU64::new(0),
                len_ms: window_ms,
            },
            |w| {
                let word = w.word.load(Ordering::Relaxed);
                word != 0 && open_for((word >> COUNT_BITS) as u32, now) < w.len_ms
            },
            |w| {
                let mut cur = w.word.load(Ordering::Acquire);
                loop {
                    let (mut start, mut used) =
                        ((cur >> COUNT_BITS) as u32, cur & ((1 << COUNT_BITS) - 1));
                    if cur == 0 || open_for(start, now) >= window_ms {
                        start = tick(now);
                        used = 0;
                    }
                    let reset = (window_ms - open_for(start, now)).div_ceil(1000);
                    if used + cost > limit {
                        return Quota {
                            allowed: false,
                            remaining: 0,
                            reset,
                        };
                    }
                    let next = (u64::from(start) << COUNT_BITS) | (used + cost);
                    match w.word.compare_exchange_weak(
                        cur,
                        next,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            return Quota {
                                allowed: true,
                                remaining: limit - used - cost,
                                reset,
                            }
                        }
                        Err(now_word) => cur = now_word,
                    }
                }
            },
        )
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// limit-conn's in-flight counts.
#[derive(Default)]
pub(crate) struct ConnStore(Sharded<Arc<AtomicI64>>);

impl ConnStore {
    /// Counts one more request in flight under `key`; returns the counter and the new count.
    pub(crate) fn enter(&self, key: u64) -> (Arc<AtomicI64>, i64) {
        self.0.with(
            key,
            || Arc::new(AtomicI64::new(0)),
            |c| Arc::strong_count(c) > 1 || c.load(Ordering::Relaxed) != 0,
            |c| {
                let n = c.fetch_add(1, Ordering::AcqRel) + 1;
                (c.clone(), n)
            },
        )
    }
}

/// Units of a request in a leaky bucket's excess (1/256 request).
const UNIT: u64 = 256;
const EXCESS_BITS: u32 = 24;

/// limit-req's leaky buckets (lua-resty-limit-req): excess drains at `rate` per second.
#[derive(Default)]
pub(crate) struct BucketStore(Sharded<AtomicU64>);

/// A leaky-bucket decision: `Err(())` rejects; `Ok(delay_ms)` admits after that delay.
pub(crate) type Leak = Result<u64, ()>;

impl BucketStore {
    /// `rate` and `burst` in requests per second; the delay is what APISIX would sleep before proxying.
    pub(crate) fn incoming(&self, key: u64, rate: f64, burst: f64) -> Leak {
        let now = now_ms();
        self.0.with(
            key,
            || AtomicU64::new(0),
            |w| (w.load(Ordering::Relaxed) >> EXCESS_BITS) + 60_000 > now,
            |w| leak(w, now, rate, burst),
        )
    }
}

/// One leaky-bucket step on a bucket word (last request ms << 24 | excess in 1/256 requests; 0: never used).
pub(crate) fn leak(w: &AtomicU64, now: u64, rate: f64, burst: f64) -> Leak {
    let max_excess = ((1u64 << EXCESS_BITS) - 1) as f64;
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let (last, excess) = (cur >> EXCESS_BITS, cur & ((1 << EXCESS_BITS) - 1));
        let elapsed = if last == 0 {
            0
        } else {
            now.saturating_sub(last)
        };
        let drained = rate * UNIT as f64 * elapsed as f64 / 1000.0;
        let next_excess = if last == 0 {
            0.0
        } else {
            (excess as f64 - drained + UNIT as f64).max(0.0)
        };
        if next_excess > burst * UNIT as f64 {
            return Err(());
        }
        let stored = next_excess.min(max_excess) as u64;
        let next = (now << EXCESS_BITS) | stored;
        if w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Ok((next_excess / UNIT as f64 / rate * 1000.0) as u64);
        }
        cur = w.load(Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_counts_exactly_across_threads() {
        let store = Arc::new(WindowStore::default());
        let allowed = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, a) = (store.clone(), allowed.clone());
                std::thread::spawn(move || {
                    for _ in 0..5000 {
                        if s.incoming(7, 10_000, 60_000, 1).allowed {
                            a.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(allowed.load(Ordering::Relaxed), 10_000);
        let q = store.incoming(7, 10_000, 60_000, 1);
        assert!(!q.allowed);
        assert!(q.reset >= 59 && q.reset <= 60, "{q:?}");
    }

    #[test]
    fn counts_beyond_32_million_as_apisix_benchmarks_configure() {
        let store = WindowStore::default();
        let q = store.incoming(5, 2_000_000_000, 60_000, 1);
        assert!(q.allowed);
        assert_eq!(q.remaining, 1_999_999_999);
        let q = store.incoming(5, 2_000_000_000, 60_000, 1_000_000_000);
        assert_eq!(q.remaining, 999_999_999);
        assert!(
            !store
                .incoming(5, 2_000_000_000, 60_000, 1_000_000_000)
                .allowed
        );
    }

    #[test]
    fn open_for_survives_tick_wraparound() {
        let start = u32::MAX - 1; // two ticks before the wrap
        assert_eq!(open_for(start, 3 * TICK_MS), 5 * TICK_MS);
    }

    #[test]
    fn window_reopens_after_its_length() {
        let store = WindowStore::default();
        assert_eq!(store.incoming(1, 1, 50, 1).remaining, 0);
        assert!(!store.incoming(1, 1, 50, 1).allowed);
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(store.incoming(1, 1, 50, 1).allowed);
    }

    #[test]
    fn bucket_rejects_beyond_burst() {
        let store = BucketStore::default();
        // rate 1/s, burst 2: the first request passes undelayed, two more queue, the fourth is rejected.
        assert_eq!(store.incoming(3, 1.0, 2.0), Ok(0));
        assert!(store.incoming(3, 1.0, 2.0).is_ok());
        assert!(store.incoming(3, 1.0, 2.0).is_ok());
        assert_eq!(store.incoming(3, 1.0, 2.0), Err(()));
    }

    #[test]
    fn conn_counts_in_flight() {
        let store = ConnStore::default();
        let (a, n) = store.enter(9);
        assert_eq!(n, 1);
        let (_b, n) = store.enter(9);
        assert_eq!(n, 2);
        a.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(store.enter(9).1, 2);
    }
}
