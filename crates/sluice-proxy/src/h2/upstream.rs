//! HTTP/2 towards upstreams (`scheme: grpc` and Sluice's `h2c` = cleartext prior knowledge, `grpcs` and `h2` = TLS
//! with ALPN "h2"): one multiplexed client connection per node per worker thread, re-made when it dies.
//!
//! `conn::Conn` calls [`exchange`] with a parsed HTTP/1.1 request (on an h2 downstream: the stream's `Conn`),
//! the head it would forward to an HTTP/1.1 upstream (`forward::request_head`, re-parsed: plugin request edits,
//! Host per `pass_host`, X-Forwarded-*, hop-by-hop fields dropped, exactly as on the HTTP/1.1 path) and its
//! downstream stream. The request body and its chunked trailers go out as DATA and a trailers HEADERS frame,
//! concurrently with the response coming back. The response head goes through the plugins' header_filter and their
//! header edits, then downstream as HTTP/1.1: with the upstream's Content-Length when it sent one, else chunked with
//! its trailers (gRPC's `grpc-status` / `grpc-message`), or close-delimited to an HTTP/1.0 client. On routes with
//! plugins the head is handed to them as an HTTP/1.1 head, body_filter runs on each DATA frame and the trailers
//! reach them before the eof call (`write_filtered`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use ::h2::client::SendRequest;
use ahash::AHashMap;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use sluice_http::{connection_tokens, BodyKind, Chunk, ChunkedDecoder, RequestHead, Version};
use sluice_plugins::{Chain, Ctx, RespEdits};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Kind};
use crate::snapshot::{NodeRt, Timeouts, UpstreamRt};

/// One node's client connection; `connecting` makes concurrent first requests share a single handshake.
#[derive(Default)]
struct Slot {
    tx: RefCell<Option<SendRequest<Bytes>>>,
    connecting: tokio::sync::Mutex<()>,
}

thread_local! {
    /// Per worker thread (each worker is one thread): client connections by node address and TLS-ness.
    static CLIENTS: RefCell<AHashMap<(SocketAddr, bool), Rc<Slot>>> = RefCell::default();
}

/// What one exchange did, for the log phase.
pub(crate) struct Exchanged {
    /// The upstream's status (health checks count it).
    pub status: u16,
    /// The status the client got (a plugin may have changed it; the log phase records it).
    pub sent_status: u16,
    pub request_body: u64,
    pub response_bytes: u64,
    /// The response was close-delimited: the downstream connection ends with it.
    pub close: bool,
}

/// The plugins that filter the response head (header_filter, then their header edits).
pub(crate) struct RespFilter<'a, 'c> {
    pub ctx: &'a mut Ctx<'c>,
    pub chains: &'a [Option<&'a Chain>; 2],
}

/// How far a failed exchange got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    BeforeSend,
    Sent,
    /// The response head reached the client.
    Responding,
}

pub(crate) type Failed = (Error, Progress);

async fn client(up: &UpstreamRt, node: &NodeRt, t: Duration) -> Result<SendRequest<Bytes>, Error> {
    let key = (node.addr, up.tls.is_some());
    let slot = CLIENTS.with(|m| m.borrow_mut().entry(key).or_default().clone());
    let cached = slot.tx.borrow().clone();
    if let Some(c) = cached {
        if let Ok(c) = c.ready().await {
            return Ok(c);
        }
    }
    let _guard = slot.connecting.lock().await;
    // Someone else may have connected while this request waited.
    let cached = slot.tx.borrow().clone();
    if let Some(c) = cached {
        if let Ok(c) = c.ready().await {
            return Ok(c);
        }
    }
    slot.tx.borrow_mut().take();
    let connect = async {
        let tcp = TcpStream::connect(node.addr).await.map_err(|e| {
            Error::upstream(
                Kind::Connect,
                format!("upstream {}: connect: {e}", node.addr),
            )
        })?;
        let _ = tcp.set_nodelay(true);
        let hs = match (&up.tls, &node.sni) {
            (Some(cfg), Some(sni)) => {
                let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(sni.clone(), tcp)
                    .await
                    .map_err(|e| {
                        Error::upstream(Kind::Tls, format!("upstream {}: TLS: {e}", node.addr))
                    })?;
                let (tx, conn) = ::h2::client::handshake(tls)
                    .await
                    .map_err(|e| h2_err(node, e))?;
                tokio::task::spawn_local(async move {
                    let _ = conn.await;
                });
                tx
            }
            _ => {
                let (tx, conn) = ::h2::client::handshake(tcp)
                    .await
                    .map_err(|e| h2_err(node, e))?;
                tokio::task::spawn_local(async move {
                    let _ = conn.await;
                });
                tx
            }
        };
        Ok::<_, Error>(hs)
    };
    let tx = tokio::time::timeout(t, connect).await.map_err(|_| {
        Error::upstream(
            Kind::ConnectTimeout,
            format!("upstream {}: connect timed out", node.addr),
        )
    })??;
    *slot.tx.borrow_mut() = Some(tx.clone());
    tx.ready().await.map_err(|e| h2_err(node, e))
}

