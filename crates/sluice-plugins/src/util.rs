//! Helpers the plugins share: schema check plus typed parse, APISIX's variable templates (`$remote_addr $http_x`),
//! limit keys, and nginx-shaped error pages. Nothing here keeps state.

use std::borrow::Cow;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_router::Var;

use crate::{Ctx, Response};

/// Validates `v` against `schema` (APISIX error text), then parses it with serde defaults filled in.
pub(crate) fn parse<T: DeserializeOwned>(schema: &Value, v: &Value) -> Result<T, String> {
    sluice_model::schema::validate(schema, v)?;
    serde_json::from_value(v.clone()).map_err(|e| e.to_string())
}

/// A string with `$var` / `${var}` references (APISIX `core.utils.resolve_var`), compiled once.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Lit(String),
    Var(Var),
}

impl Template {
    pub(crate) fn compile(s: &str) -> Template {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'$' {
                let (name, next) = if b.get(i + 1) == Some(&b'{') {
                    match s[i + 2..].find('}') {
                        Some(end) => (&s[i + 2..i + 2 + end], i + 3 + end),
                        None => ("", i + 1),
                    }
                } else {
                    let end = s[i + 1..]
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .map_or(s.len(), |e| i + 1 + e);
                    (&s[i + 1..end], end)
                };
                if !name.is_empty() {
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Var(Var::parse(name)));
                    i = next;
                    continue;
                }
            }
            let ch = s[i..].chars().next().unwrap_or('$');
            lit.push(ch);
            i += ch.len_utf8();
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Template { parts }
    }

    /// The resolved text and how many variables had a value; a missing variable becomes "".
    pub(crate) fn resolve<'c>(&'c self, ctx: &'c Ctx<'_>) -> (Cow<'c, str>, usize) {
        if let [Part::Lit(l)] = self.parts.as_slice() {
            return (Cow::Borrowed(l), 0);
        }
        let mut out = String::new();
        let mut n = 0;
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.push_str(l),
                Part::Var(v) => {
                    if let Some(val) = ctx.var(v) {
                        n += 1;
                        out.push_str(&val);
                    }
                }
            }
        }
        (Cow::Owned(out), n)
    }
}

/// limit-count / limit-req / limit-conn's `key_type` + `key`.
#[derive(Debug, Clone)]
pub(crate) enum LimitKey {
    Var(Var),
    Combination(Template),
    Constant(String),
}

impl LimitKey {
    pub(crate) fn compile(key_type: &str, key: &str) -> Result<LimitKey, String> {
        Ok(match key_type {
            "var" => LimitKey::Var(Var::parse(key)),
            "var_combination" => LimitKey::Combination(Template::compile(key)),
            "constant" => LimitKey::Constant(key.to_owned()),
            other => return Err(format!("unknown key_type {other:?}")),
        })
    }

    /// The key's value; the client address when it resolves to nothing (as APISIX does).
    pub(crate) fn resolve<'c>(&'c self, ctx: &'c Ctx<'_>) -> Cow<'c, str> {
        let v = match self {
            LimitKey::Var(v) => ctx.var(v).filter(|s| !s.is_empty()),
            LimitKey::Combination(t) => {
                let (s, n) = t.resolve(ctx);
                (n > 0).then_some(s)
            }
            LimitKey::Constant(c) => Some(Cow::Borrowed(c.as_str())),
        };
        v.unwrap_or_else(|| Cow::Owned(ctx.remote_ip().to_string()))
    }
}

/// nginx's default error page for `status` (which APISIX serves when a plugin returns a bare status), signed with
/// Sluice's own name like every other answer of the gateway.
pub(crate) fn error_page(status: u16) -> Response {
    let reason = match status {
        503 => "Service Temporarily Unavailable",
        s => sluice_http::status_reason(s),
    };
    let body = format!(
        "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n<center><h1>{status} {reason}</h1></center>\r\n<hr><center>sluice</center>\r\n</body>\r\n</html>\r\n"
    );
    Response {
        status,
        headers: vec![(
            Bytes::from_static(b"Content-Type"),
            Bytes::from_static(b"text/html; charset=utf-8"),
        )],
        body: Bytes::from(body),
    }
}

/// APISIX's `return code, {error_msg = msg}` when `msg` is set, else the bare status page.
pub(crate) fn reject(status: u16, msg: Option<&str>) -> Response {
    match msg {
        Some(m) => {
            let mut r = Response::message(status, m);
            r.body = Bytes::from(serde_json::json!({ "error_msg": m }).to_string());
            r
        }
        None => error_page(status),
    }
}

