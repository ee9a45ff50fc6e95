//! The batch processor every logger shares: APISIX's `apisix/utils/batch-processor.lua` and
//! `batch-processor-manager.lua`, off the worker threads.
//!
//! - Schema: each logger's schema gets `name`, `batch_max_size` (1000), `inactive_timeout` (5 s),
//!   `buffer_duration` (60 s), `max_retry_count` (0) and `retry_delay` (1 s) unless it declares them itself
//!   ([`wrap_schema`]); `name` defaults to the logger's label ("http logger", "kafka logger", ...).
//! - A batch is sent when it holds `batch_max_size` entries, when `inactive_timeout` seconds passed since the last
//!   entry, or `buffer_duration` seconds since the first one; a batch of size one goes out at once. The sink gets
//!   the whole batch in one call (one HTTP POST, one Kafka message, one TCP write...). A failed batch is retried
//!   `max_retry_count` times, `retry_delay` seconds apart, then dropped (and counted).
//! - Back-pressure: per plugin at most `max_pending_entries` entries (plugin_metadata, default 8192, APISIX's
//!   manager) are waiting or being sent; past that a new entry is dropped and counted, never waited for. The log
//!   phase only bumps two atomics and hands the entry to a bounded channel ([`Queue::push`]).
//! - One thread per distinct configuration (APISIX keeps one processor per configuration version) owns the buffer,
//!   the timers and the sink; it ends, after sending what it holds, when no snapshot uses that configuration.
//!   While it waits out a `retry_delay` new entries wait in the channel (still bounded by `max_pending_entries`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::CompileEnv;

/// APISIX's `DEFAULT_MAX_PENDING_ENTRIES`.
pub(crate) const DEFAULT_MAX_PENDING: usize = 8192;
/// The channel's own bound (the pending count is the real limit; this only caps what is allocated up front).
const CHANNEL_CAP: usize = 16_384;

/// Adds the batch processor's properties to a plugin schema, leaving those the plugin declares itself, and sets
/// `name`'s default to `label` (APISIX's `wrap_schema`).
pub(crate) fn wrap_schema(mut schema: Value, label: &str) -> Value {
    let bp = json!({
        "name": {"type": "string", "default": label},
        "max_retry_count": {"type": "integer", "minimum": 0, "default": 0},
        "retry_delay": {"type": "integer", "minimum": 0, "default": 1},
        "buffer_duration": {"type": "integer", "minimum": 1, "default": 60},
        "inactive_timeout": {"type": "integer", "minimum": 1, "default": 5},
        "batch_max_size": {"type": "integer", "minimum": 1, "default": 1000}
    });
    if let (Some(props), Value::Object(bp)) = (
        schema.get_mut("properties").and_then(Value::as_object_mut),
        bp,
    ) {
        for (k, v) in bp {
            props.entry(k).or_insert(v);
        }
        if let Some(n) = props.get_mut("name") {
            n["default"] = json!(label);
        }
    }
    schema
}

/// A processor's settings, read from a checked plugin configuration.
#[derive(Clone, Debug)]
pub(crate) struct BatchConf {
    pub name: String,
    pub batch_max_size: usize,
    pub inactive_timeout: Duration,
    pub buffer_duration: Duration,
    pub max_retry_count: u32,
    pub retry_delay: Duration,
}

impl BatchConf {
    /// From a configuration already checked against a [`wrap_schema`]ed schema (absent fields take the defaults).
    pub(crate) fn from_conf(v: &Value, label: &str) -> BatchConf {
        let int = |k: &str, d: u64| v.get(k).and_then(Value::as_u64).unwrap_or(d);
        BatchConf {
            name: v
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or(label)
                .to_owned(),
            batch_max_size: int("batch_max_size", 1000).max(1) as usize,
            inactive_timeout: Duration::from_secs(int("inactive_timeout", 5).max(1)),
            buffer_duration: Duration::from_secs(int("buffer_duration", 60).max(1)),
            max_retry_count: int("max_retry_count", 0).min(u64::from(u32::MAX)) as u32,
            retry_delay: Duration::from_secs(int("retry_delay", 1)),
        }
    }
}

