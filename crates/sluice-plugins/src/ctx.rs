//! Per-request plugin state: what the request looks like ([`ReqView`]), who the consumer is, and the edits plugins
//! ask for on the request going upstream and on the response going back. The proxy applies the edits while it
//! writes the heads, so an untouched header is still forwarded byte for byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::ReqView;

/// Changes to the request before it goes upstream. Header names are matched case-insensitively.
#[derive(Debug, Default, Clone)]
pub struct Edits {
    /// Lower-case names of headers to drop (e.g. key-auth's `hide_credentials`).
    pub remove_headers: Vec<Bytes>,
    /// Headers to set, replacing any of the same name.
    pub set_headers: Vec<(Bytes, Bytes)>,
    /// A new request-target (path and query), as proxy-rewrite's `uri`.
    pub uri: Option<Bytes>,
    pub method: Option<Bytes>,
    /// A new Host header value, overriding `pass_host`.
    pub host: Option<Bytes>,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.remove_headers.is_empty()
            && self.set_headers.is_empty()
            && self.uri.is_none()
            && self.method.is_none()
            && self.host.is_none()
    }
    /// Whether a header with this name must not be copied from the original request.
    pub fn drops(&self, name: &[u8]) -> bool {
        self.remove_headers
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
            || self
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// Changes to the response head before it goes to the client.
#[derive(Debug, Default, Clone)]
pub struct RespEdits {
    pub remove_headers: Vec<Bytes>,
    /// Set (replace) these headers.
    pub set_headers: Vec<(Bytes, Bytes)>,
    /// Append these headers, keeping existing ones.
    pub add_headers: Vec<(Bytes, Bytes)>,
}

impl RespEdits {
    pub fn is_empty(&self) -> bool {
        self.remove_headers.is_empty() && self.set_headers.is_empty() && self.add_headers.is_empty()
    }
    pub fn drops(&self, name: &[u8]) -> bool {
        self.remove_headers
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
            || self
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// The request context handed to every hook.
pub struct Ctx<'a> {
    pub req: &'a ReqView<'a>,
    pub route_id: &'a str,
    /// Set by an auth plugin once it identifies the consumer; read by later plugins (limit-count `consumer_name`).
    pub consumer: Option<Arc<sluice_model::Consumer>>,
    pub edits: Edits,
    pub resp: RespEdits,
}

impl<'a> Ctx<'a> {
    pub fn new(req: &'a ReqView<'a>, route_id: &'a str) -> Self {
        Ctx {
            req,
            route_id,
            consumer: None,
            edits: Edits::default(),
            resp: RespEdits::default(),
        }
    }
}

/// What the log phase learns about a finished request.
#[derive(Debug, Clone)]
pub struct LogInfo {
    pub status: u16,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// From the end of the request head to the end of the response.
    pub latency: Duration,
    /// Time the upstream took (connect through response head), when one was contacted.
    pub upstream_latency: Option<Duration>,
    pub upstream_addr: Option<SocketAddr>,
}
