//! One h2 stream served by `Conn` inline, in the task that accepted it: no pipe, no second task. [`StreamIo`] is
//! the `Conn`'s IO. The request head is serialised once from the h2 fields as HTTP/1.1 into `Conn`'s buffer;
//! reading the IO then yields the body as DATA frames arrive (chunked, with the trailers, when it has no length),
//! each frame's flow-control window released as `Conn` takes its bytes. What `Conn` writes is parsed as it
//! arrives: the head goes out as HEADERS, the body as DATA (chunked framing decoded), chunked trailers as a
//! trailers HEADERS frame. One request path means HTTP/2 can never route or filter differently from HTTP/1.1.
//!
//! Conversions follow RFC 9113 §8.2.3 (cookie crumbs joined with "; "), §8.3.1 (`:authority` becomes Host) and
//! §8.2.2 (connection-specific response fields are dropped). Request hygiene (header names, values, lengths) is
//! left to the HTTP/1.1 parser `Conn` runs on the head, so both protocols refuse the same shapes.
//!
//! Single task, so the state both the `Conn` (through its IO) and the reset watch around it need is an
//! `Rc<RefCell<_>>`: no borrow is ever held across an await.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use ::h2::server::SendResponse;
use ::h2::{RecvStream, SendStream};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use sluice_http::{
    connection_tokens, parse_response, BodyKind, Chunk, ChunkedDecoder, ResponseHead,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::conn::Conn;
use crate::server::Worker;

/// Response bytes handed to h2 beyond which the next write waits until h2 holds no data the client's window does
/// not cover: bounds what one stream buffers for a slow reader without a capacity round-trip on small answers.
const ROOM: usize = 64 * 1024;

/// Proxies one stream to completion; a response that could not be completed resets the stream.
pub(super) async fn stream(
    req: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
    client: Rc<super::Client>,
    w: Rc<Worker>,
) {
    let (parts, body) = req.into_parts();
    let mut head = BytesMut::with_capacity(512);
    let chunked = request_head(&parts, body.is_end_stream(), &mut head);
    let st = Rc::new(RefCell::new(Stream {
        pre: BytesMut::new(),
        data: Bytes::new(),
        crlf: false,
        body,
        chunked,
        req: Req::Body,
        respond,
        tx: None,
        is_head: parts.method == http::Method::HEAD,
        limits: w.shared.cfg.limits,
        rbuf: BytesMut::new(),
        resp: Resp::Head,
        unconfirmed: 0,
    }));
    let c = &*client;
    let io = StreamIo(st.clone());
    let run = Conn::with_addrs(io, c.peer, c.local, c.scheme, w, c.addrs.clone())
        .for_h2_stream(&head)
        .with_mtls_gate(c.gate.clone())
        .run();
    tokio::select! {
        biased;
        _ = run => {}
        // The client reset the stream (or the connection died): the request is abandoned, so is the work for it
        // (dropping the `Conn` drops its upstream call, which an h2 upstream sees as RST_STREAM CANCEL).
        _ = poll_fn(|cx| st.borrow_mut().poll_reset(cx)) => return,
    }
    st.borrow_mut().finish();
}

/// Where the request side is.
enum Req {
    /// DATA frames may follow.
    Body,
    /// The body ended without a length: the last chunk and the trailers are due.
    Trailers,
    /// All of the request was handed to `Conn`.
    Done,
}

/// Where the response side is.
enum Resp {
    /// Gathering the head (interim 1xx heads are skipped: Sluice answers 100-continue itself).
    Head,
    /// This many body bytes are still due.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// No framing: the body ends when `Conn` does.
    Eof,
    /// The stream was ended.
    Done,
    /// `Conn` wrote something that is not a response, or h2 refused it.
    Failed,
}

struct Stream {
    /// Request bytes due before `data`: the head, then a chunk header or the last chunk with trailers.
    pre: BytesMut,
    /// The DATA frame being read; its window is released as `Conn` takes the bytes.
    data: Bytes,
    /// A chunk's closing CRLF is due after `data`.
    crlf: bool,
    body: RecvStream,
    chunked: bool,
    req: Req,
    respond: SendResponse<Bytes>,
    /// Once the head was sent.
    tx: Option<SendStream<Bytes>>,
    is_head: bool,
    limits: sluice_http::Limits,
    /// Response bytes not parsed (head) or decoded (chunked) yet.
    rbuf: BytesMut,
    resp: Resp,
    /// Body bytes handed to h2 since it last had window for everything it holds.
    unconfirmed: usize,
}

fn broken(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, what.to_owned())
}

