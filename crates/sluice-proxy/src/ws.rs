//! WebSocket (and any HTTP/1.1 `Upgrade`) tunnelling after the upstream answered `101 Switching Protocols`:
//! bytes are copied both ways until either side closes or nothing moved in either direction for the idle timeout.
//!
//! Whether an upgrade is forwarded at all is decided by `conn` (the route's `enable_websocket`, as APISIX sets
//! `Upgrade`/`Connection` towards the upstream only for such routes). This module does not parse WebSocket frames:
//! like nginx it is a byte pipe, so ping/pong, close and extensions are end to end.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const BUF: usize = 16 * 1024;

/// Bytes carried client->upstream and upstream->client.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Carried {
    pub up: u64,
    pub down: u64,
}

/// Pipes `client` and `upstream` together. `client_pending` / `upstream_pending` are bytes already read past the
/// heads (a client may send its first frame right behind the handshake). Ends on EOF from either side (passing
/// the close on), an I/O error, or `idle` without traffic in either direction.
pub(crate) async fn tunnel<C, U>(
    client: &mut C,
    client_pending: &mut BytesMut,
    upstream: &mut U,
    upstream_pending: &mut BytesMut,
    idle: Duration,
) -> Carried
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut carried = Carried::default();
    if !client_pending.is_empty() {
        if upstream.write_all(client_pending).await.is_err() {
            return carried;
        }
        carried.up += client_pending.len() as u64;
        client_pending.clear();
    }
    if !upstream_pending.is_empty() {
        if client.write_all(upstream_pending).await.is_err() {
            return carried;
        }
        carried.down += upstream_pending.len() as u64;
        upstream_pending.clear();
    }
    let mut a = vec![0u8; BUF];
    let mut b = vec![0u8; BUF];
    loop {
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                r = client.read(&mut a) => (true, r),
                r = upstream.read(&mut b) => (false, r),
            }
        })
        .await;
        let Ok((from_client, r)) = step else {
            tracing::debug!("websocket idle timeout");
            break;
        };
        let (src, dst, n): (&[u8], &mut (dyn AsyncWrite + Unpin), usize) = match (from_client, r) {
            (_, Err(_)) => break,
            (true, Ok(n)) => (&a[..], &mut *upstream, n),
            (false, Ok(n)) => (&b[..], &mut *client, n),
        };
        if n == 0 {
            // One side is done: pass the close on and end the tunnel (a WebSocket has no useful half-open state).
            let _ = dst.shutdown().await;
            break;
        }
        if dst.write_all(&src[..n]).await.is_err() {
            break;
        }
        if from_client {
            carried.up += n as u64;
        } else {
            carried.down += n as u64;
        }
    }
    carried
}
