//! HTTP/2 downstream: h2c with prior knowledge on plain listeners and h2 over TLS (ALPN "h2"), served with the
//! `h2` crate's server.
//!
//! Each h2 stream is proxied by the very same request path as a keep-alive HTTP/1.1 connection (`conn::Conn`:
//! routing, plugins, balancer, retries, the upstream pool, hygiene checks, synthetic error pages), run inline in the
//! stream's task over an IO bound to the stream (`h2/stream.rs`): `Conn` reads the request as an HTTP/1.1 message
//! and what it writes goes out as h2 HEADERS/DATA/trailers as it is written. One request path means HTTP/2 can
//! never route or filter differently from HTTP/1.1, at the cost of serialising and parsing each head once more.
//! `h2/upstream.rs` speaks HTTP/2 to `grpc`/`grpcs` upstreams; `h2/upgrade.rs` turns an HTTP/1.1
//! `Upgrade: h2c` into an h2 connection whose stream 1 is the upgrading request.

mod cork;
mod stream;
#[cfg(test)]
mod tests;
pub(crate) mod upgrade;
pub(crate) mod upstream;

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::server::Worker;
use crate::tls_server::SkipMtls;

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Concurrent streams per connection we advertise (nginx's `http2_max_concurrent_streams` default).
const MAX_STREAMS: u32 = 128;
/// Per-stream receive window: large enough that a request body is not throttled by round-trips.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;

/// What every stream of one connection shares.
struct Client {
    peer: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
    /// Set when the TLS connection lacks the client certificate its SNI asks for.
    gate: Option<Arc<SkipMtls>>,
    addrs: crate::conn::AddrText,
}

/// What a freshly accepted cleartext connection opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The h2 client preface (RFC 9113 §3.4).
    H2,
    /// Anything else that may be HTTP/1.x (including what the HTTP/1.1 parser will refuse with a 4xx/5xx).
    Http1,
    /// A complete first line whose third token is not an HTTP version at all (h2spec 3.5's
    /// `INVALID CONNECTION PREFACE`): the peer speaks neither protocol, so it gets no HTTP/1.1 answer.
    Neither,
}

/// How much of the opening the sniff looks at: the preface, or a typical first request line.
const SNIFF: usize = 256;

/// Classifies a freshly accepted cleartext connection by peeking (the bytes stay in the socket for whichever
/// protocol serves it): one `peek` in the common case, since a request line or preface arrives in one segment.
/// Waits for at most `t` only while the bytes so far are a prefix of the preface.
pub(crate) async fn sniff(stream: &TcpStream, t: Duration) -> Opening {
    let deadline = tokio::time::Instant::now() + t;
    let mut buf = [0u8; SNIFF];
    // `peek` cannot wait for *more* bytes, so a partial preface is re-checked on a timer. The pause doubles up to
    // SNIFF_PAUSE_MAX: a client that stops mid-preface (a slowloris on h2c) costs a few wake-ups a second, not one
    // per millisecond, until the deadline; real clients send the 24-byte preface in one segment.
    let mut pause = Duration::from_millis(1);
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return Opening::Http1,
        };
        let m = n.min(PREFACE.len());
        if n == 0 || buf[..m] != PREFACE[..m] {
            return classify_line(&buf[..n]);
        }
        if n >= PREFACE.len() {
            return Opening::H2;
        }
        if tokio::time::Instant::now() >= deadline {
            return Opening::Http1;
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

const SNIFF_PAUSE_MAX: Duration = Duration::from_millis(64);

fn next_pause(p: Duration) -> Duration {
    (p * 2).min(SNIFF_PAUSE_MAX)
}

/// `Neither` only for a whole first line of exactly three tokens whose last does not start with `HTTP/` (any
/// case): `GET / http/1.1`, `GET / HTTP/9.9`, `GET /` (HTTP/0.9) and partial lines stay HTTP/1.x and get the
/// parser's 400/505.
fn classify_line(b: &[u8]) -> Opening {
    let Some(end) = memchr::memmem::find(b, b"\r\n") else {
        return Opening::Http1;
    };
    let mut parts = b[..end].split(|&c| c == b' ');
    let (Some(_), Some(_), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Opening::Http1;
    };
    if version.len() >= 5 && version[..5].eq_ignore_ascii_case(b"HTTP/") {
        Opening::Http1
    } else {
        Opening::Neither
    }
}

/// Closes a connection that did not open with the preface (RFC 9113 §3.4: no frames can be exchanged yet) or
/// with anything HTTP/1.x:
/// FIN first, then what the client sent is drained briefly so the close is orderly rather than a reset.
pub(crate) async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    // Bounded by the deadline; ends at the client's EOF.
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

/// Serves one HTTP/2 connection (the preface not yet consumed) until the client or shutdown ends it.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    peer: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
    w: Rc<Worker>,
) {
    serve_gated(io, peer, local, scheme, w, None).await
}

/// [`serve`], each stream limited to the paths `gate` allows (a TLS connection without the client certificate
/// its SNI asks for, see `tls_server::SkipMtls`).
pub(crate) async fn serve_gated<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    peer: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
    w: Rc<Worker>,
    gate: Option<Arc<SkipMtls>>,
) {
    let cfg = &w.shared.cfg;
    let mut b = ::h2::server::Builder::new();
    b.max_concurrent_streams(MAX_STREAMS)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .max_header_list_size(cfg.limits.max_head_bytes.min(u32::MAX as usize) as u32)
        .max_send_buffer_size(STREAM_WINDOW as usize);
    let (io, cork) = cork::cork(io);
    let hs = b.handshake::<_, Bytes>(io);
    tokio::pin!(hs);
    let hs = poll_fn(|cx| cork.drive(cx, |cx| hs.as_mut().poll(cx)));
    let mut conn = match tokio::time::timeout(cfg.header_timeout, hs).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(peer = %peer, error = %e, "h2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    let client = Rc::new(Client {
        peer,
        local,
        scheme,
        gate,
        addrs: crate::conn::AddrText::new(peer, local),
    });
    let keepalive = cfg.keepalive_timeout;
    let mut shutdown = w.shared.shutdown.subscribe();
    let active = Rc::new(Cell::new(0usize));
    let mut draining = false;
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            r = poll_fn(|cx| cork.drive(cx, |cx| conn.poll_accept(cx))) => match r {
                Some(Ok((req, respond))) => {
                    idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                    let (w, client) = (w.clone(), client.clone());
                    let active = active.clone();
                    active.set(active.get() + 1);
                    // A stream's future holds a whole `Conn` state machine (about 10 KiB): boxed once here,
                    // the spawn moves a pointer instead of copying it twice more (callgrind: 3 copies = ~31k
                    // instructions per stream, counted per byte of `rep movsb`).
                    tokio::task::spawn_local(Box::pin(async move {
                        stream::stream(req, respond, client, w).await;
                        active.set(active.get() - 1);
                    }));
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = %peer, error = %e, "h2 connection error");
                    cork.finish().await;
                    return;
                }
                None => return cork.finish().await,
            },
            _ = shutdown.changed(), if !draining => {
                draining = true;
                conn.graceful_shutdown();
            }
            _ = &mut idle, if !draining => {
                if active.get() == 0 {
                    draining = true;
                    conn.graceful_shutdown();
                } else {
                    idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                }
            }
        }
    }
}
