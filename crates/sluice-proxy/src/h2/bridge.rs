//! One h2 stream proxied through the HTTP/1.1 request path: the request is written into an in-memory duplex as an
//! HTTP/1.1 message, `Conn` serves it exactly as it serves a TCP client, and the HTTP/1.1 response it writes back
//! is re-framed as h2. Bodies stream both ways with backpressure (the duplex buffer is bounded, h2 windows are
//! released only after the bytes were handed on). Trailers pass both ways as chunked trailers.
//!
//! Conversions follow RFC 9113 §8.2.3 (cookie crumbs joined with "; "), §8.3.1 (`:authority` becomes Host) and
//! §8.2.2 (connection-specific response fields are dropped). Request hygiene (header names, values, lengths) is
//! left to the HTTP/1.1 parser on the far side of the bridge, so both protocols refuse the same shapes.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;

use ::h2::server::SendResponse;
use ::h2::{RecvStream, SendStream};
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use sluice_http::{connection_tokens, parse_response, BodyKind, Chunk, ChunkedDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

use crate::conn::Conn;
use crate::server::Worker;

/// Bytes in flight inside the bridge per direction.
const BRIDGE_BUF: usize = 64 * 1024;

/// Proxies one stream to completion; failures reset the stream.
pub(super) async fn stream(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
    w: Rc<Worker>,
    gate: Option<std::sync::Arc<crate::tls_server::SkipMtls>>,
) {
    let (parts, body) = req.into_parts();
    let is_head = parts.method == http::Method::HEAD;
    let mut head = BytesMut::with_capacity(512);
    let chunked = request_head(&parts, body.is_end_stream(), &mut head);
    let (ours, theirs) = tokio::io::duplex(BRIDGE_BUF);
    let task = tokio::task::spawn_local(
        Conn::new(theirs, peer, local, scheme, w.clone())
            .for_h2_stream()
            .with_mtls_gate(gate)
            .run(),
    );
    let (rd, mut wr) = tokio::io::split(ours);
    let limits = w.shared.cfg.limits;
    let send = async move {
        if wr.write_all(&head).await.is_err() {
            return;
        }
        if pump_request(body, chunked, &mut wr).await.is_err() {
            return; // dropping `wr` shows `Conn` the request ended early
        }
        // Holding `wr` open keeps `Conn` from seeing EOF before it answered; it is dropped with this future.
        std::future::pending::<()>().await;
    };
    let recv = relay_response(rd, &mut respond, is_head, &limits);
    tokio::select! {
        r = recv => match r {
            Ok(()) => {}
            // The client reset the stream: the request is abandoned, so is the work for it (dropping the
            // `Conn` drops its upstream call, which an h2 upstream sees as RST_STREAM CANCEL).
            Err(Relay::Reset) => task.abort(),
            Err(Relay::Failed) => respond.send_reset(h2::Reason::INTERNAL_ERROR),
        },
        _ = send => {}
    }
}

/// Why relaying a response stopped early.
enum Relay {
    /// The client reset the stream.
    Reset,
    /// `Conn` wrote no valid response, or sending failed.
    Failed,
}

impl From<()> for Relay {
    fn from(_: ()) -> Self {
        Relay::Failed
    }
}

/// Reads more of `Conn`'s answer, unless the client resets the stream first. `Ok(0)`: `Conn` closed.
async fn read_or_reset(
    rd: &mut ReadHalf<DuplexStream>,
    buf: &mut BytesMut,
    mut reset: impl FnMut(&mut std::task::Context<'_>) -> std::task::Poll<Result<h2::Reason, h2::Error>>,
) -> Result<usize, Relay> {
    tokio::select! {
        n = rd.read_buf(buf) => n.map_err(|_| Relay::Failed),
        _ = std::future::poll_fn(|cx| reset(cx)) => Err(Relay::Reset),
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

fn put(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Streams the h2 request body (and trailers) into the bridge.
async fn pump_request(
    mut body: RecvStream,
    chunked: bool,
    wr: &mut WriteHalf<DuplexStream>,
) -> Result<(), ()> {
    let mut hdr = BytesMut::with_capacity(16);
    while let Some(data) = body.data().await {
        let data = data.map_err(|_| ())?;
        let n = data.len();
        if n == 0 {
            continue;
        }
        if chunked {
            hdr.clear();
            sluice_http::encode_chunk_header(n, &mut hdr);
            wr.write_all(&hdr).await.map_err(|_| ())?;
            wr.write_all(&data).await.map_err(|_| ())?;
            wr.write_all(b"\r\n").await.map_err(|_| ())?;
        } else {
            wr.write_all(&data).await.map_err(|_| ())?;
        }
        let _ = body.flow_control().release_capacity(n);
    }
    if chunked {
        let trailers = body.trailers().await.map_err(|_| ())?;
        let mut end = BytesMut::from(&b"0\r\n"[..]);
        for (name, value) in trailers.iter().flatten() {
            put(&mut end, name.as_str().as_bytes(), value.as_bytes());
        }
        end.put_slice(b"\r\n");
        wr.write_all(&end).await.map_err(|_| ())?;
    }
    wr.flush().await.map_err(|_| ())
}

/// Reads the HTTP/1.1 response `Conn` wrote and sends it as h2.
async fn relay_response(
    mut rd: ReadHalf<DuplexStream>,
    respond: &mut SendResponse<Bytes>,
    is_head: bool,
    limits: &sluice_http::Limits,
) -> Result<(), Relay> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let head = loop {
        match parse_response(&mut buf, limits, is_head) {
            Ok(Some(r)) if r.status >= 200 => break r,
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(_) => return Err(Relay::Failed),
        }
        buf.reserve(4096);
        if read_or_reset(&mut rd, &mut buf, |cx| respond.poll_reset(cx)).await? == 0 {
            return Err(Relay::Failed);
        }
    };
    let status = StatusCode::from_u16(head.status).map_err(|_| ())?;
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    let tokens = connection_tokens(&head.buf, &head.headers);
    let headers = resp.headers_mut();
    for (name, value) in head.headers_iter() {
        if tokens.is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"proxy-connection") {
            continue;
        }
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    let body = if is_head { BodyKind::Empty } else { head.body };
    let empty = matches!(body, BodyKind::Empty | BodyKind::Length(0));
    let mut tx = respond.send_response(resp, empty).map_err(|_| ())?;
    match body {
        BodyKind::Empty | BodyKind::Length(0) => Ok(()),
        BodyKind::Length(mut left) => loop {
            if buf.is_empty() {
                buf.reserve(16 * 1024);
                if read_or_reset(&mut rd, &mut buf, |cx| tx.poll_reset(cx)).await? == 0 {
                    return Err(Relay::Failed);
                }
            }
            let take = (buf.len() as u64).min(left) as usize;
            left -= take as u64;
            send_data(&mut tx, buf.split_to(take).freeze(), left == 0).await?;
            if left == 0 {
                return Ok(());
            }
        },
        BodyKind::Chunked => {
            let mut dec = ChunkedDecoder::new();
            loop {
                match dec.decode(&mut buf).map_err(|_| ())? {
                    Some(Chunk::Data(d)) => send_data(&mut tx, d, false).await?,
                    Some(Chunk::End { trailers }) => return Ok(finish(&mut tx, &trailers).await?),
                    None => {
                        buf.reserve(16 * 1024);
                        if read_or_reset(&mut rd, &mut buf, |cx| tx.poll_reset(cx)).await? == 0 {
                            return Err(Relay::Failed);
                        }
                    }
                }
            }
        }
        BodyKind::Eof => Err(Relay::Failed),
    }
}

/// Ends the stream: with a trailers HEADERS frame when the chunked body carried trailer fields.
async fn finish(tx: &mut SendStream<Bytes>, raw: &[u8]) -> Result<(), ()> {
    let map = trailer_map(raw);
    if map.is_empty() {
        tx.send_data(Bytes::new(), true).map_err(|_| ())
    } else {
        tx.send_trailers(map).map_err(|_| ())
    }
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
