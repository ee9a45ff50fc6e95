//! Hop-by-hop fields (RFC 9110 §7.6.1): the static list a proxy always removes, and the per-message list of names
//! a `Connection` field adds to it.
//!
//! It owns the decision "does this field stop at this hop". It does not rewrite heads: the proxy calls these while
//! copying fields to the next hop. Proxy-Authenticate / Proxy-Authorization are deliberately end-to-end here (see
//! docs/http-conformance.md): a reverse proxy is not the proxy they address, and nginx/APISIX forward them.

use crate::head::span_slice;
use crate::parse::list_elements;
use crate::HeaderSpan;

/// Whether a field with this name is hop-by-hop whatever `Connection` says: Connection, Keep-Alive,
/// Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade (case-insensitive).
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    let list: &[&[u8]] = match name.len() {
        2 => &[b"te"],
        7 => &[b"trailer", b"upgrade"],
        10 => &[b"connection", b"keep-alive"],
        16 => &[b"proxy-connection"],
        17 => &[b"transfer-encoding"],
        _ => return false,
    };
    list.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Inline capacity of [`ConnectionTokens`]: bytes and tokens kept without allocating.
const INLINE_BYTES: usize = 64;
const INLINE_TOKENS: usize = 8;

/// The option names listed in a head's `Connection` fields, lower-cased. Up to 8 tokens / 64 bytes live inline
/// (no allocation); more spill to the heap.
#[derive(Clone)]
pub struct ConnectionTokens {
    bytes: [u8; INLINE_BYTES],
    ends: [u8; INLINE_TOKENS],
    count: usize,
    spill: Vec<Box<[u8]>>,
}

impl Default for ConnectionTokens {
    fn default() -> Self {
        ConnectionTokens {
            bytes: [0; INLINE_BYTES],
            ends: [0; INLINE_TOKENS],
            count: 0,
            spill: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ConnectionTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|t| String::from_utf8_lossy(t)))
            .finish()
    }
}

// === impl ConnectionTokens ===

impl ConnectionTokens {
    fn push(&mut self, token: &[u8]) {
        let used = self
            .count
            .checked_sub(1)
            .map_or(0, |i| usize::from(self.ends[i]));
        if self.spill.is_empty() && self.count < INLINE_TOKENS && used + token.len() <= INLINE_BYTES
        {
            let dst = &mut self.bytes[used..used + token.len()];
            dst.copy_from_slice(token);
            dst.make_ascii_lowercase();
            self.ends[self.count] = (used + token.len()) as u8;
            self.count += 1;
        } else {
            self.spill
                .push(token.to_ascii_lowercase().into_boxed_slice());
        }
    }

    /// The listed names, lower-cased, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let inline = (0..self.count).map(move |i| {
            let start = if i == 0 {
                0
            } else {
                usize::from(self.ends[i - 1])
            };
            &self.bytes[start..usize::from(self.ends[i])]
        });
        inline.chain(self.spill.iter().map(|t| &t[..]))
    }

    /// Whether `name` (any case) is listed.
    pub fn contains(&self, name: &[u8]) -> bool {
        self.iter().any(|t| t.eq_ignore_ascii_case(name))
    }

    /// Number of listed names.
    pub fn len(&self) -> usize {
        self.count + self.spill.len()
    }

    /// Whether no name is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a field with this name must not be forwarded: statically hop-by-hop, or listed in `Connection`.
    pub fn is_hop_by_hop(&self, name: &[u8]) -> bool {
        is_hop_by_hop(name) || self.contains(name)
    }
}

/// Collect the names listed in every `Connection` field of a head (`head_buf` + its `headers`).
pub fn connection_tokens(head_buf: &[u8], headers: &[HeaderSpan]) -> ConnectionTokens {
    let mut tokens = ConnectionTokens::default();
    for h in headers {
        if span_slice(head_buf, h.name).eq_ignore_ascii_case(b"connection") {
            for token in list_elements(span_slice(head_buf, h.value)) {
                tokens.push(token);
            }
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_list_is_case_insensitive_and_excludes_proxy_auth() {
        for name in [
            "Connection",
            "keep-alive",
            "PROXY-CONNECTION",
            "te",
            "Trailer",
            "transfer-encoding",
            "Upgrade",
        ] {
            assert!(is_hop_by_hop(name.as_bytes()), "{name}");
        }
        for name in [
            "proxy-authorization",
            "proxy-authenticate",
            "host",
            "content-length",
            "trailers",
            "tee",
        ] {
            assert!(!is_hop_by_hop(name.as_bytes()), "{name}");
        }
    }

    fn head(raw: &[u8]) -> (Vec<u8>, Vec<HeaderSpan>) {
        let mut buf = bytes::BytesMut::from(raw);
        let req = crate::parse_request(&mut buf, &crate::Limits::default())
            .expect("valid")
            .expect("complete");
        (req.buf.to_vec(), req.headers)
    }

    #[test]
    fn tokens_from_all_connection_fields_lowercased() {
        let (buf, headers) = head(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, X-Foo\r\nconnection: ,x-BAR ,\r\n\r\n");
        let t = connection_tokens(&buf, &headers);
        let got: Vec<&[u8]> = t.iter().collect();
        assert_eq!(got, vec![&b"keep-alive"[..], b"x-foo", b"x-bar"]);
        assert!(t.contains(b"X-Foo"));
        assert!(t.is_hop_by_hop(b"x-bar"));
        assert!(t.is_hop_by_hop(b"TE"));
        assert!(!t.is_hop_by_hop(b"x-baz"));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn many_tokens_spill_without_losing_any() {
        let names: Vec<String> = (0..20).map(|i| format!("X-Option-Number-{i}")).collect();
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: {}\r\n\r\n",
            names.join(", ")
        );
        let (buf, headers) = head(raw.as_bytes());
        let t = connection_tokens(&buf, &headers);
        assert_eq!(t.len(), 20);
        let got: Vec<String> = t
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        let want: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
        assert_eq!(got, want);
        assert!(t.contains(b"x-option-number-19"));
    }

    #[test]
    fn no_connection_field_no_tokens() {
        let (buf, headers) = head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(connection_tokens(&buf, &headers).is_empty());
    }
}