fn h2_io(e: h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

impl Stream {
    /// Ready once the client reset the stream or the connection failed.
    fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let r = match &mut self.tx {
            Some(tx) => tx.poll_reset(cx),
            None => self.respond.poll_reset(cx),
        };
        r.map(|_| ())
    }

    fn over(&self) -> bool {
        matches!(self.resp, Resp::Done | Resp::Failed)
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.pre.is_empty() {
                let n = self.pre.len().min(buf.remaining());
                buf.put_slice(&self.pre[..n]);
                self.pre.advance(n);
                return Poll::Ready(Ok(()));
            }
            if !self.data.is_empty() {
                let n = self.data.len().min(buf.remaining());
                buf.put_slice(&self.data[..n]);
                self.data.advance(n);
                let _ = self.body.flow_control().release_capacity(n);
                return Poll::Ready(Ok(()));
            }
            if self.crlf {
                self.crlf = false;
                self.pre.put_slice(b"\r\n");
                continue;
            }
            match self.req {
                Req::Body => match ready!(self.body.poll_data(cx)) {
                    Some(Ok(d)) => {
                        if self.chunked && !d.is_empty() {
                            sluice_http::encode_chunk_header(d.len(), &mut self.pre);
                            self.crlf = true;
                        }
                        self.data = d;
                    }
                    Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                    None if self.chunked => self.req = Req::Trailers,
                    None => self.req = Req::Done,
                },
                Req::Trailers => match ready!(self.body.poll_trailers(cx)) {
                    Ok(trailers) => {
                        self.pre.put_slice(b"0\r\n");
                        for (name, value) in trailers.iter().flatten() {
                            put(&mut self.pre, name.as_str().as_bytes(), value.as_bytes());
                        }
                        self.pre.put_slice(b"\r\n");
                        self.req = Req::Done;
                    }
                    Err(e) => return Poll::Ready(Err(h2_io(e))),
                },
                // Past the request, `Conn` only watches the client: the stream's end is the connection's EOF,
                // a reset is a client that went away.
                Req::Done if self.over() => return Poll::Ready(Ok(())),
                Req::Done => {
                    ready!(self.poll_reset(cx));
                    return Poll::Ready(Err(broken("client reset the stream")));
                }
            }
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if matches!(self.resp, Resp::Length(_) | Resp::Chunked(_) | Resp::Eof) {
            ready!(self.poll_room(cx))?;
        }
        let r = self.take(buf);
        if r.is_err() {
            self.resp = Resp::Failed;
        }
        Poll::Ready(r.map(|()| buf.len()))
    }

    /// Waits while h2 holds more of this stream's body than the client's window lets it send.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.unconfirmed < ROOM {
            return Poll::Ready(Ok(()));
        }
        let Some(tx) = self.tx.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        loop {
            if tx.capacity() > 0 {
                self.unconfirmed = 0;
                return Poll::Ready(Ok(()));
            }
            tx.reserve_capacity(ROOM);
            match ready!(tx.poll_capacity(cx)) {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(h2_io(e))),
                None => return Poll::Ready(Err(broken("stream closed"))),
            }
        }
    }

    /// Takes all of `buf` as the next bytes of the response.
    fn take(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.resp {
            Resp::Head => {
                self.rbuf.extend_from_slice(buf);
                loop {
                    match parse_response(&mut self.rbuf, &self.limits, self.is_head) {
                        Ok(Some(r)) if r.status >= 200 => break self.send_head(r)?,
                        Ok(Some(_)) => continue,
                        Ok(None) => return Ok(()),
                        Err(e) => return Err(io::Error::other(e.to_string())),
                    }
                }
                let rest = self.rbuf.split();
                self.body(rest)
            }
            Resp::Length(left) => {
                // Bytes beyond the length are not part of this response (`Conn` writes none).
                let n = (*left).min(buf.len() as u64) as usize;
                self.body(BytesMut::from(&buf[..n]))
            }
            Resp::Chunked(_) => {
                self.rbuf.extend_from_slice(buf);
                self.body(BytesMut::new())
            }
            Resp::Eof => self.body(BytesMut::from(buf)),
            Resp::Done | Resp::Failed => Err(broken("response already ended")),
        }
    }

    /// Sends the final head; the body state follows from its framing.
    fn send_head(&mut self, head: ResponseHead) -> io::Result<()> {
        let status = StatusCode::from_u16(head.status).map_err(io::Error::other)?;
        let mut resp = Response::new(());
        *resp.status_mut() = status;
        let tokens = connection_tokens(&head.buf, &head.headers);
        let headers = resp.headers_mut();
        headers.reserve(head.headers.len());
        for h in &head.headers {
            let name = span(&head.buf, h.name);
            if tokens.is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"proxy-connection") {
                continue;
            }
            // Values are slices of the head's buffer: no copy, no allocation per field.
            let value = head.buf.slice(h.value.0 as usize..h.value.1 as usize);
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(value),
            ) {
                headers.append(n, v);
            }
        }
        let body = if self.is_head {
            BodyKind::Empty
        } else {
            head.body
        };
        let empty = matches!(body, BodyKind::Empty | BodyKind::Length(0));
        let tx = self.respond.send_response(resp, empty).map_err(h2_io)?;
        self.tx = Some(tx);
        self.resp = match body {
            BodyKind::Empty | BodyKind::Length(0) => Resp::Done,
            BodyKind::Length(n) => Resp::Length(n),
            BodyKind::Chunked => Resp::Chunked(ChunkedDecoder::new()),
            BodyKind::Eof => Resp::Eof,
        };
        Ok(())
    }

    /// Sends body bytes as `Conn` framed them (decoding chunked framing).
    fn body(&mut self, mut bytes: BytesMut) -> io::Result<()> {
        let Some(tx) = self.tx.as_mut() else {
            return Ok(());
        };
        match &mut self.resp {
            Resp::Length(left) => {
                if bytes.is_empty() {
                    return Ok(());
                }
                let n = (*left).min(bytes.len() as u64);
                *left -= n;
                let end = *left == 0;
                bytes.truncate(n as usize);
                self.unconfirmed += bytes.len();
                tx.send_data(bytes.freeze(), end).map_err(h2_io)?;
                if end {
                    self.resp = Resp::Done;
                }
                Ok(())
            }
            Resp::Chunked(dec) => {
                if !bytes.is_empty() {
                    self.rbuf.unsplit(bytes);
                }
                loop {
                    match dec
                        .decode(&mut self.rbuf)
                        .map_err(|e| io::Error::other(e.to_string()))?
                    {
                        Some(Chunk::Data(d)) => {
                            self.unconfirmed += d.len();
                            tx.send_data(d, false).map_err(h2_io)?;
                        }
                        Some(Chunk::End { trailers }) => {
                            let map = trailer_map(&trailers);
                            if map.is_empty() {
                                tx.send_data(Bytes::new(), true).map_err(h2_io)?;
                            } else {
                                tx.send_trailers(map).map_err(h2_io)?;
                            }
                            self.resp = Resp::Done;
                            return Ok(());
                        }
                        None => return Ok(()),
                    }
                }
            }
            Resp::Eof if !bytes.is_empty() => {
                self.unconfirmed += bytes.len();
                tx.send_data(bytes.freeze(), false).map_err(h2_io)
            }
            _ => Ok(()),
        }
    }

    /// After `Conn` is done: a body delimited by its end is ended, anything unfinished resets the stream.
    fn finish(&mut self) {
        match (&self.resp, &mut self.tx) {
            (Resp::Done, _) => {}
            (Resp::Eof, Some(tx)) => {
                if tx.send_data(Bytes::new(), true).is_ok() {
                    self.resp = Resp::Done;
                }
            }
            (_, Some(tx)) => tx.send_reset(h2::Reason::INTERNAL_ERROR),
            (_, None) => self.respond.send_reset(h2::Reason::INTERNAL_ERROR),
        }
    }
}