/// Where a processor sends its batches. Runs on the processor's own thread, so it may block (bounded by its own
/// timeouts).
pub(crate) trait Sink: Send + 'static {
    /// Sends one batch; `batch_max_size` lets a sink frame a batch of one as APISIX does (a single object rather
    /// than an array).
    fn send(&mut self, entries: &[Value], batch_max_size: usize) -> Result<(), String>;
}

/// Counts of one plugin's entries, for diagnostics and tests.
#[derive(Default, Debug)]
pub struct LogStats {
    /// Entries accepted into a processor.
    pub pushed: AtomicU64,
    /// Entries refused because `max_pending_entries` were already waiting.
    pub discarded: AtomicU64,
    /// Entries delivered.
    pub sent: AtomicU64,
    /// Entries dropped after `max_retry_count` failed retries.
    pub failed: AtomicU64,
    /// Batches delivered.
    pub batches: AtomicU64,
    /// Failed send attempts (each retry counts).
    pub errors: AtomicU64,
    /// Entries accepted and not yet delivered or dropped.
    pending: AtomicUsize,
    /// Seconds (since the process's clock origin) of the last "discarding" log line.
    last_discard_log: AtomicU64,
}

impl LogStats {
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// The log phase's handle on a processor: held by every compiled plugin instance using that configuration.
pub(crate) struct Queue {
    tx: SyncSender<Value>,
    stats: Arc<LogStats>,
    limit: usize,
    plugin: &'static str,
}

impl Queue {
    /// Hands `e` to the processor, or drops it (counted) when the plugin's backlog is full. Never blocks.
    pub(crate) fn push(&self, e: Value) {
        let s = &*self.stats;
        if s.pending.fetch_add(1, Ordering::Relaxed) >= self.limit {
            s.pending.fetch_sub(1, Ordering::Relaxed);
            self.discard();
            return;
        }
        match self.tx.try_send(e) {
            Ok(()) => {
                s.pushed.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                s.pending.fetch_sub(1, Ordering::Relaxed);
                self.discard();
            }
        }
    }

    #[cold]
    fn discard(&self) {
        let s = &*self.stats;
        s.discarded.fetch_add(1, Ordering::Relaxed);
        // One line per second at most: a line per dropped entry would flood the log during the outage itself.
        let now = clock_secs();
        let last = s.last_discard_log.load(Ordering::Relaxed);
        if now > last
            && s.last_discard_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::error!(
                plugin = self.plugin,
                max_pending_entries = self.limit,
                discarded = s.discarded.load(Ordering::Relaxed),
                "max pending entries limit exceeded. discarding entry"
            );
        }
    }
}

fn clock_secs() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs() + 1
}

/// Every logger's processors and counts; lives in [`crate::Shared`], so a reload keeps processors whose
/// configuration did not change (and their buffered entries).
#[derive(Default)]
pub struct Processors {
    queues: Mutex<HashMap<String, Weak<Queue>>>,
    stats: Mutex<HashMap<&'static str, Arc<LogStats>>>,
}

impl Processors {
    /// The counts of `plugin`'s processors (zeros when it never ran).
    pub fn stats(&self, plugin: &'static str) -> Arc<LogStats> {
        self.stats
            .lock()
            .map(|mut m| m.entry(plugin).or_default().clone())
            .unwrap_or_default()
    }

