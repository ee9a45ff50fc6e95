//! Live traffic counters for the dashboard (`GET /apisix/admin/stats`), kept whether or not any route enables
//! prometheus. IO-free: the proxy records, its timers move data between the pieces.
//!
//! - [`Local`]: one per worker thread, owned by it (no lock, no atomic). A request adds to its route's and its
//!   node's [`Counters`], found by the address of the route's and node's id `Arc` (a one-entry cache, then a hash
//!   probe); the entry keeps a clone of that `Arc`, so the address cannot be reused by another id while counted.
//!   Only routes and nodes with traffic in the current second take space.
//! - Once a second each worker hands its table over ([`Local::take`] → [`Hub::submit`]: one short lock per worker
//!   per second) and starts the next one empty.
//! - [`Hub::close_second`] merges what the workers handed over into one [`Sample`] (totals, per route, per service,
//!   per node, with p50/p99 from the merged histograms) and keeps the last [`RING`] samples.
//!
//! Keys are resource ids, not compiled indices, so the series survive configuration changes. Bounded: a worker
//! counts at most [`LOCAL_CAP`] routes and nodes per second (requests beyond go to the total only), and a sample
//! keeps the top [`TOP_KEYS`] routes, services and nodes by requests.

mod hist;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ahash::AHashMap;
use serde_json::{json, Map, Value};

pub use hist::Histogram;

/// Seconds of history kept.
pub const RING: usize = 900;
/// Routes (and nodes) a worker counts separately per second.
pub const LOCAL_CAP: usize = 4096;
/// Routes, services and nodes kept per sample, by requests.
pub const TOP_KEYS: usize = 100;

/// What one finished request contributes.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub latency: Duration,
    /// The upstream's time, only for a request that reached one.
    pub upstream: Option<Duration>,
}

/// One key's counters over one second.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub req: u64,
    /// 1xx..5xx.
    pub class: [u64; 5],
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub latency: Histogram,
    pub upstream: Histogram,
}

/// A [`Record`] reduced once to what each counter update needs: status class, histogram buckets.
#[derive(Debug, Clone, Copy)]
struct Point {
    class: usize,
    bytes_in: u64,
    bytes_out: u64,
    latency: usize,
    /// `usize::MAX`: the request reached no upstream.
    upstream: usize,
}

impl Point {
    #[inline]
    fn of(r: &Record) -> Point {
        Point {
            class: usize::from(r.status / 100).clamp(1, 5) - 1,
            bytes_in: r.bytes_in,
            bytes_out: r.bytes_out,
            latency: hist::bucket(hist::micros(r.latency)),
            upstream: r
                .upstream
                .map_or(usize::MAX, |u| hist::bucket(hist::micros(u))),
        }
    }
}

impl Counters {
    pub fn add(&mut self, r: &Record) {
        self.add_point(&Point::of(r));
    }

    #[inline]
    fn add_point(&mut self, p: &Point) {
        self.req = self.req.wrapping_add(1);
        if let Some(c) = self.class.get_mut(p.class) {
            *c = c.wrapping_add(1);
        }
        self.bytes_in = self.bytes_in.wrapping_add(p.bytes_in);
        self.bytes_out = self.bytes_out.wrapping_add(p.bytes_out);
        self.latency.record_bucket(p.latency);
        self.upstream.record_bucket(p.upstream);
    }

    pub fn merge(&mut self, o: &Counters) {
        self.req += o.req;
        for (a, b) in self.class.iter_mut().zip(o.class) {
            *a += b;
        }
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.latency.merge(&o.latency);
        self.upstream.merge(&o.upstream);
    }

    pub fn stat(&self) -> Stat {
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Stat {
            req: n(self.req),
            class: self.class.map(n),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            lat: [
                self.latency.quantile_ms(0.5) as f32,
                self.latency.quantile_ms(0.99) as f32,
                self.upstream.quantile_ms(0.5) as f32,
                self.upstream.quantile_ms(0.99) as f32,
            ],
        }
    }
}

/// One key's second as kept in the ring (72 bytes with its key).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stat {
    pub req: u32,
    pub class: [u32; 5],
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// p50, p99 of the whole request; p50, p99 of the upstream's part (ms; 0 without such requests).
    pub lat: [f32; 4],
}