/// The `Conn`'s end of one h2 stream.
pub(crate) struct StreamIo(Rc<RefCell<Stream>>);

impl AsyncRead for StreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.borrow_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for StreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.borrow_mut().poll_write(cx, buf)
    }

    /// h2's connection task sends what was handed over; bounding it is `poll_write`'s job.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Writes the HTTP/1.1 request head; returns whether the body goes chunked (length unknown and not ended).
fn request_head(parts: &http::request::Parts, ended: bool, out: &mut BytesMut) -> bool {
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    if parts.method == http::Method::CONNECT {
        out.put_slice(parts.uri.authority().map_or("", |a| a.as_str()).as_bytes());
    } else {
        out.put_slice(
            parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .as_bytes(),
        );
    }
    out.put_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority();
    if let Some(a) = authority {
        put(out, b"host", a.as_str().as_bytes());
    }
    let mut has_length = false;
    let mut cookie: Option<BytesMut> = None;
    for (name, value) in &parts.headers {
        match name.as_str() {
            "host" if authority.is_some() => continue,
            // `te: trailers` (the only TE h2 allows) passes: HTTP/1.1 upstreams drop it as hop-by-hop, h2 (gRPC)
            // upstreams need it.
            "cookie" => {
                let c = cookie.get_or_insert_with(BytesMut::new);
                if !c.is_empty() {
                    c.put_slice(b"; ");
                }
                c.put_slice(value.as_bytes());
                continue;
            }
            "content-length" => has_length = true,
            _ => {}
        }
        put(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if let Some(c) = cookie {
        put(out, b"cookie", &c);
    }
    let chunked = !ended && !has_length;
    if chunked {
        out.put_slice(b"transfer-encoding: chunked\r\n");
    }
    out.put_slice(b"\r\n");
    chunked
}

fn span(buf: &[u8], s: sluice_http::Span) -> &[u8] {
    buf.get(s.0 as usize..s.1 as usize).unwrap_or_default()
}

fn put(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Parses a raw, already validated chunked trailer section into h2 fields (invalid ones and those RFC 9110 §6.5.1
/// keeps out of trailers are dropped).
pub(super) fn trailer_map(raw: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in raw.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = line[colon + 1..].trim_ascii();
        if sluice_http::is_forbidden_trailer(&line[..colon]) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// Sends `data` as the peer's flow-control window allows.
pub(crate) async fn send_data(
    tx: &mut SendStream<Bytes>,
    mut data: Bytes,
    eos: bool,
) -> Result<(), ()> {
    if data.is_empty() {
        return if eos {
            tx.send_data(data, true).map_err(|_| ())
        } else {
            Ok(())
        };
    }
    while !data.is_empty() {
        tx.reserve_capacity(data.len());
        let cap = match poll_fn(|cx| tx.poll_capacity(cx)).await {
            Some(Ok(c)) => c,
            _ => return Err(()),
        };
        if cap == 0 {
            continue;
        }
        let piece = data.split_to(cap.min(data.len()));
        tx.send_data(piece, eos && data.is_empty())
            .map_err(|_| ())?;
    }
    Ok(())
}
