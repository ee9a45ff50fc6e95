//! HTTP/2 downstream: h2c with prior knowledge on plain listeners and h2 over TLS (ALPN "h2"), served with the
//! `h2` crate's server.
//!
//! Each h2 stream is proxied by the very same HTTP/1.1 request path as a keep-alive connection (`conn::Conn`:
//! routing, plugins, balancer, retries, the upstream pool, hygiene checks, synthetic error pages), reached through
//! an in-memory bridge (`h2/bridge.rs`): the stream's request is written to the bridge as an HTTP/1.1 message and the
//! HTTP/1.1 response read back from it is re-framed as h2 HEADERS/DATA/trailers. One request path means HTTP/2 can
//! never route or filter differently from HTTP/1.1, at the cost of one in-memory serialize/parse per request.
//! `h2/upstream.rs` speaks HTTP/2 to `grpc`/`grpcs` upstreams; `h2/upgrade.rs` turns an HTTP/1.1
//! `Upgrade: h2c` into an h2 connection whose stream 1 is the upgrading request.

mod bridge;
pub(crate) mod upgrade;
pub(crate) mod upstream;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::server::Worker;

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Concurrent streams per connection we advertise (nginx's `http2_max_concurrent_streams` default).
const MAX_STREAMS: u32 = 128;
/// Per-stream receive window: large enough that a request body is not throttled by round-trips.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;

/// Whether a freshly accepted plain connection starts with the h2 preface. Only peeks: the bytes stay in the socket
/// for whichever protocol serves it. Waits for at most `t` while the bytes so far are a prefix of the preface.
pub(crate) async fn sniff_preface(stream: &TcpStream, t: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + t;
    let mut buf = [0u8; 24];
    // Bounded: at most one retry per millisecond until the deadline.
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Closes a connection that did not open with the preface (RFC 9113 §3.4: no frames can be exchanged yet):
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
    let cfg = &w.shared.cfg;
    let mut b = ::h2::server::Builder::new();
    b.max_concurrent_streams(MAX_STREAMS)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .max_header_list_size(cfg.limits.max_head_bytes.min(u32::MAX as usize) as u32)
        .max_send_buffer_size(STREAM_WINDOW as usize);
    let mut conn = match tokio::time::timeout(cfg.header_timeout, b.handshake::<_, Bytes>(io)).await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(peer = %peer, error = %e, "h2 handshake failed");
            return;
        }
        Err(_) => return,
    };
    let keepalive = cfg.keepalive_timeout;
    let mut shutdown = w.shared.shutdown.subscribe();
    let active = Rc::new(Cell::new(0usize));
    let mut draining = false;
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            r = conn.accept() => match r {
                Some(Ok((req, respond))) => {
                    idle.as_mut().reset(tokio::time::Instant::now() + keepalive);
                    let w = w.clone();
                    let active = active.clone();
                    active.set(active.get() + 1);
                    tokio::task::spawn_local(async move {
                        bridge::stream(req, respond, peer, local, scheme, w).await;
                        active.set(active.get() - 1);
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = %peer, error = %e, "h2 connection error");
                    return;
                }
                None => return,
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
