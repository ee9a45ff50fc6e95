//! The one scan over a parsed header list: it recognises the fields that decide framing and connection handling
//! (Host, Content-Length, Transfer-Encoding, Connection, Upgrade, Expect) and applies their hygiene rules.
//!
//! It owns the framing decision (RFC 9112 §6.3) and the keep-alive decision. It does not look at any other field,
//! allocates nothing, and dispatches on the name length first so most fields cost one length compare.

use crate::{BodyKind, ParseError, Span, Version};

/// What the scan learned; filled by `observe`, read by `request_body`/`response_body`/`keep_alive`.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) host: Option<Span>,
    content_length: Option<u64>,
    te: Option<TransferCodings>,
    conn_close: bool,
    conn_keep_alive: bool,
    pub(super) conn_upgrade: bool,
    /// A Connection token other than `keep-alive` and `upgrade` (whose fields are hop-by-hop anyway).
    pub(super) conn_options: bool,
    pub(super) has_upgrade: bool,
    pub(super) expect_continue: bool,
}

/// The combined Transfer-Encoding list over all TE lines (RFC 9110 §5.3 lets lines be joined with commas).
#[derive(Debug, Default, Clone, Copy)]
struct TransferCodings {
    elements: u32,
    chunked: u32,
    last_is_chunked: bool,
    unknown: bool,
}

// === impl Fields ===

impl Fields {
    /// Observe one field line. `value_span` locates `value` in the head (kept for Host).
    pub(super) fn observe(
        &mut self,
        name: &[u8],
        value: &[u8],
        value_span: Span,
        request: bool,
    ) -> Result<(), ParseError> {
        match name.len() {
            4 if request && eq_lower(name, b"host") => {
                if self.host.is_some() {
                    return Err(ParseError::MultipleHost);
                }
                if !super::target::valid_host(value, false, false) {
                    return Err(ParseError::InvalidHost);
                }
                self.host = Some(value_span);
            }
            6 if request && eq_lower(name, b"expect") => {
                self.expect_continue |= eq_lower(value, b"100-continue");
            }
            7 if eq_lower(name, b"upgrade") => self.has_upgrade = true,
            10 if eq_lower(name, b"connection") => {
                for token in list_elements(value) {
                    if eq_lower(token, b"keep-alive") {
                        self.conn_keep_alive = true;
                    } else if eq_lower(token, b"upgrade") {
                        self.conn_upgrade = true;
                    } else {
                        // `close` too: it names a field like any other option.
                        self.conn_close |= eq_lower(token, b"close");
                        self.conn_options = true;
                    }
                }
            }
            14 if eq_lower(name, b"content-length") => {
                let n = parse_content_length(value)?;
                match self.content_length {
                    Some(prev) if prev == n => return Err(ParseError::DuplicateContentLength),
                    Some(_) => return Err(ParseError::ConflictingContentLength),
                    None => self.content_length = Some(n),
                }
            }
            17 if eq_lower(name, b"transfer-encoding") => {
                let te = self.te.get_or_insert_with(TransferCodings::default);
                for coding in list_elements(value) {
                    te.elements += 1;
                    te.last_is_chunked = eq_lower(coding, b"chunked");
                    if te.last_is_chunked {
                        te.chunked += 1;
                    } else if !is_known_coding(coding) {
                        te.unknown = true;
                    }
                }
            }
            // `eq_lower` cannot compare `_`; these arms only run for names of these lengths that were not the
            // real field.
            14 | 17
                if name.eq_ignore_ascii_case(b"content_length")
                    || name.eq_ignore_ascii_case(b"transfer_encoding") =>
            {
                return Err(ParseError::UnderscoreFramingField)
            }
            _ => {}
        }
        Ok(())
    }

