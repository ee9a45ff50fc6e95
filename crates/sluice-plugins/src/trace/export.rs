//! The span exporter: a bounded queue, one background thread per configuration, batches POSTed over a plain
//! HTTP/1.1 connection with a timeout (the same small client shape as http-logger's: one request per connection,
//! only the status is read; a client library would bring a runtime or a connection pool for one POST per batch).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::SpanRecord;

/// Which wire format a batch goes out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Format {
    /// OTLP/HTTP protobuf (`ExportTraceServiceRequest`), with this resource and scope.
    Otlp,
    /// Zipkin v2 JSON (an array of spans).
    ZipkinV2,
}

/// Where and how an exporter sends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExportConf {
    pub format: Format,
    /// `host:port` to connect to.
    pub addr: String,
    /// Host header and path of the POST.
    pub host: String,
    pub path: String,
    pub timeout: Duration,
    pub headers: Vec<(String, String)>,
    pub max_queue: usize,
    pub batch_size: usize,
    /// A batch goes out when its first span has waited this long...
    pub batch_timeout: Duration,
    /// ...or when no span arrived for this long.
    pub inactive: Duration,
    /// OTLP's resource attributes (unused for Zipkin).
    pub resource: Vec<(String, super::Attr)>,
}

impl ExportConf {
    /// Splits `http://host:port/path` or `host:port` (then `default_path`) into address, Host and path.
    pub fn endpoint(url: &str, default_path: &str) -> Result<(String, String, String), String> {
        if url.starts_with("https://") {
            return Err(format!(
                "https endpoints are not supported yet: {url} (use http:// or host:port)"
            ));
        }
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, default_path),
        };
        if authority.is_empty() || authority.contains(['@', ' ', '?', '#']) {
            return Err(format!("invalid endpoint address: {url}"));
        }
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']');
        let addr = if has_port {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok((addr, authority.to_owned(), path.to_owned()))
    }
}

/// One configuration's queue and counters. The sending thread starts on the first span.
pub(crate) struct Exporter {
    conf: Arc<ExportConf>,
    tx: OnceLock<Option<SyncSender<SpanRecord>>>,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct Stats {
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    /// Second (since start) of the last "queue full" warning.
    last_drop_log: AtomicU64,
}

fn epoch() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Whether a warning stamped in `last` may be logged now (at most once a second per exporter).
fn once_a_second(last: &AtomicU64) -> bool {
    let now = epoch().elapsed().as_secs() + 1;
    let prev = last.load(Ordering::Relaxed);
    prev != now
        && last
            .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl Exporter {
    fn new(conf: ExportConf) -> Exporter {
        Exporter {
            conf: Arc::new(conf),
            tx: OnceLock::new(),
            stats: Arc::default(),
        }
    }

    /// Queues a finished span; never waits. A full queue (or a thread that could not start) drops it.
    pub fn submit(&self, span: SpanRecord) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = sync_channel(self.conf.max_queue);
            let (conf, stats) = (self.conf.clone(), self.stats.clone());
            match std::thread::Builder::new()
                .name("sluice-trace-export".into())
                .spawn(move || run(rx, &conf, &stats))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::error!(error = %e, "trace exporter: cannot start its thread");
                    None
                }
            }
        });
        let full = match tx {
            Some(tx) => match tx.try_send(span) {
                Ok(()) => return,
                Err(TrySendError::Full(_)) => true,
                Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        if once_a_second(&self.stats.last_drop_log) {
            tracing::warn!(
                collector = %self.conf.addr,
                queue = self.conf.max_queue,
                dropped = self.stats.dropped.load(Ordering::Relaxed),
                "trace exporter: {}, span dropped",
                if full { "queue full" } else { "exporter stopped" }
            );
        }
    }
}

/// The exporters by configuration, shared by every snapshot (a reload keeps the queue and its thread).
#[derive(Default)]
pub(crate) struct Exporters(Mutex<Vec<Arc<Exporter>>>);

impl Exporters {
    pub fn get(&self, conf: ExportConf) -> Arc<Exporter> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // An exporter no compiled plugin holds any more goes: its queue's sender drops with it, so its thread
        // sends what it has and ends (configurations that come and go leave no threads behind).
        all.retain(|e| Arc::strong_count(e) > 1);
        if let Some(e) = all.iter().find(|e| *e.conf == conf) {
            return e.clone();
        }
        let e = Arc::new(Exporter::new(conf));
        all.push(e.clone());
        e
    }

    /// (exported, dropped, failed) spans over every exporter.
    pub fn counts(&self) -> (u64, u64, u64) {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().fold((0, 0, 0), |(e, d, f), x| {
            (
                e + x.stats.exported.load(Ordering::Relaxed),
                d + x.stats.dropped.load(Ordering::Relaxed),
                f + x.stats.failed.load(Ordering::Relaxed),
            )
        })
    }
}