impl Stat {
    pub fn to_json(&self) -> Value {
        // Three decimals (microseconds) are what the histogram resolves, and keep the JSON short.
        let ms = |v: f32| (f64::from(v) * 1000.0).round() / 1000.0;
        json!({
            "req": self.req,
            "s1xx": self.class[0], "s2xx": self.class[1], "s3xx": self.class[2],
            "s4xx": self.class[3], "s5xx": self.class[4],
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "lat_p50": ms(self.lat[0]), "lat_p99": ms(self.lat[1]),
            "up_p50": ms(self.lat[2]), "up_p99": ms(self.lat[3]),
        })
    }
}

/// Counters by key for one second, keyed by the address of the key's `Arc<str>`.
struct Table<E> {
    entries: Vec<E>,
    index: AHashMap<usize, u32>,
    /// The last key looked up and its entry: keep-alive traffic to one route skips the hash probe.
    last: (usize, u32),
}

impl<E> Default for Table<E> {
    fn default() -> Self {
        Table {
            entries: Vec::new(),
            index: AHashMap::new(),
            last: (0, u32::MAX),
        }
    }
}

impl<E> Table<E> {
    /// The entry of `key`, made by `make` on first use; `None` once the table holds [`LOCAL_CAP`] keys.
    #[inline(always)]
    fn get(&mut self, key: usize, make: impl FnOnce() -> E) -> Option<&mut E> {
        let i = if self.last.0 == key {
            self.last.1
        } else {
            let i = match self.index.get(&key) {
                Some(&i) => i,
                None => {
                    if self.entries.len() >= LOCAL_CAP {
                        return None;
                    }
                    self.entries.push(make());
                    let i = (self.entries.len() - 1) as u32;
                    self.index.insert(key, i);
                    i
                }
            };
            self.last = (key, i);
            i
        };
        self.entries.get_mut(i as usize)
    }

    /// This second's entries; the next second starts with room for as many, so steady traffic never grows the
    /// table on the request path.
    fn take(&mut self) -> Vec<E> {
        self.index.clear();
        self.last = (0, u32::MAX);
        let room = self.entries.len();
        std::mem::replace(&mut self.entries, Vec::with_capacity(room))
    }
}

fn key_of(k: &Arc<str>) -> usize {
    Arc::as_ptr(k) as *const u8 as usize
}

pub struct RouteEntry {
    pub id: Arc<str>,
    pub service: Option<Arc<str>>,
    pub counters: Counters,
}

pub struct NodeEntry {
    pub addr: Arc<str>,
    pub counters: Counters,
}

/// One worker's counters for the current second. Not `Sync`: its worker alone records into it.
#[derive(Default)]
pub struct Local {
    routes: Table<RouteEntry>,
    nodes: Table<NodeEntry>,
    /// Requests with no route (404, bad requests) or beyond the route cap: in the total only.
    other: Counters,
    dirty: bool,
}

impl Local {
    /// A request served by the route `id` (of service `service`), through `node` when it reached an upstream.
    /// Inlined into the proxy's one call site: the call itself cost a fifth of it.
    #[inline(always)]
    pub fn record(
        &mut self,
        route: Option<(&Arc<str>, Option<&Arc<str>>)>,
        node: Option<&Arc<str>>,
        r: &Record,
    ) {
        self.dirty = true;
        let p = Point::of(r);
        let counted = match route {
            Some((id, service)) => match self.routes.get(key_of(id), || RouteEntry {
                id: id.clone(),
                service: service.cloned(),
                counters: Counters::default(),
            }) {
                Some(e) => {
                    e.counters.add_point(&p);
                    true
                }
                None => false,
            },
            None => false,
        };
        if !counted {
            self.other.add_point(&p);
        }
        if let Some(n) = node {
            if let Some(e) = self.nodes.get(key_of(n), || NodeEntry {
                addr: n.clone(),
                counters: Counters::default(),
            }) {
                e.counters.add_point(&p);
            }
        }
    }

    /// This second's counters, leaving the table empty; `None` when nothing was recorded.
    pub fn take(&mut self) -> Option<Batch> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        Some(Batch {
            routes: self.routes.take(),
            nodes: self.nodes.take(),
            other: std::mem::take(&mut self.other),
        })
    }
}

/// One worker's second, handed to the [`Hub`].
pub struct Batch {
    pub routes: Vec<RouteEntry>,
    pub nodes: Vec<NodeEntry>,
    pub other: Counters,
}