    /// Shared framing checks; `Ok(None)` = no framing field at all.
    fn framing(&self, version: Version, request: bool) -> Result<Option<BodyKind>, ParseError> {
        let Some(te) = self.te else {
            return Ok(self.content_length.map(|n| {
                if n == 0 {
                    BodyKind::Empty
                } else {
                    BodyKind::Length(n)
                }
            }));
        };
        if version == Version::Http10 {
            return Err(ParseError::TransferEncodingHttp10);
        }
        if self.content_length.is_some() {
            return Err(ParseError::ContentLengthAndTransferEncoding);
        }
        if te.elements == 0 {
            return Err(ParseError::EmptyTransferEncoding);
        }
        if te.unknown {
            return Err(ParseError::UnknownTransferCoding);
        }
        if te.chunked > 1 {
            return Err(ParseError::ChunkedTwice);
        }
        if request && !te.last_is_chunked {
            return Err(ParseError::ChunkedNotFinal);
        }
        // gzip/deflate/compress as *transfer* codings: the proxy strips Transfer-Encoding (hop-by-hop) and
        // re-frames, so forwarding such a body would silently drop a coding. Refuse instead (requests: 501;
        // responses: this also covers RFC 9112 §6.3 rule 4's read-to-close case, see docs/http-conformance.md).
        if te.elements > te.chunked {
            return Err(ParseError::UnsupportedTransferCoding);
        }
        Ok(Some(BodyKind::Chunked))
    }

    /// Request framing: Chunked, Length, or Empty when no framing field is present (RFC 9112 §6.3 rule 6).
    pub(super) fn request_body(&self, version: Version) -> Result<BodyKind, ParseError> {
        Ok(self.framing(version, true)?.unwrap_or(BodyKind::Empty))
    }

    /// Response framing before the HEAD/1xx/204/304 override: no framing field means read to close.
    pub(super) fn response_body(&self, version: Version) -> Result<BodyKind, ParseError> {
        Ok(self.framing(version, false)?.unwrap_or(BodyKind::Eof))
    }

    /// RFC 9112 §9.3: HTTP/1.1 persists unless `close`; HTTP/1.0 only with `keep-alive` (and no `close`).
    pub(super) fn keep_alive(&self, version: Version) -> bool {
        match version {
            Version::Http11 => !self.conn_close,
            Version::Http10 => self.conn_keep_alive && !self.conn_close,
        }
    }
}

/// Content-Length = 1*DIGIT (RFC 9110 §8.6). The list form is rejected, not merged.
fn parse_content_length(value: &[u8]) -> Result<u64, ParseError> {
    if value.is_empty() {
        return Err(ParseError::InvalidContentLength);
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return Err(if b == b',' {
                ParseError::ContentLengthList
            } else {
                ParseError::InvalidContentLength
            });
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(ParseError::ContentLengthOverflow)?;
    }
    Ok(n)
}

/// Registered transfer codings other than chunked (IANA HTTP Transfer Coding Registry).
fn is_known_coding(coding: &[u8]) -> bool {
    const KNOWN: [&[u8]; 5] = [b"gzip", b"x-gzip", b"deflate", b"compress", b"x-compress"];
    KNOWN.iter().any(|k| eq_lower(coding, k))
}

/// `bytes == lower` ignoring ASCII case, for a `lower` made of `a-z`, `0-9` and `-`, and `bytes` that httparse
/// accepted (tchar names, or value bytes: HTAB, SP..`~`, obs-text). OR-ing 0x20 lower-cases letters and leaves
/// digits and `-` unchanged, and no other such byte maps onto `a-z0-9-` (only CR and C0 controls would, and
/// httparse rejects those), so comparing 8 bytes at a time is exact. ~3x cheaper than `eq_ignore_ascii_case`.
#[inline]
pub(crate) fn eq_lower(bytes: &[u8], lower: &[u8]) -> bool {
    const MASK: u64 = 0x2020_2020_2020_2020;
    if bytes.len() != lower.len() {
        return false;
    }
    let (mut a, mut b) = (bytes.chunks_exact(8), lower.chunks_exact(8));
    for (x, y) in (&mut a).zip(&mut b) {
        if word(x) | MASK != word(y) {
            return false;
        }
    }
    a.remainder()
        .iter()
        .zip(b.remainder())
        .all(|(x, y)| x | 0x20 == *y)
}

#[inline]
fn word(chunk: &[u8]) -> u64 {
    u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or_default())
}

/// The non-empty elements of a `#list` value, OWS trimmed (RFC 9110 §5.6.1: empty elements are ignored).
pub(crate) fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}
