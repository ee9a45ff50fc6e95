//! Dubbo2 calls over long-lived multiplexed connections, per worker thread and provider node.
//!
//! Each connection is one task that owns the socket: requests reach it through a channel and are written as they
//! come; answers are matched to their callers by request id, so up to `multiplex` calls share a connection (APISIX's
//! `upstream_multiplex_count`). A node gets another connection only when every one it has is that busy. The task
//! answers the provider's heartbeats, sends its own when the connection is idle, and on any error fails the calls in
//! flight and leaves the pool; the next call connects again. Never a connection per request.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use sluice_dubbo::protocol::{self, Frame, FrameDecoder, Message, Request, DEFAULT_MAX_PAYLOAD};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::CallFailure;

/// Idle time after which a connection sends a heartbeat (Dubbo's default is 60 s).
const HEARTBEAT: Duration = Duration::from_secs(30);
/// Connections per node per worker thread, at most.
const MAX_CONNS: usize = 16;

/// A decoded hessian2 answer, or the frame itself for a caller that reads another serialization (http-dubbo).
enum Reply {
    Message(Message),
    Frame(Frame),
}

type Answer = Result<Reply, String>;

/// Writes a request frame with the request id it is given.
pub(crate) type Encode<'a> = &'a dyn Fn(u64, &mut Vec<u8>) -> Result<(), String>;

struct Outgoing {
    id: u64,
    frame: Vec<u8>,
    /// The caller decodes the answer itself.
    raw: bool,
    reply: oneshot::Sender<Answer>,
}

/// One multiplexed connection.
struct Mux {
    tx: mpsc::UnboundedSender<Outgoing>,
    inflight: Cell<usize>,
    dead: Rc<Cell<bool>>,
}

#[derive(Default)]
struct Node {
    conns: RefCell<Vec<Rc<Mux>>>,
    /// Serialises connecting, so a burst of first calls shares one handshake instead of opening many.
    connecting: tokio::sync::Mutex<()>,
}

thread_local! {
    static NODES: RefCell<HashMap<SocketAddr, Rc<Node>>> = RefCell::default();
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

fn next_id() -> u64 {
    NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id.wrapping_add(1).max(1));
        id
    })
}

fn failure(sent: bool, timeout: bool, message: impl Into<String>) -> CallFailure {
    CallFailure {
        sent,
        timeout,
        retry: false,
        message: message.into(),
    }
}

/// A connection of `node` with room for one more call, connecting one if needed.
async fn mux_for(
    addr: SocketAddr,
    multiplex: usize,
    connect: Duration,
) -> Result<Rc<Mux>, CallFailure> {
    let node = NODES.with(|n| n.borrow_mut().entry(addr).or_default().clone());
    let pick = |node: &Node| {
        let mut conns = node.conns.borrow_mut();
        conns.retain(|m| !m.dead.get());
        conns
            .iter()
            .filter(|m| m.inflight.get() < multiplex)
            .min_by_key(|m| m.inflight.get())
            .cloned()
            .or_else(|| {
                // Every connection is full and no more may be opened: share the least busy one.
                (conns.len() >= MAX_CONNS)
                    .then(|| conns.iter().min_by_key(|m| m.inflight.get()).cloned())
                    .flatten()
            })
    };
    if let Some(m) = pick(&node) {
        return Ok(m);
    }
    let _guard = node.connecting.lock().await;
    if let Some(m) = pick(&node) {
        return Ok(m);
    }
    let stream = match tokio::time::timeout(connect, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(failure(false, false, format!("dubbo {addr}: connect: {e}"))),
        Err(_) => {
            return Err(failure(
                false,
                true,
                format!("dubbo {addr}: connect timed out"),
            ))
        }
    };
    let _ = stream.set_nodelay(true);
    let (tx, rx) = mpsc::unbounded_channel();
    let dead = Rc::new(Cell::new(false));
    tokio::task::spawn_local(run(stream, rx, dead.clone()));
    let m = Rc::new(Mux {
        tx,
        inflight: Cell::new(0),
        dead,
    });
    node.conns.borrow_mut().push(m.clone());
    Ok(m)
}

/// Sends `req` to `addr` and waits for its answer within `read`.
pub(crate) async fn call(
    addr: SocketAddr,
    req: &Request,
    multiplex: usize,
    connect: Duration,
    read: Duration,
) -> Result<Message, CallFailure> {
    let encode = |id: u64, frame: &mut Vec<u8>| {
        protocol::encode_request(req, id, DEFAULT_MAX_PAYLOAD, frame).map_err(|e| e.to_string())
    };
    match exchange(addr, &encode, false, multiplex, connect, read).await? {
        Reply::Message(m) => Ok(m),
        Reply::Frame(_) => Err(failure(true, false, "dubbo: unexpected raw answer")),
    }
}

/// Sends the frame `encode` writes (with the request id it is given) and returns the answer's frame undecoded.
pub(crate) async fn call_raw(
    addr: SocketAddr,
    encode: Encode<'_>,
    multiplex: usize,
    connect: Duration,
    read: Duration,
) -> Result<Frame, CallFailure> {
    match exchange(addr, encode, true, multiplex, connect, read).await? {
        Reply::Frame(f) => Ok(f),
        Reply::Message(_) => Err(failure(true, false, "dubbo: unexpected decoded answer")),
    }
}

