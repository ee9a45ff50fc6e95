//! How the dual-protocol port classifies a connection's opening bytes.

use super::{classify_line, Opening};

#[test]
fn only_a_first_line_with_a_non_http_version_token_is_neither() {
    assert_eq!(
        classify_line(b"INVALID CONNECTION PREFACE\r\n\r\n"),
        Opening::Neither
    );
    assert_eq!(classify_line(b"GET / FTP/1.0\r\n"), Opening::Neither);
    for http1 in [
        &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"GET / http/1.1\r\n",
        b"GET / HTTP/2.0\r\n",
        b"GET /\r\n",
        b"GET / HTTP/1.1",
        b"INVALID CONNECTION",
        b"A B C D\r\n",
        b"",
    ] {
        assert_eq!(
            classify_line(http1),
            Opening::Http1,
            "{:?}",
            String::from_utf8_lossy(http1)
        );
    }
}
