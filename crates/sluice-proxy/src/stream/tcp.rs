//! One TCP connection on a stream listener: (TLS termination or SNI read-ahead), route, stream plugins, upstream
//! connect with retries over the balancer, then bytes both ways until both sides closed or nothing moved for the
//! idle timeout. A side's end (FIN) is passed on as a half-close and the other direction keeps flowing.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use sluice_plugins::stream::{Preread, StreamConn, StreamHeld};
use sluice_upstream::{FailureKind, LbKind, Tried};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::LazyConfigAcceptor;

use super::log::Session;
use super::StreamRt;
use crate::server::Worker;
use crate::slots::Slot;
use crate::snapshot::UpstreamRt;

/// Copy buffer per direction: nginx stream's `proxy_buffer_size` and HAProxy's `tune.bufsize` default.
const BUF: usize = 16 * 1024;

pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    tls: bool,
    slot: Rc<Slot>,
    w: Rc<Worker>,
) {
    // A stream connection is never evicted to make room for a newcomer (it may be mid-transfer).
    slot.set_busy();
    let snap = w.shared.snapshot.load_full();
    if snap.stream.is_empty() {
        return;
    }
    let wait = w.shared.cfg.header_timeout;
    if tls {
        let deadline = slot.opened + wait;
        let handshake = async {
            let start =
                LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
            let hello = start.client_hello();
            let sni = hello
                .server_name()
                .or(w.shared.cfg.fallback_sni.as_deref())
                .map(str::to_ascii_lowercase);
            let Some(site) = snap.tls.lookup(sni.as_deref()) else {
                return Err(io::Error::other("no certificate for the requested SNI"));
            };
            // The HTTP listeners' configuration offers h2 and http/1.1 by ALPN; a stream carries neither.
            let mut cfg = (*site.config).clone();
            cfg.alpn_protocols.clear();
            let tls = start.into_stream(Arc::new(cfg)).await?;
            Ok::<_, io::Error>((tls, sni))
        };
        match tokio::time::timeout_at(deadline, handshake).await {
            Ok(Ok((tls, sni))) => {
                if let Some(r) = snap.stream.find(sni.as_deref(), peer.ip(), local) {
                    proxy(tls, &[], r, peer, local, &w).await;
                } else {
                    tracing::debug!(%peer, ?sni, "stream: no route matched");
                }
            }
            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "stream: TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "stream: TLS handshake timed out"),
        }
        return;
    }
    let (prefix, sni) = if snap.stream.wants_sni(local) {
        match super::sni::read_client_hello(&mut stream, wait).await {
            super::sni::ReadAhead::Routed { buf, sni } => (buf, sni),
            super::sni::ReadAhead::Close(why) => {
                tracing::debug!(%peer, why, "stream: closed while reading the ClientHello");
                return;
            }
        }
    } else {
        (Vec::new(), None)
    };
    let Some(r) = snap.stream.find(sni.as_deref(), peer.ip(), local) else {
        tracing::debug!(%peer, ?sni, "stream: no route matched");
        return;
    };
    // TCP_NODELAY was set on the client socket when it was accepted (`server::accept_loop`).
    proxy(stream, &prefix, r, peer, local, &w).await;
}

/// Plugins, upstream, then the copy; then the stream access log's line.
async fn proxy<C: AsyncRead + AsyncWrite + Unpin>(
    client: C,
    prefix: &[u8],
    r: &StreamRt,
    peer: SocketAddr,
    local: SocketAddr,
    w: &Worker,
) {
    let started = Instant::now();
    r.counters.total.fetch_add(1, Ordering::Relaxed);
    r.counters.active.fetch_add(1, Ordering::Relaxed);
    let mut s = Session {
        peer,
        local,
        status: 200,
        bytes_sent: 0,
        bytes_received: 0,
        time: Duration::ZERO,
        upstream: None,
    };
    proxy_session(client, prefix, r, &mut s, w).await;
    r.counters.active.fetch_sub(1, Ordering::Relaxed);
    if let (Some(log), Some((_, format))) = (&w.stream_log, &w.shared.cfg.stream_access_log) {
        s.time = started.elapsed();
        log.log_with(|out| format.render(&s, out));
    }
}

async fn proxy_session<C: AsyncRead + AsyncWrite + Unpin>(
    mut client: C,
    prefix: &[u8],
    r: &StreamRt,
    s: &mut Session,
    w: &Worker,
) {
    let (peer, local) = (s.peer, s.local);
    // Slots limit-conn holds for this connection; released when it ends.
    let mut held = StreamHeld::default();
    if let Some(chain) = &r.plugins {
        let c = StreamConn {
            remote: peer,
            local,
            route_id: &r.id,
        };
        match chain.preread(&c, &mut held) {
            Preread::Close(by) => {
                tracing::debug!(%peer, route = &*r.id, plugin = by, "stream: refused by plugin");
                // nginx stream's statuses: limit_conn's 503, access's 403.
                s.status = if by == "limit-conn" { 503 } else { 403 };
                return;
            }
            Preread::Continue(d) if !d.is_zero() => tokio::time::sleep(d).await,
            Preread::Continue(_) => {}
        }
    }
    s.status = 502;
    let Some(up) = r.upstream.as_deref() else {
        tracing::warn!(
            route = &*r.id,
            "stream: the route's upstream or service is gone"
        );
        return;
    };
    if let Some((_, why)) = &up.missing {
        tracing::warn!(route = &*r.id, why = &**why, "stream: no upstream node");
        return;
    }
    let pp = w
        .shared
        .cfg
        .proxy_protocol_to_upstream
        .then(|| crate::proxy_protocol::v1_header(peer, local));
    let Some((node, upstream)) = connect(up, r, peer, pp.as_deref()).await else {
        return;
    };
    s.status = 200;
    s.upstream = Some(up.nodes[node].addr);
    let (from_client, from_upstream) = (Cell::new(prefix.len() as u64), Cell::new(0));
    r.counters
        .bytes_in
        .fetch_add(prefix.len() as u64, Ordering::Relaxed);
    let live = (&r.counters.bytes_in, &r.counters.bytes_out);
    let res = match upstream {
        Up::Plain(mut u) => {
            let _ = u.set_nodelay(true);
            pipe(
                &mut client,
                &mut u,
                prefix,
                r.idle_timeout,
                (&from_client, &from_upstream),
                live,
            )
            .await
        }
        Up::Tls(mut u) => {
            pipe(
                &mut client,
                &mut *u,
                prefix,
                r.idle_timeout,
                (&from_client, &from_upstream),
                live,
            )
            .await
        }
    };
    (s.bytes_received, s.bytes_sent) = (from_client.get(), from_upstream.get());
    if let Err(e) = res {
        tracing::debug!(%peer, route = &*r.id, node = %up.nodes[node].addr, error = %e, "stream: ended");
    }
    drop(held);
}

