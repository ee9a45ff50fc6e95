//! Head parsing: `parse_request` and `parse_response` drive one `httparse` pass over the buffered bytes, then one
//! scan of the resulting header list (`fields.rs`) that validates framing/Host/Connection and builds the spans.
//!
//! It owns the size limits, the CRLF-only rule (httparse itself accepts bare LF), the request-target forms
//! (`target.rs`) and the mapping of httparse's coarse errors onto one `ParseError` per rule (`diagnose.rs`, error
//! path only). It does not read sockets: the caller appends bytes to its `BytesMut` and calls again on `Ok(None)`.
//! Re-parsing from the start on each call is deliberate (as hyper does): heads are small and usually arrive in one
//! read, and a resumable parser would cost more on the common path.

mod diagnose;
mod fields;
mod target;
#[cfg(test)]
mod tests;

use std::mem::MaybeUninit;

use bytes::{Buf, BytesMut};

use crate::{BodyKind, HeaderSpan, Limits, ParseError, RequestHead, ResponseHead, Span, Version};
pub(crate) use diagnose::is_tchar;
pub(crate) use fields::list_elements;
use fields::Fields;

/// Header slots kept on the stack for httparse; a `Limits::max_headers` above this costs one allocation per parse.
const STACK_HEADERS: usize = 128;

type Slots<'b> = [MaybeUninit<httparse::Header<'b>>; STACK_HEADERS];

/// Parse a request head from the start of `buf`.
///
/// `Ok(None)`: the head is not complete yet; append more bytes and call again (nothing was consumed). `Ok(Some)`:
/// the head was split off `buf` (which now starts at the body). Leading empty lines (CRLF) are skipped, as RFC 9112
/// §2.2 allows. Errors follow `docs/http-conformance.md`; `ParseError::status` is the status to answer with.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<RequestHead>, ParseError> {
    let lead = skip_empty_lines(buf)?;
    let mut stack: Slots<'_> = [const { MaybeUninit::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots = header_slots(&mut stack, &mut heap, limits.max_headers);

    let head = &buf[lead..];
    let mut req = httparse::Request::new(&mut []);
    let n = match req.parse_with_uninit_headers(head, slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            check_partial_request(head, limits)?;
            check_partial_size(buf.len(), limits)?;
            return Ok(None);
        }
        Err(e) => return Err(diagnose::request(head, e)),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(ParseError::MalformedStartLine);
    };
    if target.len() > limits.max_uri_bytes {
        return Err(ParseError::UriTooLong);
    }
    if lead + n > max_head(limits) {
        return Err(ParseError::HeadTooLarge);
    }
    let version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    check_line_ends(head, n, req.headers)?;

    let method_b = method.as_bytes();
    let target_start = offset(head, target.as_bytes());
    let form = target::classify(method_b, target.as_bytes())?;

    let mut fields = Fields::default();
    let mut spans = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let span = HeaderSpan {
            name: span_of(head, h.name.as_bytes()),
            value: span_of(head, h.value),
        };
        fields.observe(h.name.as_bytes(), h.value, span.value, true)?;
        spans.push(span);
    }

    let body = fields.request_body(version)?;
    let host = match (form.authority, fields.host) {
        (Some(auth), Some(host_span)) => {
            let auth_bytes = &target.as_bytes()[auth.0..auth.1];
            if !auth_bytes.eq_ignore_ascii_case(slice(head, host_span)) {
                return Err(ParseError::HostMismatch);
            }
            Some(shift(auth, target_start))
        }
        (None, Some(host_span)) => Some(host_span),
        (_, None) if version == Version::Http11 => return Err(ParseError::MissingHost),
        (Some(auth), None) => Some(shift(auth, target_start)),
        (None, None) => None,
    };
    let keep_alive = fields.keep_alive(version);
    let is_11 = version == Version::Http11;
    let parsed = RequestHead {
        buf: Default::default(),
        method: (0, method_b.len() as u32),
        target: (target_start as u32, (target_start + target.len()) as u32),
        path: shift(form.path, target_start),
        query: form.query.map(|q| shift(q, target_start)),
        version,
        headers: spans,
        host,
        body,
        keep_alive,
        connection_options: fields.conn_options,
        expect_continue: is_11 && fields.expect_continue,
        upgrade: is_11 && fields.conn_upgrade && fields.has_upgrade,
    };
    Ok(Some(RequestHead {
        buf: split_head(buf, lead, n),
        ..parsed
    }))
}

