//! The four request-target forms of RFC 9112 §3.2 and the `uri-host [":" port]` syntax shared with Host.
//!
//! It owns which form a target is, whether the method allows it, and where path/query/authority sit inside it.
//! It does not percent-decode, normalise dot-segments or look at the path bytes beyond `?`/`#`: the target is
//! forwarded as sent and the router decides what a path means.

use crate::ParseError;

/// Offsets relative to the start of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Form {
    pub(super) path: (usize, usize),
    pub(super) query: Option<(usize, usize)>,
    /// absolute-form only: the authority, which becomes the request's host.
    pub(super) authority: Option<(usize, usize)>,
}

/// Classify `target` (already restricted by httparse to VCHAR / obs-text, valid UTF-8, non-empty).
pub(super) fn classify(method: &[u8], target: &[u8]) -> Result<Form, ParseError> {
    let connect = method == b"CONNECT";
    match target.first() {
        Some(b'/') if !connect => path_and_query(target, 0, None),
        Some(b'*') if target.len() == 1 && !connect => {
            if method != b"OPTIONS" {
                return Err(ParseError::AsteriskFormNotOptions);
            }
            Ok(Form {
                path: (0, 1),
                query: None,
                authority: None,
            })
        }
        _ if connect => {
            // authority-form = uri-host ":" port, port required (RFC 9112 §3.2.3).
            if !valid_host(target, true, true) {
                return Err(ParseError::ConnectWithoutAuthority);
            }
            let end = target.len();
            Ok(Form {
                path: (end, end),
                query: None,
                authority: None,
            })
        }
        _ => absolute_form(target),
    }
}

/// absolute-form: `http[s]://authority[/path][?query]` (RFC 9112 §3.2.2). Anything else that is a valid
/// `host:port` is authority-form sent with the wrong method; the rest is an invalid target.
fn absolute_form(target: &[u8]) -> Result<Form, ParseError> {
    let scheme_len = match memchr::memmem::find(target, b"://") {
        Some(i) => i,
        None if valid_host(target, true, true) => return Err(ParseError::AuthorityFormNotConnect),
        None => return Err(ParseError::InvalidTarget),
    };
    let scheme = &target[..scheme_len];
    if !(scheme.eq_ignore_ascii_case(b"http") || scheme.eq_ignore_ascii_case(b"https")) {
        return Err(ParseError::InvalidAbsoluteForm);
    }
    let auth_start = scheme_len + 3;
    let rest = &target[auth_start..];
    let auth_len = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..auth_len];
    // Userinfo is deprecated and a recipient SHOULD treat it as an error (RFC 9110 §4.2.4).
    if authority.is_empty() || authority.contains(&b'@') || !valid_host(authority, true, false) {
        return Err(ParseError::InvalidAbsoluteForm);
    }
    let auth_end = auth_start + auth_len;
    path_and_query(target, auth_end, Some((auth_start, auth_end)))
}

/// Split `target[from..]` at the first `?`; a `#` anywhere is a fragment, which a request-target cannot carry.
fn path_and_query(
    target: &[u8],
    from: usize,
    authority: Option<(usize, usize)>,
) -> Result<Form, ParseError> {
    let rest = &target[from..];
    match memchr::memchr2(b'?', b'#', rest) {
        None => Ok(Form {
            path: (from, target.len()),
            query: None,
            authority,
        }),
        Some(i) if rest[i] == b'#' => Err(ParseError::FragmentInTarget),
        Some(i) => {
            if memchr::memchr(b'#', &rest[i + 1..]).is_some() {
                return Err(ParseError::FragmentInTarget);
            }
            Ok(Form {
                path: (from, from + i),
                query: Some((from + i + 1, target.len())),
                authority,
            })
        }
    }
}

/// `uri-host [":" port]` (RFC 9110 §7.2 / RFC 3986 §3.2.2): IP-literal in brackets, or a reg-name / IPv4 of
/// unreserved, pct-encoded and sub-delims bytes. `host_required` for URIs (RFC 9110 §4.2.1: an http URI with an
/// empty host is invalid), `port_required` for authority-form. An empty Host field value is valid (RFC 9112 §3.2:
/// sent when the target URI has no authority).
pub(crate) fn valid_host(value: &[u8], host_required: bool, port_required: bool) -> bool {
    let (host_ok, port) = if let Some(rest) = value.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let literal = &rest[..close];
        let ok = !literal.is_empty()
            && literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
        match &rest[close + 1..] {
            [] => (ok, None),
            [b':', port @ ..] => (ok, Some(port)),
            _ => return false,
        }
    } else {
        // One pass: reg-name bytes up to the first ':' (hosts are short; a table beats memchr's call overhead).
        let mut colon = None;
        for (i, &b) in value.iter().enumerate() {
            if b == b':' {
                colon = Some(i);
                break;
            }
            if !REG_NAME[usize::from(b)] {
                return false;
            }
        }
        match colon {
            Some(i) => (!(host_required && i == 0), Some(&value[i + 1..])),
            None => (!(host_required && value.is_empty()), None),
        }
    };
    if !host_ok {
        return false;
    }
    match port {
        Some(p) => {
            p.iter().all(u8::is_ascii_digit) && p.len() <= 5 && !(port_required && p.is_empty())
        }
        None => !port_required,
    }
}

/// reg-name bytes: unreserved / pct-encoded ('%') / sub-delims (RFC 3986 §3.2.2).
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        i += 1;
    }
    t
};
