//! One downstream HTTP/1.1 connection: read a head, route it, proxy it with retries, stream the response back,
//! repeat while keep-alive holds. See `LIFECYCLE.md` beside this file for the states and when each side closes.
//!
//! Per request the hot path does: one parse, one router lookup, one balancer pick, a pool pop, one write of head
//! and small body upstream, one read, one write back. No locks, no per-request `Arc` clone of the snapshot (the
//! connection re-reads it only when the generation counter moved), and buffers are reused across requests.

use std::borrow::Cow;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_http::{parse_request, parse_response, BodyKind, RequestHead, ResponseHead};
use sluice_plugins::{Chain, Ctx, Flow, LogInfo, ReqView, RespEdits, Response};
use sluice_router::{MatchRequest, Params};
use sluice_upstream::{FailureKind, Tried};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::access_log::{Line, Try};
use crate::body::{flush, BodyError, Copy, EarlyWatch, Watched, WatchedSink};
use crate::error::{html_page, synthetic, Error, Kind, Side, Synthetic};
use crate::forward::{self, ForwardInfo, OutFraming};
use crate::pool::Checkout;
use crate::server::Worker;
use crate::slots::Slot;
use crate::snapshot::{CompiledRoute, HashOn, NodeRt, Snapshot, UpstreamRt};

mod mirror;
mod plugin_body;
mod switch;

const BUF_SIZE: usize = 8 * 1024;

/// A worker's spare connection buffers. Every h2 stream runs a `Conn` with three buffers; allocating them per
/// stream cost ~1.9k instructions a request in mimalloc's slow path (8 KiB blocks churned through its pages).
#[derive(Default)]
pub(crate) struct BufPool(std::cell::RefCell<Vec<BytesMut>>);

impl BufPool {
    /// Enough for the streams of a few busy h2 connections; beyond it buffers are freed.
    const KEEP: usize = 384;
    /// A buffer that grew past this for a large head or body is freed rather than kept.
    const MAX_CAPACITY: usize = 8 * BUF_SIZE;

    fn take(&self) -> BytesMut {
        self.0
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(BUF_SIZE))
    }

    fn put(&self, mut b: BytesMut) {
        let mut v = self.0.borrow_mut();
        if v.len() >= Self::KEEP || b.capacity() > Self::MAX_CAPACITY {
            return;
        }
        b.clear();
        // Heads are split off the front of these buffers: once those parts are dropped, this takes the whole
        // allocation back without allocating (while one is alive it allocates, as `take` would).
        b.reserve(BUF_SIZE);
        v.push(b);
    }
}

/// A connection's peer IP and local port as text, formatted once per connection.
#[derive(Clone)]
pub(crate) struct AddrText {
    client_ip: Rc<str>,
    server_port: Rc<[u8]>,
}

impl AddrText {
    pub(crate) fn new(peer: SocketAddr, local: SocketAddr) -> Self {
        AddrText {
            client_ip: peer.ip().to_string().into(),
            server_port: local.port().to_string().into_bytes().into(),
        }
    }
}

pub(crate) struct Conn<S> {
    io: S,
    peer: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
    rbuf: BytesMut,
    ubuf: BytesMut,
    out: BytesMut,
    /// The peer IP as text, formatted once: X-Forwarded-For, X-Real-IP and the `remote_addr` variable use it.
    client_ip: Rc<str>,
    server_port: Rc<[u8]>,
    params: Params,
    w: Rc<Worker>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// TLS without the client certificate a `skip_mtls_uri_regex` site asks for: only the paths it lists.
    mtls_gate: Option<Arc<crate::tls_server::SkipMtls>>,
    /// The accepted connection's eviction state (`None` for h2 streams served by a `Conn`).
    slot: Option<Rc<Slot>>,
    /// Where the first head's deadline counts from.
    opened: tokio::time::Instant,
    /// One h2 stream (`h2/stream.rs`; the access log says HTTP/2.0).
    h2: bool,
    /// What the client got for the current request, for the access log.
    sent: Sent,
    /// The current request's upstream attempts, for the access log (reused across requests).
    tries: Vec<Try>,
    /// How many bytes at the front of `rbuf` are the body read for the plugins (as it will be forwarded).
    buffered_body: usize,
    /// The connection's one timer for the waits of every request (the keep-alive wait, the upstream's answer).
    timer: Deadline,
    /// The X-Forwarded-* lines of this connection, formatted at its first upstream request.
    fwd_lines: Option<forward::FwdLines>,
    /// The previous request's Host as sent and as routing sees it: the next request naming the same bytes skips
    /// the UTF-8 check and the port / case handling.
    host_memo: sluice_plugins::HostMemo,
}

/// One timer a connection reuses for its waits instead of arming and dropping a new one per wait. A wait whose
/// future is ready on its first poll reads no clock. A wait that is pending reads the clock once for its deadline
/// but does not move the timer there when that is later than where the timer already is (every keep-alive wait
/// after the first): the timer then fires early, at an earlier wait's deadline, and only that wake moves it on to
/// this wait's. A later deadline costs nothing per wait, an earlier one (a shorter timeout) one reset.
#[derive(Default)]
struct Deadline {
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The current wait's deadline (the timer's may be earlier).
    due: Option<tokio::time::Instant>,
    /// The waker the timer last answered `Pending` to, cleared when the timer is reset. While it is this task's
    /// and the timer has not fired, the timer holds that waker already: a new wait does not poll it again.
    polled_by: Option<std::task::Waker>,
}

/// The wait outlived its timeout.
struct TimedOut;

impl Deadline {
    /// `fut`'s output, or `TimedOut` when it is not ready within `t` of its first poll.
    async fn within<F: std::future::Future>(
        &mut self,
        t: std::time::Duration,
        fut: F,
    ) -> Result<F::Output, TimedOut> {
        use std::future::Future;
        use std::task::Poll;
        let mut fut = std::pin::pin!(fut);
        let mut armed = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(v));
            }
            // First time pending: the deadline counts from here.
            if !armed {
                armed = true;
                let due = tokio::time::Instant::now() + t;
                self.due = Some(due);
                match &mut self.sleep {
                    Some(s) if s.deadline() <= due && !s.is_elapsed() => {}
                    Some(s) => {
                        s.as_mut().reset(due);
                        self.polled_by = None;
                    }
                    None => self.sleep = Some(Box::pin(tokio::time::sleep_until(due))),
                }
            }
            let (Some(s), Some(due)) = (self.sleep.as_mut(), self.due) else {
                return Poll::Pending;
            };
            // At most twice: a timer that fired at an earlier deadline is moved to `due` and polled again.
            loop {
                // Armed for this task (neither fired nor reset since it last answered Pending to this waker): its
                // wake is registered, polling it again would only register the same waker.
                if !s.is_elapsed()
                    && self
                        .polled_by
                        .as_ref()
                        .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    return Poll::Pending;
                }
                match s.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.polled_by = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    Poll::Ready(()) if s.deadline() >= due => return Poll::Ready(Err(TimedOut)),
                    Poll::Ready(()) => {
                        s.as_mut().reset(due);
                        self.polled_by = None;
                    }
                }
            }
        })
        .await
    }
}

/// The response the client got: status, bytes on the wire, bytes of body.
#[derive(Debug, Clone, Copy, Default)]
struct Sent {
    status: u16,
    bytes: u64,
    body: u64,
}

/// What the access log needs of a proxied request beyond the head: the route and node it went to, and the
/// plugins' rewrites of Host and target.
#[derive(Default)]
struct UpRec<'s> {
    route: Option<&'s CompiledRoute>,
    node: usize,
    host: Option<bytes::Bytes>,
    uri: Option<bytes::Bytes>,
    /// The route the router picked (the live counters count plugins' answers too).
    matched: Option<&'s CompiledRoute>,
    /// An upstream attempt was made: `route` and `node` name where it went.
    attempted: bool,
    /// The upstream's time of the attempt that answered.
    upstream: Option<std::time::Duration>,
    /// Request body bytes forwarded.
    body_in: u64,
    /// How long the request took up to the end of the upstream attempt that answered (the response written),
    /// from the request's own clock reads: spares the end-of-request clock read and a second subtraction.
    elapsed: Option<std::time::Duration>,
}

