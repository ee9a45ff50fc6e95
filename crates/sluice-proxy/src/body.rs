//! Streaming a message body from one side to the other without buffering it whole.
//!
//! Input framing (length, chunked, read-to-close) is decoded; output framing is written fresh (length bodies pass
//! as they are, chunked is re-chunked, so malformed chunk framing can never leak through). Output is gathered in
//! `out` and flushed before each read, so a small head plus a small body leave in one write (a length body's
//! piece of 512 bytes or more is not copied behind the head: both leave in one vectored write). [`filtered`] is
//! the separate path for responses plugins filter (body_filter, gzip); [`Copy`] stays the zero-copy one.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use sluice_http::{encode_chunk_header, BodyKind, Chunk, ChunkedDecoder, LAST_CHUNK};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Which end failed while copying.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// The sender failed: closed early, timed out, or sent invalid framing.
    Source(String, bool /* timed out */),
    Sink(String),
    /// The receiver did not take the bytes within the write timeout.
    SinkTimeout,
    /// The body is larger than the configured limit.
    TooLarge,
}

/// Bytes this large are written straight from the read buffer instead of being copied into `out`.
const DIRECT_WRITE: usize = 16 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// A length body's piece this large leaves with what `out` holds (the head) in one vectored write instead of
/// being copied behind it: the same single write, without copying the piece.
const VECTORED_MIN: usize = 512;

pub(crate) struct Copy<'a> {
    pub input: BodyKind,
    pub chunked_out: bool,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    /// 0 = unlimited.
    pub max_bytes: u64,
    pub out: &'a mut BytesMut,
}

/// `tokio::time::timeout` that arms no timer (and reads no clock) when `fut` is ready on its first poll, which is
/// what a socket write into an empty send buffer, or a read of bytes already received, almost always is. Only a
/// future that has to wait gets a deadline, `t` from that first poll (the same instant, within microseconds, that a
/// timer armed up front would have started from).
pub(crate) async fn timeout_lazy<F: std::future::Future>(
    t: Duration,
    fut: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await;
    match first {
        Some(v) => Ok(v),
        None => tokio::time::timeout(t, fut).await,
    }
}

pub(crate) async fn flush<W: AsyncWrite + Unpin>(
    dst: &mut W,
    out: &mut BytesMut,
    t: Duration,
) -> Result<(), BodyError> {
    if out.is_empty() {
        return Ok(());
    }
    let r = timeout_lazy(t, dst.write_all(out)).await;
    out.clear();
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BodyError::Sink(e.to_string())),
        Err(_) => Err(BodyError::SinkTimeout),
    }
}

/// Writes `out` then `data` with vectored writes (partial writes resumed), then clears `out`.
async fn write_pair<W: AsyncWrite + Unpin>(
    dst: &mut W,
    out: &mut BytesMut,
    data: &[u8],
    t: Duration,
) -> Result<(), BodyError> {
    let r = timeout_lazy(t, async {
        let (mut a, mut b) = (&out[..], data);
        while !a.is_empty() || !b.is_empty() {
            let n = dst
                .write_vectored(&[std::io::IoSlice::new(a), std::io::IoSlice::new(b)])
                .await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
            }
            let in_a = n.min(a.len());
            a = &a[in_a..];
            b = b.get(n - in_a..).unwrap_or_default();
        }
        Ok(())
    })
    .await;
    out.clear();
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BodyError::Sink(e.to_string())),
        Err(_) => Err(BodyError::SinkTimeout),
    }
}

async fn fill<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut BytesMut,
    t: Duration,
) -> Result<usize, BodyError> {
    buf.reserve(READ_CHUNK);
    match timeout_lazy(t, src.read_buf(buf)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(BodyError::Source(e.to_string(), false)),
        Err(_) => Err(BodyError::Source("read timed out".into(), true)),
    }
}