fn h2_err(node: &NodeRt, e: ::h2::Error) -> Error {
    Error::upstream(Kind::UpstreamIo, format!("upstream {}: h2: {e}", node.addr))
}

/// Builds the h2 request from the forwarded HTTP/1.1 head `fwd`: its Host becomes `:authority`, hop-by-hop fields
/// (already dropped by `forward`, but a plugin may set one) and a Content-Length beside chunked framing are left out.
fn request(
    head: &RequestHead,
    fwd: &RequestHead,
    up: &UpstreamRt,
    node: &NodeRt,
) -> Result<http::Request<()>, Error> {
    let authority = fwd.header("host").unwrap_or(&node.host_header);
    let bad = |m: String| Error::downstream(Kind::BadRequest(400), m);
    let uri = http::Uri::builder()
        .scheme(if up.tls.is_some() { "https" } else { "http" })
        .authority(authority)
        .path_and_query(path_and_query(fwd))
        .build()
        .map_err(|e| bad(format!("request target: {e}")))?;
    let mut req = http::Request::builder()
        .method(fwd.method_str())
        .uri(uri)
        .body(())
        .map_err(|e| bad(format!("request: {e}")))?;
    let tokens = connection_tokens(&fwd.buf, &fwd.headers);
    let headers = req.headers_mut();
    for (name, value) in fwd.headers_iter() {
        if tokens.is_hop_by_hop(name)
            || name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length") && fwd.body == BodyKind::Chunked
        {
            continue;
        }
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    // gRPC requires `te: trailers` end to end; it is hop-by-hop in HTTP/1.1, so it is re-added here (also for a
    // request a plugin turned into gRPC: grpc-transcode, grpc-web).
    if head
        .header("te")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"trailers"))
        || fwd
            .header("content-type")
            .is_some_and(|v| v.starts_with(b"application/grpc"))
    {
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    Ok(req)
}

fn path_and_query(head: &RequestHead) -> Vec<u8> {
    let mut pq = head.slice(head.path).to_vec();
    if let Some(q) = head.query {
        pq.push(b'?');
        pq.extend_from_slice(head.slice(q));
    }
    pq
}

/// Proxies one request to an h2 upstream and streams the response to `io`. `head` is the client's request (its
/// body framing and version count), `fwd` the head as it would be forwarded over HTTP/1.1.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    rbuf: &mut BytesMut,
    head: &RequestHead,
    fwd: &RequestHead,
    up: &UpstreamRt,
    node: &NodeRt,
    t: Timeouts,
    client_timeout: Duration,
    filter: Option<RespFilter<'_, '_>>,
) -> Result<Exchanged, Failed> {
    let req = request(head, fwd, up, node).map_err(|e| (e, Progress::BeforeSend))?;
    let mut tx = client(up, node, t.connect)
        .await
        .map_err(|e| (e.before_send(), Progress::BeforeSend))?;
    let end = head.body == BodyKind::Empty;
    let (resp, mut body_tx) = tx
        .send_request(req, end)
        .map_err(|e| (h2_err(node, e), Progress::BeforeSend))?;
    let (mut rd, mut wr) = tokio::io::split(io);
    let sent = std::cell::Cell::new(0u64);
    let send = async {
        if !end {
            let n = send_body(&mut rd, rbuf, head.body, &mut body_tx, client_timeout)
                .await
                .map_err(|m| {
                    let e = Error::downstream(Kind::BadRequest(400), format!("request body: {m}"));
                    (e, Progress::Sent)
                })?;
            sent.set(n);
        }
        // The request is out: from here the client is only watched, as nginx does (`proxy_ignore_client_abort
        // off`): a client that closes cancels the call (dropping the stream resets it upstream). What it sends
        // meanwhile (a pipelined request) stays in `rbuf`, up to a bound.
        loop {
            if rbuf.len() >= 64 * 1024 {
                std::future::pending::<()>().await;
            }
            rbuf.reserve(4096);
            match rd.read_buf(rbuf).await {
                Ok(0) | Err(_) => {
                    let e = Error::downstream(
                        Kind::ClientClosed,
                        "client closed while the upstream call was in flight",
                    );
                    return Err::<std::convert::Infallible, _>((e, Progress::Sent));
                }
                Ok(_) => {}
            }
        }
    };
    let recv = async {
        let resp = tokio::time::timeout(t.read, resp)
            .await
            .map_err(|_| {
                let e = Error::upstream(Kind::UpstreamTimeout, "upstream read timed out");
                (e, Progress::Sent)
            })?
            .map_err(|e| (h2_err(node, e), Progress::Sent))?;
        let down = Downstream {
            head_only: head.method_str() == "HEAD",
            http10: head.version == Version::Http10,
        };
        write_response(&mut wr, resp, down, filter, t.read).await
    };
    // The request body streams while the response comes back (gRPC bidirectional streaming); a failed body ends
    // the exchange at once (dropping the response stream resets it upstream).
    tokio::pin!(send, recv);
    tokio::select! {
        Err(e) = &mut send => Err(e),
        r = &mut recv => {
            let w = r?;
            Ok(Exchanged {
                status: w.status,
                sent_status: w.sent_status,
                request_body: sent.get(),
                response_bytes: w.bytes,
                close: w.close,
            })
        }
    }
}