/// How far one attempt got before it failed: decides whether another node may be tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing reached the upstream.
    BeforeSend,
    /// The request (or part of it) was sent; no response byte reached the client.
    Sent { stale: bool },
    /// The client already has part of the response: the only way out is closing the connection.
    Responding,
}

/// A request that was proxied to the end.
struct Done {
    keep: bool,
    status: u16,
    request_body: u64,
    response_bytes: u64,
    /// Of `response_bytes`, the body (the access log's `$body_bytes_sent`).
    body_bytes: u64,
    upstream_latency: std::time::Duration,
}

struct Failure {
    err: Error,
    stage: Stage,
    /// The client's request body was (partly) consumed: the request cannot be replayed.
    body_consumed: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Writes the request head as it goes to `node` into `self.out` (cleared first): the same bytes whichever
    /// protocol then carries it upstream.
    fn upstream_head(
        &mut self,
        head: &RequestHead,
        up: &UpstreamRt,
        node: &NodeRt,
        host: Option<&str>,
        edits: Option<&sluice_plugins::Edits>,
    ) {
        self.out.clear();
        let lines = self.fwd_lines.get_or_insert_with(|| {
            forward::FwdLines::new(
                self.client_ip.as_bytes(),
                &self.server_port,
                self.scheme.as_bytes(),
            )
        });
        forward::request_head(
            head,
            &ForwardInfo {
                pass_host: &up.pass_host,
                node,
                client_ip: self.client_ip.as_bytes(),
                scheme: self.scheme.as_bytes(),
                host,
                lines,
            },
            edits,
            &mut self.out,
        );
    }

    pub(crate) fn new(
        io: S,
        peer: SocketAddr,
        local: SocketAddr,
        scheme: &'static str,
        w: Rc<Worker>,
    ) -> Self {
        Self::with_addrs(io, peer, local, scheme, w, AddrText::new(peer, local))
    }

    /// [`Conn::new`] with the addresses already formatted: an h2 connection's streams share its [`AddrText`].
    pub(crate) fn with_addrs(
        io: S,
        peer: SocketAddr,
        local: SocketAddr,
        scheme: &'static str,
        w: Rc<Worker>,
        addrs: AddrText,
    ) -> Self {
        let shutdown = w.shared.shutdown.subscribe();
        Conn {
            io,
            peer,
            local,
            scheme,
            rbuf: w.bufs.take(),
            ubuf: w.bufs.take(),
            out: w.bufs.take(),
            client_ip: addrs.client_ip,
            server_port: addrs.server_port,
            params: Params::new(),
            host_memo: Default::default(),
            w,
            shutdown,
            mtls_gate: None,
            slot: None,
            opened: tokio::time::Instant::now(),
            h2: false,
            sent: Sent::default(),
            tries: Vec::new(),
            buffered_body: 0,
            timer: Deadline::default(),
            fwd_lines: None,
        }
    }

    /// Ties the connection to its accept slot: evictable while it waits for a head, and the first head's deadline
    /// counts from the accept.
    pub(crate) fn with_slot(mut self, slot: Rc<Slot>) -> Self {
        self.opened = slot.opened;
        self.slot = Some(slot);
        self
    }

    /// Marks this connection as one h2 stream.
    /// Marks this connection as one h2 stream whose request head (serialised from the h2 fields) is `head`:
    /// parsed from the buffer at once, without a read through the stream or a head deadline.
    pub(crate) fn for_h2_stream(mut self, head: &[u8]) -> Self {
        self.h2 = true;
        self.rbuf.extend_from_slice(head);
        self
    }

    pub(crate) fn with_mtls_gate(mut self, gate: Option<Arc<crate::tls_server::SkipMtls>>) -> Self {
        self.mtls_gate = gate;
        self
    }

    pub(crate) async fn run(mut self) {
        if let Some(frame) = self.serve_requests().await {
            let io = crate::h2::upgrade::Upgraded::new(self.io, self.rbuf, frame);
            return crate::h2::serve(io, self.peer, self.local, self.scheme, self.w).await;
        }
        self.w.bufs.put(self.rbuf);
        self.w.bufs.put(self.ubuf);
        self.w.bufs.put(self.out);
    }

