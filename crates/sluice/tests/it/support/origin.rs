//! An in-process HTTP/1.1 origin on 127.0.0.1:0 (tokio + httparse): keep-alive, chunked bodies both ways, and a
//! behaviour chosen by the request path (see [`Origin`]). It records every request it receives (method, target,
//! raw header lines in order, decoded body) and counts accepted TCP connections. It deliberately implements only
//! what the tests need: no pipelining guarantees beyond sequential requests, no HTTP/1.0 specifics.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Client;

/// A request as the origin received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Which accepted connection (0-based) carried it.
    pub conn: usize,
    pub method: String,
    pub target: String,
    /// Header lines exactly as received: name case and order preserved.
    pub headers: Vec<(String, String)>,
    /// The decoded body.
    pub body: Vec<u8>,
    /// Whether the body arrived with `Transfer-Encoding: chunked`.
    pub chunked: bool,
}

impl Recorded {
    /// The first header with this name, case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

/// What the origin does with every request, whatever the path says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Path-selected behaviour.
    Normal,
    /// Sleep this long, then the path-selected behaviour.
    Delay(Duration),
    /// Read the request, then close without answering.
    Close,
    /// Read the request, then reset the connection (SO_LINGER 0).
    Reset,
    /// Accept and never read: the sender's writes stall once the socket buffers are full.
    Stall,
    /// Answer normally (no `Connection: close`), then close the connection: a pooled connection goes stale.
    CloseAfterResponse,
}

struct State {
    name: String,
    mode: Mutex<Mode>,
    accepted: AtomicUsize,
    in_flight: AtomicUsize,
    requests: Mutex<Vec<Recorded>>,
}

/// The origin. Paths:
/// (the first of these keywords among the path's segments counts, so `/prefix/delay/100` delays)
/// `/echo` body = request body; `/len` body = `len=N sum=S`; `/delay/MS`; `/status/CODE`; `/chunked/N` N chunks;
/// `/large/BYTES` a Content-Length body of `pattern(i)` bytes written in 64 KiB pieces; `/eof/BYTES` a close-delimited
/// body; `/slowstream` a chunk, 500 ms pause, another chunk; `/stall` a chunk, then nothing more until the peer
/// closes (bounded at 30 s), so that only the gateway's read timeout can end it; `/hop` a response carrying hop-by-hop fields;
/// `/truncate/N` announces 2N body bytes, sends N and closes; `/close` close without a response; anything else: 200 with the origin's name as body.
/// Every response carries `X-Origin: name`, `X-Seen-Host` and `X-Seen-Target`.
#[derive(Clone)]
pub struct Origin {
    pub addr: SocketAddr,
    st: Arc<State>,
}

/// The byte at `i` of every large body (a period that does not divide buffer sizes, so misplaced bytes show).
pub fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

impl Origin {
    pub async fn start(name: &str) -> Origin {
        Self::with_mode(name, Mode::Normal).await
    }

    pub async fn with_mode(name: &str, mode: Mode) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        let addr = l.local_addr().expect("origin addr");
        let st = Arc::new(State {
            name: name.to_owned(),
            mode: Mutex::new(mode),
            accepted: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
        });
        let st2 = st.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let id = st2.accepted.fetch_add(1, Ordering::SeqCst);
                let _ = s.set_nodelay(true);
                if *st2.mode.lock().expect("lock") == Mode::Stall {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(20)).await;
                        drop(s);
                    });
                    continue;
                }
                tokio::spawn(serve(s, id, st2.clone()));
            }
        });
        Origin { addr, st }
    }

    pub fn name(&self) -> &str {
        &self.st.name
    }
    pub fn set_mode(&self, m: Mode) {
        *self.st.mode.lock().expect("lock") = m;
    }
    /// TCP connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.st.accepted.load(Ordering::SeqCst)
    }
    /// Requests being handled right now.
    pub fn in_flight(&self) -> usize {
        self.st.in_flight.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> Vec<Recorded> {
        self.st.requests.lock().expect("lock").clone()
    }
    pub fn count(&self) -> usize {
        self.st.requests.lock().expect("lock").len()
    }
    pub fn last(&self) -> Recorded {
        self.requests()
            .pop()
            .expect("the origin received no request")
    }
}

struct Rd {
    s: TcpStream,
    buf: BytesMut,
}