async fn exchange(
    addr: SocketAddr,
    encode: Encode<'_>,
    raw: bool,
    multiplex: usize,
    connect: Duration,
    read: Duration,
) -> Result<Reply, CallFailure> {
    let mux = mux_for(addr, multiplex, connect).await?;
    let id = next_id();
    let mut frame = Vec::with_capacity(256);
    encode(id, &mut frame).map_err(|e| failure(false, false, format!("dubbo request: {e}")))?;
    let (reply, rx) = oneshot::channel();
    if mux
        .tx
        .send(Outgoing {
            id,
            frame,
            raw,
            reply,
        })
        .is_err()
    {
        mux.dead.set(true);
        return Err(failure(
            false,
            false,
            format!("dubbo {addr}: connection closed"),
        ));
    }
    mux.inflight.set(mux.inflight.get() + 1);
    let r = tokio::time::timeout(read, rx).await;
    mux.inflight.set(mux.inflight.get() - 1);
    match r {
        Ok(Ok(Ok(m))) => Ok(m),
        Ok(Ok(Err(e))) => Err(failure(true, false, format!("dubbo {addr}: {e}"))),
        Ok(Err(_)) => Err(failure(
            true,
            false,
            format!("dubbo {addr}: connection closed"),
        )),
        Err(_) => Err(failure(
            true,
            true,
            format!("dubbo {addr}: no answer in {read:?}"),
        )),
    }
}

/// The connection's task: writes what callers send, hands answers back by id, keeps the connection alive.
async fn run(stream: TcpStream, mut rx: mpsc::UnboundedReceiver<Outgoing>, dead: Rc<Cell<bool>>) {
    let (mut rd, mut wr) = stream.into_split();
    let mut pending: HashMap<u64, (oneshot::Sender<Answer>, bool)> = HashMap::new();
    let mut frames = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    let mut buf = vec![0u8; 16 * 1024];
    let mut wbuf: Vec<u8> = Vec::with_capacity(4096);
    let idle = tokio::time::sleep(HEARTBEAT);
    tokio::pin!(idle);
    let why: String = 'conn: loop {
        tokio::select! {
            out = rx.recv() => {
                let Some(out) = out else { break 'conn "pool dropped".into() };
                // Every call queued by now leaves in one write.
                wbuf.clear();
                let mut next = Some(out);
                while let Some(out) = next.take().or_else(|| rx.try_recv().ok()) {
                    // A caller that gave up already (timeout) needs no slot.
                    if out.reply.is_closed() {
                        continue;
                    }
                    wbuf.extend_from_slice(&out.frame);
                    pending.insert(out.id, (out.reply, out.raw));
                }
                if wbuf.is_empty() {
                    continue;
                }
                if let Err(e) = wr.write_all(&wbuf).await {
                    break 'conn format!("write: {e}");
                }
                idle.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
            }
            n = rd.read(&mut buf) => {
                let n = match n {
                    Ok(0) => break 'conn "closed by the provider".into(),
                    Ok(n) => n,
                    Err(e) => break 'conn format!("read: {e}"),
                };
                frames.push(&buf[..n]);
                loop {
                    let frame = match frames.next_frame() {
                        Ok(Some(f)) => f,
                        Ok(None) => break,
                        Err(e) => break 'conn format!("bad frame: {e}"),
                    };
                    let h = frame.header;
                    if !h.is_request() && !h.is_event() {
                        // A response: its caller gets it, decoded unless it reads the frame itself.
                        let Some((tx, raw)) = pending.remove(&h.id) else { continue };
                        let answer = if raw {
                            Ok(Reply::Frame(frame))
                        } else {
                            // Nothing here reads an answer's attachments.
                            match protocol::decode_without_response_attachments(&frame) {
                                Ok(m @ Message::Response { .. }) => Ok(Reply::Message(m)),
                                Ok(_) => Err("not a response".to_owned()),
                                Err(e) => Err(format!("undecodable answer: {e}")),
                            }
                        };
                        let _ = tx.send(answer);
                        continue;
                    }
                    // A provider's heartbeat is answered; other events, requests from the provider and undecodable
                    // events are ignored.
                    if let Ok(Message::Event { id, request: true, two_way: true, .. }) = protocol::decode(&frame) {
                        let mut hb = Vec::with_capacity(17);
                        protocol::encode_heartbeat(id, false, &mut hb);
                        if let Err(e) = wr.write_all(&hb).await {
                            break 'conn format!("write: {e}");
                        }
                    }
                }
            }
            _ = &mut idle => {
                let mut hb = Vec::with_capacity(17);
                protocol::encode_heartbeat(next_id(), true, &mut hb);
                if let Err(e) = wr.write_all(&hb).await {
                    break 'conn format!("write: {e}");
                }
                idle.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
            }
        }
    };
    dead.set(true);
    tracing::debug!(reason = %why, "dubbo connection ends");
    for (_, (tx, _)) in pending.drain() {
        let _ = tx.send(Err(why.clone()));
    }
    rx.close();
    while let Ok(out) = rx.try_recv() {
        let _ = out.reply.send(Err(why.clone()));
    }
}