    /// The processor for `plugin` with configuration `conf` (its JSON text is the key, as APISIX keys by
    /// configuration version), started with the sink `make_sink` builds when there is none yet.
    pub(crate) fn queue(
        &self,
        plugin: &'static str,
        conf: &Value,
        label: &str,
        env: &CompileEnv<'_>,
        make_sink: impl FnOnce() -> Result<Box<dyn Sink>, String>,
    ) -> Result<Arc<Queue>, String> {
        let limit = env
            .metadata(plugin)
            .and_then(|m| m.get("max_pending_entries"))
            .and_then(Value::as_u64)
            .filter(|&n| n >= 1)
            .map_or(DEFAULT_MAX_PENDING, |n| n.min(usize::MAX as u64) as usize);
        let key = format!("{plugin}\0{limit}\0{conf}");
        let mut m = self
            .queues
            .lock()
            .map_err(|_| "batch processors poisoned")?;
        if let Some(q) = m.get(&key).and_then(Weak::upgrade) {
            return Ok(q);
        }
        m.retain(|_, w| w.strong_count() > 0);
        let bc = BatchConf::from_conf(conf, label);
        let sink = make_sink()?;
        let stats = self.stats(plugin);
        let (tx, rx) = sync_channel::<Value>(limit.min(CHANNEL_CAP));
        let st = stats.clone();
        std::thread::Builder::new()
            .name(format!("sluice-{plugin}"))
            .spawn(move || run(rx, bc, sink, st))
            .map_err(|e| e.to_string())?;
        let q = Arc::new(Queue {
            tx,
            stats,
            limit,
            plugin,
        });
        m.insert(key, Arc::downgrade(&q));
        Ok(q)
    }
}

/// The processor thread: buffers entries, sends batches by size, inactivity and age, retries, and exits (after
/// sending what it holds) when its last [`Queue`] is gone.
fn run(rx: Receiver<Value>, c: BatchConf, mut sink: Box<dyn Sink>, stats: Arc<LogStats>) {
    let mut buf: Vec<Value> = Vec::with_capacity(c.batch_max_size.min(1024));
    let mut first = Instant::now();
    let mut last = first;
    loop {
        let got = if buf.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            let due = (last + c.inactive_timeout).min(first + c.buffer_duration);
            rx.recv_timeout(due.saturating_duration_since(Instant::now()))
        };
        match got {
            Ok(e) => {
                let now = Instant::now();
                if buf.is_empty() {
                    first = now;
                }
                last = now;
                buf.push(e);
                if buf.len() >= c.batch_max_size {
                    flush(&c, &mut *sink, &mut buf, &stats);
                }
            }
            Err(RecvTimeoutError::Timeout) => flush(&c, &mut *sink, &mut buf, &stats),
            Err(RecvTimeoutError::Disconnected) => {
                flush(&c, &mut *sink, &mut buf, &stats);
                return;
            }
        }
    }
}

