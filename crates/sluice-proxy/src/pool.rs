//! Upstream connections and the per-worker keep-alive pool.
//!
//! Each worker thread runs its own single-threaded runtime and owns its pool (`Rc<RefCell<..>>`), so taking and
//! returning a connection is a hash lookup and a `Vec` push/pop: no lock, no atomic. Pools are keyed by node address
//! and TLS identity, not by upstream object, so a configuration change keeps every warm connection.
//! APISIX's `keepalive_pool` is per nginx worker; here it is per worker thread, the same thing.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ahash::AHashMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Kind};
use crate::snapshot::{NodeRt, PoolCfg, UpstreamRt};

/// An upstream connection, plain or TLS.
pub(crate) enum UpConn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpConn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpConn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpConn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpConn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpConn::Plain(s) => Pin::new(s).poll_flush(cx),
            UpConn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpConn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpConn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection checked out of the pool or freshly made, with what the pool needs to take it back.
pub(crate) struct Checkout {
    pub conn: UpConn,
    pub key: PoolKey,
    pub uses: u32,
    pub reused: bool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    addr: SocketAddr,
    /// The TLS server name; `None` for plain connections.
    sni: Option<Arc<[u8]>>,
}

struct Idle {
    conn: UpConn,
    since: Instant,
    uses: u32,
}

/// Idle connections older than this are probed before reuse, since the upstream may have closed them.
const PROBE_AFTER: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(crate) struct Pool {
    idle: RefCell<AHashMap<PoolKey, Vec<Idle>>>,
    /// Counters for tests and the benchmark: how many connections were opened and reused.
    pub opened: std::cell::Cell<u64>,
    pub reused: std::cell::Cell<u64>,
}

impl Pool {
    /// A pooled connection to `node` if a live one is idle, else a new one (connect timeout applies).
    /// `has_body` requests always probe a pooled connection first, because their body cannot be
    /// replayed if the upstream had closed it (a bodiless request is simply retried on a fresh connection).
    pub(crate) async fn checkout_for(
        &self,
        up: &UpstreamRt,
        node: &NodeRt,
        connect_timeout: Duration,
        has_body: bool,
        now: Instant,
    ) -> Result<Checkout, Error> {
        let key = PoolKey {
            addr: node.addr,
            sni: node.sni.as_ref().map(|s| Arc::from(s.to_str().as_bytes())),
        };
        if let Some(c) = self.take(&key, up.pool, has_body, now) {
            self.reused.set(self.reused.get() + 1);
            return Ok(c);
        }
        let conn = tokio::time::timeout(connect_timeout, connect(up, node))
            .await
            .map_err(|_| {
                Error::upstream(
                    Kind::ConnectTimeout,
                    format!("upstream {}: connect timed out", node.addr),
                )
                .before_send()
            })??;
        self.opened.set(self.opened.get() + 1);
        Ok(Checkout {
            conn,
            key,
            uses: 0,
            reused: false,
        })
    }

    /// `now`: the caller's clock read of this request (an idle connection's age needs no finer clock).
    fn take(&self, key: &PoolKey, cfg: PoolCfg, probe: bool, now: Instant) -> Option<Checkout> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(c) = list.pop() {
            let age = now.saturating_duration_since(c.since);
            if age >= cfg.idle_timeout {
                continue;
            }
            if (probe || age >= PROBE_AFTER) && !alive(&c.conn) {
                continue;
            }
            return Some(Checkout {
                conn: c.conn,
                key: key.clone(),
                uses: c.uses,
                reused: true,
            });
        }
        None
    }

    /// Returns a connection after a complete exchange; drops it when the pool is full or it served its quota.
    /// `since`: when the connection went idle (the caller's clock read of the exchange's end).
    pub(crate) fn checkin(&self, c: Checkout, cfg: PoolCfg, since: Instant) {
        let uses = c.uses + 1;
        if uses >= cfg.requests || cfg.size == 0 {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(c.key).or_default();
        if list.len() >= cfg.size {
            return;
        }
        list.push(Idle {
            conn: c.conn,
            since,
            uses,
        });
    }
}

/// An idle plain connection is alive if reading would block; EOF or stray bytes mean it cannot be reused.
fn alive(conn: &UpConn) -> bool {
    match conn {
        UpConn::Plain(s) => {
            let mut b = [0u8; 1];
            matches!(s.try_read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        }
        UpConn::Tls(_) => true,
    }
}

async fn connect(up: &UpstreamRt, node: &NodeRt) -> Result<UpConn, Error> {
    let tcp = TcpStream::connect(node.addr).await.map_err(|e| {
        Error::upstream(
            Kind::Connect,
            format!("upstream {}: connect: {e}", node.addr),
        )
        .before_send()
    })?;
    let _ = tcp.set_nodelay(true);
    match (&up.tls, &node.sni) {
        (Some(cfg), Some(sni)) => {
            let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                .connect(sni.clone(), tcp)
                .await
                .map_err(|e| {
                    Error::upstream(Kind::Tls, format!("upstream {}: TLS: {e}", node.addr))
                        .before_send()
                })?;
            Ok(UpConn::Tls(Box::new(tls)))
        }
        _ => Ok(UpConn::Plain(tcp)),
    }
}