impl Rd {
    async fn fill(&mut self) -> bool {
        self.buf.reserve(16 * 1024);
        matches!(self.s.read_buf(&mut self.buf).await, Ok(n) if n > 0)
    }
    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf.split_to(i + 2);
                return Some(String::from_utf8_lossy(&l[..i]).into_owned());
            }
            if !self.fill().await {
                return None;
            }
        }
    }
    async fn exact(&mut self, n: usize, out: &mut Vec<u8>) -> bool {
        let mut left = n;
        while left > 0 {
            if self.buf.is_empty() && !self.fill().await {
                return false;
            }
            let k = left.min(self.buf.len());
            out.extend_from_slice(&self.buf[..k]);
            self.buf.advance(k);
            left -= k;
        }
        true
    }
}

/// Parses one request head out of `rd.buf`; `None` on EOF or garbage.
async fn read_head(rd: &mut Rd) -> Option<(String, String, Vec<(String, String)>)> {
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut hs);
        match req.parse(&rd.buf) {
            Ok(httparse::Status::Complete(n)) => {
                let m = req.method?.to_owned();
                let p = req.path?.to_owned();
                let h = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                rd.buf.advance(n);
                return Some((m, p, h));
            }
            Ok(httparse::Status::Partial) => {
                if !rd.fill().await {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

async fn read_body(rd: &mut Rd, headers: &[(String, String)]) -> Option<(Vec<u8>, bool)> {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let l = rd.line().await?;
            let size = usize::from_str_radix(l.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                while !rd.line().await?.is_empty() {}
                return Some((body, true));
            }
            if !rd.exact(size, &mut body).await {
                return None;
            }
            let crlf = rd.line().await?;
            if !crlf.is_empty() {
                return None;
            }
        }
    }
    if let Some(n) = get("content-length") {
        let n: usize = n.parse().ok()?;
        if !rd.exact(n, &mut body).await {
            return None;
        }
    }
    Some((body, false))
}

async fn serve(s: TcpStream, conn: usize, st: Arc<State>) {
    let mut rd = Rd {
        s,
        buf: BytesMut::with_capacity(16 * 1024),
    };
    loop {
        let Some((method, target, headers)) = read_head(&mut rd).await else {
            return;
        };
        let Some((body, chunked)) = read_body(&mut rd, &headers).await else {
            return;
        };
        let rec = Recorded {
            conn,
            method,
            target,
            headers,
            body,
            chunked,
        };
        st.requests.lock().expect("lock").push(rec.clone());
        st.in_flight.fetch_add(1, Ordering::SeqCst);
        let keep = respond(&mut rd.s, &rec, &st).await
            && *st.mode.lock().expect("lock") != Mode::CloseAfterResponse;
        st.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !keep {
            return;
        }
    }
}

fn head(status: u16, st: &State, rec: &Recorded, extra: &str) -> String {
    format!(
        "HTTP/1.1 {status} {}\r\nX-Origin: {}\r\nX-Seen-Host: {}\r\nX-Seen-Target: {}\r\n{extra}",
        reason(status),
        st.name,
        rec.header("host").unwrap_or("-"),
        rec.target
    )
}

fn reason(s: u16) -> &'static str {
    match s {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

const KEYWORDS: [&str; 12] = [
    "truncate",
    "echo",
    "len",
    "delay",
    "status",
    "close",
    "hop",
    "chunked",
    "slowstream",
    "stall",
    "large",
    "eof",
];

/// Writes the response; returns whether the connection stays open.
async fn respond(s: &mut TcpStream, rec: &Recorded, st: &State) -> bool {
    let mode = *st.mode.lock().expect("lock");
    match mode {
        Mode::Normal | Mode::CloseAfterResponse | Mode::Stall => {}
        Mode::Delay(d) => tokio::time::sleep(d).await,
        Mode::Close => return false,
        Mode::Reset => {
            // Linger 0 makes the close an RST; it does not block with a zero timeout.
            #[allow(deprecated)]
            let _ = s.set_linger(Some(Duration::ZERO));
            return false;
        }
    }
    let path = rec.target.split('?').next().unwrap_or("").to_owned();
    // The first known keyword among the segments selects the behaviour, so routes may add a prefix.
    let segs: Vec<&str> = path.split('/').collect();
    let at = segs.iter().position(|s| KEYWORDS.contains(s));
    let first = at.map_or("", |i| segs[i]);
    let arg = at.and_then(|i| segs.get(i + 1)).copied().unwrap_or("");
    let num = |d: u64| arg.parse::<u64>().unwrap_or(d);
    let is_head = rec.method == "HEAD";
    let fixed = |status: u16, body: &[u8], extra: &str| {
        let mut out = head(status, st, rec, extra).into_bytes();
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        if !is_head {
            out.extend_from_slice(body);
        }
        out
    };
    match first {
        "echo" => s.write_all(&fixed(200, &rec.body, "")).await.is_ok(),
        "len" => {
            let sum: u64 = rec.body.iter().map(|&b| u64::from(b)).sum();
            let b = format!("len={} sum={sum}", rec.body.len());
            s.write_all(&fixed(200, b.as_bytes(), "")).await.is_ok()
        }
        "delay" => {
            tokio::time::sleep(Duration::from_millis(num(0))).await;
            s.write_all(&fixed(200, st.name.as_bytes(), ""))
                .await
                .is_ok()
        }
        "status" => s
            .write_all(&fixed(num(200) as u16, st.name.as_bytes(), ""))
            .await
            .is_ok(),
        "close" => false,
        "hop" => {
            let extra = "Connection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\nProxy-Authenticate: Basic\r\nX-Kept: yes\r\n";
            s.write_all(&fixed(200, b"hop", extra)).await.is_ok()
        }
        "chunked" => {
            let mut out = head(200, st, rec, "Transfer-Encoding: chunked\r\n\r\n").into_bytes();
            for i in 0..num(3) {
                let c = format!("chunk-{i}\n");
                out.extend_from_slice(format!("{:x}\r\n{c}\r\n", c.len()).as_bytes());
            }
            out.extend_from_slice(b"0\r\n\r\n");
            s.write_all(&out).await.is_ok()
        }
        "slowstream" => {
            let h = head(200, st, rec, "Transfer-Encoding: chunked\r\n\r\n");
            if s.write_all(format!("{h}5\r\nfirst\r\n").as_bytes())
                .await
                .is_err()
            {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            s.write_all(b"6\r\nsecond\r\n0\r\n\r\n").await.is_ok()
        }
        "stall" => {
            let h = head(200, st, rec, "Transfer-Encoding: chunked\r\n\r\n");
            if s.write_all(format!("{h}5\r\nfirst\r\n").as_bytes())
                .await
                .is_err()
            {
                return false;
            }
            // Nothing more is sent: wait for the gateway to give up on this connection (EOF or reset).
            let mut scratch = [0u8; 512];
            let _ = tokio::time::timeout(Duration::from_secs(30), async {
                while matches!(s.read(&mut scratch).await, Ok(n) if n > 0) {}
            })
            .await;
            false
        }
        "truncate" => {
            // Announces twice the bytes it sends, then closes.
            let n = num(1000);
            let mut out =
                head(200, st, rec, &format!("Content-Length: {}\r\n\r\n", 2 * n)).into_bytes();
            out.extend((0..n).map(pattern));
            let _ = s.write_all(&out).await;
            false
        }
        "large" | "eof" => {
            let total = num(1 << 20);
            let extra = if first == "large" {
                format!("Content-Length: {total}\r\n\r\n")
            } else {
                "Connection: close\r\n\r\n".to_owned()
            };
            if s.write_all(head(200, st, rec, &extra).as_bytes())
                .await
                .is_err()
            {
                return false;
            }
            if is_head {
                return first == "large";
            }
            let mut off = 0u64;
            let mut piece = Vec::with_capacity(64 * 1024);
            while off < total {
                let n = (total - off).min(64 * 1024);
                piece.clear();
                piece.extend((off..off + n).map(pattern));
                if s.write_all(&piece).await.is_err() {
                    return false;
                }
                off += n;
            }
            first == "large"
        }
        _ => s
            .write_all(&fixed(200, st.name.as_bytes(), ""))
            .await
            .is_ok(),
    }
}

/// An origin bound to `ip:port` (discovery tests publish that exact address) answering its `name` to every request.
pub async fn named_origin(
    ip: IpAddr,
    port: u16,
    name: &'static str,
) -> tokio::task::JoinHandle<()> {
    let l = tokio::net::TcpListener::bind(SocketAddr::new(ip, port))
        .await
        .expect("bind origin");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut have = Vec::new();
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        let r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{name}",
                            name.len()
                        );
                        if s.write_all(r.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    })
}

/// Status and body of a GET on a new connection.
pub async fn body_of(gw: SocketAddr, path: &str) -> (u16, String) {
    let r = Client::connect(gw).await.get(path).await;
    (r.status, r.text())
}
