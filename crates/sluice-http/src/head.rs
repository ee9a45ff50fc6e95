//! The parsed head types, `RequestHead` and `ResponseHead`: the raw head bytes plus spans into them.
//!
//! It owns the accessors (string views, case-insensitive header lookup, iteration in wire order). It does not
//! parse (see `parse.rs`) and does not offer mutation: a plugin that changes headers writes a new head; what it
//! did not touch is forwarded from `buf` byte for byte.

use bytes::Bytes;

use crate::{BodyKind, HeaderSpan, Span, Version};

/// A parsed request head. All spans index `buf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The raw head bytes, request line through the final CRLFCRLF (leading empty lines removed).
    pub buf: Bytes,
    /// The method token, case as sent (methods are case-sensitive).
    pub method: Span,
    /// The request-target exactly as sent.
    pub target: Span,
    /// The target without `?query`. For absolute-form, the path part only (empty if the URI has no path: treat it
    /// as `/`); for authority-form (CONNECT), empty; for asterisk-form, `*`.
    pub path: Span,
    /// The query without the `?` (`Some` of an empty span for a bare `?`).
    pub query: Option<Span>,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Every field line in wire order, original case.
    pub headers: Vec<HeaderSpan>,
    /// The Host value as sent, or for absolute-form the authority of the target (which must agree with Host).
    pub host: Option<Span>,
    /// Empty, Length or Chunked (never Eof for requests).
    pub body: BodyKind,
    /// Whether the connection may serve another request after this one (version + Connection).
    pub keep_alive: bool,
    /// Whether a `Connection` field lists a name other than `keep-alive` and `upgrade` (those two fields are
    /// hop-by-hop whatever it says). Only then does forwarding need [`crate::connection_tokens`].
    pub connection_options: bool,
    /// HTTP/1.1 with `Expect: 100-continue`.
    pub expect_continue: bool,
    /// HTTP/1.1 with a `Connection: upgrade` token and an Upgrade field.
    pub upgrade: bool,
}

/// A parsed response head. All spans index `buf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The raw head bytes, status line through the final CRLFCRLF.
    pub buf: Bytes,
    /// The three-digit status code.
    pub status: u16,
    /// The reason phrase as sent (may be empty, may hold obs-text).
    pub reason: Span,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Every field line in wire order, original case.
    pub headers: Vec<HeaderSpan>,
    /// How the body is framed, given the request method and the status.
    pub body: BodyKind,
    /// Whether a `Connection` field lists a name other than `keep-alive` and `upgrade` (those two fields are
    /// hop-by-hop whatever it says). Only then does forwarding need [`crate::connection_tokens`].
    pub connection_options: bool,
    /// Whether the connection may carry another exchange after this one (version + Connection + framing).
    pub keep_alive: bool,
}

#[inline]
pub(crate) fn span_slice(buf: &[u8], s: Span) -> &[u8] {
    buf.get(s.0 as usize..s.1 as usize).unwrap_or_default()
}

#[inline]
fn span_str(buf: &[u8], s: Span) -> &str {
    // Spans handed to this are validated ASCII / UTF-8 at parse time; "" is the defensive fallback.
    std::str::from_utf8(span_slice(buf, s)).unwrap_or_default()
}

fn find_header<'a>(buf: &'a [u8], headers: &[HeaderSpan], lower_name: &str) -> Option<&'a [u8]> {
    let want = lower_name.as_bytes();
    headers
        .iter()
        .find(|h| span_slice(buf, h.name).eq_ignore_ascii_case(want))
        .map(|h| span_slice(buf, h.value))
}

// === impl RequestHead ===

impl RequestHead {
    /// The method as a string (`"GET"`). The standard methods map to constants (no UTF-8 check per call: the
    /// router and the proxy ask several times per request); any other token (ASCII, checked by the parser) is
    /// validated here.
    pub fn method_str(&self) -> &str {
        match self.slice(self.method) {
            b"GET" => "GET",
            b"POST" => "POST",
            b"HEAD" => "HEAD",
            b"PUT" => "PUT",
            b"DELETE" => "DELETE",
            b"PATCH" => "PATCH",
            b"OPTIONS" => "OPTIONS",
            b"CONNECT" => "CONNECT",
            b"TRACE" => "TRACE",
            _ => span_str(&self.buf, self.method),
        }
    }

    /// Whether the method is `HEAD` (its response has no body).
    pub fn is_head(&self) -> bool {
        self.slice(self.method) == b"HEAD"
    }

    /// The path (target without query) as a string.
    pub fn path_str(&self) -> &str {
        span_str(&self.buf, self.path)
    }

    /// The request-target as sent.
    pub fn target_str(&self) -> &str {
        span_str(&self.buf, self.target)
    }

    /// The query without `?`, if the target has one.
    pub fn query_str(&self) -> Option<&str> {
        self.query.map(|q| span_str(&self.buf, q))
    }

    /// The host (Host value, or absolute-form authority) as sent, port included.
    pub fn host_str(&self) -> Option<&str> {
        self.host.map(|h| span_str(&self.buf, h))
    }

    /// The bytes of a span of this head.
    pub fn slice(&self, s: Span) -> &[u8] {
        span_slice(&self.buf, s)
    }

    /// The value of the first field named `lower_name` (compared case-insensitively).
    pub fn header(&self, lower_name: &str) -> Option<&[u8]> {
        find_header(&self.buf, &self.headers, lower_name)
    }

    /// `(name, value)` of every field line in wire order.
    pub fn headers_iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.iter().map(move |h| {
            (
                span_slice(&self.buf, h.name),
                span_slice(&self.buf, h.value),
            )
        })
    }
}

// === impl ResponseHead ===

impl ResponseHead {
    /// The reason phrase, or "" if it holds obs-text that is not UTF-8.
    pub fn reason_str(&self) -> &str {
        span_str(&self.buf, self.reason)
    }

    /// The bytes of a span of this head.
    pub fn slice(&self, s: Span) -> &[u8] {
        span_slice(&self.buf, s)
    }

    /// The value of the first field named `lower_name` (compared case-insensitively).
    pub fn header(&self, lower_name: &str) -> Option<&[u8]> {
        find_header(&self.buf, &self.headers, lower_name)
    }

    /// `(name, value)` of every field line in wire order.
    pub fn headers_iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.iter().map(move |h| {
            (
                span_slice(&self.buf, h.name),
                span_slice(&self.buf, h.value),
            )
        })
    }
}
