//! The built-in load generator: HTTP/1.1 keep-alive, closed-loop (each connection sends its next
//! request when the previous answer arrives) or fixed-rate open-loop (each connection follows an
//! absolute schedule; latency is measured from the scheduled send time whenever the target made
//! the connection fall behind, as wrk2 does, so coordinated omission does not hide stalls).
//! One current-thread runtime per generator thread; per-thread histograms merged at the end.
//! HTTP/2 cleartext (prior knowledge, one stream at a time per connection) with `h2c`. It does not
//! speak TLS, and it does not know what it is measuring (see `runner`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::new_histogram;

/// When a load run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// Measure for this long (after the warm-up).
    Duration(Duration),
    /// Send exactly this many requests (no warm-up); elapsed time is until the last answer.
    Requests(u64),
}

/// What to send, where, and how hard.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub connections: usize,
    pub threads: usize,
    pub stop: Stop,
    /// Total requests per second for open-loop runs; `None` is closed-loop.
    pub rate: Option<f64>,
    /// Per-request (and per-connect) timeout.
    pub timeout: Duration,
    pub warmup: Duration,
    /// Speak HTTP/2 over cleartext (prior knowledge), one stream at a time per connection.
    pub h2c: bool,
    /// Request rotation (HTTP/1.1 only): when not empty, request k of a connection is
    /// `spread[(first + k) % len]`, each entry a path and the headers sent besides `headers`; `first` is
    /// the connection's index, so connections start on different entries. The requests are serialized
    /// once before the run: rotating costs an index and a modulo per request, nothing else.
    pub spread: Vec<(String, Vec<(String, String)>)>,
}

impl LoadSpec {
    /// A closed-loop spec with common defaults (GET `path`, 1 thread, 5 s timeout, no warm-up).
    pub fn new(addr: SocketAddr, path: &str, connections: usize, stop: Stop) -> Self {
        LoadSpec {
            addr,
            host: addr.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            connections,
            threads: 1,
            stop,
            rate: None,
            timeout: Duration::from_secs(5),
            warmup: Duration::ZERO,
            h2c: false,
            spread: Vec::new(),
        }
    }

    fn request_bytes(&self, path: &str, extra: &[(String, String)]) -> Vec<u8> {
        let mut s = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: sluice-bench\r\n",
            path, self.host
        );
        for (k, v) in self.headers.iter().chain(extra) {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        s.into_bytes()
    }

    /// Every request the run sends, serialized: one, or one per `spread` entry.
    fn requests(&self) -> Vec<Box<[u8]>> {
        if self.spread.is_empty() || self.h2c {
            return vec![self.request_bytes(&self.path, &[]).into()];
        }
        self.spread
            .iter()
            .map(|(p, h)| self.request_bytes(p, h).into())
            .collect()
    }
}

/// Failed or non-2xx requests by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    /// Answers whose status was not 2xx (they still count as requests and in latency).
    pub non_2xx: u64,
    /// Connection attempts refused, reset or timed out.
    pub connect: u64,
    /// Requests with no complete answer within the timeout.
    pub timeout: u64,
    /// Read/write failures or a connection closed mid-answer.
    pub io: u64,
}

impl Errors {
    fn add(&mut self, o: &Errors) {
        self.non_2xx += o.non_2xx;
        self.connect += o.connect;
        self.timeout += o.timeout;
        self.io += o.io;
    }

    /// Errors that are not answers (connect + timeout + io).
    pub fn failures(&self) -> u64 {
        self.connect + self.timeout + self.io
    }
}

/// Everything one load run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// Complete answers (any status) to requests sent inside the window.
    pub requests: u64,
    pub errors: Errors,
    /// Response bytes (head + body) read inside the window.
    pub bytes: u64,
    pub elapsed: Duration,
    /// Latencies in nanoseconds.
    pub hist: Histogram<u64>,
}

