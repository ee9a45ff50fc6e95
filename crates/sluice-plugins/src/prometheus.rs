//! prometheus (priority 500, log): APISIX's metrics, recorded in the log phase and served by
//! [`serve_metrics`] (`/apisix/prometheus/metrics`, 127.0.0.1:9091 by default, wired by the binary).
//!
//! Per request: one probe in a thread-local cache of series handles, then relaxed atomic adds on that series
//! (status count, three latency histograms, two byte counters). The registry's lock is only taken when a thread
//! meets a label set for the first time. Cardinality is bounded: past [`MAX_SERIES`] label sets, new ones fold
//! into one overflow series per status code. `service`, `matched_uri` and `matched_host` come from the route's
//! compiled [`crate::RouteMeta`] (its configured patterns, so cardinality is bounded by configuration);
//! `prefer_name` labels routes and services by name when they have one.

mod export;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use serde::Deserialize;
use serde_json::{json, Value};

pub use export::serve_metrics;

use crate::registry::Entry;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "prometheus";
pub const PRIORITY: i32 = 500;

/// Label sets kept before new ones fold into the overflow series.
pub const MAX_SERIES: usize = 10_000;

/// A thread's cache of series handles is cleared when it reaches this many keys. Above [`MAX_SERIES`]: a load
/// that uses every series of a full registry (100 routes x 100 consumers is exactly 10,000) plus a few more keys
/// (other statuses, overflow) must stay cached, or every request would miss and rebuild its labels under the
/// registry's lock.
const CACHE_MAX: usize = 2 * MAX_SERIES;

/// APISIX's default latency buckets, in milliseconds.
pub const DEFAULT_BUCKETS: [f64; 15] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0,
    60000.0,
];

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"prefer_name": {"type": "boolean", "default": false}}
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    prefer_name: bool,
}

fn check(v: &Value) -> Result<(), String> {
    crate::util::parse::<Conf>(&schema(), v).map(drop)
}

/// Gauges only the binary knows (nginx `stub_status`'s counterparts).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnStats {
    pub active: u64,
    pub accepted: u64,
    pub handled: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
}

type ConnSource = Box<dyn Fn() -> ConnStats + Send + Sync>;
type TextSource = Box<dyn Fn(&mut String) + Send + Sync>;

/// The label set of one series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Labels {
    pub route: Box<str>,
    pub service: Box<str>,
    pub matched_uri: Box<str>,
    pub matched_host: Box<str>,
    pub consumer: Box<str>,
    pub node: Box<str>,
    pub code: u16,
}

