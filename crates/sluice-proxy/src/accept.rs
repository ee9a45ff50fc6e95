//! What happens to an accepted TCP connection before HTTP: the dispatch point between protocols.
//!
//! Plain listeners speak HTTP/1.1 and h2c, told apart by peeking at the opening bytes (`h2::sniff`: the h2
//! preface, HTTP/1.x, or neither, which is closed unanswered); TLS listeners terminate TLS first and pick HTTP/1.1
//! or h2 by ALPN. Everything after this point is generic over the stream type, so HTTP/1.1 over TLS is the same `Conn`.

use std::net::SocketAddr;
use std::rc::Rc;

use tokio::net::TcpStream;

use crate::conn::Conn;
use crate::server::Worker;
use crate::slots::Slot;

/// How a listener's connections start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// Cleartext HTTP (APISIX `node_listen`).
    Plain,
    /// TLS with certificates from `ssls` chosen by SNI (APISIX `apisix.ssl.listen`).
    Tls,
    /// HTTP/2 cleartext only, by prior knowledge: no HTTP/1.1 fallback, so anything but the h2 preface is a
    /// connection error (RFC 9113 §3.4). For h2c-only (e.g. gRPC) ports; `Plain` sniffs and serves both.
    H2c,
    /// An L4 stream listener (APISIX `stream_proxy.tcp`): `stream_routes`, TLS passed through.
    Stream,
    /// An L4 stream listener terminating TLS with the `ssls` certificates (`stream_proxy.tcp` `{tls: true}`).
    StreamTls,
    /// `Plain`, `Tls`, `Stream` or `StreamTls` behind a PROXY protocol sender (APISIX `apisix.proxy_protocol`):
    /// each connection opens with a PROXY header, whose source address becomes the client's.
    ProxyProtocol(Behind),
}

/// The listener kinds a PROXY header can precede.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    Plain,
    Tls,
    Stream,
    StreamTls,
}

impl ListenerKind {
    /// `kind`, behind a PROXY protocol sender when `pp` (kinds without a PROXY variant stay as they are).
    pub fn with_proxy_protocol(self, pp: bool) -> ListenerKind {
        let behind = match self {
            _ if !pp => return self,
            ListenerKind::Plain => Behind::Plain,
            ListenerKind::Tls => Behind::Tls,
            ListenerKind::Stream => Behind::Stream,
            ListenerKind::StreamTls => Behind::StreamTls,
            other => return other,
        };
        ListenerKind::ProxyProtocol(behind)
    }
}

pub(crate) async fn serve(
    mut stream: TcpStream,
    mut peer: SocketAddr,
    local: SocketAddr,
    kind: ListenerKind,
    slot: Rc<Slot>,
    w: Rc<Worker>,
) {
    use crate::h2::Opening;
    let t = w.shared.cfg.header_timeout;
    let kind = match kind {
        // The header first (within the header timeout); then the listener's own protocol, from the client it names.
        ListenerKind::ProxyProtocol(behind) => {
            match crate::proxy_protocol::read_header(&mut stream, peer, t).await {
                Ok(client) => peer = client,
                Err(why) => {
                    tracing::debug!(%peer, why, "PROXY protocol: closing the connection");
                    return;
                }
            }
            match behind {
                Behind::Plain => ListenerKind::Plain,
                Behind::Tls => ListenerKind::Tls,
                Behind::Stream => ListenerKind::Stream,
                Behind::StreamTls => ListenerKind::StreamTls,
            }
        }
        k => k,
    };
    let http1 = |stream, slot, w| Conn::new(stream, peer, local, "http", w).with_slot(slot);
    // An h2 connection multiplexes requests: never evicted for a newcomer once it has opened.
    let h2 = |stream, slot: Rc<Slot>, w| {
        slot.set_busy();
        crate::h2::serve(stream, peer, local, "http", w)
    };
    match kind {
        ListenerKind::Plain if w.shared.cfg.enable_http2 => {
            match crate::h2::sniff(&stream, t).await {
                Opening::H2 => h2(stream, slot, w).await,
                Opening::Http1 => http1(stream, slot, w).run().await,
                Opening::Neither => crate::h2::refuse(stream).await,
            }
        }
        ListenerKind::Plain => http1(stream, slot, w).run().await,
        ListenerKind::Tls => crate::tls_server::serve(stream, peer, local, slot, w).await,
        ListenerKind::Stream => {
            crate::stream::tcp::serve(stream, peer, local, false, slot, w).await
        }
        ListenerKind::StreamTls => {
            crate::stream::tcp::serve(stream, peer, local, true, slot, w).await
        }
        ListenerKind::H2c => match crate::h2::sniff(&stream, t).await {
            Opening::H2 => h2(stream, slot, w).await,
            _ => crate::h2::refuse(stream).await,
        },
        // Replaced by the kind behind it above.
        ListenerKind::ProxyProtocol(_) => {}
    }
}