async fn send_body<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    kind: BodyKind,
    tx: &mut ::h2::SendStream<Bytes>,
    t: Duration,
) -> Result<u64, String> {
    let mut sent = 0u64;
    let mut dec = ChunkedDecoder::new();
    let mut left = match kind {
        BodyKind::Length(n) => n,
        _ => 0,
    };
    loop {
        match kind {
            BodyKind::Chunked => match dec.decode(rbuf).map_err(|e| e.to_string())? {
                Some(Chunk::Data(d)) => {
                    sent += d.len() as u64;
                    super::stream::send_data(tx, d, false)
                        .await
                        .map_err(|_| "upstream stream closed")?;
                    continue;
                }
                Some(Chunk::End { trailers }) => {
                    let map = super::stream::trailer_map(&trailers);
                    let r = if map.is_empty() {
                        tx.send_data(Bytes::new(), true)
                    } else {
                        tx.send_trailers(map)
                    };
                    r.map_err(|e| e.to_string())?;
                    return Ok(sent);
                }
                None => {}
            },
            _ => {
                if !rbuf.is_empty() {
                    let take = (rbuf.len() as u64).min(left) as usize;
                    left -= take as u64;
                    sent += take as u64;
                    super::stream::send_data(tx, rbuf.split_to(take).freeze(), left == 0)
                        .await
                        .map_err(|_| "upstream stream closed")?;
                }
                if left == 0 {
                    return Ok(sent);
                }
            }
        }
        rbuf.reserve(16 * 1024);
        match tokio::time::timeout(t, rd.read_buf(rbuf)).await {
            Ok(Ok(0)) => return Err("client closed inside the body".into()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("client body timed out".into()),
        }
    }
}

/// What the downstream request allows in the response.
#[derive(Clone, Copy)]
struct Downstream {
    head_only: bool,
    http10: bool,
}

/// How the HTTP/1.1 response body is delimited.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// HEAD, 204, 304: no body.
    None,
    /// The upstream's Content-Length, body copied as is (trailers, if any, cannot follow).
    Length,
    /// Chunked, with the upstream's trailers.
    Chunked,
    /// An HTTP/1.0 client and no length: the body ends with the connection.
    Close,
}

/// What writing the response did.
struct Written {
    status: u16,
    sent_status: u16,
    bytes: u64,
    close: bool,
}