/// One second of the whole process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Unix seconds.
    pub t: u64,
    pub total: Stat,
    pub routes: Vec<(Arc<str>, Stat)>,
    pub services: Vec<(Arc<str>, Stat)>,
    pub nodes: Vec<(Arc<str>, Stat)>,
}

impl Sample {
    /// `{"t", "total", "routes": {id: stat}, "services": {..}, "nodes": {"host:port": ..}}`.
    pub fn to_json(&self) -> Value {
        let map = |v: &[(Arc<str>, Stat)]| {
            Value::Object(
                v.iter()
                    .map(|(k, s)| (k.to_string(), s.to_json()))
                    .collect::<Map<String, Value>>(),
            )
        };
        json!({
            "t": self.t,
            "total": self.total.to_json(),
            "routes": map(&self.routes),
            "services": map(&self.services),
            "nodes": map(&self.nodes),
        })
    }
}

/// Where workers hand their seconds over and where the closed seconds are kept.
#[derive(Default)]
pub struct Hub {
    inbox: Mutex<Vec<Batch>>,
    ring: Mutex<VecDeque<Arc<Sample>>>,
}

impl Hub {
    pub fn submit(&self, b: Batch) {
        if let Ok(mut inbox) = self.inbox.lock() {
            inbox.push(b);
        }
    }

    /// Closes second `t` with everything handed over since the last close (a worker that was late counts in
    /// the next second: counts are never dropped). Seconds skipped since the last close are filled as idle, so
    /// the ring has one sample per second.
    pub fn close_second(&self, t: u64) -> Arc<Sample> {
        let batches = self
            .inbox
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        let sample = Arc::new(merge(t, batches));
        if let Ok(mut ring) = self.ring.lock() {
            let last = ring.back().map(|s| s.t);
            if let Some(last) = last {
                if t <= last {
                    // The clock went back: keep the series ordered by replacing nothing, appending after.
                    let fixed = Arc::new(Sample {
                        t: last + 1,
                        ..(*sample).clone()
                    });
                    push(&mut ring, fixed.clone());
                    return fixed;
                }
                let gap = (t - last - 1).min(RING as u64);
                for g in 0..gap {
                    push(
                        &mut ring,
                        Arc::new(Sample {
                            t: t - gap + g,
                            ..Sample::default()
                        }),
                    );
                }
            }
            push(&mut ring, sample.clone());
        }
        sample
    }

    /// The last `seconds` samples, oldest first.
    pub fn series(&self, seconds: usize) -> Vec<Arc<Sample>> {
        let Ok(ring) = self.ring.lock() else {
            return Vec::new();
        };
        let skip = ring.len().saturating_sub(seconds);
        ring.iter().skip(skip).cloned().collect()
    }
}

fn push(ring: &mut VecDeque<Arc<Sample>>, s: Arc<Sample>) {
    if ring.len() >= RING {
        ring.pop_front();
    }
    ring.push_back(s);
}

fn merge(t: u64, batches: Vec<Batch>) -> Sample {
    let mut total = Counters::default();
    let mut routes: AHashMap<Arc<str>, Counters> = AHashMap::new();
    let mut services: AHashMap<Arc<str>, Counters> = AHashMap::new();
    let mut nodes: AHashMap<Arc<str>, Counters> = AHashMap::new();
    for b in batches {
        total.merge(&b.other);
        for e in b.routes {
            total.merge(&e.counters);
            if let Some(s) = e.service {
                services.entry(s).or_default().merge(&e.counters);
            }
            match routes.get_mut(&e.id) {
                Some(c) => c.merge(&e.counters),
                None => {
                    routes.insert(e.id, e.counters);
                }
            }
        }
        for e in b.nodes {
            match nodes.get_mut(&e.addr) {
                Some(c) => c.merge(&e.counters),
                None => {
                    nodes.insert(e.addr, e.counters);
                }
            }
        }
    }
    Sample {
        t,
        total: total.stat(),
        routes: top(routes),
        services: top(services),
        nodes: top(nodes),
    }
}

