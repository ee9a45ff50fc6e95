//! `ParseError`: one variant per hygiene rule the codec enforces, with the status a server answers it with.
//!
//! It owns the mapping rule -> status code and the message text. It does not carry a connection side or a
//! retryable flag: the proxy wraps a `ParseError` into its data-plane error (a response-side error becomes a 502
//! there, whatever `status()` says, because the status is written for the downstream request case).

use std::fmt;

/// Why a head or a chunked body was rejected. Each hygiene rule of `docs/http-conformance.md` has its own variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    // --- sizes ---
    /// The head did not end within `Limits::max_head_bytes` (431).
    HeadTooLarge,
    /// More header lines than `Limits::max_headers` (431).
    TooManyHeaders,
    /// The request-target is longer than `Limits::max_uri_bytes` (414).
    UriTooLong,

    // --- start line ---
    /// A version that is well-formed but not HTTP/1.0 or HTTP/1.1, e.g. `HTTP/2.0`, `HTTP/0.9`, `HTTP/1.2` (505).
    UnsupportedVersion,
    /// A version that is not `HTTP/` DIGIT `.` DIGIT (lower case, missing digits, trailing junk) (400).
    MalformedVersion,
    /// A request line without a version (an HTTP/0.9 simple-request) (400).
    MissingVersion,
    /// The method is not a token (400).
    InvalidMethod,
    /// The request-target is empty, has bytes outside RFC 3986 + obs-text, or is not UTF-8 (400).
    InvalidTarget,
    /// The request-target contains a `#` fragment, which RFC 9112 §3.2 does not allow (400).
    FragmentInTarget,
    /// `*` used with a method other than OPTIONS (400).
    AsteriskFormNotOptions,
    /// authority-form (`host:port`) used with a method other than CONNECT (400).
    AuthorityFormNotConnect,
    /// CONNECT with a target that is not authority-form (400).
    ConnectWithoutAuthority,
    /// absolute-form with a scheme other than http/https, an empty authority or userinfo (`user@host`) (400).
    InvalidAbsoluteForm,
    /// Spaces or other bytes where the start line needs exactly one SP / CRLF (400).
    MalformedStartLine,
    /// A response status line that is not `HTTP/1.x SP 3DIGIT [SP reason] CRLF` (400; 502 at the proxy).
    InvalidStatus,

    // --- field syntax ---
    /// A line terminated by LF without CR (400).
    BareLf,
    /// A CR not followed by LF outside a field value (400).
    BareCr,
    /// obs-fold: a field line starting with SP or HTAB (400, RFC 9112 §5.2).
    ObsFold,
    /// Whitespace between a field name and the colon (400, RFC 9112 §5.1).
    WhitespaceBeforeColon,
    /// A field name with a non-token byte, or an empty one (400).
    InvalidHeaderName,
    /// A field value with NUL, bare CR or another CTL (400, RFC 9110 §5.5).
    InvalidHeaderValue,

    // --- Host ---
    /// HTTP/1.1 request without Host (400, RFC 9112 §3.2).
    MissingHost,
    /// More than one Host line (400, RFC 9112 §3.2).
    MultipleHost,
    /// A Host value that is not `uri-host [":" port]` (400).
    InvalidHost,
    /// absolute-form authority and Host disagree (400, see docs/http-conformance.md).
    HostMismatch,

    // --- framing ---
    /// Both Content-Length and Transfer-Encoding (400, RFC 9112 §6.3 rule 3: we reject rather than ignore CL).
    ContentLengthAndTransferEncoding,
    /// Content-Length value that is not 1*DIGIT (400).
    InvalidContentLength,
    /// Content-Length that does not fit in a u64 (400).
    ContentLengthOverflow,
    /// Content-Length in list form (`42, 42`) (400, RFC 9110 §8.6).
    ContentLengthList,
    /// Two Content-Length lines with different values (400).
    ConflictingContentLength,
    /// Two Content-Length lines with identical values (400: we reject rather than merge, RFC 9110 §8.6).
    DuplicateContentLength,
    /// A request Transfer-Encoding whose final coding is not chunked (400, RFC 9112 §6.3 rule 4).
    ChunkedNotFinal,
    /// `chunked` applied more than once (400, RFC 9112 §7).
    ChunkedTwice,
    /// A transfer coding Sluice does not know (501, RFC 9112 §6.1).
    UnknownTransferCoding,
    /// A registered coding other than chunked (gzip, deflate, compress) used as a transfer coding: Sluice does not
    /// implement them and would drop them when re-framing (501).
    UnsupportedTransferCoding,
    /// An empty Transfer-Encoding value (400).
    EmptyTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 message (400, RFC 9112 §6.1: "faulty framing").
    TransferEncodingHttp10,
    /// `Content_Length` / `Transfer_Encoding`: a next hop that maps `_` to `-` (CGI-style servers) would frame the
    /// message differently from Sluice, which ignores them (400).
    UnderscoreFramingField,

    // --- chunked body ---
    /// A chunk-size line without hex digits, or with bytes a chunk line cannot contain (400).
    InvalidChunkSize,
    /// A chunk size that does not fit in a u64 (400).
    ChunkSizeOverflow,
    /// Chunk extensions over `CHUNK_EXT_LIMIT` bytes in one message (400).
    ChunkExtensionTooLong,
    /// Chunk data not followed by CRLF (400).
    MissingChunkCrlf,
    /// A trailer section over `TRAILER_LIMIT` bytes (431).
    TrailersTooLarge,
    /// A trailer line that is not a valid field line (400).
    InvalidTrailer,
}