/// Writes the h2 response as HTTP/1.1.
async fn write_response<W: AsyncWrite + Unpin>(
    wr: &mut W,
    resp: http::Response<::h2::RecvStream>,
    down: Downstream,
    filter: Option<RespFilter<'_, '_>>,
    t: Duration,
) -> Result<Written, Failed> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status.as_u16();
    if let Some(f) = filter {
        return write_filtered(wr, parts, body, down, f, t).await;
    }
    let edits: Option<&RespEdits> = None;
    let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH);
    let framing = if down.head_only || status == 204 || status == 304 {
        Framing::None
    } else if has_length {
        Framing::Length
    } else if down.http10 {
        Framing::Close
    } else {
        Framing::Chunked
    };
    // A plugin's new status (response-rewrite `status_code`) goes out with its standard reason phrase; the
    // upstream's own status is what health and the log phase see.
    let sent_status = edits.and_then(|e| e.status).unwrap_or(status);
    let mut out = BytesMut::with_capacity(512);
    out.put_slice(b"HTTP/1.1 ");
    let mut code = crate::forward::itoa_buf();
    out.put_slice(crate::forward::fmt_u16(sent_status, &mut code));
    out.put_u8(b' ');
    out.put_slice(sluice_http::status_reason(sent_status).as_bytes());
    out.put_slice(b"\r\n");
    for (n, v) in &parts.headers {
        // The length the body is framed with cannot be removed by a plugin (as on the HTTP/1.1 path).
        let framing_length = framing == Framing::Length && n == http::header::CONTENT_LENGTH;
        if !framing_length && edits.is_some_and(|e| e.drops(n.as_str().as_bytes())) {
            continue;
        }
        put(&mut out, n.as_str().as_bytes(), v.as_bytes());
    }
    if let Some(e) = edits {
        for (n, v) in e.set_headers.iter().chain(&e.add_headers) {
            if !crate::forward::is_owned_response_field(n) {
                put(&mut out, n, v);
            }
        }
    }
    put_date(&mut out, &parts.headers);
    match framing {
        Framing::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Close => out.put_slice(b"connection: close\r\n"),
        Framing::None | Framing::Length => {}
    }
    out.put_slice(b"\r\n");
    let close = framing == Framing::Close;
    let down = |e: std::io::Error| {
        let e = Error::downstream(Kind::ClientClosed, e.to_string());
        (e, Progress::Responding)
    };
    let mut total = out.len() as u64;
    if framing == Framing::None {
        wr.write_all(&out).await.map_err(down)?;
        wr.flush().await.map_err(down)?;
        return Ok(Written {
            status,
            sent_status,
            bytes: total,
            close,
        });
    }
    // `out` collects the head and whatever body has already arrived: it is written only when the next frame is not
    // there yet (so a streamed response is never held back) or grows large, and a small response leaves in one
    // write.
    loop {
        let ready = std::future::poll_fn(|cx| std::task::Poll::Ready(body.poll_data(cx))).await;
        let next = match ready {
            std::task::Poll::Ready(next) => next,
            std::task::Poll::Pending => {
                if !out.is_empty() {
                    wr.write_all(&out).await.map_err(down)?;
                    wr.flush().await.map_err(down)?;
                    out.clear();
                }
                tokio::time::timeout(t, body.data()).await.map_err(|_| {
                    let e = Error::upstream(Kind::UpstreamTimeout, "upstream body timed out");
                    (e, Progress::Responding)
                })?
            }
        };
        let Some(d) = next else { break };
        let d = d.map_err(|e| {
            (
                Error::upstream(Kind::UpstreamIo, format!("h2 body: {e}")),
                Progress::Responding,
            )
        })?;
        if d.is_empty() {
            continue;
        }
        let n = d.len();
        let before = out.len();
        if framing == Framing::Chunked {
            sluice_http::encode_chunk_header(n, &mut out);
            out.put_slice(&d);
            out.put_slice(b"\r\n");
        } else {
            out.put_slice(&d);
        }
        total += (out.len() - before) as u64;
        let _ = body.flow_control().release_capacity(n);
        if out.len() >= 64 * 1024 {
            wr.write_all(&out).await.map_err(down)?;
            out.clear();
        }
    }
    if framing == Framing::Chunked {
        let trailers = body.trailers().await.map_err(|e| {
            (
                Error::upstream(Kind::UpstreamIo, format!("h2 trailers: {e}")),
                Progress::Responding,
            )
        })?;
        let before = out.len();
        out.put_slice(b"0\r\n");
        for (n, v) in trailers.iter().flatten() {
            if !sluice_http::is_forbidden_trailer(n.as_str().as_bytes()) {
                put(&mut out, n.as_str().as_bytes(), v.as_bytes());
            }
        }
        out.put_slice(b"\r\n");
        total += (out.len() - before) as u64;
    }
    wr.write_all(&out).await.map_err(down)?;
    wr.flush().await.map_err(down)?;
    Ok(Written {
        status,
        sent_status,
        bytes: total,
        close,
    })
}