pub(crate) struct Hist {
    pub buckets: Box<[AtomicU64]>,
    /// Sum in microseconds.
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

impl Hist {
    fn new(n: usize) -> Hist {
        Hist {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
    fn observe(&self, bounds: &[f64], us: u64) {
        let ms = us as f64 / 1000.0;
        // Non-cumulative storage; the exporter accumulates.
        let i = bounds.iter().position(|b| ms <= *b).unwrap_or(bounds.len());
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct Series {
    pub status: AtomicU64,
    /// request, upstream, apisix.
    pub latency: [Hist; 3],
    pub ingress: AtomicU64,
    pub egress: AtomicU64,
}

/// The metric families (kept in [`crate::Shared`], so they survive reloads).
pub struct Metrics {
    id: u64,
    pub(crate) buckets: OnceLock<Arc<[f64]>>,
    pub(crate) series: RwLock<HashMap<Labels, Arc<Series>>>,
    pub(crate) requests: AtomicU64,
    pub(crate) conns: RwLock<Option<ConnSource>>,
    pub(crate) text: RwLock<Vec<TextSource>>,
}

static METRICS_IDS: AtomicU64 = AtomicU64::new(1);

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            id: METRICS_IDS.fetch_add(1, Ordering::Relaxed),
            buckets: OnceLock::new(),
            series: RwLock::default(),
            requests: AtomicU64::new(0),
            conns: RwLock::new(None),
            text: RwLock::default(),
        }
    }
}

/// A thread's cached series: keyed by cheap identities, checked against the labels on every hit (a pointer may
/// be reused by a later snapshot's route).
struct Cached {
    route: Box<str>,
    service: Box<str>,
    consumer: Box<str>,
    series: Arc<Series>,
}

type CacheKey = (u64, usize, usize, Option<std::net::SocketAddr>, u16, bool);

thread_local! {
    /// (registry id, route id ptr, consumer ptr, upstream, status, prefer_name) -> series: a request whose labels this
    /// thread has seen takes no lock and allocates nothing.
    static CACHE: RefCell<ahash::AHashMap<CacheKey, Cached>> = RefCell::new(ahash::AHashMap::new());
}

#[cfg(test)]
thread_local! {
    /// Cache misses of this thread (tests).
    static MISSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Metrics {
    /// Supplies `apisix_nginx_http_current_connections` / `apisix_http_requests_total` inputs from the proxy.
    pub fn set_connections_source(&self, f: impl Fn() -> ConnStats + Send + Sync + 'static) {
        if let Ok(mut g) = self.conns.write() {
            *g = Some(Box::new(f));
        }
    }

    /// Appends exposition text (e.g. `apisix_upstream_status`) produced by the binary at scrape time.
    pub fn add_text_source(&self, f: impl Fn(&mut String) + Send + Sync + 'static) {
        if let Ok(mut g) = self.text.write() {
            g.push(Box::new(f));
        }
    }

    fn bounds(&self) -> &[f64] {
        self.buckets.get_or_init(|| Arc::from(&DEFAULT_BUCKETS[..]))
    }

    fn series(&self, labels: Labels) -> Arc<Series> {
        let n = self.bounds().len() + 1;
        let mut map = match self.series.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let mut labels = labels;
        if map.len() >= MAX_SERIES && !map.contains_key(&labels) {
            labels = Labels {
                route: "".into(),
                service: "".into(),
                matched_uri: "".into(),
                matched_host: "".into(),
                consumer: "".into(),
                node: "".into(),
                code: labels.code,
            };
        }
        map.entry(labels)
            .or_insert_with(|| {
                Arc::new(Series {
                    status: AtomicU64::new(0),
                    latency: [Hist::new(n), Hist::new(n), Hist::new(n)],
                    ingress: AtomicU64::new(0),
                    egress: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn cached(&self, ctx: &Ctx<'_>, info: &LogInfo, prefer_name: bool) -> Arc<Series> {
        let consumer = ctx.consumer.as_ref();
        let key: CacheKey = (
            self.id,
            ctx.route_id.as_ptr() as usize,
            consumer.map_or(0, |c| Arc::as_ptr(c) as usize),
            info.upstream_addr,
            info.status,
            prefer_name,
        );
        let name = ctx.consumer_name().unwrap_or("");
        let meta = ctx.route;
        let route = meta
            .and_then(|m| m.route_name.as_deref())
            .filter(|_| prefer_name)
            .unwrap_or(ctx.route_id);
        let service = meta
            .and_then(|m| m.service_name.as_deref())
            .filter(|_| prefer_name)
            .or_else(|| meta.and_then(|m| m.service_id.as_deref()))
            .unwrap_or("");
        let hit = CACHE.with(|c| {
            c.borrow()
                .get(&key)
                .filter(|e| &*e.route == route && &*e.consumer == name && &*e.service == service)
                .map(|e| e.series.clone())
        });
        if let Some(s) = hit {
            return s;
        }
        #[cfg(test)]
        MISSES.with(|m| m.set(m.get() + 1));
        let series = self.series(Labels {
            route: route.into(),
            service: service.into(),
            matched_uri: meta.map_or("", |m| &m.matched_uri).into(),
            matched_host: meta.map_or("", |m| &m.matched_host).into(),
            consumer: name.into(),
            node: info
                .upstream_addr
                .map(|a| a.ip().to_string())
                .unwrap_or_default()
                .into(),
            code: info.status,
        });
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= CACHE_MAX {
                c.clear();
            }
            c.insert(
                key,
                Cached {
                    route: route.into(),
                    service: service.into(),
                    consumer: name.into(),
                    series: series.clone(),
                },
            );
        });
        series
    }

    /// Records one finished request.
    pub(crate) fn record(&self, ctx: &Ctx<'_>, info: &LogInfo, prefer_name: bool) {
        let s = self.cached(ctx, info, prefer_name);
        s.status.fetch_add(1, Ordering::Relaxed);
        let bounds = self.bounds();
        let total = info.latency.as_micros() as u64;
        s.latency[0].observe(bounds, total);
        if let Some(u) = info.upstream_latency {
            let u = u.as_micros() as u64;
            s.latency[1].observe(bounds, u);
            s.latency[2].observe(bounds, total.saturating_sub(u));
        } else {
            s.latency[2].observe(bounds, total);
        }
        s.ingress.fetch_add(info.request_bytes, Ordering::Relaxed);
        s.egress.fetch_add(info.response_bytes, Ordering::Relaxed);
        // Counted last with Release (the exporter loads it with Acquire first): a scrape that sees N requests
        // sees every series count of those N.
        self.requests.fetch_add(1, Ordering::Release);
    }

    /// The exposition text APISIX serves at `/apisix/prometheus/metrics`.
    pub fn render(&self) -> String {
        export::render(self)
    }
}

struct Prometheus {
    metrics: Arc<Metrics>,
    prefer_name: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = crate::util::parse(&schema(), v)?;
    let metrics = env.shared.metrics.clone();
    // `plugin_attr.prometheus.default_buckets` applies from the first compilation on (a histogram's bounds
    // cannot change while it has observations).
    let attr = env
        .plugin_attr
        .and_then(|a| a.get("prometheus"))
        .and_then(|p| p.get("default_buckets"))
        .and_then(Value::as_array);
    if let Some(b) = attr {
        let mut bounds: Vec<f64> = b.iter().filter_map(Value::as_f64).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let _ = metrics.buckets.set(Arc::from(bounds));
    }
    Ok(Arc::new(Prometheus {
        metrics,
        prefer_name: c.prefer_name,
    }))
}

impl Plugin for Prometheus {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Log])
    }
    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        self.metrics.record(ctx, info, self.prefer_name);
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    /// 100 routes x 100 consumers fill the registry with exactly `MAX_SERIES` label sets; with a few more keys (a
    /// 401 per route) a cache bounded at `MAX_SERIES` was cleared on every lap and missed on every request.
    #[test]
    fn every_series_of_a_full_registry_stays_cached() {
        let mut buf = bytes::BytesMut::from(&b"GET /r HTTP/1.1\r\nHost: a\r\n\r\n"[..]);
        let head = sluice_http::parse_request(&mut buf, &sluice_http::Limits::default())
            .unwrap()
            .unwrap();
        let addr: std::net::SocketAddr = "127.0.0.1:80".parse().unwrap();
        let view = crate::ReqView::new(&head, addr, addr, "http").unwrap();
        let routes: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
        let consumers: Vec<Arc<sluice_model::Consumer>> = (0..100)
            .map(|i| {
                Arc::new(serde_json::from_value(json!({ "username": format!("c{i}") })).unwrap())
            })
            .collect();
        let m = Metrics::default();
        let info = |status| LogInfo {
            status,
            request_bytes: 1,
            response_bytes: 1,
            latency: std::time::Duration::from_micros(100),
            upstream_latency: None,
            upstream_addr: Some(addr),
            upstream_status: None,
        };
        let lap = |with_401: bool| {
            for r in &routes {
                for c in &consumers {
                    let mut ctx = Ctx::new(&view, r);
                    ctx.consumer = Some(c.clone());
                    m.record(&ctx, &info(200), false);
                }
                if with_401 {
                    m.record(&Ctx::new(&view, r), &info(401), false);
                }
            }
        };
        lap(true);
        let before = MISSES.with(|c| c.get());
        lap(true);
        lap(false);
        assert_eq!(
            MISSES.with(|c| c.get()),
            before,
            "second and third laps missed the cache"
        );
        assert_eq!(m.requests.load(Ordering::Relaxed), 3 * 10_000 + 2 * 100);
    }

    /// The cache key holds the upstream address exactly: an IPv4 node and its IPv4-mapped IPv6 form are different
    /// `node` labels, and every request lands on its own label set, hit or miss.
    #[test]
    fn nodes_that_pack_alike_keep_their_own_series() {
        let mut buf = bytes::BytesMut::from(&b"GET /r HTTP/1.1\r\nHost: a\r\n\r\n"[..]);
        let head = sluice_http::parse_request(&mut buf, &sluice_http::Limits::default())
            .unwrap()
            .unwrap();
        let addr: std::net::SocketAddr = "127.0.0.1:80".parse().unwrap();
        let view = crate::ReqView::new(&head, addr, addr, "http").unwrap();
        let m = Metrics::default();
        let nodes = [
            "127.0.0.1:80",
            "[::ffff:127.0.0.1]:80",
            "127.0.0.1:81",
            "[::1]:80",
        ];
        for _ in 0..3 {
            for n in nodes {
                let info = LogInfo {
                    status: 200,
                    request_bytes: 1,
                    response_bytes: 1,
                    latency: std::time::Duration::from_micros(100),
                    upstream_latency: None,
                    upstream_addr: Some(n.parse().unwrap()),
                    upstream_status: None,
                };
                m.record(&Ctx::new(&view, "r1"), &info, false);
            }
        }
        let map = m.series.read().unwrap();
        let count = |node: &str| {
            map.iter()
                .filter(|(l, _)| &*l.node == node)
                .map(|(_, s)| s.status.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        assert_eq!(count("127.0.0.1"), 6);
        assert_eq!(count("::ffff:127.0.0.1"), 3);
        assert_eq!(count("::1"), 3);
        assert_eq!(map.len(), 3);
    }
}