impl Copy<'_> {
    /// Copies the body; `out` may already hold a head to send with the first bytes. Flushes everything before
    /// returning. Returns the number of body bytes carried.
    pub(crate) async fn run<R, W>(
        self,
        src: &mut R,
        sbuf: &mut BytesMut,
        dst: &mut W,
    ) -> Result<u64, BodyError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let Copy {
            input,
            chunked_out,
            read_timeout,
            write_timeout,
            max_bytes,
            out,
        } = self;
        let mut total: u64 = 0;
        let over = |total: u64| max_bytes != 0 && total > max_bytes;
        match input {
            BodyKind::Empty => {}
            BodyKind::Length(n) => {
                if max_bytes != 0 && n > max_bytes {
                    return Err(BodyError::TooLarge);
                }
                let mut left = n;
                while left > 0 {
                    if sbuf.is_empty() {
                        flush(dst, out, write_timeout).await?;
                        if fill(src, sbuf, read_timeout).await? == 0 {
                            return Err(BodyError::Source(
                                format!("closed with {left} body bytes missing"),
                                false,
                            ));
                        }
                    }
                    let take = (left.min(sbuf.len() as u64)) as usize;
                    let data = sbuf.split_to(take);
                    if !chunked_out && data.len() >= VECTORED_MIN && dst.is_write_vectored() {
                        write_pair(dst, out, &data, write_timeout).await?;
                    } else {
                        emit(dst, out, &data, chunked_out, write_timeout).await?;
                    }
                    left -= take as u64;
                    total += take as u64;
                }
            }
            BodyKind::Chunked => {
                let mut dec = ChunkedDecoder::new();
                loop {
                    match dec.decode(sbuf) {
                        Ok(Some(Chunk::Data(data))) => {
                            total += data.len() as u64;
                            if over(total) {
                                return Err(BodyError::TooLarge);
                            }
                            emit(dst, out, &data, chunked_out, write_timeout).await?;
                        }
                        Ok(Some(Chunk::End { trailers })) => {
                            if chunked_out {
                                // Trailers pass, less the fields RFC 9110 §6.5.1 keeps out of them.
                                out.put_slice(b"0\r\n");
                                sluice_http::filter_trailers(&trailers, out);
                            }
                            break;
                        }
                        Ok(None) => {
                            flush(dst, out, write_timeout).await?;
                            if fill(src, sbuf, read_timeout).await? == 0 {
                                return Err(BodyError::Source(
                                    "closed inside a chunked body".into(),
                                    false,
                                ));
                            }
                        }
                        Err(e) => {
                            return Err(BodyError::Source(
                                format!("invalid chunked body: {e}"),
                                false,
                            ))
                        }
                    }
                }
            }
            BodyKind::Eof => loop {
                if !sbuf.is_empty() {
                    let data = sbuf.split();
                    total += data.len() as u64;
                    emit(dst, out, &data, chunked_out, write_timeout).await?;
                }
                flush(dst, out, write_timeout).await?;
                if fill(src, sbuf, read_timeout).await? == 0 {
                    if chunked_out {
                        out.put_slice(LAST_CHUNK);
                    }
                    break;
                }
            },
        }
        flush(dst, out, write_timeout).await?;
        Ok(total)
    }
}

async fn emit<W: AsyncWrite + Unpin>(
    dst: &mut W,
    out: &mut BytesMut,
    data: &[u8],
    chunked: bool,
    t: Duration,
) -> Result<(), BodyError> {
    if data.is_empty() {
        return Ok(());
    }
    if chunked {
        encode_chunk_header(data.len(), out);
    }
    if data.len() >= DIRECT_WRITE {
        flush(dst, out, t).await?;
        match timeout_lazy(t, dst.write_all(data)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(BodyError::Sink(e.to_string())),
            Err(_) => return Err(BodyError::SinkTimeout),
        }
    } else {
        out.put_slice(data);
    }
    if chunked {
        out.put_slice(b"\r\n");
    }
    Ok(())
}

/// Where the next piece of a body being decoded comes from.
enum Decode {
    Length(u64),
    Chunked(ChunkedDecoder),
    Eof,
    Done,
}

impl Decode {
    fn new(input: BodyKind) -> Self {
        match input {
            BodyKind::Empty => Decode::Done,
            BodyKind::Length(n) => Decode::Length(n),
            BodyKind::Chunked => Decode::Chunked(ChunkedDecoder::new()),
            BodyKind::Eof => Decode::Eof,
        }
    }