enum Up {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Picks a node and connects within the route's connect timeout; a node that fails is reported to passive
/// health and the next one is tried, up to the upstream's `retries` (default: every other node).
async fn connect(
    up: &UpstreamRt,
    r: &StreamRt,
    peer: SocketAddr,
    pp: Option<&str>,
) -> Option<(usize, Up)> {
    let retries = up
        .retries
        .unwrap_or(up.nodes.len().saturating_sub(1) as u32);
    // chash: the client address (the only key a stream connection has before any byte).
    let ip;
    let key = if up.balancer.kind() == LbKind::Chash {
        ip = super::canonical(peer.ip()).to_string();
        Some(ip.as_bytes())
    } else {
        None
    };
    let mut tried = Tried::new();
    let mut attempts = 0;
    loop {
        let Some(i) = up.balancer.pick(key, &tried) else {
            tracing::warn!(route = &*r.id, "stream: no healthy upstream node");
            return None;
        };
        tried.insert(i);
        attempts += 1;
        up.balancer.on_request_start(i);
        let t0 = Instant::now();
        let node = &up.nodes[i];
        let res = tokio::time::timeout(r.connect_timeout, async {
            let mut tcp = TcpStream::connect(node.addr).await?;
            // The PROXY header (`enable_tcp_pp_to_upstream`) goes first, before any TLS to the upstream.
            if let Some(h) = pp {
                tcp.write_all(h.as_bytes()).await?;
            }
            match (&up.tls, &node.sni) {
                (Some(cfg), Some(sni)) => {
                    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                        .connect(sni.clone(), tcp)
                        .await?;
                    Ok::<_, io::Error>(Up::Tls(Box::new(tls)))
                }
                _ => Ok(Up::Plain(tcp)),
            }
        })
        .await;
        let spent = t0.elapsed();
        // The balancer's latency figure (ewma) is the connect time; its in-flight count (least_conn) ends
        // here too, so a long-lived connection does not skew it forever.
        up.balancer
            .on_request_end(i, spent, matches!(res, Ok(Ok(_))));
        let kind = match res {
            Ok(Ok(c)) => return Some((i, c)),
            Ok(Err(e)) => {
                tracing::warn!(route = &*r.id, node = %node.addr, error = %e, "stream: upstream connect failed");
                FailureKind::Tcp
            }
            Err(_) => {
                tracing::warn!(route = &*r.id, node = %node.addr, "stream: upstream connect timed out");
                FailureKind::Timeout
            }
        };
        up.balancer.health().report_failure(i, kind);
        if attempts > retries as usize {
            return None;
        }
    }
}

/// Counts successful reads, so the idle watchdog sees traffic without a clock read per read, and the bytes read
/// (the access log's `$bytes_received` / `$bytes_sent`).
struct Tracked<'a, S> {
    inner: &'a mut S,
    moved: &'a Cell<u64>,
    bytes: &'a Cell<u64>,
    /// The route's live byte counter.
    live: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n != 0 {
            self.moved.set(self.moved.get() + 1);
            self.bytes.set(self.bytes.get() + n as u64);
            self.live.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Copies both ways until both directions ended (each end passed on as a shutdown of the other side's write
/// half) or nothing moved either way for `idle` (checked every `idle / 8`, so it fires within `idle * 9/8`).
/// `read` counts the bytes read from `a` and from `b` (this connection's), `live` the same for the route.
pub(crate) async fn pipe<A, B>(
    a: &mut A,
    b: &mut B,
    prefix: &[u8],
    idle: Duration,
    read: (&Cell<u64>, &Cell<u64>),
    live: (&AtomicU64, &AtomicU64),
) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    if !prefix.is_empty() {
        b.write_all(prefix).await?;
    }
    let moved = Cell::new(0u64);
    let mut ta = Tracked {
        inner: a,
        moved: &moved,
        bytes: read.0,
        live: live.0,
    };
    let mut tb = Tracked {
        inner: b,
        moved: &moved,
        bytes: read.1,
        live: live.1,
    };
    let copy = super::copy::bidirectional(&mut ta, &mut tb, BUF);
    let watchdog = async {
        let step = (idle / 8).max(Duration::from_millis(1));
        let (mut seen, mut quiet) = (moved.get(), Duration::ZERO);
        loop {
            tokio::time::sleep(step).await;
            let now = moved.get();
            if now == seen {
                quiet += step;
                if quiet >= idle {
                    return;
                }
            } else {
                (seen, quiet) = (now, Duration::ZERO);
            }
        }
    };
    tokio::select! {
        r = copy => r,
        () = watchdog => Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout")),
    }
}
