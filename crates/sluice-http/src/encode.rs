//! Small writers for heads Sluice produces itself (error responses, forwarded heads): status line, field line,
//! `Content-Length`. They append to a `BytesMut` without formatting machinery (`fmt` costs more than the bytes).
//!
//! They do not validate: names and values come from parsed heads or from Sluice's own constants. They do not
//! decide framing or hop-by-hop removal (see `parse.rs`, `hop.rs`).

use bytes::{BufMut, BytesMut};

use crate::{status_reason, Version};

/// Append `HTTP/1.1 404 Not Found\r\n` (reason from [`status_reason`]; an unregistered code gets an empty one).
pub fn write_status_line(version: Version, status: u16, out: &mut BytesMut) {
    let reason = status_reason(status);
    out.reserve(8 + 5 + reason.len() + 2);
    out.put_slice(version.as_bytes());
    out.put_u8(b' ');
    let code = status.min(999);
    out.put_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]);
    out.put_u8(b' ');
    out.put_slice(reason.as_bytes());
    out.put_slice(b"\r\n");
}

/// Append `name: value\r\n`.
pub fn write_header(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.reserve(name.len() + value.len() + 4);
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Append `Content-Length: {len}\r\n`.
pub fn write_content_length(len: u64, out: &mut BytesMut) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = len;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    write_header(b"Content-Length", &digits[i..], out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_response, BodyKind, Limits};

    #[test]
    fn status_lines() {
        let mut out = BytesMut::new();
        write_status_line(Version::Http11, 404, &mut out);
        write_status_line(Version::Http10, 200, &mut out);
        write_status_line(Version::Http11, 299, &mut out);
        assert_eq!(
            &out[..],
            b"HTTP/1.1 404 Not Found\r\nHTTP/1.0 200 OK\r\nHTTP/1.1 299 \r\n"
        );
    }

    #[test]
    fn written_head_parses_back() {
        let mut out = BytesMut::new();
        write_status_line(Version::Http11, 502, &mut out);
        write_header(b"Server", b"sluice", &mut out);
        write_content_length(1234567890123, &mut out);
        out.put_slice(b"\r\n");
        let head = parse_response(&mut out, &Limits::default(), false)
            .expect("valid")
            .expect("complete");
        assert_eq!((head.status, head.reason_str()), (502, "Bad Gateway"));
        assert_eq!(head.body, BodyKind::Length(1234567890123));
        assert_eq!(head.header("server"), Some(&b"sluice"[..]));
    }

    #[test]
    fn content_length_edges() {
        for (n, want) in [
            (0u64, "0"),
            (9, "9"),
            (10, "10"),
            (u64::MAX, "18446744073709551615"),
        ] {
            let mut out = BytesMut::new();
            write_content_length(n, &mut out);
            assert_eq!(out, format!("Content-Length: {want}\r\n").as_bytes());
        }
    }
}
