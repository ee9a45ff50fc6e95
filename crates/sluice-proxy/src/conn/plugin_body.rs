//! Reading a request body whole before the request phases, for plugins that inspect it (request-validation's
//! `body_schema`; see `sluice_plugins::Plugin::needs_body`). The body stays in the connection's read buffer (a
//! chunked one re-framed as a single chunk, trailers dropped), so the forward then sends it exactly as it streams
//! any body; the plugins get one copy. A plugin's replacement body takes its place there (`swap_body`). Only routes whose chains ask for the body come here: every other route
//! keeps streaming. Not here: the size check of a `Content-Length` body (done before routing).

use bytes::{BufMut, Bytes, BytesMut};
use sluice_http::{BodyKind, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::Conn;
use crate::body::{BodyError, Copy};
use crate::error::{Error, Kind};

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// The whole request body, read up to client_max_body_size (413 past it).
    pub(super) async fn read_body_for_plugins(
        &mut self,
        head: &RequestHead,
    ) -> Result<Bytes, Error> {
        let t = self.w.shared.cfg.body_timeout;
        if head.expect_continue && head.body != BodyKind::Empty {
            // The client waits for this before sending; the forward's own 100 later is a harmless repeat.
            self.io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
        }
        match head.body {
            BodyKind::Length(n) => {
                let n = usize::try_from(n)
                    .map_err(|_| Error::downstream(Kind::BadRequest(413), "body too large"))?;
                while self.rbuf.len() < n {
                    self.rbuf.reserve(n - self.rbuf.len());
                    match tokio::time::timeout(t, self.io.read_buf(&mut self.rbuf)).await {
                        Ok(Ok(k)) if k > 0 => {}
                        Ok(Ok(_)) => {
                            return Err(Error::downstream(
                                Kind::ClientClosed,
                                "client closed inside the request body",
                            ))
                        }
                        Ok(Err(e)) => {
                            return Err(Error::downstream(Kind::ClientClosed, e.to_string()))
                        }
                        Err(_) => {
                            return Err(Error::downstream(
                                Kind::ClientTimeout,
                                "request body timed out",
                            ))
                        }
                    }
                }
                self.buffered_body = n;
                Ok(Bytes::copy_from_slice(&self.rbuf[..n]))
            }
            BodyKind::Chunked => {
                let mut body: Vec<u8> = Vec::new();
                let mut scratch = BytesMut::new();
                Copy {
                    input: BodyKind::Chunked,
                    chunked_out: false,
                    read_timeout: t,
                    write_timeout: t,
                    max_bytes: self.w.shared.cfg.max_body,
                    out: &mut scratch,
                }
                .run(&mut self.io, &mut self.rbuf, &mut body)
                .await
                .map_err(|e| match e {
                    BodyError::TooLarge => {
                        Error::downstream(Kind::BadRequest(413), "request body too large")
                    }
                    BodyError::Source(m, true) => Error::downstream(Kind::ClientTimeout, m),
                    BodyError::Source(m, false) => Error::downstream(Kind::BadRequest(400), m),
                    other => Error::downstream(Kind::BadRequest(400), format!("{other:?}")),
                })?;
                let mut framed = BytesMut::with_capacity(body.len() + 32 + self.rbuf.len());
                if !body.is_empty() {
                    framed.put_slice(format!("{:x}\r\n", body.len()).as_bytes());
                    framed.put_slice(&body);
                    framed.put_slice(b"\r\n");
                }
                framed.put_slice(b"0\r\n\r\n");
                self.buffered_body = framed.len();
                framed.put_slice(&self.rbuf);
                self.rbuf = framed;
                Ok(Bytes::from(body))
            }
            _ => {
                self.buffered_body = 0;
                Ok(Bytes::new())
            }
        }
    }

    /// Puts a plugin's replacement body where the client's was at the front of the read buffer (reading and
    /// dropping the client's first if no plugin had it read), and returns the head to forward it with: framed by
    /// the new length, no `Expect`.
    pub(super) async fn swap_body(
        &mut self,
        head: &RequestHead,
        already_read: bool,
        body: Bytes,
    ) -> Result<RequestHead, Error> {
        if !already_read {
            self.read_body_for_plugins(head).await?;
        }
        let skip = std::mem::take(&mut self.buffered_body);
        let rest = self.rbuf.split_off(skip.min(self.rbuf.len()));
        let mut buf = BytesMut::with_capacity(body.len() + rest.len().max(super::BUF_SIZE));
        buf.put_slice(&body);
        buf.put_slice(&rest);
        self.rbuf = buf;
        Ok(RequestHead {
            body: BodyKind::Length(body.len() as u64),
            expect_continue: false,
            ..head.clone()
        })
    }
}
