//! h2c (HTTP/2 over cleartext, prior knowledge) for the mock: a connection whose first bytes are
//! the HTTP/2 preface is handed to the `h2` crate; each stream gets the same body, delay and
//! `/status/NNN` rule as HTTP/1.1. No h2c upgrade from HTTP/1.1 (`Upgrade: h2c`), no TLS/ALPN.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::delay::XorShift;
use crate::MockConfig;

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream that first yields bytes already read while sniffing the protocol.
struct Prefixed {
    pre: Bytes,
    io: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre[..n]);
            this.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Serves an h2c connection whose first bytes (`pre`) were already read.
pub(crate) async fn serve(io: TcpStream, pre: Bytes, cfg: Arc<MockConfig>, seed: u64) {
    let mut rng = XorShift::new(seed);
    let Ok(mut conn) = h2::server::handshake(Prefixed { pre, io }).await else {
        return;
    };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        let status = req
            .uri()
            .path()
            .strip_prefix("/status/")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|c| (200..=999).contains(c))
            .unwrap_or(cfg.status);
        let delay = cfg.delay.sample(&mut rng);
        let body = cfg.body.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let Ok(resp) = http::Response::builder()
                .status(status)
                .header("server", "sluice-mock")
                .header("content-type", "text/plain")
                .header("content-length", body.len())
                .body(())
            else {
                return;
            };
            let Ok(mut send) = respond.send_response(resp, body.is_empty()) else {
                return;
            };
            if !body.is_empty() {
                let _ = send.send_data(body, true);
            }
        });
    }
}