/// The h2 response head as an HTTP/1.1 one, so plugins read it as they read an HTTP/1.1 upstream's.
fn h1_head(parts: &http::response::Parts) -> Result<sluice_http::ResponseHead, Failed> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_slice(b"HTTP/1.1 ");
    let mut code = crate::forward::itoa_buf();
    buf.put_slice(crate::forward::fmt_u16(parts.status.as_u16(), &mut code));
    buf.put_slice(b" \r\n");
    for (n, v) in &parts.headers {
        put(&mut buf, n.as_str().as_bytes(), v.as_bytes());
    }
    buf.put_slice(b"\r\n");
    let limits = sluice_http::Limits {
        max_headers: parts.headers.len() + 8,
        max_head_bytes: buf.len() + 1,
        max_uri_bytes: 1,
    };
    match sluice_http::parse_response(&mut buf, &limits, false) {
        Ok(Some(h)) => Ok(h),
        Ok(None) | Err(_) => Err((
            Error::upstream(
                Kind::UpstreamProtocol,
                "h2 response head not valid as HTTP/1.1",
            ),
            Progress::Sent,
        )),
    }
}

/// The response head for the client from the h2 head and the plugins' edits. `length`: the body's length when it
/// was collected whole (a held head), replacing the upstream's.
fn put_head(
    out: &mut BytesMut,
    status: u16,
    headers: &http::HeaderMap,
    edits: &RespEdits,
    framing: Framing,
    length: Option<u64>,
) {
    let sent_status = edits.status.unwrap_or(status);
    out.put_slice(b"HTTP/1.1 ");
    let mut code = crate::forward::itoa_buf();
    out.put_slice(crate::forward::fmt_u16(sent_status, &mut code));
    out.put_u8(b' ');
    out.put_slice(sluice_http::status_reason(sent_status).as_bytes());
    out.put_slice(b"\r\n");
    for (n, v) in headers {
        if n == http::header::CONTENT_LENGTH {
            if framing == Framing::Length && length.is_none() {
                put(out, n.as_str().as_bytes(), v.as_bytes());
            }
            continue;
        }
        if !edits.drops(n.as_str().as_bytes()) {
            put(out, n.as_str().as_bytes(), v.as_bytes());
        }
    }
    for (n, v) in edits.set_headers.iter().chain(&edits.add_headers) {
        if !crate::forward::is_owned_response_field(n) {
            put(out, n, v);
        }
    }
    put_date(out, headers);
    match framing {
        Framing::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Close => out.put_slice(b"connection: close\r\n"),
        Framing::Length => {
            if let Some(l) = length {
                let mut n = crate::forward::itoa_buf();
                put(out, b"content-length", crate::forward::fmt_u64(l, &mut n));
            }
        }
        Framing::None => {}
    }
    out.put_slice(b"\r\n");
}

