//! HTTP/2 towards upstreams (`scheme: grpc` = h2c, `grpcs` = h2 over TLS with ALPN "h2"): one multiplexed client
//! connection per node per worker thread, re-made when it dies.
//!
//! `conn::Conn` calls [`exchange`] with a parsed HTTP/1.1 request (on an h2 downstream that is the bridged stream)
//! and its downstream stream: the request body and its chunked trailers go out as DATA and a trailers HEADERS
//! frame, concurrently with the response coming back, which is written downstream as a chunked HTTP/1.1 message
//! whose trailers carry the upstream's (gRPC's `grpc-status` / `grpc-message`). Plugins' response edits are not
//! applied on this path.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use ::h2::client::SendRequest;
use ahash::AHashMap;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use sluice_http::{connection_tokens, BodyKind, Chunk, ChunkedDecoder, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Kind};
use crate::snapshot::{NodeRt, PassHost, Timeouts, UpstreamRt};

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
    pub status: u16,
    pub request_body: u64,
    pub response_bytes: u64,
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

/// Builds the upstream request from the HTTP/1.1 head: hop-by-hop fields dropped, Host becomes `:authority`.
fn request(
    head: &RequestHead,
    up: &UpstreamRt,
    node: &NodeRt,
    client_host: Option<&[u8]>,
) -> Result<http::Request<()>, Error> {
    let authority: &[u8] = match &up.pass_host {
        PassHost::Pass => client_host.unwrap_or(&node.host_header),
        PassHost::Node => &node.host_header,
        PassHost::Rewrite(h) => h,
    };
    let bad = |m: String| Error::downstream(Kind::BadRequest(400), m);
    let uri = http::Uri::builder()
        .scheme(if up.tls.is_some() { "https" } else { "http" })
        .authority(authority)
        .path_and_query(path_and_query(head))
        .build()
        .map_err(|e| bad(format!("request target: {e}")))?;
    let mut req = http::Request::builder()
        .method(head.method_str())
        .uri(uri)
        .body(())
        .map_err(|e| bad(format!("request: {e}")))?;
    let tokens = connection_tokens(&head.buf, &head.headers);
    let headers = req.headers_mut();
    for (name, value) in head.headers_iter() {
        if tokens.is_hop_by_hop(name)
            || name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"content-length") && head.body == BodyKind::Chunked
        {
            continue;
        }
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    // gRPC requires `te: trailers` end to end; it is hop-by-hop in HTTP/1.1, so it is re-added here.
    if head
        .header("te")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"trailers"))
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

/// Proxies one request to an h2 upstream and streams the response to `io`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    rbuf: &mut BytesMut,
    head: &RequestHead,
    up: &UpstreamRt,
    node: &NodeRt,
    client_host: Option<&[u8]>,
    t: Timeouts,
    client_timeout: Duration,
) -> Result<Exchanged, Failed> {
    let req = request(head, up, node, client_host).map_err(|e| (e, Progress::BeforeSend))?;
    let mut tx = client(up, node, t.connect)
        .await
        .map_err(|e| (e.before_send(), Progress::BeforeSend))?;
    let end = head.body == BodyKind::Empty;
    let (resp, mut body_tx) = tx
        .send_request(req, end)
        .map_err(|e| (h2_err(node, e), Progress::BeforeSend))?;
    let (mut rd, mut wr) = tokio::io::split(io);
    let send = async {
        if end {
            return Ok(0);
        }
        send_body(&mut rd, rbuf, head.body, &mut body_tx, client_timeout)
            .await
            .map_err(|m| {
                let e = Error::downstream(Kind::BadRequest(400), format!("request body: {m}"));
                (e, Progress::Sent)
            })
    };
    let recv = async {
        let resp = tokio::time::timeout(t.read, resp)
            .await
            .map_err(|_| {
                let e = Error::upstream(Kind::UpstreamTimeout, "upstream read timed out");
                (e, Progress::Sent)
            })?
            .map_err(|e| (h2_err(node, e), Progress::Sent))?;
        write_response(&mut wr, resp, head.method_str() == "HEAD", t.read).await
    };
    // The request body streams while the response comes back (gRPC bidirectional streaming); a failed body ends
    // the exchange at once (dropping the response stream resets it upstream).
    tokio::pin!(send, recv);
    let mut sent = None;
    loop {
        tokio::select! {
            r = &mut send, if sent.is_none() => sent = Some(r?),
            r = &mut recv => {
                let (status, response_bytes) = r?;
                return Ok(Exchanged { status, request_body: sent.unwrap_or(0), response_bytes });
            }
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
                    super::bridge::send_data(tx, d, false)
                        .await
                        .map_err(|_| "upstream stream closed")?;
                    continue;
                }
                Some(Chunk::End { trailers }) => {
                    let map = super::bridge::trailer_map(&trailers);
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
                    super::bridge::send_data(tx, rbuf.split_to(take).freeze(), left == 0)
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

/// Writes the h2 response as chunked HTTP/1.1 (trailers kept); returns status and bytes written.
async fn write_response<W: AsyncWrite + Unpin>(
    wr: &mut W,
    resp: http::Response<::h2::RecvStream>,
    head_only: bool,
    t: Duration,
) -> Result<(u16, u64), Failed> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status.as_u16();
    let bodyless = head_only || status == 204 || status == 304;
    let mut out = BytesMut::with_capacity(512);
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(parts.status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(sluice_http::status_reason(status).as_bytes());
    out.put_slice(b"\r\n");
    for (n, v) in &parts.headers {
        if bodyless || n != http::header::CONTENT_LENGTH {
            put(&mut out, n.as_str().as_bytes(), v.as_bytes());
        }
    }
    if !bodyless {
        out.put_slice(b"transfer-encoding: chunked\r\n");
    }
    out.put_slice(b"\r\n");
    let down = |e: std::io::Error| {
        let e = Error::downstream(Kind::ClientClosed, e.to_string());
        (e, Progress::Responding)
    };
    let mut total = out.len() as u64;
    wr.write_all(&out).await.map_err(down)?;
    if bodyless {
        return Ok((status, total));
    }
    loop {
        let next = tokio::time::timeout(t, body.data()).await.map_err(|_| {
            let e = Error::upstream(Kind::UpstreamTimeout, "upstream body timed out");
            (e, Progress::Responding)
        })?;
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
        out.clear();
        sluice_http::encode_chunk_header(n, &mut out);
        wr.write_all(&out).await.map_err(down)?;
        wr.write_all(&d).await.map_err(down)?;
        wr.write_all(b"\r\n").await.map_err(down)?;
        total += (out.len() + n + 2) as u64;
        let _ = body.flow_control().release_capacity(n);
    }
    let trailers = body.trailers().await.map_err(|e| {
        (
            Error::upstream(Kind::UpstreamIo, format!("h2 trailers: {e}")),
            Progress::Responding,
        )
    })?;
    out.clear();
    out.put_slice(b"0\r\n");
    for (n, v) in trailers.iter().flatten() {
        put(&mut out, n.as_str().as_bytes(), v.as_bytes());
    }
    out.put_slice(b"\r\n");
    total += out.len() as u64;
    wr.write_all(&out).await.map_err(down)?;
    wr.flush().await.map_err(down)?;
    Ok((status, total))
}

fn put(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}
