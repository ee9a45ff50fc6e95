//! Error path only: turn httparse's coarse error kinds into the specific `ParseError` of the rule that was broken.
//!
//! httparse stops at the first bad byte; this re-reads the (possibly incomplete) buffer to name the rule. It must
//! give the same answer for any prefix on which httparse already fails, so that a head split at any byte boundary
//! is rejected with the same error as the whole head. It is never called on a successful parse.

use crate::ParseError;

/// Classify an httparse error on a request head (`head` starts at the request line).
pub(super) fn request(head: &[u8], e: httparse::Error) -> ParseError {
    match e {
        httparse::Error::Token => request_line_token(head),
        httparse::Error::Version => version(version_token_of_request(head)),
        httparse::Error::NewLine => {
            let tok = version_token_of_request(head);
            if start_line_ok(head) {
                ParseError::BareCr
            } else if tok != b"HTTP/1.1" && tok != b"HTTP/1.0" {
                // "HTTP/1.1x": httparse matched 8 bytes and then wanted the line end.
                ParseError::MalformedVersion
            } else {
                ParseError::MalformedStartLine
            }
        }
        httparse::Error::HeaderName => header_name(head),
        httparse::Error::HeaderValue => ParseError::InvalidHeaderValue,
        httparse::Error::TooManyHeaders => ParseError::TooManyHeaders,
        httparse::Error::Status => ParseError::MalformedStartLine,
    }
}

/// Classify an httparse error on a response head (`head` starts at the status line).
pub(super) fn response(head: &[u8], e: httparse::Error) -> ParseError {
    match e {
        httparse::Error::Version => version(token(head)),
        httparse::Error::NewLine => ParseError::BareCr,
        httparse::Error::HeaderName => header_name(head),
        httparse::Error::HeaderValue => ParseError::InvalidHeaderValue,
        httparse::Error::TooManyHeaders => ParseError::TooManyHeaders,
        httparse::Error::Status | httparse::Error::Token => ParseError::InvalidStatus,
    }
}

/// httparse's Token error covers the method, the target and a missing version; find which.
fn request_line_token(line: &[u8]) -> ParseError {
    let m_end = line
        .iter()
        .position(|&b| !is_tchar(b))
        .unwrap_or(line.len());
    if m_end == 0 || line.get(m_end) != Some(&b' ') {
        return ParseError::InvalidMethod;
    }
    let t_start = m_end + 1;
    let t_len = line[t_start..]
        .iter()
        .position(|&b| !(b'!'..=0x7e).contains(&b) && b < 0x80)
        .unwrap_or(line.len() - t_start);
    if t_len == 0 {
        // Empty target or a second SP: the start line needs exactly one SP between parts.
        return ParseError::MalformedStartLine;
    }
    match line.get(t_start + t_len) {
        // "GET /\r\n": an HTTP/0.9 simple-request.
        Some(b'\r' | b'\n') => ParseError::MissingVersion,
        _ => ParseError::InvalidTarget,
    }
}

/// The bytes after the second SP of a request line.
fn version_token_of_request(line: &[u8]) -> &[u8] {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let _method = parts.next();
    let _target = parts.next();
    token(parts.next().unwrap_or_default())
}

/// A start-line element: up to SP, CR, LF or the end of the bytes we have.
fn token(bytes: &[u8]) -> &[u8] {
    let end = memchr::memchr3(b' ', b'\r', b'\n', bytes).unwrap_or(bytes.len());
    &bytes[..end]
}

/// RFC 9110 §2.5: a well-formed version whose major (or HTTP/1 minor) we do not implement is 505; anything not of
/// the form `HTTP/` DIGIT `.` DIGIT is 400. Works on a prefix: httparse fails on the first wrong byte.
fn version(tok: &[u8]) -> ParseError {
    const NAME: &[u8] = b"HTTP/";
    if !tok.starts_with(NAME) {
        return ParseError::MalformedVersion;
    }
    match (tok.get(5), tok.get(6), tok.get(7)) {
        (Some(major), _, _) if major.is_ascii_digit() && *major != b'1' => {
            ParseError::UnsupportedVersion
        }
        (Some(b'1'), Some(b'.'), Some(minor))
            if minor.is_ascii_digit() && !matches!(minor, b'0' | b'1') =>
        {
            ParseError::UnsupportedVersion
        }
        _ => ParseError::MalformedVersion,
    }
}

/// Whether the head begins with a complete, well-formed request line (so a NewLine error is in the fields).
fn start_line_ok(head: &[u8]) -> bool {
    match memchr::memchr(b'\n', head) {
        Some(i) => {
            let line = &head[..i];
            memchr::memchr(b'\r', line) == Some(i.wrapping_sub(1))
                && (line.ends_with(b" HTTP/1.1\r") || line.ends_with(b" HTTP/1.0\r"))
        }
        None => false,
    }
}

/// httparse's HeaderName error covers obs-fold, space before the colon and bad name bytes; find the line.
fn header_name(head: &[u8]) -> ParseError {
    let Some(first_lf) = memchr::memchr(b'\n', head) else {
        return ParseError::InvalidHeaderName;
    };
    let mut rest = &head[first_lf + 1..];
    loop {
        let line_end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..line_end];
        match line.first() {
            Some(b' ' | b'\t') => return ParseError::ObsFold,
            None | Some(b'\r') => return ParseError::InvalidHeaderName,
            Some(_) => {}
        }
        let name_end = line
            .iter()
            .position(|&b| !is_tchar(b))
            .unwrap_or(line.len());
        match line.get(name_end) {
            Some(b':') if name_end > 0 && line_end < rest.len() => rest = &rest[line_end + 1..],
            Some(b' ' | b'\t') if name_end > 0 => return ParseError::WhitespaceBeforeColon,
            _ => return ParseError::InvalidHeaderName,
        }
    }
}

/// tchar (RFC 9110 §5.6.2).
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}
