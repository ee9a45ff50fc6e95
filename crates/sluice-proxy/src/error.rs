//! The data plane's one error type, and the one place that turns an error into what the client sees.
//!
//! Every failure on the request path carries which side caused it (so a downstream failure is never answered with
//! a 502), whether trying another node is safe, and the context that identifies it in logs
//! (`upstream 10.0.0.3:80: connect: refused`). `synthetic` is the only mapping from errors to responses.

use std::borrow::Cow;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Downstream,
    Upstream,
    Internal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Client sent something unparseable: the codec's status applies.
    BadRequest(u16),
    ClientClosed,
    ClientTimeout,
    NoRoute,
    NoUpstreamNode,
    /// A route with plugins but no upstream that no plugin answered: APISIX's 503.
    NoUpstreamConf,
    Connect,
    ConnectTimeout,
    /// The upstream closed or failed before a complete response head arrived.
    UpstreamIo,
    UpstreamTimeout,
    /// The upstream answered with an invalid response.
    UpstreamProtocol,
    Tls,
    /// Configured but not servable (an upstream `type` without a balancer): 500, as APISIX's failing `require`.
    Internal,
    /// A discovered upstream without nodes: 503, as APISIX's `set_by_route`.
    Unavailable,
}

#[derive(Debug)]
pub struct Error {
    pub(crate) kind: Kind,
    pub side: Side,
    /// True when nothing of the request reached the upstream, so another node may be tried for any method.
    pub nothing_sent: bool,
    pub context: Cow<'static, str>,
}

impl Error {
    pub(crate) fn new(kind: Kind, side: Side, context: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            side,
            nothing_sent: false,
            context: context.into(),
        }
    }
    pub(crate) fn upstream(kind: Kind, context: impl Into<Cow<'static, str>>) -> Self {
        Self::new(kind, Side::Upstream, context)
    }
    pub(crate) fn downstream(kind: Kind, context: impl Into<Cow<'static, str>>) -> Self {
        Self::new(kind, Side::Downstream, context)
    }
    pub(crate) fn before_send(mut self) -> Self {
        self.nothing_sent = true;
        self
    }
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.kind,
            Kind::ConnectTimeout | Kind::UpstreamTimeout | Kind::ClientTimeout
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({:?}): {}", self.kind, self.side, self.context)
    }
}

impl std::error::Error for Error {}

/// A response Sluice writes itself.
pub(crate) struct Synthetic {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Cow<'static, [u8]>,
}

/// APISIX answers proxy failures with nginx's error pages and a missing route with a JSON error.
pub(crate) fn synthetic(err: &Error) -> Option<Synthetic> {
    let status = match err.kind {
        Kind::ClientClosed => return None,
        // A request body stalled past `client_body_timeout` (callers that already sent part of a response close
        // instead of asking for a page).
        Kind::ClientTimeout => 408,
        Kind::BadRequest(s) => s,
        Kind::NoRoute => {
            return Some(Synthetic {
                status: 404,
                content_type: "application/json",
                body: Cow::Borrowed(b"{\"error_msg\":\"404 Route Not Found\"}\n"),
            })
        }
        Kind::NoUpstreamNode
        | Kind::Connect
        | Kind::UpstreamIo
        | Kind::UpstreamProtocol
        | Kind::Tls => 502,
        Kind::NoUpstreamConf => 503,
        Kind::ConnectTimeout | Kind::UpstreamTimeout => 504,
        Kind::Internal => 500,
        Kind::Unavailable => 503,
    };
    Some(html_page(status))
}

pub(crate) fn html_page(status: u16) -> Synthetic {
    let reason = sluice_http::status_reason(status);
    let body = format!(
        "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n<center><h1>{status} {reason}</h1></center>\r\n<hr><center>sluice</center>\r\n</body>\r\n</html>\r\n"
    );
    Synthetic {
        status,
        content_type: "text/html; charset=utf-8",
        body: Cow::Owned(body.into_bytes()),
    }
}
