//! What happens to an accepted TCP connection before HTTP: the dispatch point between protocols.
//!
//! Plain listeners speak HTTP/1.1 (and h2c, see below); TLS listeners terminate TLS first and pick HTTP/1.1 or h2 by
//! ALPN. Everything after this point is generic over the stream type, so HTTP/1.1 over TLS is the same `Conn`.

use std::net::SocketAddr;
use std::rc::Rc;

use tokio::net::TcpStream;

use crate::conn::Conn;
use crate::server::Worker;

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
}

pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    kind: ListenerKind,
    w: Rc<Worker>,
) {
    match kind {
        ListenerKind::Plain => {
            let t = w.shared.cfg.header_timeout;
            if w.shared.cfg.enable_http2 && crate::h2::sniff_preface(&stream, t).await {
                crate::h2::serve(stream, peer, local, "http", w).await
            } else {
                Conn::new(stream, peer, local, "http", w).run().await
            }
        }
        ListenerKind::Tls => crate::tls_server::serve(stream, peer, local, w).await,
        ListenerKind::H2c => {
            if crate::h2::sniff_preface(&stream, w.shared.cfg.header_timeout).await {
                crate::h2::serve(stream, peer, local, "http", w).await
            } else {
                crate::h2::refuse(stream).await
            }
        }
    }
}
