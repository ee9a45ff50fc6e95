//! sluice-http: Sluice's own IO-agnostic HTTP/1.1 codec.
//!
//! It owns head parsing (on top of `httparse`), the body-framing decision, the chunked transfer coding (decode and
//! encode), hop-by-hop classification, the cached `Date:` value and the status-reason table, and it enforces the
//! RFC 9110/9112 message hygiene documented in `docs/http-conformance.md` (reject, never "fix"). It deliberately
//! does not touch sockets, timers or configuration, does not normalise paths (the router does) and does not build
//! an `http::HeaderMap`: heads keep their raw bytes and expose `(start, end)` spans into them, so forwarding what a
//! plugin did not touch is a copy of the original bytes.
//!
//! Cost budget (see `benches/parse.rs`): one `httparse` pass plus one scan of the header list per head, one
//! `Vec<HeaderSpan>` allocation per head, no per-header allocation. A 415-byte browser request costs ~4.1k
//! instructions (httparse alone: 2.4k), a 190-byte response ~2.9k (httparse alone: 1.8k).

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod chunked;
pub mod date;
mod encode;
mod error;
mod head;
mod hop;
mod parse;
mod status;
mod trailer;
pub mod uri;

pub use chunked::{
    encode_chunk_header, Chunk, ChunkedDecoder, CHUNK_EXT_LIMIT, LAST_CHUNK, TRAILER_LIMIT,
};
pub use encode::{write_content_length, write_header, write_status_line};
pub use error::ParseError;
pub use head::{RequestHead, ResponseHead};
pub use hop::{connection_tokens, is_hop_by_hop, ConnectionTokens};
pub use parse::{parse_request, parse_response};
pub use status::status_reason;
pub use trailer::{filter_trailers, is_forbidden_trailer, FORBIDDEN_TRAILERS};

/// `(start, end)` byte offsets into a head's `buf`.
pub type Span = (u32, u32);

/// Default for [`Limits::max_headers`]: header field lines per head.
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Default for [`Limits::max_head_bytes`]. RFC 9112 §2.3 leaves the size of a head to the recipient; 32 KiB is
/// nginx's `large_client_header_buffers` total (4 x 8k) rounded up to a power of two.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 32 * 1024;
/// Default for [`Limits::max_uri_bytes`]. RFC 9112 §3: "It is RECOMMENDED that all HTTP senders and recipients
/// support, at a minimum, request-line lengths of 8000 octets."
pub const DEFAULT_MAX_URI_BYTES: usize = 8 * 1024;

/// Size limits applied while parsing a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// More header field lines than this -> 431.
    pub max_headers: usize,
    /// A head (start line through the final CRLFCRLF, including ignored leading CRLFs) longer than this -> 431.
    /// Spans are `u32`, so values above `u32::MAX` act as `u32::MAX`.
    pub max_head_bytes: usize,
    /// A request-target longer than this -> 414.
    pub max_uri_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_headers: DEFAULT_MAX_HEADERS,
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            max_uri_bytes: DEFAULT_MAX_URI_BYTES,
        }
    }
}

/// The HTTP/1.x minor version of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// `HTTP/1.0`
    Http10,
    /// `HTTP/1.1`
    Http11,
}

impl Version {
    /// The version as written on the wire (`b"HTTP/1.1"`).
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Version::Http10 => b"HTTP/1.0",
            Version::Http11 => b"HTTP/1.1",
        }
    }
}

/// One header field line: spans of its name (original case) and of its value (without surrounding OWS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderSpan {
    /// The field name as sent.
    pub name: Span,
    /// The field value, leading and trailing whitespace removed.
    pub value: Span,
}

/// How the body of a message is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body: no framing headers, `Content-Length: 0`, or a response that never has one (HEAD, 1xx, 204, 304).
    Empty,
    /// Exactly this many bytes (never 0: that is `Empty`).
    Length(u64),
    /// `Transfer-Encoding` whose final coding is `chunked`.
    Chunked,
    /// Responses only: read until the connection closes.
    Eof,
}