/// APISIX's regex replacement syntax (`$1`) in the regex crate's unambiguous form (`${1}`).
pub(crate) fn dollar_groups(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '$' && it.peek().is_some_and(char::is_ascii_digit) {
            out.push_str("${");
            while let Some(d) = it.peek().copied().filter(char::is_ascii_digit) {
                out.push(d);
                it.next();
            }
            out.push('}');
        } else {
            out.push(c);
        }
    }
    out
}

/// Unpadded base64url (JWT segments).
pub(crate) fn base64url_encode(b: &[u8]) -> String {
    encode64(
        b,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    )
}

/// Standard padded base64.
pub(crate) fn base64_encode(b: &[u8]) -> String {
    let mut s = encode64(
        b,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    );
    while !s.len().is_multiple_of(4) {
        s.push('=');
    }
    s
}

fn encode64(b: &[u8], alphabet: &[u8; 64]) -> String {
    let a = alphabet;
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..=c.len() {
            out.push(a[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Standard base64 (padding optional); `None` on any invalid byte.
pub(crate) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s.trim_end_matches('=').as_bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dollar_groups_are_braced() {
        assert_eq!(super::dollar_groups("/$1/x$2y"), "/${1}/x${2}y");
        assert_eq!(super::dollar_groups("$a"), "$a");
    }

    #[test]
    fn base64url_round_trips() {
        for s in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\xfe\xfd"] {
            assert_eq!(
                super::base64_decode(&super::base64url_encode(s)).unwrap(),
                s
            );
        }
        assert_eq!(super::base64url_encode(b"foo:bar"), "Zm9vOmJhcg");
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(super::base64_decode("Zm9vOmJhcg==").unwrap(), b"foo:bar");
        assert_eq!(super::base64_decode("Zm9vOmJhcg").unwrap(), b"foo:bar");
        assert!(super::base64_decode("Zm9v*").is_none());
    }

    use super::*;

    #[test]
    fn templates_split_vars_and_literals() {
        let t = Template::compile("$remote_addr ${http_x}-k $");
        assert_eq!(t.parts.len(), 4);
        assert!(matches!(&t.parts[1], Part::Lit(l) if l == " "));
        assert!(matches!(
            Template::compile("plain").parts.as_slice(),
            [Part::Lit(_)]
        ));
    }
}

/// Numbers up to this are served from a static table (limit-count's `X-RateLimit-Reset` seconds, small counts).
const SMALL_MAX: usize = 3600;

const fn digits(n: usize) -> usize {
    if n < 10 {
        1
    } else if n < 100 {
        2
    } else if n < 1000 {
        3
    } else {
        4
    }
}

const fn small_len() -> usize {
    let mut n = 0;
    let mut len = 0;
    while n <= SMALL_MAX {
        len += digits(n);
        n += 1;
    }
    len
}

const SMALL_LEN: usize = small_len();

/// "0123...3600" and where each number ends in it.
const fn small_table() -> ([u8; SMALL_LEN], [u16; SMALL_MAX + 2]) {
    let mut text = [0u8; SMALL_LEN];
    let mut ends = [0u16; SMALL_MAX + 2];
    let mut n = 0;
    let mut at = 0;
    while n <= SMALL_MAX {
        let d = digits(n);
        let mut v = n;
        let mut i = d;
        while i > 0 {
            i -= 1;
            text[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        at += d;
        ends[n + 1] = at as u16;
        n += 1;
    }
    (text, ends)
}

static SMALL: ([u8; SMALL_LEN], [u16; SMALL_MAX + 2]) = small_table();

/// `n` in decimal as a header value: up to 3600 a static slice (no allocation, no reference count), above it
/// `itoa`'s digits and one allocation (no formatter).
pub(crate) fn decimal(n: u64) -> Bytes {
    if n <= SMALL_MAX as u64 {
        let (text, ends) = &SMALL;
        let i = n as usize;
        return Bytes::from_static(&text[usize::from(ends[i])..usize::from(ends[i + 1])]);
    }
    // itoa's digit-pair table: no formatter machinery, one exact allocation.
    Bytes::copy_from_slice(itoa::Buffer::new().format(n).as_bytes())
}

#[cfg(test)]
mod decimal_tests {
    #[test]
    fn decimal_writes_every_digit() {
        for n in (0..=3700).chain([9_999, 10_000, 4_294_967_294, u64::MAX]) {
            assert_eq!(&super::decimal(n)[..], n.to_string().as_bytes());
        }
    }
}