    /// Serves requests until the connection ends; `Some`: it was upgraded to h2c (101 sent), the frame is the
    /// upgrading request as stream 1.
    async fn serve_requests(&mut self) -> Option<Bytes> {
        let mut snap: Arc<Snapshot> = self.w.shared.snapshot.load_full();
        let mut gen = self.w.shared.generation();
        let mut first = true;
        loop {
            let head = match self.read_head(first).await {
                Ok(Some(h)) => h,
                Ok(None) => return None,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, error = %e, "bad request");
                    self.sent = Sent::default();
                    if let Some(s) = synthetic(&e) {
                        let _ = self.write_synthetic(&s, false, false).await;
                    }
                    self.log_unread(&e);
                    return None;
                }
            };
            first = false;
            if let Some(s) = &self.slot {
                s.set_busy();
            }
            if !self.h2
                && self.scheme == "http"
                && self.w.shared.cfg.enable_http2
                && crate::h2::upgrade::wants_h2c(&head)
            {
                if let Some(frame) = crate::h2::upgrade::stream1_headers(&head) {
                    const SWITCH: &[u8] =
                        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
                    if self.io.write_all(SWITCH).await.is_err() {
                        return None;
                    }
                    return Some(frame);
                }
            }
            let now_gen = self.w.shared.generation();
            if now_gen != gen {
                snap = self.w.shared.snapshot.load_full();
                gen = now_gen;
            }
            match self.handle(&snap, head).await {
                Ok(true) if !self.w.shared.stopping() => {}
                _ => return None,
            }
            // Idle keep-alive from here: may give way to a new connection at the cap (a new connection's slot
            // starts evictable).
            if let Some(s) = &self.slot {
                s.set_evictable(&self.w.slots);
            }
        }
    }

    fn parse_head(&mut self) -> Result<Option<RequestHead>, Error> {
        parse_request(&mut self.rbuf, &self.w.shared.cfg.limits)
            .map_err(|e| Error::downstream(Kind::BadRequest(e.status()), e.to_string()))
    }

    /// The next request head. Between requests the connection waits `keepalive_timeout` for a first byte; from
    /// there (for the first request: from the accept) the whole head must arrive by one deadline,
    /// `client_header_timeout`, however it is dribbled. At the deadline a started head gets 408 (HAProxy's answer;
    /// nginx closes silently), a connection that sent nothing is closed silently. `Ok(None)`: close quietly.
    async fn read_head(&mut self, first: bool) -> Result<Option<RequestHead>, Error> {
        if let Some(h) = self.parse_head()? {
            return Ok(Some(h));
        }
        let cfg = &self.w.shared.cfg;
        if self.rbuf.is_empty() && !first {
            if self.w.shared.stopping() {
                return Ok(None);
            }
            self.rbuf.reserve(BUF_SIZE / 2);
            let read = self
                .timer
                .within(cfg.keepalive_timeout, self.io.read_buf(&mut self.rbuf));
            let r = match &self.slot {
                // The worker's accept loop closes this connection at a shutdown while the slot says idle (the
                // flag was checked above, in the same poll): no shutdown future per request.
                Some(slot) => {
                    slot.set_idle(true);
                    let r = read.await;
                    slot.set_idle(false);
                    r
                }
                None => tokio::select! {
                    r = read => r,
                    _ = self.shutdown.changed() => return Ok(None),
                },
            };
            match r {
                Ok(Ok(0)) | Err(_) => return Ok(None),
                Ok(Err(e)) => {
                    return Err(Error::downstream(
                        Kind::ClientClosed,
                        format!("client read: {e}"),
                    ))
                }
                Ok(Ok(_)) => {}
            }
            // Almost always the whole head arrived in that one read: no deadline timer is armed.
            if let Some(h) = self.parse_head()? {
                return Ok(Some(h));
            }
        }
        let cfg = &self.w.shared.cfg;
        let from = if first {
            self.opened
        } else {
            tokio::time::Instant::now()
        };
        let deadline = tokio::time::sleep_until(from + cfg.header_timeout);
        tokio::pin!(deadline);
        loop {
            let nothing_yet = self.rbuf.is_empty();
            self.rbuf.reserve(BUF_SIZE / 2);
            let read = self.io.read_buf(&mut self.rbuf);
            let r = if nothing_yet {
                if self.w.shared.stopping() {
                    return Ok(None);
                }
                tokio::select! {
                    r = read => Some(r),
                    _ = &mut deadline => None,
                    _ = self.shutdown.changed() => return Ok(None),
                }
            } else {
                tokio::select! {
                    r = read => Some(r),
                    _ = &mut deadline => None,
                }
            };
            match r {
                None | Some(Ok(0)) if nothing_yet => return Ok(None),
                None => {
                    return Err(Error::downstream(
                        Kind::BadRequest(408),
                        "client header timeout",
                    ))
                }
                Some(Ok(0)) => {
                    return Err(Error::downstream(
                        Kind::ClientClosed,
                        "client closed inside a request head",
                    ))
                }
                Some(Err(e)) => {
                    return Err(Error::downstream(
                        Kind::ClientClosed,
                        format!("client read: {e}"),
                    ))
                }
                Some(Ok(_)) => {}
            }
            if let Some(h) = self.parse_head()? {
                return Ok(Some(h));
            }
        }
    }

    /// Serves one request, counts it (`sluice-stats`) and logs it. `Ok(true)`: the connection may carry another.
    async fn handle(&mut self, snap: &Snapshot, head: RequestHead) -> Result<bool, Error> {
        let start = Instant::now();
        self.sent = Sent::default();
        let logging = self.w.log.is_some();
        if logging {
            self.tries.clear();
        }
        let mut up = UpRec::default();
        let r = self.serve(snap, &head, &mut up, start).await;
        let elapsed = match up.elapsed {
            Some(d) => d,
            None => start.elapsed(),
        };
        let status = self.final_status(&r);
        self.count(&head, &up, status, elapsed);
        if logging {
            self.log(&head, &up, status, elapsed);
        }
        r
    }

    /// The status the client got; when nothing was answered, nginx's: 499 for a client that went away, 408 for one
    /// that stalled, else 502.
    fn final_status(&self, r: &Result<bool, Error>) -> u16 {
        match (self.sent.status, r) {
            (0, Err(e)) if e.kind == Kind::ClientTimeout => 408,
            (0, Err(e)) if e.side == Side::Downstream => 499,
            (0, _) => 502,
            (s, _) => s,
        }
    }

    /// Adds the request to this worker's live counters: one table probe for the route, one for the node.
    #[inline]
    fn count(&self, head: &RequestHead, up: &UpRec<'_>, status: u16, latency: std::time::Duration) {
        let route = up.matched.map(|r| (&r.id, r.service.as_ref()));
        let node = match up.route {
            Some(r) if up.attempted => r.upstream.nodes.get(up.node).map(|n| &n.stats_key),
            _ => None,
        };
        let r = sluice_stats::Record {
            status,
            bytes_in: head.buf.len() as u64 + up.body_in,
            bytes_out: self.sent.bytes,
            latency,
            upstream: up.upstream,
        };
        self.w.stats.borrow_mut().record(route, node, &r);
    }

    /// The access log line of a request that was read whole (whatever became of it).
    fn log(&self, head: &RequestHead, up: &UpRec<'_>, status: u16, elapsed: std::time::Duration) {
        let Some(log) = &self.w.log else { return };
        let upstream = up.route.map(|route| {
            let u = &route.upstream;
            let node = &u.nodes[up.node.min(u.nodes.len().saturating_sub(1))];
            let client_host = head.header("host").filter(|h| !h.is_empty());
            let host: &[u8] = match (&up.host, &u.pass_host) {
                (Some(h), _) => h,
                (None, crate::snapshot::PassHost::Pass) => client_host.unwrap_or(&node.host_header),
                (None, crate::snapshot::PassHost::Node) => &node.host_header,
                (None, crate::snapshot::PassHost::Rewrite(h)) => h,
            };
            crate::access_log::Upstream {
                scheme: match (u.h2, u.tls.is_some()) {
                    (true, true) => "grpcs",
                    (true, false) => "grpc",
                    (false, true) => "https",
                    (false, false) => "http",
                },
                host,
                uri: up.uri.as_ref(),
            }
        });
        log.log(&Line {
            peer: self.peer,
            client_ip: &self.client_ip,
            local: self.local,
            scheme: self.scheme,
            h2: self.h2,
            head: Some(head),
            status,
            bytes_sent: self.sent.bytes,
            body_bytes_sent: self.sent.body,
            request_length: head.buf.len() as u64,
            request_time: elapsed,
            tries: &self.tries,
            upstream,
        });
    }

    /// The access log line of a request whose head could not be read (nginx logs these too: 400, 408, 414, 431),
    /// and its count in the live totals.
    fn log_unread(&self, e: &Error) {
        let status = match (self.sent.status, e.kind) {
            (0, Kind::ClientTimeout) => 408,
            (0, _) => 400,
            (s, _) => s,
        };
        self.w.stats.borrow_mut().record(
            None,
            None,
            &sluice_stats::Record {
                status,
                bytes_in: self.rbuf.len() as u64,
                bytes_out: self.sent.bytes,
                latency: std::time::Duration::ZERO,
                upstream: None,
            },
        );
        let Some(log) = &self.w.log else { return };
        log.log(&Line {
            peer: self.peer,
            client_ip: &self.client_ip,
            local: self.local,
            scheme: self.scheme,
            h2: self.h2,
            head: None,
            status,
            bytes_sent: self.sent.bytes,
            body_bytes_sent: self.sent.body,
            request_length: self.rbuf.len() as u64,
            request_time: std::time::Duration::ZERO,
            tries: &[],
            upstream: None,
        });
    }

    async fn serve<'s>(
        &mut self,
        snap: &'s Snapshot,
        head: &RequestHead,
        rec: &mut UpRec<'s>,
        req_start: Instant,
    ) -> Result<bool, Error> {
        let client_ip = self.client_ip.clone();
        // Routing, vars and plugins see nginx's `$uri`; a path that has none (bad escape, `..` above the root) is
        // refused like nginx does, before anything else looks at it.
        // An h2 stream's `Conn` serves one request: a memo would only cost its allocations.
        let host = match self.h2 {
            false => head.host.map(|h| self.host_memo.get(head.slice(h))),
            true => None,
        };
        let host_text = match &host {
            Some(h) => Some(Cow::Borrowed(h.text())),
            None => head.host_str().map(sluice_plugins::host_of),
        };
        let view = match ReqView::with_host(head, self.peer, self.local, self.scheme, host_text)
            .and_then(|v| {
                if self.w.shared.cfg.normalize_uri_like_servlet {
                    v.like_servlet()
                } else {
                    Ok(v)
                }
            }) {
            Ok(v) => v.with_peer_text(&client_ip),
            Err(e) => {
                let e = Error::downstream(Kind::BadRequest(400), e.to_string());
                return self.refuse(head, &e).await;
            }
        };
        // On the normalised path too (APISIX matches `$uri`): `/public/../admin` is not a public path.
        if self
            .mtls_gate
            .as_ref()
            .is_some_and(|g| !g.allows(view.uri.as_bytes()))
        {
            let e = Error::downstream(Kind::BadRequest(400), "client certificate required");
            return self.refuse(head, &e).await;
        }
        self.params.clear();
        let Some(served) = snap
            .router
            .find(&view, &mut self.params)
            .and_then(|&slot| snap.served(slot))
        else {
            if let Some(global) = snap.global.as_deref() {
                return self.unmatched(head, &view, global).await;
            }
            return self
                .refuse(head, &Error::downstream(Kind::NoRoute, "no route"))
                .await;
        };
        let route = &served.route;
        rec.matched = Some(route);
        if let Some(status) = route.dangling {
            // Its service or plugin config is gone: APISIX answers before any plugin, global rules included.
            tracing::error!(route = %route.id, status, "route names a deleted service or plugin config");
            return self
                .refuse(
                    head,
                    &Error::downstream(Kind::BadRequest(status), "dangling reference"),
                )
                .await;
        }
        let max_body = self.w.shared.cfg.max_body;
        if let BodyKind::Length(n) = head.body {
            if max_body != 0 && n > max_body {
                return self
                    .refuse(
                        head,
                        &Error::downstream(Kind::BadRequest(413), "body too large"),
                    )
                    .await;
            }
        }
        let chains: [Option<&Chain>; 2] = [snap.global.as_deref(), route.plugins.as_deref()];
        // A plugin that inspects the body (request-validation body_schema) gets it read whole first; it stays in
        // `rbuf` for the forward. Only chains that ask pay this.
        let req_body = if chains.iter().flatten().any(|c| c.needs_body()) {
            match self.read_body_for_plugins(head).await {
                Ok(b) => Some(b),
                Err(e) => return self.refuse(head, &e).await,
            }
        } else {
            None
        };
        // Built in place: the context is large, and each by-value builder step was a copy of it.
        let mut pctx = None;
        if chains.iter().any(Option::is_some) {
            let ctx = pctx.insert(Ctx::new(&view, &route.id));
            ctx.route = Some(&served.meta);
            ctx.started = Some(req_start);
            if !self.params.is_empty() {
                ctx.set_params(self.params.clone());
            }
            if let Some(b) = &req_body {
                ctx.body = Some(b);
            }
        }
        if let Some(ctx) = pctx.as_mut() {
            if let Some(r) = self.request_phases(&chains, ctx).await? {
                return self.respond_plugin(head, r, ctx, &chains, req_start).await;
            }
        }
        // A plugin's replacement body (grpc-transcode's message, grpc-web's decoded frames) goes upstream instead
        // of the client's, framed by its length.
        let replaced;
        let head = match pctx.as_mut().and_then(|c| c.edits.body.take()) {
            None => head,
            Some(body) => match self.swap_body(head, req_body.is_some(), body).await {
                Ok(h) => {
                    replaced = h;
                    &replaced
                }
                Err(e) => return self.refuse(head, &e).await,
            },
        };
        // A plugin that speaks the upstream's protocol itself (dubbo-proxy) does the exchange; the node choice,
        // retries, health and the response phases stay here.
        if let Some(ctx) = pctx.as_mut() {
            if let Some(call) = ctx.take_upstream_call() {
                let route = ctx
                    .picked_upstream()
                    .and_then(|i| served.splits.get(i))
                    .unwrap_or(route);
                let consumer = ctx.consumer.clone();
                let key = hash_key(
                    &route.upstream,
                    &view,
                    consumer.as_deref().map(|c| c.username.as_str()),
                );
                if route.upstream.unsupported.is_some() || route.upstream.missing.is_some() {
                    return self
                        .unservable(head, route, Some(ctx), &chains, req_start)
                        .await;
                }
                let body_read = req_body.is_some();
                return self
                    .serve_call(
                        head, route, call, ctx, &chains, key, req_start, body_read, rec,
                    )
                    .await;
            }
        }
        // Plugin decisions on the way upstream (one branch on the no-plugin path): a copy for a mirror
        // (proxy-mirror), another upstream (traffic-split: the route's sibling with that upstream).
        let route = match pctx.as_mut() {
            None => route,
            Some(ctx) => {
                if let Some(m) = ctx.take_mirror() {
                    self.mirror(m, head).await;
                }
                ctx.picked_upstream()
                    .and_then(|i| served.splits.get(i))
                    .unwrap_or(route)
            }
        };
        let up: &UpstreamRt = &route.upstream;
        if up.unsupported.is_some() || up.missing.is_some() {
            return self
                .unservable(head, route, pctx.as_mut(), &chains, req_start)
                .await;
        }
        let logging = self.w.log.is_some();
        rec.route = Some(route);
        if logging {
            if let Some(ctx) = pctx.as_ref() {
                rec.host = ctx.edits.host.clone();
                rec.uri = ctx.edits.uri.clone();
            }
        }
        let consumer = pctx.as_ref().and_then(|c| c.consumer.clone());
        let hash_key = hash_key(up, &view, consumer.as_deref().map(|c| c.username.as_str()));
        let host = view.host.as_deref();

        let retries = up
            .retries
            .unwrap_or(up.nodes.len().saturating_sub(1) as u32);
        // Only an upstream with `retry_timeout` needs the clock here.
        let started = up.retry_timeout.map(|_| Instant::now());
        let mut tried = Tried::new();
        let mut body_consumed = false;
        let mut stale_retry_used = false;
        let mut first_attempt = true;
        loop {
            let Some(node_idx) = up.balancer.pick(hash_key.as_deref(), &tried) else {
                return self
                    .refuse(
                        head,
                        &Error::upstream(Kind::NoUpstreamNode, "no healthy node"),
                    )
                    .await;
            };
            tried.insert(node_idx);
            up.balancer.on_request_start(node_idx);
            // Without plugins, only routing ran since the request's own clock read (microseconds, no IO): the
            // first attempt starts from it. Plugins (which may wait) and retries read the clock.
            let t0 = if first_attempt && pctx.is_none() {
                req_start
            } else {
                Instant::now()
            };
            first_attempt = false;
            let res = self
                .attempt(
                    head,
                    host,
                    route,
                    node_idx,
                    &mut body_consumed,
                    pctx.as_mut(),
                    &chains,
                    t0,
                )
                .await;
            // This clock read also ends the request for the live counters and the log phase (`rec.elapsed`).
            let end = Instant::now();
            let spent = end.saturating_duration_since(t0);
            up.balancer
                .on_request_end_at(node_idx, spent, res.is_ok(), end);
            // The first attempt without plugins started at the request's own clock read: the same span.
            let elapsed = if t0 == req_start {
                spent
            } else {
                end.saturating_duration_since(req_start)
            };
            if res.is_ok() {
                rec.elapsed = Some(elapsed);
            }
            rec.node = node_idx;
            rec.attempted = true;
            if logging {
                let status = match &res {
                    Ok(d) => pctx
                        .as_ref()
                        .and_then(|c| c.upstream_head())
                        .map_or(d.status, |h| h.status),
                    Err(f) if f.err.is_timeout() => 504,
                    Err(_) => 502,
                };
                self.tries.push(Try {
                    addr: up.nodes[node_idx].addr,
                    status,
                    time: spent,
                });
            }
            let f = match res {
                Ok(done) => {
                    self.sent = Sent {
                        status: done.status,
                        bytes: done.response_bytes,
                        body: done.body_bytes,
                    };
                    rec.upstream = Some(done.upstream_latency);
                    rec.body_in = done.request_body;
                    if let Some(ctx) = pctx.as_ref() {
                        let info = LogInfo {
                            status: done.status,
                            request_bytes: head.buf.len() as u64 + done.request_body,
                            response_bytes: done.response_bytes,
                            latency: elapsed,
                            upstream_latency: Some(done.upstream_latency),
                            upstream_addr: Some(up.nodes[node_idx].addr),
                            upstream_status: ctx.upstream_head().map(|h| h.status),
                        };
                        Chain::log_phase(&chains, ctx, &info);
                    }
                    return Ok(done.keep);
                }
                Err(f) => f,
            };
            if f.err.side == Side::Upstream {
                let kind = if f.err.is_timeout() {
                    FailureKind::Timeout
                } else {
                    FailureKind::Tcp
                };
                up.balancer.health().report_failure(node_idx, kind);
                tracing::warn!(route = %route.id, error = %f.err, "upstream attempt failed");
            }
            let replayable = !f.body_consumed;
            let within_time = match (up.retry_timeout, started) {
                (Some(t), Some(s)) => s.elapsed() < t,
                _ => true,
            };
            let retry = f.err.side == Side::Upstream
                && replayable
                && within_time
                && match f.stage {
                    Stage::BeforeSend => (tried.len() as u32) <= retries,
                    // A pooled connection the upstream had closed: the request never reached it.
                    Stage::Sent { stale: true } if !stale_retry_used => {
                        stale_retry_used = true;
                        tried = Tried::new();
                        true
                    }
                    Stage::Sent { .. } => idempotent(head) && (tried.len() as u32) <= retries,
                    Stage::Responding => false,
                };
            if retry {
                continue;
            }
            if f.stage == Stage::Responding
                || f.err.side == Side::Downstream && synthetic(&f.err).is_none()
            {
                return Err(f.err);
            }
            let s = synthetic(&f.err).unwrap_or_else(|| html_page(502));
            // The request body may be partly unread: the connection cannot carry another request.
            let keep = !f.body_consumed && head.body == BodyKind::Empty && head.keep_alive;
            self.write_synthetic(&s, keep, head.is_head())
                .await
                .map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
            return Ok(keep);
        }
    }

    /// Writes a plugin's own response (after header_filter) and runs the log phase.
    async fn respond_plugin(
        &mut self,
        head: &RequestHead,
        r: Response,
        ctx: &mut Ctx<'_>,
        chains: &[Option<&Chain>; 2],
        started: Instant,
    ) -> Result<bool, Error> {
        self.respond_own(head, r, ctx, chains, started, None).await
    }

    /// [`Conn::respond_plugin`] for an answer that came from an upstream a plugin called itself (`via`: the node
    /// and the call's duration, for the log phase); the request body, read for the plugin, is not waiting.
    async fn respond_own(
        &mut self,
        head: &RequestHead,
        mut r: Response,
        ctx: &mut Ctx<'_>,
        chains: &[Option<&Chain>; 2],
        started: Instant,
        via: Option<(SocketAddr, std::time::Duration)>,
    ) -> Result<bool, Error> {
        let upstream_status = via.map(|_| r.status);
        // The plugins filter the answer like an upstream's: headers, then the whole body as one piece with eof.
        ctx.set_own_headers(std::mem::take(&mut r.headers));
        sluice_plugins::header_filters(chains, ctx, r.status);
        r.status = ctx.resp.status.unwrap_or(r.status);
        if sluice_plugins::filters_body(chains, ctx) {
            let mut piece = sluice_plugins::BodyChunk {
                data: std::mem::take(&mut r.body),
                eof: true,
            };
            sluice_plugins::body_filters(chains, ctx, &mut piece);
            r.body = piece.data;
        }
        let keep = head.keep_alive
            && (head.body == BodyKind::Empty || via.is_some())
            && !self.w.shared.stopping();
        self.out.clear();
        let mut n = forward::itoa_buf();
        self.out.put_slice(b"HTTP/1.1 ");
        self.out.put_slice(forward::fmt_u16(r.status, &mut n));
        self.out.put_u8(b' ');
        self.out
            .put_slice(sluice_http::status_reason(r.status).as_bytes());
        self.out.put_slice(b"\r\n");
        // An answer replayed from a cache (proxy-cache) carries the origin's Server and Date: never two of each.
        if ctx.response_header("server").is_none() {
            self.out.put_slice(b"Server: sluice\r\n");
        }
        if ctx.response_header("date").is_none() {
            self.out.put_slice(b"Date: ");
            self.out.put_slice(&sluice_http::date::now());
            self.out.put_slice(b"\r\n");
        }
        for (name, value) in ctx.response_headers() {
            if !name.eq_ignore_ascii_case(b"content-length") {
                forward::put_header(&mut self.out, name, value);
            }
        }
        // 204 and 304 have no body and no Content-Length (RFC 9110 §8.6; proxy-cache's 304 on a hit).
        let bodiless = matches!(r.status, 204 | 304);
        if !bodiless {
            self.out.put_slice(b"Content-Length: ");
            self.out
                .put_slice(forward::fmt_u64(r.body.len() as u64, &mut n));
            self.out.put_slice(b"\r\n");
        }
        self.out.put_slice(if keep {
            &b"\r\n"[..]
        } else {
            &b"Connection: close\r\n\r\n"[..]
        });
        let body = if !head.is_head() && !bodiless {
            self.out.put_slice(&r.body);
            r.body.len() as u64
        } else {
            0
        };
        let sent = self.out.len() as u64;
        self.sent = Sent {
            status: r.status,
            bytes: sent,
            body,
        };
        let w = self.io.write_all(&self.out).await;
        self.out.clear();
        w.map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
        let info = LogInfo {
            status: r.status,
            request_bytes: head.buf.len() as u64,
            response_bytes: sent,
            latency: started.elapsed(),
            upstream_latency: via.map(|v| v.1),
            upstream_addr: via.map(|v| v.0),
            upstream_status,
        };
        Chain::log_phase(chains, ctx, &info);
        Ok(keep)
    }

    /// A request no route matches, with global rules configured: as APISIX's `http_access_phase`, the global
    /// rules' rewrite and access phases run (one may answer, e.g. an auth plugin's 401), otherwise the answer is
    /// the 404; header_filter and log see it, so prometheus counts it with an empty route label.
    async fn unmatched(
        &mut self,
        head: &RequestHead,
        view: &ReqView<'_>,
        global: &Chain,
    ) -> Result<bool, Error> {
        let started = Instant::now();
        let chains = [Some(global), None];
        let mut ctx = Ctx::new(view, "");
        ctx.started = Some(started);
        let answer = self.request_phases(&chains, &mut ctx).await?;
        let r = answer.unwrap_or_else(|| {
            let nf = synthetic(&Error::downstream(Kind::NoRoute, "no route"));
            let (status, body) = nf.map_or((404, Default::default()), |s| (s.status, s.body));
            Response {
                status,
                headers: vec![(
                    bytes::Bytes::from_static(b"Content-Type"),
                    bytes::Bytes::from_static(b"application/json"),
                )],
                body: bytes::Bytes::from(body.into_owned()),
            }
        });
        self.respond_plugin(head, r, &mut ctx, &chains, started)
            .await
    }

    /// Runs the chains' request phases (global rules first). A hook that asked for a delay (limit-req, limit-conn,
    /// fault-injection) or started IO (`Ctx::await_io`) paused its chain: the wait happens here without blocking
    /// the thread, then the chain resumes after that hook. `Some`: a plugin answered.
    async fn request_phases(
        &mut self,
        chains: &[Option<&Chain>; 2],
        ctx: &mut Ctx<'_>,
    ) -> Result<Option<Response>, Error> {
        for chain in chains.iter().flatten() {
            loop {
                let flow = chain.run_request(ctx);
                let delay = ctx.take_delay();
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if let Some(effect) = ctx.take_effect() {
                    match self.await_effect(effect).await? {
                        Ok(resume) => ctx.resume_with(resume),
                        Err(r) => return Ok(Some(ctx.effect_failed(r))),
                    }
                }
                match flow {
                    Flow::Respond(r) => return Ok(Some(r)),
                    Flow::Continue if ctx.paused() => {}
                    Flow::Continue => break,
                }
            }
        }
        Ok(None)
    }

    /// Awaits a plugin's IO while watching the client: a client that closes its connection cancels the IO (the
    /// future is dropped) and the request ends as nginx's 499. Bytes the client sends meanwhile (its body, a
    /// pipelined request) are kept for later, up to one buffer's worth; past that the client is no longer watched.
    async fn await_effect(
        &mut self,
        effect: sluice_plugins::Effect,
    ) -> Result<Result<sluice_plugins::Resume, Response>, Error> {
        self.watching_client(effect.run()).await
    }

    /// The upstream exchange of a plugin that speaks the upstream's protocol itself (`Ctx::call_upstream`): nodes
    /// from the route's balancer, a node that could not be reached is reported to health and the next one tried
    /// (a call that may have reached its node is not repeated), the answer goes through the response phases.
    #[allow(clippy::too_many_arguments)] // the request's state, borrowed piecewise from `serve`
    async fn serve_call<'s>(
        &mut self,
        head: &RequestHead,
        route: &'s CompiledRoute,
        call: sluice_plugins::UpstreamCall,
        ctx: &mut Ctx<'_>,
        chains: &[Option<&Chain>; 2],
        key: Option<std::borrow::Cow<'_, [u8]>>,
        started: Instant,
        body_read: bool,
        rec: &mut UpRec<'s>,
    ) -> Result<bool, Error> {
        if body_read {
            // The plugin has the body; it is not forwarded.
            let n = std::mem::take(&mut self.buffered_body).min(self.rbuf.len());
            let _ = self.rbuf.split_to(n);
        } else if head.body != BodyKind::Empty {
            // An unread body cannot be skipped safely: this connection ends with the answer.
            tracing::warn!(route = %route.id, "request body not read by the plugin");
        }
        let up: &UpstreamRt = &route.upstream;
        let t = route.timeouts;
        let timeouts = sluice_plugins::CallTimeouts {
            connect: t.connect,
            send: t.send,
            read: t.read,
        };
        let retries = up
            .retries
            .unwrap_or(up.nodes.len().saturating_sub(1) as u32);
        let logging = self.w.log.is_some();
        let mut tried = Tried::new();
        // The last failure asked for a repeat (`CallFailure::retry`).
        let mut repeat = false;
        loop {
            let mut pick = up.balancer.pick(key.as_deref(), &tried);
            if pick.is_none() && repeat {
                // The plugin's repeat when every node was tried: any node again.
                tried = Tried::new();
                pick = up.balancer.pick(key.as_deref(), &tried);
            }
            let Some(node_idx) = pick else {
                return self
                    .refuse(
                        head,
                        &Error::upstream(Kind::NoUpstreamNode, "no healthy node"),
                    )
                    .await;
            };
            tried.insert(node_idx);
            let node = &up.nodes[node_idx];
            up.balancer.on_request_start(node_idx);
            let t0 = Instant::now();
            let r = self.watching_client(call(node.addr, timeouts)).await;
            let spent = t0.elapsed();
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    up.balancer.on_request_end(node_idx, spent, false);
                    return Err(e);
                }
            };
            up.balancer.on_request_end(node_idx, spent, r.is_ok());
            rec.route = Some(route);
            rec.node = node_idx;
            rec.attempted = true;
            if r.is_ok() {
                rec.upstream = Some(spent);
            }
            if logging {
                let status = match &r {
                    Ok(resp) => resp.status,
                    Err(f) if f.timeout => 504,
                    Err(_) => 502,
                };
                self.tries.push(Try {
                    addr: node.addr,
                    status,
                    time: spent,
                });
            }
            let f = match r {
                Ok(resp) => {
                    up.balancer
                        .health()
                        .report_http_status(node_idx, resp.status);
                    return self
                        .respond_own(head, resp, ctx, chains, started, Some((node.addr, spent)))
                        .await;
                }
                Err(f) => f,
            };
            let kind = if f.timeout {
                FailureKind::Timeout
            } else {
                FailureKind::Tcp
            };
            up.balancer.health().report_failure(node_idx, kind);
            tracing::warn!(route = %route.id, node = %node.addr, error = %f.message, "upstream call failed");
            // Another node for one that never reached its node (the upstream's `retries`), or the plugin's repeat
            // (its own budget: a call it knows is safe to send again), on a node not tried yet when there is one.
            repeat = f.retry;
            if f.retry || (!f.sent && (tried.len() as u32) <= retries) {
                continue;
            }
            let e = if f.timeout {
                Error::upstream(Kind::UpstreamTimeout, f.message)
            } else {
                Error::upstream(Kind::UpstreamIo, f.message)
            };
            let s = synthetic(&e).unwrap_or_else(|| html_page(502));
            let keep = head.keep_alive && (head.body == BodyKind::Empty || body_read);
            self.write_synthetic(&s, keep, head.is_head())
                .await
                .map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
            return Ok(keep);
        }
    }

    /// Awaits `fut` while watching the client, as [`Conn::await_effect`] does: a client that closes cancels it.
    async fn watching_client<T>(
        &mut self,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, Error> {
        tokio::pin!(fut);
        let mut watching = true;
        loop {
            if !watching {
                return Ok(fut.await);
            }
            self.rbuf.reserve(BUF_SIZE / 2);
            tokio::select! {
                r = &mut fut => return Ok(r),
                n = self.io.read_buf(&mut self.rbuf) => match n {
                    Ok(0) | Err(_) => {
                        return Err(Error::downstream(
                            Kind::ClientClosed,
                            "client closed while an upstream call was in flight",
                        ))
                    }
                    Ok(_) => watching = self.rbuf.len() < 4 * BUF_SIZE,
                },
            }
        }
    }

    /// A route whose upstream cannot be served, after its plugins ran: 500 when its `type` has no balancer (as
    /// APISIX answers when its balancer module is missing), 502 when its `upstream_id` names nothing (APISIX's
    /// `handle_upstream`), 503 when discovery has no node for it (APISIX's `set_by_route`). The response phases see the answer, as they see APISIX's `core.response.exit`.
    async fn unservable(
        &mut self,
        head: &RequestHead,
        route: &CompiledRoute,
        ctx: Option<&mut Ctx<'_>>,
        chains: &[Option<&Chain>; 2],
        started: Instant,
    ) -> Result<bool, Error> {
        let up = &route.upstream;
        let (kind, why) = match (&up.unsupported, &up.missing) {
            (Some(why), _) => (Kind::Internal, why),
            (None, Some((_, why))) if **why == *UpstreamRt::NO_UPSTREAM_CONF => {
                (Kind::NoUpstreamConf, why)
            }
            (None, Some((503, why))) => (Kind::Unavailable, why),
            (None, Some((_, why))) => (Kind::NoUpstreamNode, why),
            (None, None) => return Ok(false),
        };
        tracing::error!(route = %route.id, "{why}");
        let err = Error::upstream(kind, why.to_string());
        match (ctx, synthetic(&err)) {
            (Some(ctx), Some(page)) => {
                let r = Response {
                    status: page.status,
                    headers: vec![(
                        bytes::Bytes::from_static(b"Content-Type"),
                        bytes::Bytes::from_static(page.content_type.as_bytes()),
                    )],
                    body: bytes::Bytes::from(page.body.into_owned()),
                };
                self.respond_plugin(head, r, ctx, chains, started).await
            }
            _ => self.refuse(head, &err).await,
        }
    }

    /// Answers without contacting an upstream. An unread request body means the connection must close.
    async fn refuse(&mut self, head: &RequestHead, err: &Error) -> Result<bool, Error> {
        let keep = head.keep_alive && head.body == BodyKind::Empty;
        if let Some(s) = synthetic(err) {
            self.write_synthetic(&s, keep, head.is_head())
                .await
                .map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
        }
        Ok(keep)
    }

    #[allow(clippy::too_many_arguments)] // the per-attempt state is borrowed piecewise from `handle`
    async fn attempt(
        &mut self,
        head: &RequestHead,
        host: Option<&str>,
        route: &CompiledRoute,
        node_idx: usize,
        body_consumed: &mut bool,
        mut pctx: Option<&mut Ctx<'_>>,
        chains: &[Option<&Chain>; 2],
        // The caller's clock read just before this attempt: its start for the upstream latency and the pool.
        t_up: Instant,
    ) -> Result<Done, Failure> {
        let up: &UpstreamRt = &route.upstream;
        let node = &up.nodes[node_idx];
        let t = route.timeouts;
        let fail = |err: Error, stage: Stage, consumed: bool| Failure {
            err,
            stage,
            body_consumed: consumed,
        };
        if up.h2 {
            return self
                .attempt_h2(head, host, route, node_idx, body_consumed, pctx, chains)
                .await;
        }
        let mut c: Checkout = self
            .w
            .pool
            .checkout_for(up, node, t.connect, head.body != BodyKind::Empty, t_up)
            .await
            .map_err(|e| fail(e, Stage::BeforeSend, *body_consumed))?;
        if !c.reused {
            self.w.shared.count_connect();
        }
        let reused = c.reused;

        // Request head, then body.
        self.upstream_head(head, up, node, host, pctx.as_deref().map(|c| &c.edits));
        // APISIX passes Upgrade/Connection upstream only on `enable_websocket` routes; elsewhere they are dropped
        // as hop-by-hop and the upstream sees a plain request.
        let upgrade = if route.websocket && head.upgrade {
            head.header("upgrade")
        } else {
            None
        };
        if let Some(u) = upgrade {
            self.out.truncate(self.out.len() - 2);
            forward::put_header(&mut self.out, b"Upgrade", u);
            self.out.put_slice(b"Connection: upgrade\r\n\r\n");
        }
        let sent_err = |e: BodyError, consumed: bool| match e {
            // nginx answers a send timeout with 504, like a read timeout.
            BodyError::SinkTimeout => fail(
                Error::upstream(
                    Kind::UpstreamTimeout,
                    format!("upstream {}: send timed out", node.addr),
                ),
                Stage::Sent { stale: false },
                consumed,
            ),
            BodyError::Sink(m) => fail(
                Error::upstream(
                    Kind::UpstreamIo,
                    format!("upstream {}: send: {m}", node.addr),
                ),
                Stage::Sent { stale: reused },
                consumed,
            ),
            BodyError::Source(m, timed_out) => fail(
                Error::downstream(
                    if timed_out {
                        Kind::ClientTimeout
                    } else {
                        Kind::BadRequest(400)
                    },
                    format!("request body: {m}"),
                ),
                Stage::Sent { stale: false },
                true,
            ),
            BodyError::TooLarge => fail(
                Error::downstream(Kind::BadRequest(413), "request body too large"),
                Stage::Sent { stale: false },
                true,
            ),
        };
        let mut request_body = 0;
        // The upstream answered before the whole request went out: that connection is never pooled. `body_cut`:
        // the copy stopped there, so the client's connection closes (the rest of its body was not read).
        let (mut answered_early, mut body_cut) = (false, false);
        self.ubuf.clear();
        if head.body != BodyKind::Empty {
            if head.expect_continue {
                flush(&mut c.conn, &mut self.out, t.send)
                    .await
                    .map_err(|e| sent_err(e, false))?;
                self.io
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .map_err(|e| {
                        fail(
                            Error::downstream(Kind::ClientClosed, e.to_string()),
                            Stage::Sent { stale: false },
                            false,
                        )
                    })?;
            }
            *body_consumed = true;
            let watch = EarlyWatch::new(&mut c.conn, &mut self.ubuf, self.w.shared.cfg.limits);
            let copied = Copy {
                input: head.body,
                chunked_out: head.body == BodyKind::Chunked,
                read_timeout: self.w.shared.cfg.body_timeout,
                write_timeout: t.send,
                max_bytes: self.w.shared.cfg.max_body,
                out: &mut self.out,
            }
            .run(
                &mut Watched {
                    client: &mut self.io,
                    watch: &watch,
                },
                &mut self.rbuf,
                &mut WatchedSink { watch: &watch },
            )
            .await;
            answered_early = watch.answered_early();
            let upstream_failed = watch.take_failure();
            match (copied, upstream_failed) {
                (Ok(n), _) => request_body = n,
                (Err(_), _) if answered_early => {
                    body_cut = true;
                    self.out.clear();
                }
                (Err(_), Some(e)) => return Err(sent_err(BodyError::Sink(e.to_string()), true)),
                (Err(e), None) => return Err(sent_err(e, true)),
            }
        } else {
            flush(&mut c.conn, &mut self.out, t.send)
                .await
                .map_err(|e| sent_err(e, false))?;
        }

        // Response head.
        let is_head = head.is_head();
        let resp = self
            .read_response_head(&mut c, is_head, t.read)
            .await
            .map_err(|(e, got_bytes)| {
                fail(
                    e,
                    Stage::Sent {
                        stale: reused && !got_bytes,
                    },
                    *body_consumed,
                )
            })?;
        up.balancer
            .health()
            .report_http_status(node_idx, resp.status);
        if resp.status == 101 {
            return self
                .switch_protocols(&resp, upgrade.is_some(), c, route, t_up)
                .await
                .map_err(|e| fail(e, Stage::Sent { stale: false }, *body_consumed));
        }

        // Response to the client.
        let mut framing = forward::out_framing(&resp, head.version);
        let upstream_latency = t_up.elapsed();
        let (mut status, resp_body, resp_keep) = (resp.status, resp.body, resp.keep_alive);
        // With plugins, the head moves into their context (header_filter, body_filter and log read it).
        let mut own = Some(resp);
        let mut filter_body = false;
        if let Some(ctx) = pctx.as_deref_mut() {
            if let Some(r) = own.take() {
                ctx.set_upstream_head(r);
            }
            sluice_plugins::header_filters(chains, ctx, status);
            status = ctx.resp.status.unwrap_or(status);
            filter_body = resp_body != BodyKind::Empty && sluice_plugins::filters_body(chains, ctx);
            // A changed body has no known length: chunked for HTTP/1.1, delimited by close for HTTP/1.0.
            if filter_body && ctx.resp.body_modified {
                framing = match head.version {
                    sluice_http::Version::Http11 => OutFraming::Chunked,
                    sluice_http::Version::Http10 => OutFraming::Close,
                };
            }
        }
        let keep = head.keep_alive
            && framing != OutFraming::Close
            && !self.w.shared.stopping()
            && !body_cut;
        self.out.clear();
        let resp_edits: Option<&RespEdits> = pctx.as_deref().map(|c| &c.resp);
        if let Some(r) = own
            .as_ref()
            .or_else(|| pctx.as_deref().and_then(|c| c.upstream_head()))
        {
            forward::response_head(r, framing, head.version, keep, resp_edits, &mut self.out);
        }
        let mut head_len = self.out.len() as u64;
        let mut complete = true;
        let copied = match (filter_body, pctx) {
            // A held head (`RespEdits::hold_head`): the filtered body is collected, then the head (with what the
            // filters decided at the end) goes out framed by the body's length.
            (true, Some(ctx)) if ctx.resp.hold_head => {
                self.out.clear();
                let mut held: Vec<u8> = Vec::new();
                let mut scratch = BytesMut::new();
                let r = crate::body::filtered(
                    resp_body,
                    false,
                    (t.read, self.w.shared.cfg.header_timeout),
                    &mut scratch,
                    (&mut c.conn, &mut self.ubuf, &mut held),
                    &mut |ev| filter_event(chains, ctx, ev),
                )
                .await;
                match r {
                    Ok(f) => {
                        complete = f.complete;
                        ctx.resp.remove("content-length");
                        if let Some(r) = ctx.upstream_head() {
                            forward::response_head(
                                r,
                                OutFraming::None,
                                head.version,
                                keep,
                                Some(&ctx.resp),
                                &mut self.out,
                            );
                        }
                        self.out.truncate(self.out.len().saturating_sub(2));
                        let mut n = forward::itoa_buf();
                        self.out.put_slice(b"Content-Length: ");
                        self.out
                            .put_slice(forward::fmt_u64(held.len() as u64, &mut n));
                        self.out.put_slice(b"\r\n\r\n");
                        head_len = self.out.len() as u64;
                        self.out.put_slice(&held);
                        let w = self.io.write_all(&self.out).await;
                        self.out.clear();
                        status = ctx.resp.status.unwrap_or(status);
                        w.map(|_| held.len() as u64)
                            .map_err(|e| BodyError::Sink(e.to_string()))
                    }
                    Err(e) => Err(e),
                }
            }
            (true, Some(ctx)) => crate::body::filtered(
                resp_body,
                framing == OutFraming::Chunked,
                (t.read, self.w.shared.cfg.header_timeout),
                &mut self.out,
                (&mut c.conn, &mut self.ubuf, &mut self.io),
                &mut |ev| filter_event(chains, ctx, ev),
            )
            .await
            .map(|f| {
                complete = f.complete;
                f.written
            }),
            _ => {
                Copy {
                    input: resp_body,
                    chunked_out: framing == OutFraming::Chunked,
                    read_timeout: t.read,
                    write_timeout: self.w.shared.cfg.header_timeout,
                    max_bytes: 0,
                    out: &mut self.out,
                }
                .run(&mut c.conn, &mut self.ubuf, &mut self.io)
                .await
            }
        };
        let response_body = match copied {
            Ok(n) => n,
            Err(BodyError::SinkTimeout) => {
                return Err(fail(
                    Error::downstream(Kind::ClientTimeout, "client write timed out"),
                    Stage::Responding,
                    true,
                ));
            }
            Err(BodyError::Sink(m)) => {
                return Err(fail(
                    Error::downstream(Kind::ClientClosed, m),
                    Stage::Responding,
                    true,
                ));
            }
            Err(BodyError::Source(m, timed_out)) => {
                let kind = if timed_out {
                    Kind::UpstreamTimeout
                } else {
                    Kind::UpstreamIo
                };
                return Err(fail(
                    Error::upstream(kind, format!("upstream {}: response body: {m}", node.addr)),
                    Stage::Responding,
                    true,
                ));
            }
            Err(BodyError::TooLarge) => {
                return Err(fail(
                    Error::upstream(Kind::UpstreamProtocol, "response body too large"),
                    Stage::Responding,
                    true,
                ));
            }
        };
        // Only a request sent whole before any answer arrived leaves the upstream in step for the next one.
        if resp_keep
            && resp_body != BodyKind::Eof
            && self.ubuf.is_empty()
            && complete
            && !answered_early
        {
            // Idle from when its answer arrived (a clock read this request already made).
            self.w.pool.checkin(c, up.pool, t_up + upstream_latency);
        }
        if body_cut {
            crate::body::linger(&mut self.io, &mut self.rbuf).await;
        }
        Ok(Done {
            keep,
            status,
            request_body: if head.body == BodyKind::Empty {
                0
            } else {
                request_body
            },
            response_bytes: head_len + response_body,
            body_bytes: response_body,
            upstream_latency,
        })
    }

    /// Reads the final response head, skipping interim 1xx responses (100-continue is answered by Sluice itself).
    /// The error's flag says whether any response byte arrived (false on a stale pooled connection).
    async fn read_response_head(
        &mut self,
        c: &mut Checkout,
        is_head: bool,
        read_timeout: std::time::Duration,
    ) -> Result<ResponseHead, (Error, bool)> {
        let limits = &self.w.shared.cfg.limits;
        let mut got = false;
        loop {
            match parse_response(&mut self.ubuf, limits, is_head) {
                Ok(Some(r)) if (100..200).contains(&r.status) && r.status != 101 => continue,
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => {
                    return Err((
                        Error::upstream(Kind::UpstreamProtocol, format!("invalid response: {e}")),
                        true,
                    ))
                }
            }
            self.ubuf.reserve(BUF_SIZE / 2);
            match self
                .timer
                .within(read_timeout, c.conn.read_buf(&mut self.ubuf))
                .await
            {
                Ok(Ok(0)) => {
                    return Err((
                        Error::upstream(Kind::UpstreamIo, "upstream closed before a response"),
                        got,
                    ))
                }
                Ok(Ok(_)) => got = true,
                Ok(Err(e)) => {
                    return Err((
                        Error::upstream(Kind::UpstreamIo, format!("upstream read: {e}")),
                        got,
                    ))
                }
                Err(_) => {
                    return Err((
                        Error::upstream(Kind::UpstreamTimeout, "upstream read timed out"),
                        true,
                    ))
                }
            }
        }
    }

    async fn write_synthetic(
        &mut self,
        s: &Synthetic,
        keep: bool,
        head_only: bool,
    ) -> io::Result<()> {
        self.out.clear();
        let mut n = forward::itoa_buf();
        self.out.put_slice(b"HTTP/1.1 ");
        self.out.put_slice(forward::fmt_u16(s.status, &mut n));
        self.out.put_u8(b' ');
        self.out
            .put_slice(sluice_http::status_reason(s.status).as_bytes());
        self.out.put_slice(b"\r\nServer: sluice\r\nDate: ");
        self.out.put_slice(&sluice_http::date::now());
        self.out.put_slice(b"\r\nContent-Type: ");
        self.out.put_slice(s.content_type.as_bytes());
        self.out.put_slice(b"\r\nContent-Length: ");
        self.out
            .put_slice(forward::fmt_u64(s.body.len() as u64, &mut n));
        self.out.put_slice(if keep {
            &b"\r\n\r\n"[..]
        } else {
            &b"\r\nConnection: close\r\n\r\n"[..]
        });
        if !head_only {
            self.out.put_slice(&s.body);
        }
        self.sent = Sent {
            status: s.status,
            bytes: self.out.len() as u64,
            body: if head_only { 0 } else { s.body.len() as u64 },
        };
        let r = self.io.write_all(&self.out).await;
        self.out.clear();
        r
    }
}