impl LoadResult {
    /// Answers per second.
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Response bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct ThreadStats {
    hist: Histogram<u64>,
    requests: u64,
    errors: Errors,
    bytes: u64,
}

struct Window {
    t0: Instant,
    measure_from: Instant,
    end: Option<Instant>,
}

struct Shared {
    issued: AtomicU64,
    last_done_ns: AtomicU64,
}

/// Runs the load described by `spec`, blocking until it is done.
pub fn run_load(spec: &LoadSpec) -> Result<LoadResult, String> {
    if spec.connections == 0 {
        return Err("connections must be at least 1".into());
    }
    if matches!(spec.rate, Some(r) if !(r > 0.0 && r.is_finite())) {
        return Err("rate must be a positive number".into());
    }
    let threads = spec.threads.clamp(1, spec.connections);
    let req: Arc<[Box<[u8]>]> = spec.requests().into();
    let t0 = Instant::now() + Duration::from_millis(20);
    let (measure_from, end) = match spec.stop {
        Stop::Duration(d) => (t0 + spec.warmup, Some(t0 + spec.warmup + d)),
        Stop::Requests(_) => (t0, None),
    };
    let shared = Arc::new(Shared {
        issued: AtomicU64::new(0),
        last_done_ns: AtomicU64::new(0),
    });
    let mut handles = Vec::with_capacity(threads);
    for t in 0..threads {
        let spec = spec.clone();
        let req = req.clone();
        let shared = shared.clone();
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{t}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let local = tokio::task::LocalSet::new();
                let stats = Rc::new(RefCell::new(ThreadStats {
                    hist: new_histogram(),
                    requests: 0,
                    errors: Errors::default(),
                    bytes: 0,
                }));
                let win = Rc::new(Window {
                    t0,
                    measure_from,
                    end,
                });
                let spec = Rc::new(spec);
                local.block_on(&rt, async {
                    let mut tasks = Vec::new();
                    for idx in (t..spec.connections).step_by(threads) {
                        tasks.push(tokio::task::spawn_local(conn_task(
                            idx,
                            spec.clone(),
                            req.clone(),
                            stats.clone(),
                            win.clone(),
                            shared.clone(),
                        )));
                    }
                    for task in tasks {
                        let _ = task.await;
                    }
                });
                let s = Rc::try_unwrap(stats)
                    .map_err(|_| "stats still shared".to_string())?
                    .into_inner();
                Ok::<ThreadStats, String>(s)
            })
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    let mut total = ThreadStats {
        hist: new_histogram(),
        requests: 0,
        errors: Errors::default(),
        bytes: 0,
    };
    for h in handles {
        let s = h.join().map_err(|_| "load thread panicked".to_string())??;
        total.hist.add(&s.hist).map_err(|e| e.to_string())?;
        total.requests += s.requests;
        total.bytes += s.bytes;
        total.errors.add(&s.errors);
    }
    let elapsed = match (spec.stop, end) {
        (Stop::Duration(_), Some(end)) => end - measure_from,
        _ => Duration::from_nanos(shared.last_done_ns.load(Ordering::Relaxed).max(1)),
    };
    Ok(LoadResult {
        requests: total.requests,
        errors: total.errors,
        bytes: total.bytes,
        elapsed,
        hist: total.hist,
    })
}