fn flush(c: &BatchConf, sink: &mut dyn Sink, buf: &mut Vec<Value>, stats: &LogStats) {
    if buf.is_empty() {
        return;
    }
    let n = buf.len();
    let mut retries = 0u32;
    loop {
        match sink.send(buf, c.batch_max_size) {
            Ok(()) => {
                stats.sent.fetch_add(n as u64, Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Err(e) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(name = %c.name, error = %e, "Batch Processor failed to process entries");
                retries += 1;
                if retries > c.max_retry_count {
                    tracing::error!(name = %c.name, max_retry_count = c.max_retry_count,
                        entries = n, "Batch Processor exceeded the max_retry_count, dropping the entries");
                    stats.failed.fetch_add(n as u64, Ordering::Relaxed);
                    break;
                }
                std::thread::sleep(c.retry_delay);
            }
        }
    }
    stats.pending.fetch_sub(n, Ordering::Relaxed);
    buf.clear();
}

/// APISIX's framing of a batch for the loggers that send JSON: one entry alone when `batch_max_size` is 1, else
/// an array (`core.json.encode(entries)`).
pub(crate) fn encode_batch(entries: &[Value], batch_max_size: usize) -> String {
    if batch_max_size == 1 && entries.len() == 1 {
        entries[0].to_string()
    } else {
        let mut s = String::with_capacity(entries.len() * 512);
        s.push('[');
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&e.to_string());
        }
        s.push(']');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    type Seen = Arc<Mutex<Vec<Vec<Value>>>>;

    struct Rec(Seen, Arc<AtomicBool>);
    impl Sink for Rec {
        fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
            self.0.lock().unwrap().push(entries.to_vec());
            if self.1.load(Ordering::Relaxed) {
                Err("sink down".into())
            } else {
                Ok(())
            }
        }
    }

    fn start(conf: Value, fail: bool) -> (Arc<Queue>, Seen, Arc<LogStats>) {
        let seen: Seen = Arc::default();
        let stats = Arc::new(LogStats::default());
        let (tx, rx) = sync_channel(64);
        let bc = BatchConf::from_conf(&conf, "test logger");
        let sink = Box::new(Rec(seen.clone(), Arc::new(AtomicBool::new(fail))));
        let st = stats.clone();
        std::thread::spawn(move || run(rx, bc, sink, st));
        let q = Arc::new(Queue {
            tx,
            stats: stats.clone(),
            limit: 4,
            plugin: "test",
        });
        (q, seen, stats)
    }

    fn wait(f: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !f() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn schema_defaults_and_plugin_overrides() {
        let s = wrap_schema(
            json!({"type": "object", "properties": {"name": {"type": "string"},
                   "batch_max_size": {"type": "integer", "default": 7}}}),
            "kafka logger",
        );
        assert_eq!(s["properties"]["name"]["default"], "kafka logger");
        assert_eq!(s["properties"]["batch_max_size"]["default"], 7);
        assert_eq!(s["properties"]["inactive_timeout"]["default"], 5);
        assert_eq!(s["properties"]["buffer_duration"]["minimum"], 1);
        assert_eq!(s["properties"]["retry_delay"]["minimum"], 0);
        let c = BatchConf::from_conf(&json!({}), "x");
        assert_eq!(
            (c.name.as_str(), c.batch_max_size, c.max_retry_count),
            ("x", 1000, 0)
        );
    }

    #[test]
    fn full_batches_go_at_once_and_the_rest_after_inactivity() {
        let (q, seen, stats) = start(json!({"batch_max_size": 2, "inactive_timeout": 1}), false);
        for i in 0..3 {
            q.push(json!(i));
        }
        wait(|| seen.lock().unwrap().len() == 1);
        assert_eq!(seen.lock().unwrap()[0], vec![json!(0), json!(1)]);
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "third entry waits for inactive_timeout"
        );
        wait(|| seen.lock().unwrap().len() == 2);
        assert_eq!(seen.lock().unwrap()[1], vec![json!(2)]);
        assert_eq!(stats.sent.load(Ordering::Relaxed), 3);
        assert_eq!(stats.batches.load(Ordering::Relaxed), 2);
        assert_eq!(stats.pending(), 0);
    }

    #[test]
    fn failures_retry_then_drop_and_the_backlog_is_bounded() {
        let (q, seen, stats) = start(
            json!({"batch_max_size": 2, "max_retry_count": 2, "retry_delay": 0}),
            true,
        );
        q.push(json!(1));
        q.push(json!(2));
        wait(|| stats.failed.load(Ordering::Relaxed) == 2);
        // One try and two retries of the same batch, then dropped.
        assert_eq!(seen.lock().unwrap().len(), 3);
        assert_eq!(stats.errors.load(Ordering::Relaxed), 3);
        assert_eq!(stats.pending(), 0);
        // The limit (4 here) bounds entries waiting or in flight; the rest are discarded at once.
        let (q, _seen, stats) = start(
            json!({"batch_max_size": 1000, "inactive_timeout": 60}),
            false,
        );
        for i in 0..10 {
            q.push(json!(i));
        }
        assert_eq!(stats.pushed.load(Ordering::Relaxed), 4);
        assert_eq!(stats.discarded.load(Ordering::Relaxed), 6);
        // Dropping the last handle sends what is buffered.
        drop(q);
        wait(|| stats.sent.load(Ordering::Relaxed) == 4);
        assert_eq!(stats.sent.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn batch_of_one_is_a_single_object() {
        assert_eq!(encode_batch(&[json!({"a": 1})], 1), r#"{"a":1}"#);
        assert_eq!(encode_batch(&[json!({"a": 1})], 5), r#"[{"a":1}]"#);
        assert_eq!(encode_batch(&[json!(1), json!(2)], 5), "[1,2]");
    }
}