    /// The next decoded piece of the body; `None` at its end. Before waiting for the source, `out` is flushed so
    /// what a filter already produced reaches the client (streamed responses stay streamed).
    async fn next<R, W>(
        &mut self,
        src: &mut R,
        sbuf: &mut BytesMut,
        dst: &mut W,
        out: &mut BytesMut,
        t: (Duration, Duration),
        trailers: &mut Option<bytes::Bytes>,
    ) -> Result<Option<bytes::Bytes>, BodyError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (read_timeout, write_timeout) = t;
        loop {
            match self {
                Decode::Done => return Ok(None),
                Decode::Length(0) => {
                    *self = Decode::Done;
                    return Ok(None);
                }
                Decode::Length(left) if !sbuf.is_empty() => {
                    let take = (*left).min(sbuf.len() as u64) as usize;
                    *left -= take as u64;
                    return Ok(Some(sbuf.split_to(take).freeze()));
                }
                Decode::Eof if !sbuf.is_empty() => return Ok(Some(sbuf.split().freeze())),
                Decode::Chunked(dec) => match dec.decode(sbuf) {
                    Ok(Some(Chunk::Data(d))) => return Ok(Some(d)),
                    Ok(Some(Chunk::End { trailers: t })) => {
                        *self = Decode::Done;
                        if t.as_ref() != b"\r\n" {
                            *trailers = Some(t);
                        }
                        return Ok(None);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Err(BodyError::Source(
                            format!("invalid chunked body: {e}"),
                            false,
                        ))
                    }
                },
                Decode::Length(_) | Decode::Eof => {}
            }
            flush(dst, out, write_timeout).await?;
            if fill(src, sbuf, read_timeout).await? == 0 {
                return match self {
                    Decode::Eof => {
                        *self = Decode::Done;
                        Ok(None)
                    }
                    Decode::Length(left) => Err(BodyError::Source(
                        format!("closed with {left} body bytes missing"),
                        false,
                    )),
                    _ => Err(BodyError::Source(
                        "closed inside a chunked body".into(),
                        false,
                    )),
                };
            }
        }
    }
}

/// What [`filtered`] hands its filter: a piece of the body, or (before the `eof` piece) the trailers of a chunked
/// body, raw, with whether they are to be passed on.
pub(crate) enum FilterEvent<'a> {
    Piece(&'a mut sluice_plugins::BodyChunk),
    Trailers(&'a [u8], &'a mut bool),
}

/// A response body passed through the plugins' body_filter phase: each decoded piece goes to `filter`, what it
/// returns is written with the output framing (`chunked_out`, else as is), and a last call with `eof` lets
/// filters flush what they held; a chunked body's trailers reach the filter first and follow a chunked output
/// unless it drops them. Once a filter ends the body the rest of the input is left unread (it may be an endless
/// stream): `complete` is then false and the source connection must not be reused.
pub(crate) async fn filtered<R, W>(
    input: BodyKind,
    chunked_out: bool,
    timeouts: (Duration, Duration),
    out: &mut BytesMut,
    io: (&mut R, &mut BytesMut, &mut W),
    filter: &mut dyn FnMut(FilterEvent<'_>),
) -> Result<Filtered, BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (src, sbuf, dst) = io;
    let write_timeout = timeouts.1;
    let mut dec = Decode::new(input);
    let mut done = Filtered {
        read: 0,
        written: 0,
        complete: true,
    };
    let (mut trailers, mut pass_trailers) = (None, false);
    loop {
        let piece = dec
            .next(src, sbuf, dst, out, timeouts, &mut trailers)
            .await?;
        if let Some(d) = &piece {
            done.read += d.len() as u64;
        }
        let last = piece.is_none();
        if let (true, Some(t)) = (last, &trailers) {
            pass_trailers = true;
            filter(FilterEvent::Trailers(t, &mut pass_trailers));
        }
        let mut chunk = sluice_plugins::BodyChunk {
            data: piece.unwrap_or_default(),
            eof: last,
        };
        filter(FilterEvent::Piece(&mut chunk));
        done.written += chunk.data.len() as u64;
        emit(dst, out, &chunk.data, chunked_out, write_timeout).await?;
        if last {
            break;
        }
        if chunk.eof {
            done.complete = matches!(dec, Decode::Done | Decode::Length(0));
            break;
        }
    }
    if chunked_out {
        match trailers.filter(|_| pass_trailers && done.complete) {
            Some(t) => {
                // Trailers pass, less the fields RFC 9110 §6.5.1 keeps out of them.
                out.put_slice(b"0\r\n");
                sluice_http::filter_trailers(&t, out);
            }
            None => out.put_slice(LAST_CHUNK),
        }
    }
    flush(dst, out, write_timeout).await?;
    Ok(done)
}