/// Writes the h2 response through the plugins: header_filter on the head (as an HTTP/1.1 head), body_filter on
/// each DATA frame, the trailers handed over before the eof call. A re-framed body goes out chunked (or
/// close-delimited to HTTP/1.0); a held head (`RespEdits::hold_head`) waits for the whole filtered body and frames
/// it by its length. Trailers follow a chunked body unless a filter dropped them.
async fn write_filtered<W: AsyncWrite + Unpin>(
    wr: &mut W,
    parts: http::response::Parts,
    mut body: ::h2::RecvStream,
    down: Downstream,
    f: RespFilter<'_, '_>,
    t: Duration,
) -> Result<Written, Failed> {
    let (ctx, chains) = (f.ctx, f.chains);
    let status = parts.status.as_u16();
    ctx.set_upstream_head(h1_head(&parts)?);
    sluice_plugins::header_filters(chains, ctx, status);
    let no_body = down.head_only || status == 204 || status == 304;
    let filtering = !no_body && sluice_plugins::filters_body(chains, ctx);
    let hold = filtering && ctx.resp.hold_head;
    let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH)
        && !(filtering && ctx.resp.body_modified);
    let framing = if no_body {
        Framing::None
    } else if hold || has_length {
        Framing::Length
    } else if down.http10 {
        Framing::Close
    } else {
        Framing::Chunked
    };
    let sent_status = ctx.resp.status.unwrap_or(status);
    let close = framing == Framing::Close;
    let down_err = |e: std::io::Error| {
        let e = Error::downstream(Kind::ClientClosed, e.to_string());
        (e, Progress::Responding)
    };
    let up_err = |what: &str, e: ::h2::Error| {
        let e = Error::upstream(Kind::UpstreamIo, format!("h2 {what}: {e}"));
        (e, Progress::Responding)
    };
    let mut out = BytesMut::with_capacity(512);
    if !hold {
        put_head(&mut out, status, &parts.headers, &ctx.resp, framing, None);
    }
    let mut total = out.len() as u64;
    if framing == Framing::None {
        wr.write_all(&out).await.map_err(down_err)?;
        wr.flush().await.map_err(down_err)?;
        return Ok(Written {
            status,
            sent_status,
            bytes: total,
            close,
        });
    }
    let mut held = BytesMut::new();
    let mut ended = false;
    // As in `write_response`: what is ready leaves together, a frame not there yet flushes what is waiting.
    loop {
        let ready = std::future::poll_fn(|cx| std::task::Poll::Ready(body.poll_data(cx))).await;
        let next = match ready {
            std::task::Poll::Ready(next) => next,
            std::task::Poll::Pending => {
                if !out.is_empty() {
                    wr.write_all(&out).await.map_err(down_err)?;
                    wr.flush().await.map_err(down_err)?;
                    out.clear();
                }
                tokio::time::timeout(t, body.data()).await.map_err(|_| {
                    let e = Error::upstream(Kind::UpstreamTimeout, "upstream body timed out");
                    (e, Progress::Responding)
                })?
            }
        };
        let mut chunk = match next {
            None => {
                let trailers = body.trailers().await.map_err(|e| up_err("trailers", e))?;
                let list = trailers
                    .iter()
                    .flatten()
                    .map(|(n, v)| {
                        (
                            Bytes::copy_from_slice(n.as_str().as_bytes()),
                            Bytes::copy_from_slice(v.as_bytes()),
                        )
                    })
                    .collect();
                ctx.set_upstream_trailers(list);
                sluice_plugins::BodyChunk {
                    data: Bytes::new(),
                    eof: true,
                }
            }
            Some(d) => {
                let d = d.map_err(|e| up_err("body", e))?;
                let _ = body.flow_control().release_capacity(d.len());
                sluice_plugins::BodyChunk {
                    data: d,
                    eof: false,
                }
            }
        };
        let last = chunk.eof;
        if filtering {
            sluice_plugins::body_filters(chains, ctx, &mut chunk);
        }
        let d = &chunk.data;
        if hold {
            held.put_slice(d);
        } else if !d.is_empty() {
            let before = out.len();
            if framing == Framing::Chunked {
                sluice_http::encode_chunk_header(d.len(), &mut out);
                out.put_slice(d);
                out.put_slice(b"\r\n");
            } else {
                out.put_slice(d);
            }
            total += (out.len() - before) as u64;
            if out.len() >= 64 * 1024 {
                wr.write_all(&out).await.map_err(down_err)?;
                out.clear();
            }
        }
        if last {
            break;
        }
        if chunk.eof {
            // A filter ended the body: the rest of the stream is not read (dropping it resets it upstream).
            ended = true;
            break;
        }
    }
    if hold {
        put_head(
            &mut out,
            status,
            &parts.headers,
            &ctx.resp,
            framing,
            Some(held.len() as u64),
        );
        out.put_slice(&held);
        total += out.len() as u64;
    }
    let sent_status = ctx.resp.status.unwrap_or(status);
    if framing == Framing::Chunked {
        let before = out.len();
        out.put_slice(b"0\r\n");
        if !ended && !ctx.resp.drop_trailers {
            for (n, v) in ctx.upstream_trailers() {
                if !sluice_http::is_forbidden_trailer(n) {
                    put(&mut out, n, v);
                }
            }
        }
        out.put_slice(b"\r\n");
        total += (out.len() - before) as u64;
    }
    wr.write_all(&out).await.map_err(down_err)?;
    wr.flush().await.map_err(down_err)?;
    Ok(Written {
        status,
        sent_status,
        bytes: total,
        close,
    })
}

/// gRPC servers send no `Date`; a proxy forwarding a response without one adds it (RFC 9110 §6.6.1).
fn put_date(out: &mut BytesMut, headers: &http::HeaderMap) {
    if !headers.contains_key(http::header::DATE) {
        put(out, b"date", &sluice_http::date::now());
    }
}

fn put(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}
