//! proxy-mirror's side of a `Conn`: reading the request body the copy needs (whole, into `rbuf`, where the
//! forward then finds it as if just received) and handing the copy to [`crate::mirror`]. Kept apart from the
//! request path in `conn.rs`, which only calls [`Conn::mirror`] when a plugin asked for a copy.

use bytes::BytesMut;
use sluice_http::{BodyKind, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::{Conn, BUF_SIZE};

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// proxy-mirror: reads a small body into `rbuf` (the forward then finds it there, as if just received) and
    /// hands a copy of the request to the mirror's task. Whatever goes wrong here is left to the forward.
    pub(super) async fn mirror(&mut self, m: sluice_plugins::Mirror, head: &RequestHead) {
        let body = match head.body {
            BodyKind::Empty => bytes::Bytes::new(),
            BodyKind::Length(n)
                if n <= crate::mirror::MAX_BODY
                    && !head.expect_continue
                    && crate::mirror::has_room() =>
            {
                let n = n as usize;
                while self.rbuf.len() < n {
                    self.rbuf.reserve(n - self.rbuf.len());
                    let read = self.io.read_buf(&mut self.rbuf);
                    match tokio::time::timeout(self.w.shared.cfg.header_timeout, read).await {
                        Ok(Ok(k)) if k > 0 => {}
                        _ => return crate::mirror::skip("request body not received"),
                    }
                }
                bytes::Bytes::copy_from_slice(&self.rbuf[..n])
            }
            BodyKind::Chunked if !head.expect_continue && crate::mirror::has_room() => {
                match self.read_chunked_for_mirror().await {
                    Some(b) => b,
                    None => return crate::mirror::skip("chunked body not mirrored"),
                }
            }
            _ => return crate::mirror::skip("body not mirrored"),
        };
        crate::mirror::send(m, head, body);
    }

    /// Reads a chunked request body whole into `rbuf` (raw, for the forward) and returns its decoded bytes;
    /// `None` past [`crate::mirror::MAX_BODY`] or on any error (the forward then meets and answers it).
    async fn read_chunked_for_mirror(&mut self) -> Option<bytes::Bytes> {
        use sluice_http::{Chunk, ChunkedDecoder};
        let max = crate::mirror::MAX_BODY as usize;
        let mut dec = ChunkedDecoder::new();
        // Decoded from a copy: `rbuf` keeps the raw body for the forward.
        let mut scan = BytesMut::from(&self.rbuf[..]);
        let mut body = BytesMut::new();
        loop {
            match dec.decode(&mut scan) {
                Ok(Some(Chunk::Data(d))) => {
                    body.extend_from_slice(&d);
                    if body.len() > max {
                        return None;
                    }
                }
                Ok(Some(Chunk::End { .. })) => return Some(body.freeze()),
                Ok(None) => {
                    if self.rbuf.len() > 2 * max {
                        return None;
                    }
                    let before = self.rbuf.len();
                    self.rbuf.reserve(BUF_SIZE);
                    let read = self.io.read_buf(&mut self.rbuf);
                    match tokio::time::timeout(self.w.shared.cfg.header_timeout, read).await {
                        Ok(Ok(k)) if k > 0 => scan.extend_from_slice(&self.rbuf[before..]),
                        _ => return None,
                    }
                }
                Err(_) => return None,
            }
        }
    }
}
