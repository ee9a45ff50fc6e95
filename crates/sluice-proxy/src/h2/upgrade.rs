//! HTTP/1.1 `Upgrade: h2c` (RFC 7540 §3.2; deprecated by RFC 9113 §3.1 but still sent by some clients, e.g.
//! `curl --http2`). The upgrading request becomes stream 1, half-closed by the client.
//!
//! The `h2` crate cannot adopt an upgraded stream, so the request is handed to it the way a client would have
//! sent it: a HEADERS frame for stream 1 (HPACK literals, END_STREAM) spliced into the client's byte stream right
//! after its preface and first SETTINGS frame. Only bodiless requests are upgraded (others stay HTTP/1.1, which
//! RFC 9110 §7.8 allows), and `HTTP2-Settings` is not applied (the client's SETTINGS frame follows anyway).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use sluice_http::{connection_tokens, BodyKind, RequestHead};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest frame payload a peer must accept before SETTINGS (RFC 9113 §4.2).
const MAX_FRAME: usize = 16_384;

/// Whether `head` asks to upgrade to h2c and can be (no body, the HTTP2-Settings field present).
pub(crate) fn wants_h2c(head: &RequestHead) -> bool {
    head.upgrade
        && head.body == BodyKind::Empty
        && head.header("http2-settings").is_some()
        && head.header("upgrade").is_some_and(|v| {
            v.split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"h2c"))
        })
}

/// The HEADERS frame carrying `head` as stream 1, or `None` when its field block does not fit one frame.
pub(crate) fn stream1_headers(head: &RequestHead) -> Option<Bytes> {
    let mut block = BytesMut::with_capacity(head.buf.len());
    literal(&mut block, b":method", head.slice(head.method));
    literal(&mut block, b":scheme", b"http");
    let target = head.slice(head.target);
    if target.first() == Some(&b'/') || target == b"*" {
        literal(&mut block, b":path", target);
    } else {
        let mut pq = head.slice(head.path).to_vec();
        if let Some(q) = head.query {
            pq.push(b'?');
            pq.extend_from_slice(head.slice(q));
        }
        literal(&mut block, b":path", &pq);
    }
    if let Some(h) = head.header("host") {
        literal(&mut block, b":authority", h);
    }
    let tokens = connection_tokens(&head.buf, &head.headers);
    let mut name = Vec::new();
    for (n, v) in head.headers_iter() {
        if tokens.is_hop_by_hop(n)
            || n.eq_ignore_ascii_case(b"host")
            || n.eq_ignore_ascii_case(b"http2-settings")
            || n.eq_ignore_ascii_case(b"proxy-connection")
        {
            continue;
        }
        name.clear();
        name.extend(n.iter().map(u8::to_ascii_lowercase));
        literal(&mut block, &name, v);
    }
    if block.len() > MAX_FRAME {
        return None;
    }
    let mut frame = BytesMut::with_capacity(9 + block.len());
    let len = block.len() as u32;
    frame.put_slice(&len.to_be_bytes()[1..]);
    frame.put_u8(0x1); // HEADERS
    frame.put_u8(0x1 | 0x4); // END_STREAM | END_HEADERS
    frame.put_u32(1);
    frame.put_slice(&block);
    Some(frame.freeze())
}

/// "Literal Header Field without Indexing — New Name" (RFC 7541 §6.2.2), strings not Huffman-coded.
fn literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0);
    string(out, name);
    string(out, value);
}

fn string(out: &mut BytesMut, s: &[u8]) {
    // 7-bit prefix integer (RFC 7541 §5.1), H bit clear.
    let mut n = s.len();
    if n < 127 {
        out.put_u8(n as u8);
    } else {
        out.put_u8(127);
        n -= 127;
        while n >= 128 {
            out.put_u8((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.put_u8(n as u8);
    }
    out.put_slice(s);
}

/// The client's stream after the 101: bytes already read come first, and `inject` is spliced in after the
/// preface and the first frame (which must be SETTINGS; anything else passes unchanged for h2 to refuse).
pub(crate) struct Upgraded<S> {
    io: S,
    buf: BytesMut,
    inject: Option<Bytes>,
    out: Bytes,
}

impl<S> Upgraded<S> {
    pub(crate) fn new(io: S, already_read: BytesMut, inject: Bytes) -> Self {
        Upgraded {
            io,
            buf: already_read,
            inject: Some(inject),
            out: Bytes::new(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Upgraded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        rb: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if !me.out.is_empty() {
                let n = rb.remaining().min(me.out.len());
                rb.put_slice(&me.out.split_to(n));
                return Poll::Ready(Ok(()));
            }
            let Some(inject) = me.inject.as_ref() else {
                return Pin::new(&mut me.io).poll_read(cx, rb);
            };
            const HEAD: usize = 24 + 9;
            if me.buf.len() >= HEAD {
                let len = u32::from_be_bytes([0, me.buf[24], me.buf[25], me.buf[26]]) as usize;
                let is_settings = me.buf[27] == 0x4;
                if !is_settings || me.buf.len() >= HEAD + len {
                    let mut out = BytesMut::with_capacity(me.buf.len() + inject.len());
                    if is_settings {
                        out.put_slice(&me.buf.split_to(HEAD + len));
                        out.put_slice(inject);
                    }
                    out.put_slice(&me.buf.split());
                    me.out = out.freeze();
                    me.inject = None;
                    continue;
                }
            }
            let mut tmp = [0u8; 4096];
            let mut trb = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut me.io).poll_read(cx, &mut trb))?;
            if trb.filled().is_empty() {
                me.out = me.buf.split().freeze();
                me.inject = None;
                if me.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            me.buf.extend_from_slice(trb.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Upgraded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