/// Trailer fields as (name, value) pairs, from a chunked body's raw trailer section.
pub(crate) fn trailer_fields(raw: &[u8]) -> Vec<(bytes::Bytes, bytes::Bytes)> {
    raw.split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = memchr::memchr(b':', line)?;
            let value = line[colon + 1..].trim_ascii();
            Some((
                bytes::Bytes::copy_from_slice(&line[..colon]),
                bytes::Bytes::copy_from_slice(value),
            ))
        })
        .collect()
}

/// What [`filtered`] carried.
pub(crate) struct Filtered {
    /// Body bytes read from the source and written to the client (after the filters).
    pub read: u64,
    pub written: u64,
    /// The source body was read to its end (false when a filter ended it early).
    pub complete: bool,
}

/// Watches the upstream for an answer while a request body is being sent: nginx stops sending the body when the
/// response arrives early, and never reuses that connection (the upstream may not have read the rest, and would
/// parse it as the next request). [`Watched`] and [`WatchedSink`] are the two ends [`Copy`] is given; each checks
/// the upstream before it touches its own side, so an early response is seen whether the copy is waiting for the
/// client or blocked writing upstream. Interim 1xx responses are consumed and the body goes on.
///
/// A `RefCell` rather than a split: the copy is one future on one thread, so the two ends never borrow at once,
/// and a split stream would cost an `Arc` per request.
pub(crate) struct EarlyWatch<'a, U> {
    state: std::cell::RefCell<WatchState<'a, U>>,
}

struct WatchState<'a, U> {
    up: &'a mut U,
    /// The upstream's read buffer: what arrived stays there for the response-head read.
    ubuf: &'a mut BytesMut,
    limits: sluice_http::Limits,
    /// A final response (or bytes that can only start one) arrived before the body was sent.
    early: bool,
    /// The upstream closed or failed while the body was being sent.
    failed: Option<std::io::Error>,
}

const EARLY: &str = "upstream answered before the request body was sent";

impl<'a, U: AsyncRead + AsyncWrite + Unpin> EarlyWatch<'a, U> {
    pub(crate) fn new(up: &'a mut U, ubuf: &'a mut BytesMut, limits: sluice_http::Limits) -> Self {
        EarlyWatch {
            state: std::cell::RefCell::new(WatchState {
                up,
                ubuf,
                limits,
                early: false,
                failed: None,
            }),
        }
    }

    /// Whether the upstream's answer started before the body was fully sent (also true when the copy ended and
    /// bytes of a response are waiting): the connection must not be pooled.
    pub(crate) fn answered_early(&self) -> bool {
        let st = self.state.borrow();
        st.early || !st.ubuf.is_empty()
    }

    /// The upstream error that stopped the copy, if it was one (not the client's).
    pub(crate) fn take_failure(&self) -> Option<std::io::Error> {
        self.state.borrow_mut().failed.take()
    }

    /// Reads what the upstream sent so far; `Err` stops the copy (an early answer, or the upstream failed).
    fn poll_check(&self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        use std::task::Poll;
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        if st.early {
            return Err(std::io::Error::other(EARLY));
        }
        loop {
            match interim(st.ubuf) {
                Some(false) => {
                    st.early = true;
                    return Err(std::io::Error::other(EARLY));
                }
                Some(true) if memchr::memmem::find(st.ubuf, b"\r\n\r\n").is_some() => {
                    match sluice_http::parse_response(st.ubuf, &st.limits, false) {
                        Ok(Some(r)) if (100..200).contains(&r.status) && r.status != 101 => {
                            continue
                        }
                        // Anything else is what the response-head read will report.
                        _ => {
                            st.early = true;
                            return Err(std::io::Error::other(EARLY));
                        }
                    }
                }
                Some(true) | None => {}
            }
            let mut tmp = [0u8; 1024];
            let mut rb = tokio::io::ReadBuf::new(&mut tmp);
            match std::pin::Pin::new(&mut *st.up).poll_read(cx, &mut rb) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    let e = || {
                        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "upstream closed")
                    };
                    st.failed = Some(e());
                    return Err(e());
                }
                Poll::Ready(Ok(())) => st.ubuf.extend_from_slice(rb.filled()),
                Poll::Ready(Err(e)) => {
                    let copy = std::io::Error::new(e.kind(), e.to_string());
                    st.failed = Some(e);
                    return Err(copy);
                }
            }
        }
    }
}