// === impl ParseError ===

impl ParseError {
    /// The status a server answers this error with: 400, 414, 431, 501 or 505.
    pub fn status(&self) -> u16 {
        use ParseError::*;
        match self {
            HeadTooLarge | TooManyHeaders | TrailersTooLarge => 431,
            UriTooLong => 414,
            UnsupportedVersion => 505,
            UnknownTransferCoding | UnsupportedTransferCoding => 501,
            _ => 400,
        }
    }

    /// Whether this error was found in a chunked body rather than in a head.
    pub fn is_body_error(&self) -> bool {
        use ParseError::*;
        matches!(
            self,
            InvalidChunkSize
                | ChunkSizeOverflow
                | ChunkExtensionTooLong
                | MissingChunkCrlf
                | TrailersTooLarge
                | InvalidTrailer
        )
    }

    fn message(&self) -> &'static str {
        use ParseError::*;
        match self {
            HeadTooLarge => "head larger than the limit",
            TooManyHeaders => "more header fields than the limit",
            UriTooLong => "request-target longer than the limit",
            UnsupportedVersion => "unsupported HTTP version",
            MalformedVersion => "malformed HTTP version",
            MissingVersion => "request line without HTTP version (HTTP/0.9)",
            InvalidMethod => "invalid method token",
            InvalidTarget => "invalid request-target",
            FragmentInTarget => "fragment in request-target",
            AsteriskFormNotOptions => "asterisk-form target with a method other than OPTIONS",
            AuthorityFormNotConnect => "authority-form target with a method other than CONNECT",
            ConnectWithoutAuthority => "CONNECT without an authority-form target",
            InvalidAbsoluteForm => "invalid absolute-form target",
            MalformedStartLine => "malformed start line",
            InvalidStatus => "invalid response status line",
            BareLf => "line terminated by bare LF",
            BareCr => "CR not followed by LF",
            ObsFold => "obsolete line folding in a field",
            WhitespaceBeforeColon => "whitespace between field name and colon",
            InvalidHeaderName => "invalid field name",
            InvalidHeaderValue => "invalid byte in field value",
            MissingHost => "HTTP/1.1 request without Host",
            MultipleHost => "more than one Host field",
            InvalidHost => "invalid Host value",
            HostMismatch => "Host differs from the absolute-form authority",
            ContentLengthAndTransferEncoding => "both Content-Length and Transfer-Encoding",
            InvalidContentLength => "invalid Content-Length",
            ContentLengthOverflow => "Content-Length overflows",
            ContentLengthList => "Content-Length in list form",
            ConflictingContentLength => "conflicting Content-Length fields",
            DuplicateContentLength => "duplicate Content-Length fields",
            ChunkedNotFinal => "Transfer-Encoding whose final coding is not chunked",
            ChunkedTwice => "chunked applied more than once",
            UnknownTransferCoding => "unknown transfer coding",
            UnsupportedTransferCoding => "transfer coding other than chunked is not supported",
            EmptyTransferEncoding => "empty Transfer-Encoding",
            TransferEncodingHttp10 => "Transfer-Encoding in an HTTP/1.0 message",
            UnderscoreFramingField => "Content_Length or Transfer_Encoding field",
            InvalidChunkSize => "invalid chunk size line",
            ChunkSizeOverflow => "chunk size overflows",
            ChunkExtensionTooLong => "chunk extensions longer than the limit",
            MissingChunkCrlf => "chunk data not followed by CRLF",
            TrailersTooLarge => "trailer section larger than the limit",
            InvalidTrailer => "invalid trailer field",
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ParseError {}
