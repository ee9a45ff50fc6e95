//! Which fields may travel in a trailer section (RFC 9110 §6.5.1): a proxy forwards trailers, so a field that only
//! means something in a head (framing, routing, request modifiers, authentication, response control data, how to
//! process the content) must not reach the next hop as a trailer, where a recipient that merges trailers into the
//! head would act on it.
//!
//! It owns the list and the filtering of a raw, already validated trailer section. The list is documented in
//! docs/http-conformance.md ("Trailers").

use bytes::{BufMut, BytesMut};

/// Trailer fields dropped in both directions (lower case). `X-Forwarded-*` is matched as a prefix.
pub const FORBIDDEN_TRAILERS: &[&str] = &[
    // framing and connection handling
    "content-length",
    "transfer-encoding",
    "trailer",
    "te",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    // routing and request modifiers
    "host",
    "expect",
    "max-forwards",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "cache-control",
    "pragma",
    // authentication and state
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "cookie",
    "set-cookie",
    // response control data
    "age",
    "date",
    "expires",
    "location",
    "retry-after",
    "vary",
    "warning",
    // how to process the content
    "content-encoding",
    "content-type",
    "content-range",
    // what the gateway itself asserts about the client
    "forwarded",
    "x-real-ip",
];

const FORWARDED_PREFIX: &[u8] = b"x-forwarded-";

/// Whether a field with this name (any case) is dropped from trailers.
pub fn is_forbidden_trailer(name: &[u8]) -> bool {
    name.get(..FORWARDED_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(FORWARDED_PREFIX))
        || FORBIDDEN_TRAILERS
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f.as_bytes()))
}

/// Appends `raw` (a validated trailer section as [`crate::Chunk::End`] returns it: field lines, each ending in
/// CRLF, then CRLF) to `out` without the forbidden fields.
pub fn filter_trailers(raw: &[u8], out: &mut BytesMut) {
    if raw == b"\r\n" {
        out.put_slice(raw);
        return;
    }
    let mut rest = raw;
    while let Some(end) = memchr::memmem::find(rest, b"\r\n") {
        let line = &rest[..end];
        rest = &rest[end + 2..];
        if line.is_empty() {
            break;
        }
        let name = memchr::memchr(b':', line).map_or(line, |c| &line[..c]);
        if !is_forbidden_trailer(name) {
            out.put_slice(line);
            out.put_slice(b"\r\n");
        }
    }
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_any_case_and_forwarded_prefix() {
        for n in [
            "Content-Length",
            "TRANSFER-ENCODING",
            "host",
            "Authorization",
            "Set-Cookie",
            "X-Forwarded-For",
            "x-forwarded-anything",
            "Trailer",
            "Content-Type",
        ] {
            assert!(is_forbidden_trailer(n.as_bytes()), "{n}");
        }
        for n in [
            "grpc-status",
            "grpc-message",
            "x-checksum",
            "server-timing",
            "x-forwarded",
            "hosts",
            "digest",
        ] {
            assert!(!is_forbidden_trailer(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn filter_keeps_order_and_drops_forbidden_lines() {
        let mut out = BytesMut::new();
        filter_trailers(
            b"X-A: 1\r\nContent-Length: 5\r\nhost:evil\r\ngrpc-status: 0\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
            &mut out,
        );
        assert_eq!(&out[..], b"X-A: 1\r\ngrpc-status: 0\r\n\r\n");
        out.clear();
        filter_trailers(b"\r\n", &mut out);
        assert_eq!(&out[..], b"\r\n");
        out.clear();
        filter_trailers(b"Set-Cookie: a=b\r\n\r\n", &mut out);
        assert_eq!(&out[..], b"\r\n");
    }
}
