//! Sending proxy-mirror's request copies. A copy is the client's request head (method, headers, Host as sent,
//! hop-by-hop fields dropped, `Connection: close`) at the plugin's target, plus the body, written to the mirror
//! on a task of its own; the mirror's answer is read and dropped. The main request never waits for it and never
//! sees its failures. Bounded: at most [`MAX_IN_FLIGHT`] copies per worker thread are in flight (a slow or dead
//! mirror makes further copies be skipped, not queued), each with [`MAX_BODY`] bytes of body at most (a chunked
//! body is sent decoded, with Content-Length) and [`TIMEOUT`] to finish. Not here: deciding which requests are
//! mirrored (the plugin), reading the body (conn.rs).

use std::cell::Cell;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_http::RequestHead;
use sluice_plugins::Mirror;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Copies in flight per worker thread.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// Larger request bodies (decoded size for chunked ones) are not mirrored.
pub(crate) const MAX_BODY: u64 = 1 << 20;
/// Connect, send and read of one copy.
const TIMEOUT: Duration = Duration::from_secs(30);

thread_local! {
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// A copy that is not sent: too many in flight, or a body that is not mirrored (chunked, over [`MAX_BODY`],
/// `Expect: 100-continue`, or the client stopped sending it).
pub(crate) fn skip(why: &'static str) {
    tracing::debug!(why, "proxy-mirror copy skipped");
}

/// Whether another copy may start on this thread.
pub(crate) fn has_room() -> bool {
    IN_FLIGHT.with(|n| n.get() < MAX_IN_FLIGHT)
}

/// Sends a copy of `head` + `body` to `m` on a local task (call from a worker's `LocalSet`).
pub(crate) fn send(m: Mirror, head: &RequestHead, body: Bytes) {
    if !has_room() {
        return skip("too many copies in flight");
    }
    let mut out = BytesMut::with_capacity(head.buf.len() + body.len() + 64);
    out.put_slice(head.method_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(m.target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in head.headers_iter() {
        if sluice_http::is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        crate::forward::put_header(&mut out, name, value);
    }
    if !body.is_empty() || head.body != sluice_http::BodyKind::Empty {
        out.put_slice(b"Content-Length: ");
        out.put_slice(body.len().to_string().as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"Connection: close\r\n\r\n");
    out.put_slice(&body);
    let bytes = out.freeze();
    IN_FLIGHT.with(|n| n.set(n.get() + 1));
    tokio::task::spawn_local(async move {
        let r = tokio::time::timeout(TIMEOUT, exchange(m.addr, &bytes)).await;
        if !matches!(r, Ok(Ok(()))) {
            tracing::debug!(mirror = %m.addr, "proxy-mirror copy failed or timed out");
        }
        IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(1)));
    });
}

async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> std::io::Result<()> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(bytes).await?;
    // The answer is ignored; reading it to the end lets the mirror finish cleanly.
    let mut sink = [0u8; 4096];
    while s.read(&mut sink).await? != 0 {}
    Ok(())
}