/// Parse a response head from the start of `buf`; `req_method_head` says the request was HEAD (no body follows).
///
/// Framing (RFC 9112 §6.3): HEAD, 1xx, 204 and 304 -> `Empty`; `Transfer-Encoding: chunked` -> `Chunked`;
/// Content-Length -> `Length`/`Empty`; nothing -> `Eof`. The same conflict checks as requests apply (CL+TE, bad or
/// duplicate CL, chunked twice, codings other than chunked) so an upstream cannot split responses. 1xx heads are
/// returned like any other: the caller forwards them and parses again.
pub fn parse_response(
    buf: &mut BytesMut,
    limits: &Limits,
    req_method_head: bool,
) -> Result<Option<ResponseHead>, ParseError> {
    let lead = skip_empty_lines(buf)?;
    let mut stack: Slots<'_> = [const { MaybeUninit::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots = header_slots(&mut stack, &mut heap, limits.max_headers);

    let head = &buf[lead..];
    let mut res = httparse::Response::new(&mut []);
    let n = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, head, slots)
    {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            check_partial_size(buf.len(), limits)?;
            return Ok(None);
        }
        Err(e) => return Err(diagnose::response(head, e)),
    };
    let (Some(status), Some(minor)) = (res.code, res.version) else {
        return Err(ParseError::InvalidStatus);
    };
    if lead + n > max_head(limits) {
        return Err(ParseError::HeadTooLarge);
    }
    if !(100..=599).contains(&status) {
        return Err(ParseError::InvalidStatus);
    }
    let version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    check_line_ends(head, n, res.headers)?;
    let reason = reason_span(head);

    let mut fields = Fields::default();
    let mut spans = Vec::with_capacity(res.headers.len());
    for h in res.headers.iter() {
        let span = HeaderSpan {
            name: span_of(head, h.name.as_bytes()),
            value: span_of(head, h.value),
        };
        fields.observe(h.name.as_bytes(), h.value, span.value, false)?;
        spans.push(span);
    }
    let mut body = fields.response_body(version)?;
    if req_method_head || status < 200 || status == 204 || status == 304 {
        body = BodyKind::Empty;
    }
    let keep_alive = body != BodyKind::Eof && fields.keep_alive(version);
    let parsed = ResponseHead {
        buf: Default::default(),
        status,
        reason,
        version,
        headers: spans,
        body,
        connection_options: fields.conn_options,
        keep_alive,
    };
    Ok(Some(ResponseHead {
        buf: split_head(buf, lead, n),
        ..parsed
    }))
}

/// Skip the empty lines RFC 9112 §2.2 lets a recipient ignore before a start line: CRLF pairs only.
fn skip_empty_lines(buf: &[u8]) -> Result<usize, ParseError> {
    let mut i = 0;
    loop {
        match (buf.get(i), buf.get(i + 1)) {
            (Some(b'\r'), Some(b'\n')) => i += 2,
            (Some(b'\r'), Some(_)) => return Err(ParseError::BareCr),
            (Some(b'\n'), _) => return Err(ParseError::BareLf),
            _ => return Ok(i),
        }
    }
}

fn header_slots<'s, 'b>(
    stack: &'s mut Slots<'b>,
    heap: &'s mut Vec<MaybeUninit<httparse::Header<'b>>>,
    max: usize,
) -> &'s mut [MaybeUninit<httparse::Header<'b>>] {
    if max <= STACK_HEADERS {
        &mut stack[..max]
    } else {
        heap.resize_with(max, MaybeUninit::uninit);
        &mut heap[..]
    }
}

/// Incomplete head: report an over-long request-target as soon as it is over the limit (414, not a later 431).
fn check_partial_request(head: &[u8], limits: &Limits) -> Result<(), ParseError> {
    if head.len() <= limits.max_uri_bytes {
        return Ok(());
    }
    let Some(sp) = memchr::memchr(b' ', head) else {
        return Ok(());
    };
    let rest = &head[sp + 1..];
    let target_len = memchr::memchr3(b' ', b'\r', b'\n', rest).unwrap_or(rest.len());
    if target_len > limits.max_uri_bytes {
        return Err(ParseError::UriTooLong);
    }
    Ok(())
}

/// Spans are u32: never accept a head they cannot index.
fn max_head(limits: &Limits) -> usize {
    limits.max_head_bytes.min(u32::MAX as usize)
}

fn check_partial_size(buffered: usize, limits: &Limits) -> Result<(), ParseError> {
    if buffered > max_head(limits) {
        return Err(ParseError::HeadTooLarge);
    }
    Ok(())
}

/// httparse accepts a bare LF as a line end; RFC 9112 §2.2 lets us reject it, and a proxy must, because the next
/// hop may disagree about where lines end. Each field name starts right after the previous line's end, so checking
/// the two bytes before every name plus the final CRLFCRLF covers every line of the head.
fn check_line_ends(
    head: &[u8],
    n: usize,
    headers: &[httparse::Header<'_>],
) -> Result<(), ParseError> {
    for h in headers {
        let start = offset(head, h.name.as_bytes());
        if start < 2 || head.get(start - 2..start) != Some(b"\r\n") {
            return Err(ParseError::BareLf);
        }
    }
    if n < 4 || head.get(n - 4..n) != Some(b"\r\n\r\n") {
        return Err(ParseError::BareLf);
    }
    Ok(())
}

/// The reason phrase: httparse returns "" for obs-text, so take it from the bytes (`HTTP/1.1 200 reason\r\n`).
fn reason_span(head: &[u8]) -> Span {
    let line_end = memchr::memchr(b'\r', head).unwrap_or(head.len());
    if head.get(12) == Some(&b' ') && line_end > 13 {
        (13, line_end as u32)
    } else {
        (line_end as u32, line_end as u32)
    }
}

/// Split the head off `buf` (O(1)), dropping the `lead` empty lines so spans index the start line at 0.
fn split_head(buf: &mut BytesMut, lead: usize, n: usize) -> bytes::Bytes {
    let mut head = buf.split_to(lead + n);
    head.advance(lead);
    head.freeze()
}

#[inline]
fn offset(base: &[u8], part: &[u8]) -> usize {
    // `part` is a sub-slice httparse returned from `base` (or an empty slice just past it).
    (part.as_ptr() as usize).saturating_sub(base.as_ptr() as usize)
}

#[inline]
fn span_of(base: &[u8], part: &[u8]) -> Span {
    let start = offset(base, part);
    (start as u32, (start + part.len()) as u32)
}

#[inline]
fn slice(base: &[u8], s: Span) -> &[u8] {
    base.get(s.0 as usize..s.1 as usize).unwrap_or_default()
}

#[inline]
fn shift(s: (usize, usize), by: usize) -> Span {
    ((s.0 + by) as u32, (s.1 + by) as u32)
}