fn run(rx: Receiver<SpanRecord>, conf: &ExportConf, stats: &Stats) {
    let mut batch: Vec<SpanRecord> = Vec::with_capacity(conf.batch_size.min(4096));
    let (mut first, mut last) = (Instant::now(), Instant::now());
    let last_fail_log = AtomicU64::new(0);
    loop {
        let wait = if batch.is_empty() {
            Duration::from_secs(3600)
        } else {
            let age = conf.batch_timeout.saturating_sub(first.elapsed());
            let idle = conf.inactive.saturating_sub(last.elapsed());
            age.min(idle)
        };
        let more = match rx.recv_timeout(wait) {
            Ok(s) => {
                last = Instant::now();
                if batch.is_empty() {
                    first = last;
                }
                batch.push(s);
                if batch.len() < conf.batch_size && first.elapsed() < conf.batch_timeout {
                    continue;
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        if !batch.is_empty() {
            let body = match conf.format {
                Format::Otlp => super::otlp::encode(&batch, &conf.resource),
                Format::ZipkinV2 => super::zipkin_json::encode(&batch),
            };
            match post(conf, &body) {
                Ok(()) => {
                    stats
                        .exported
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    stats
                        .failed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if once_a_second(&last_fail_log) {
                        tracing::warn!(collector = %conf.addr, error = %e, spans = batch.len(),
                            "trace exporter: batch not delivered");
                    }
                }
            }
            batch.clear();
        }
        if !more {
            return;
        }
    }
}

fn post(conf: &ExportConf, body: &[u8]) -> Result<(), String> {
    let ctype = match conf.format {
        Format::Otlp => "application/x-protobuf",
        Format::ZipkinV2 => "application/json",
    };
    let t = conf.timeout;
    let sa = conf
        .addr
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&sa, t).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(t)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(t)).map_err(|e| e.to_string())?;
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        conf.path,
        conf.host,
        body.len()
    );
    for (n, v) in &conf.headers {
        head.push_str(n);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(body).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 32];
    let mut n = 0;
    // The status line's first 12 bytes (`HTTP/1.1 200`), however the peer splits its writes.
    while n < 12 {
        match s.read(&mut buf[n..]).map_err(|e| e.to_string())? {
            0 => break,
            k => n += k,
        }
    }
    let status = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.get(..3)?.parse::<u16>().ok())
        .unwrap_or(0);
    if !(200..300).contains(&status) {
        return Err(format!("collector answered status {status}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ExportConf, Exporters, Format};

    fn conf(addr: &str) -> ExportConf {
        ExportConf {
            format: Format::ZipkinV2,
            addr: addr.into(),
            host: addr.into(),
            path: "/".into(),
            timeout: std::time::Duration::from_secs(1),
            headers: Vec::new(),
            max_queue: 4,
            batch_size: 2,
            batch_timeout: std::time::Duration::from_secs(1),
            inactive: std::time::Duration::from_secs(1),
            resource: Vec::new(),
        }
    }

    #[test]
    fn exporters_are_shared_by_configuration_and_dropped_when_unused() {
        let all = Exporters::default();
        let a = all.get(conf("127.0.0.1:9"));
        let b = all.get(conf("127.0.0.1:9"));
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        let c = all.get(conf("127.0.0.1:10"));
        assert_eq!(all.0.lock().unwrap().len(), 2);
        drop((a, b));
        let _d = all.get(conf("127.0.0.1:11"));
        let left: Vec<String> = all
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.conf.addr.clone())
            .collect();
        assert_eq!(left, ["127.0.0.1:10", "127.0.0.1:11"]);
        drop(c);
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            ExportConf::endpoint("127.0.0.1:4318", "/v1/traces").unwrap(),
            (
                "127.0.0.1:4318".into(),
                "127.0.0.1:4318".into(),
                "/v1/traces".into()
            )
        );
        assert_eq!(
            ExportConf::endpoint("http://zipkin:9411/api/v2/spans", "/").unwrap(),
            (
                "zipkin:9411".into(),
                "zipkin:9411".into(),
                "/api/v2/spans".into()
            )
        );
        assert_eq!(
            ExportConf::endpoint("http://collector", "/v1/traces")
                .unwrap()
                .0,
            "collector:80"
        );
        assert!(ExportConf::endpoint("https://c:4318", "/").is_err());
        assert!(ExportConf::endpoint("http://u@c:4318", "/").is_err());
        assert!(ExportConf::endpoint("", "/").is_err());
    }
}