/// Whether `buf` starts with an interim (1xx, not 101) status line; `None` while too short to tell.
fn interim(buf: &[u8]) -> Option<bool> {
    const PREFIX: &[u8] = b"HTTP/1.";
    if buf.is_empty() {
        return None;
    }
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Some(false);
    }
    if buf.len() < 12 {
        return None;
    }
    Some(buf[9] == b'1' && &buf[9..12] != b"101")
}

/// The client end of a watched body copy.
pub(crate) struct Watched<'w, 'a, C, U> {
    pub client: &'w mut C,
    pub watch: &'w EarlyWatch<'a, U>,
}

/// The upstream end of a watched body copy.
pub(crate) struct WatchedSink<'w, 'a, U> {
    pub watch: &'w EarlyWatch<'a, U>,
}

impl<C: AsyncRead + Unpin, U: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<'_, '_, C, U> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.watch.poll_check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut *this.client).poll_read(cx, buf)
    }
}

impl<U: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WatchedSink<'_, '_, U> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Err(e) = self.watch.poll_check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        let mut st = self.watch.state.borrow_mut();
        std::pin::Pin::new(&mut *st.up).poll_write(cx, data)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let mut st = self.watch.state.borrow_mut();
        std::pin::Pin::new(&mut *st.up).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let mut st = self.watch.state.borrow_mut();
        std::pin::Pin::new(&mut *st.up).poll_shutdown(cx)
    }
}

/// How long [`linger`] drains a client whose body was left unread.
const LINGER: Duration = Duration::from_secs(2);

/// Closes our side of a client connection whose request body was not read to its end, then drains what the client
/// still sends for a bounded time (nginx's lingering close): closing with unread bytes would reset the connection
/// and could destroy the response still in flight.
pub(crate) async fn linger<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, buf: &mut BytesMut) {
    let deadline = tokio::time::Instant::now() + LINGER;
    if !matches!(
        tokio::time::timeout_at(deadline, io.shutdown()).await,
        Ok(Ok(()))
    ) {
        return;
    }
    // Bounded by the deadline; ends at the client's EOF.
    loop {
        buf.clear();
        buf.reserve(READ_CHUNK);
        match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
    buf.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A sink that takes at most `max` bytes per write, vectored or not (a socket whose buffer is nearly full).
    struct Trickle {
        got: Vec<u8>,
        max: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut left = self.max;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(left);
                self.got.extend_from_slice(&b[..take]);
                (left, n) = (left - take, n + take);
            }
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Head and body leave whole and in order whatever each write takes: writes that end inside the head, at its
    /// end, and inside the body.
    #[tokio::test]
    async fn a_length_body_behind_a_head_survives_partial_vectored_writes() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n";
        let body: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        for max in [1, 7, head.len(), head.len() + 1, 1000, 4096] {
            let mut src: &[u8] = &body;
            let mut sbuf = BytesMut::from(&body[..]);
            let mut out = BytesMut::from(&head[..]);
            let mut dst = Trickle {
                got: Vec::new(),
                max,
            };
            let n = Copy {
                input: BodyKind::Length(3000),
                chunked_out: false,
                read_timeout: Duration::from_secs(1),
                write_timeout: Duration::from_secs(1),
                max_bytes: 0,
                out: &mut out,
            }
            .run(&mut src, &mut sbuf, &mut dst)
            .await
            .unwrap();
            assert_eq!(n, 3000, "max {max}");
            assert_eq!(&dst.got[..head.len()], &head[..], "max {max}");
            assert!(dst.got[head.len()..] == body[..], "max {max}: body differs");
            assert!(out.is_empty());
        }
    }
}