/// The [`TOP_KEYS`] keys with the most requests (ties by key, so the choice is stable).
fn top(m: AHashMap<Arc<str>, Counters>) -> Vec<(Arc<str>, Stat)> {
    let mut v: Vec<(Arc<str>, &Counters)> = m.iter().map(|(k, c)| (k.clone(), c)).collect();
    v.sort_by(|a, b| b.1.req.cmp(&a.1.req).then_with(|| a.0.cmp(&b.0)));
    v.truncate(TOP_KEYS);
    v.into_iter().map(|(k, c)| (k, c.stat())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(status: u16, ms: u64, up: Option<u64>) -> Record {
        Record {
            status,
            bytes_in: 10,
            bytes_out: 100,
            latency: Duration::from_millis(ms),
            upstream: up.map(Duration::from_millis),
        }
    }

    #[test]
    fn workers_merge_by_id_not_by_arc() {
        let hub = Hub::default();
        let (r1a, r1b): (Arc<str>, Arc<str>) = (Arc::from("1"), Arc::from("1"));
        let svc: Arc<str> = Arc::from("s");
        let node: Arc<str> = Arc::from("127.0.0.1:80");
        let mut w1 = Local::default();
        let mut w2 = Local::default();
        for _ in 0..3 {
            w1.record(Some((&r1a, Some(&svc))), Some(&node), &rec(200, 2, Some(1)));
        }
        // The same route id compiled again (another snapshot): another Arc, the same key in the sample.
        w2.record(Some((&r1b, Some(&svc))), Some(&node), &rec(502, 4, None));
        w2.record(None, None, &rec(404, 1, None));
        hub.submit(w1.take().expect("recorded"));
        hub.submit(w2.take().expect("recorded"));
        assert!(w1.take().is_none(), "a taken table starts empty");
        let s = hub.close_second(100);
        assert_eq!(s.total.req, 5);
        assert_eq!(s.total.class, [0, 3, 0, 1, 1]);
        assert_eq!(s.total.bytes_in, 50);
        assert_eq!(s.routes.len(), 1);
        assert_eq!(&*s.routes[0].0, "1");
        assert_eq!(s.routes[0].1.req, 4);
        assert_eq!(s.services[0].1.req, 4);
        assert_eq!(s.nodes[0].1.req, 4);
        // Upstream latency only from the three that reached the upstream.
        assert!((0.875..=1.125).contains(&s.routes[0].1.lat[2]));
        let j = s.to_json();
        assert_eq!(j["routes"]["1"]["s5xx"], 1);
        assert_eq!(j["total"]["s4xx"], 1);
        assert_eq!(j["nodes"]["127.0.0.1:80"]["req"], 4);
    }

    #[test]
    fn ring_is_bounded_and_gap_filled() {
        let hub = Hub::default();
        hub.close_second(10);
        hub.close_second(13);
        let ts: Vec<u64> = hub.series(10).iter().map(|s| s.t).collect();
        assert_eq!(ts, vec![10, 11, 12, 13]);
        for t in 14..14 + RING as u64 + 5 {
            hub.close_second(t);
        }
        let all = hub.series(usize::MAX);
        assert_eq!(all.len(), RING);
        assert_eq!(all.last().map(|s| s.t), Some(13 + RING as u64 + 5));
        assert_eq!(hub.series(3).len(), 3);
        // A clock that went back never unorders the series.
        let s = hub.close_second(5);
        assert_eq!(s.t, 13 + RING as u64 + 6);
    }

    #[test]
    fn sizes_behind_the_documented_memory_figures() {
        // docs/admin-api.md: 72 bytes per key per second in the ring, ~0.95 KB per counted route or node.
        assert_eq!(std::mem::size_of::<(Arc<str>, Stat)>(), 72);
        assert!(std::mem::size_of::<RouteEntry>() <= 960);
        assert!(std::mem::size_of::<NodeEntry>() <= 960);
    }

    #[test]
    fn caps_hold() {
        let mut w = Local::default();
        let ids: Vec<Arc<str>> = (0..LOCAL_CAP + 10)
            .map(|i| Arc::from(i.to_string()))
            .collect();
        for id in &ids {
            w.record(Some((id, None)), None, &rec(200, 1, None));
        }
        let b = w.take().expect("recorded");
        assert_eq!(b.routes.len(), LOCAL_CAP);
        assert_eq!(b.other.req, 10, "beyond the cap: in the total only");
        let hub = Hub::default();
        hub.submit(b);
        let s = hub.close_second(1);
        assert_eq!(s.total.req, (LOCAL_CAP + 10) as u32);
        assert_eq!(s.routes.len(), TOP_KEYS);
    }
}