async fn conn_task(
    idx: usize,
    spec: Rc<LoadSpec>,
    req: Arc<[Box<[u8]>]>,
    stats: Rc<RefCell<ThreadStats>>,
    win: Rc<Window>,
    shared: Arc<Shared>,
) {
    let interval = spec
        .rate
        .map(|r| Duration::from_secs_f64(spec.connections as f64 / r));
    // Stagger connections over one interval so an open-loop run does not send in bursts.
    let mut next = interval.map(|iv| win.t0 + iv.mul_f64(idx as f64 / spec.connections as f64));
    let mut conn: Option<Conn> = None;
    // Which request of `req` goes next (rotation; always 0 with one request).
    let mut turn = idx;
    let before_end = |t: Instant| win.end.is_none_or(|e| t < e);
    tokio::time::sleep_until(win.t0.into()).await;
    loop {
        let now = Instant::now();
        if !before_end(now) {
            break;
        }
        if let Stop::Requests(n) = spec.stop {
            if shared.issued.fetch_add(1, Ordering::Relaxed) >= n {
                break;
            }
        }
        // Latency base: the scheduled time when the target made us late, else the real send time.
        let mut scheduled = None;
        if let (Some(iv), Some(t)) = (interval, next.as_mut()) {
            let intended = *t;
            *t += iv;
            if now < intended {
                if !before_end(intended) {
                    break;
                }
                tokio::time::sleep_until(intended.into()).await;
            } else {
                scheduled = Some(intended);
            }
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match tokio::time::timeout(spec.timeout, Conn::open(&spec)).await {
                Ok(Ok(c)) => conn.insert(c),
                _ => {
                    let t = scheduled.unwrap_or(now);
                    if t >= win.measure_from && before_end(t) {
                        stats.borrow_mut().errors.connect += 1;
                    }
                    // Back off so a refused port does not turn into a busy loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let sent = Instant::now();
        let base = scheduled.unwrap_or(sent);
        let this = &req[turn % req.len()];
        turn = turn.wrapping_add(1);
        let res = tokio::time::timeout(spec.timeout, c.exchange(this, &spec.headers)).await;
        let done = Instant::now();
        if matches!(spec.stop, Stop::Requests(_)) {
            let ns = (done - win.t0).as_nanos() as u64;
            shared.last_done_ns.fetch_max(ns, Ordering::Relaxed);
        }
        let counted = base >= win.measure_from && before_end(base);
        let mut st = stats.borrow_mut();
        match res {
            Ok(Ok(ans)) => {
                if counted {
                    st.requests += 1;
                    st.bytes += ans.bytes as u64;
                    st.hist.saturating_record((done - base).as_nanos() as u64);
                    if !(200..300).contains(&ans.status) {
                        st.errors.non_2xx += 1;
                    }
                }
                if ans.close {
                    conn = None;
                }
            }
            Ok(Err(_)) => {
                if counted {
                    st.errors.io += 1;
                }
                conn = None;
            }
            Err(_) => {
                if counted {
                    st.errors.timeout += 1;
                }
                conn = None;
            }
        }
    }
}

/// One client connection of either protocol.
enum Conn {
    H1(H1Conn),
    H2(H2Conn),
}

struct H1Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

struct H2Conn {
    send: h2::client::SendRequest<bytes::Bytes>,
    uri: http::Uri,
}

/// One parsed answer.
pub(crate) struct Answer {
    pub status: u16,
    pub bytes: usize,
    pub close: bool,
}

enum Body {
    Length(usize),
    Chunked,
    UntilClose,
}

// === impl Conn ===

impl Conn {
    async fn open(spec: &LoadSpec) -> std::io::Result<Conn> {
        let s = TcpStream::connect(spec.addr).await?;
        let _ = s.set_nodelay(true);
        if !spec.h2c {
            return Ok(Conn::H1(H1Conn {
                stream: s,
                buf: Vec::with_capacity(16 * 1024),
            }));
        }
        let (send, driver) = h2::client::handshake(s)
            .await
            .map_err(std::io::Error::other)?;
        tokio::task::spawn_local(async move {
            let _ = driver.await;
        });
        let uri = format!("http://{}{}", spec.host, spec.path)
            .parse()
            .map_err(std::io::Error::other)?;
        Ok(Conn::H2(H2Conn { send, uri }))
    }

    async fn exchange(
        &mut self,
        req: &[u8],
        headers: &[(String, String)],
    ) -> std::io::Result<Answer> {
        match self {
            Conn::H1(c) => c.exchange(req).await,
            Conn::H2(c) => c.exchange(headers).await,
        }
    }
}

// === impl H2Conn ===

impl H2Conn {
    /// One request on a new stream; bytes counted are the response body's.
    async fn exchange(&mut self, headers: &[(String, String)]) -> std::io::Result<Answer> {
        let mut b = http::Request::get(self.uri.clone());
        for (k, v) in headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let req = b.body(()).map_err(std::io::Error::other)?;
        let mut send = self
            .send
            .clone()
            .ready()
            .await
            .map_err(std::io::Error::other)?;
        let (resp, _) = send
            .send_request(req, true)
            .map_err(std::io::Error::other)?;
        let resp = resp.await.map_err(std::io::Error::other)?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut bytes = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            bytes += chunk.len();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        Ok(Answer {
            status,
            bytes,
            close: false,
        })
    }
}

// === impl H1Conn ===

impl H1Conn {
    async fn exchange(&mut self, req: &[u8]) -> std::io::Result<Answer> {
        self.stream.write_all(req).await?;
        let mut head: Option<(usize, u16, Body, bool)> = None;
        loop {
            if head.is_none() {
                head = parse_head(&self.buf).map_err(std::io::Error::other)?;
            }
            if let Some((head_len, status, body, close)) = &head {
                let total = match body {
                    Body::Length(n) => Some(head_len + n),
                    Body::Chunked => match sluice_mock::chunked_len(&self.buf[*head_len..]) {
                        Some(Ok(n)) => Some(head_len + n),
                        Some(Err(())) => return Err(std::io::Error::other("bad chunked body")),
                        None => None,
                    },
                    Body::UntilClose => None,
                };
                if let Some(total) = total {
                    if self.buf.len() >= total {
                        consume(&mut self.buf, total);
                        return Ok(Answer {
                            status: *status,
                            bytes: total,
                            close: *close,
                        });
                    }
                }
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return match head {
                    Some((_, status, Body::UntilClose, _)) => {
                        let bytes = self.buf.len();
                        self.buf.clear();
                        Ok(Answer {
                            status,
                            bytes,
                            close: true,
                        })
                    }
                    _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
                };
            }
        }
    }
}

fn consume(buf: &mut Vec<u8>, n: usize) {
    if buf.len() == n {
        buf.clear();
    } else {
        buf.drain(..n);
    }
}

/// Parses a response head: (head length, status, body framing, connection closes after).
fn parse_head(buf: &[u8]) -> Result<Option<(usize, u16, Body, bool)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    let mut body = Body::UntilClose;
    let mut close = resp.version == Some(0);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let len = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or("bad content-length")?;
            body = Body::Length(len);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding")
            && h.value.eq_ignore_ascii_case(b"chunked")
        {
            body = Body::Chunked;
        } else if h.name.eq_ignore_ascii_case("connection")
            && h.value.eq_ignore_ascii_case(b"close")
        {
            close = true;
        }
    }
    if status == 204 || status == 304 || (100..200).contains(&status) {
        body = Body::Length(0);
    }
    Ok(Some((n, status, body, close)))
}

#[cfg(test)]
pub(crate) mod tests;
