//! Sluice's data plane. It receives compiled configuration ([`Snapshot`]) and serves HTTP/1.1 on worker threads;
//! it knows nothing of stores, the Admin API or file formats (they depend on it, never the reverse).
//!
//! Request path: `server` accepts on a worker's own listener -> `conn` reads and parses a head (`sluice-http`) ->
//! the snapshot's router (`sluice-router`) picks a route -> its upstream's balancer (`sluice-upstream`) picks a node
//! -> `pool` lends a kept-alive connection -> `forward` writes the head, `body` streams bodies both ways.
//! docs/architecture.md draws the whole picture.

mod accept;
mod access_log;
mod body;
mod conn;
mod error;
mod forward;
mod h2;
mod health_check;
mod inspect;
mod listen;
mod mirror;
mod pool;
pub mod proxy_protocol;
mod server;
mod slots;
mod snapshot;
mod stream;
mod tls;
mod tls_server;
mod ws;

pub use accept::{Behind, ListenerKind};
pub use access_log::{AccessLog, AccessLogConfig, AccessLogHandle, Escape, Format, Target};
pub use error::{Error, Side};
pub use inspect::{ChainEntry, InspectError, MatchInput, MatchOutcome};
pub use listen::{listen_addrs, DEFAULT_TLS_PORT};
pub use server::{Gateway, Listeners, NodeHealth, ProxyConfig, Running, UpstreamHealth};
pub use snapshot::{Prepared, Snapshot};
pub use stream::log::{stream_access_log, StreamFormat};
pub use stream::{
    render_prometheus as render_stream_prometheus, stream_listen, StreamCounters, StreamListen,
    StreamRouteStats,
};