/// Runs the body filters on a piece, or hands them the upstream's trailers (a filter may drop them).
fn filter_event(chains: &[Option<&Chain>; 2], ctx: &mut Ctx<'_>, ev: crate::body::FilterEvent<'_>) {
    match ev {
        crate::body::FilterEvent::Piece(p) => sluice_plugins::body_filters(chains, ctx, p),
        crate::body::FilterEvent::Trailers(raw, pass) => {
            ctx.set_upstream_trailers(crate::body::trailer_fields(raw));
            *pass = !ctx.resp.drop_trailers;
        }
    }
}

fn idempotent(head: &RequestHead) -> bool {
    matches!(
        head.method_str(),
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// The chash key. As APISIX, a missing value (no such header, no consumer) falls back to the client address.
pub(crate) fn hash_key<'a>(
    up: &UpstreamRt,
    view: &'a ReqView<'_>,
    consumer: Option<&'a str>,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    use std::borrow::Cow;
    if up.balancer.kind() != sluice_upstream::LbKind::Chash {
        return None;
    }
    let key = match &up.hash_on {
        HashOn::Var(v) => view.var(v).map(|c| match c {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        }),
        HashOn::Header(h) => view.head.header(h).map(Cow::Borrowed),
        HashOn::Cookie(c) => view.cookie(c).map(|s| Cow::Borrowed(s.as_bytes())),
        HashOn::Consumer => consumer.map(|c| Cow::Borrowed(c.as_bytes())),
    };
    key.or_else(|| Some(Cow::Owned(view.remote_addr().to_string().into_bytes())))
}

#[cfg(test)]
mod buf_pool_tests {
    use super::{BufPool, BUF_SIZE};
    use bytes::BufMut;

    #[test]
    fn recycles_split_buffers_whole_and_stays_bounded() {
        let pool = BufPool::default();
        let mut b = pool.take();
        b.put_slice(&[b'x'; 300]);
        let head = b.split_to(200).freeze();
        let ptr = b.as_ptr() as usize - 200;
        drop(head);
        pool.put(b);
        let again = pool.take();
        assert!(again.capacity() >= BUF_SIZE);
        assert!(again.is_empty());
        assert_eq!(
            again.as_ptr() as usize,
            ptr,
            "the same allocation, taken back whole"
        );

        // A buffer that grew large is not kept; the pool never holds more than KEEP.
        pool.put(bytes::BytesMut::with_capacity(BufPool::MAX_CAPACITY + 1));
        assert!(pool.0.borrow().is_empty());
        for _ in 0..BufPool::KEEP + 10 {
            pool.put(bytes::BytesMut::with_capacity(BUF_SIZE));
        }
        assert_eq!(pool.0.borrow().len(), BufPool::KEEP);
    }
}
