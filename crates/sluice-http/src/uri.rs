//! The request path as routing sees it: nginx's `$uri`, which APISIX matches routes on.
//!
//! [`normalize`] does what nginx's request-line parser does to the path (checked against nginx 1.22 on this
//! machine, see the tests): every `%XX` is decoded once (a decoded `/` or `.` then counts as one: `%2F` splits
//! segments, `%2e%2e` is `..`), a raw `#` ends the path, slashes are merged, `.` and `..` segments are resolved.
//! A bad escape, an encoded NUL or a `..` above the root is the client's error (nginx answers 400). The original
//! bytes stay what is forwarded upstream; only routing, `uri` and plugins see the normalised form.
//!
//! [`servlet`] is APISIX's `normalize_uri_like_servlet` applied on top, and [`escape_path`] nginx's
//! `ngx_escape_uri(NGX_ESCAPE_URI)`, for a plugin that writes a path built from the decoded one back to the wire.

use std::borrow::Cow;
use std::fmt;

/// Why a path cannot be normalised: the request gets 400, as from nginx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UriError {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%00`.
    Nul,
    /// A `..` segment with nothing left to remove.
    AboveRoot,
    /// Servlet normalisation: a `.`/`..` or empty segment carrying `;` parameters, or an encoded dot segment.
    ServletDotSegment,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UriError::BadEscape => "invalid percent-encoding in the path",
            UriError::Nul => "encoded NUL in the path",
            UriError::AboveRoot => "the path climbs above the root",
            UriError::ServletDotSegment => "dot or empty segment with parameters in the path",
        })
    }
}

impl std::error::Error for UriError {}

/// True when `path` is already its own normal form, so [`normalize`] borrows it: no `%`, no `#`, no `//` and no
/// `/.` (the only shapes that change anything). One pass over the bytes, no allocation.
#[inline]
pub fn is_normal(path: &[u8]) -> bool {
    let mut prev = 0u8;
    for &b in path {
        match b {
            b'%' | b'#' => return false,
            b'/' | b'.' if prev == b'/' => return false,
            _ => {}
        }
        prev = b;
    }
    true
}

/// nginx's `$uri` for a request path (the target without its query). A path not starting with `/` (`*`, the
/// authority-form's empty path) is returned unchanged, except that an empty one is `/`. Non-UTF-8 bytes produced
/// by decoding are kept percent-encoded (uppercase hex), so the result is always a `str`.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, UriError> {
    if path.is_empty() {
        return Ok(Cow::Borrowed("/"));
    }
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path.as_bytes())?;
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    // Start offset in `out` of each kept segment's '/', to pop on `..`.
    let mut starts: Vec<usize> = Vec::new();
    let mut trailing = false;
    for seg in decoded[1..].split(|&b| b == b'/') {
        trailing = false;
        match seg {
            b"" | b"." => trailing = true,
            b".." => {
                let start = starts.pop().ok_or(UriError::AboveRoot)?;
                out.truncate(start);
                trailing = true;
            }
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(seg);
            }
        }
    }
    if out.is_empty() || trailing {
        out.push(b'/');
    }
    Ok(Cow::Owned(into_string(out)))
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes once, up to a raw `#`.
fn decode(p: &[u8]) -> Result<Vec<u8>, UriError> {
    let mut out = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'#' => break,
            b'%' => {
                let (h, l) = p
                    .get(i + 1)
                    .and_then(|&h| hex(h))
                    .zip(p.get(i + 2).and_then(|&l| hex(l)))
                    .ok_or(UriError::BadEscape)?;
                let b = h << 4 | l;
                if b == 0 {
                    return Err(UriError::Nul);
                }
                out.push(b);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

fn into_string(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            let bytes = e.into_bytes();
            let mut s = String::with_capacity(bytes.len() * 3);
            for chunk in bytes.utf8_chunks() {
                s.push_str(chunk.valid());
                for b in chunk.invalid() {
                    push_pct(&mut s, *b);
                }
            }
            s
        }
    }
}

fn push_pct(s: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    s.push('%');
    s.push(HEX[usize::from(b >> 4)] as char);
    s.push(HEX[usize::from(b & 15)] as char);
}

/// APISIX's `normalize_uri_like_servlet`, on an already [`normalize`]d path: `;params` are cut from every segment
/// (`/admin;x` -> `/admin`), and the shapes a servlet container would resolve differently from the router are
/// refused: `..;x`, `.;x`, an empty segment with parameters before the last (`/;x/admin`), and `%2e`/`%2e%2e`
/// left after decoding (from `%252e`).
pub fn servlet(uri: &str) -> Result<Cow<'_, str>, UriError> {
    if !uri.contains(';') {
        return Ok(Cow::Borrowed(uri));
    }
    let segs: Vec<&str> = uri.split('/').collect();
    let last = segs.len() - 1;
    let mut out = String::with_capacity(uri.len());
    for (i, seg) in segs.iter().enumerate() {
        let mut seg = *seg;
        if let Some(pos) = seg.find(';') {
            seg = &seg[..pos];
            if seg == "." || seg == ".." || (seg.is_empty() && i < last) {
                return Err(UriError::ServletDotSegment);
            }
            if seg.eq_ignore_ascii_case("%2e") || seg.eq_ignore_ascii_case("%2e%2e") {
                return Err(UriError::ServletDotSegment);
            }
        }
        if i > 0 {
            out.push('/');
        }
        out.push_str(seg);
    }
    Ok(Cow::Owned(out))
}

/// nginx's `ngx_escape_uri(NGX_ESCAPE_URI)`, which APISIX's proxy-rewrite applies to the path it built: control
/// bytes, space, `#`, `%`, `?`, DEL and non-ASCII become `%XX`, so a decoded path cannot break a request line.
pub fn escape_path(p: &str) -> Cow<'_, str> {
    fn escaped(b: u8) -> bool {
        b <= b' ' || matches!(b, b'#' | b'%' | b'?') || b >= 0x7f
    }
    if !p.bytes().any(escaped) {
        return Cow::Borrowed(p);
    }
    let mut s = String::with_capacity(p.len() + 16);
    for &b in p.as_bytes() {
        if escaped(b) {
            push_pct(&mut s, b);
        } else {
            s.push(b as char);
        }
    }
    Cow::Owned(s)
}

/// APISIX's `escape_uri_control_chars`: only control bytes (CR and LF among them) and DEL become `%XX`, for a
/// query or header value that must keep its delimiters.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b.is_ascii_control()) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_ascii_control() {
            push_pct(&mut out, c as u8);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests;
